# Multi-GPU data-parallel training, measured: d2l section 13.6 as a pipeline.
#   snakemake --cores 1 report            everything, at the scale this machine suits
#   snakemake -n report                   what would run, and why
# Configuration: config.yaml, validated against schemas/config.schema.yaml.
# Experiments: src/dpscale/registry.py (one rule each, rules/measure.smk).
import os
import shlex
import sys

from snakemake.utils import min_version, validate

min_version("9.0")
sys.path.insert(0, f"{workflow.basedir}/src")
from dpscale.config import coerce_cli_types
from dpscale.locks import release_stale

# The report names the command that built it; the environment carries it to the job,
# not a params value, so the same report built by another command line does not rerun.
if workflow.is_main_process:
    os.environ["DPSCALE_SNAKEMAKE_COMMAND"] = shlex.join(["snakemake", *sys.argv[1:]])

# A run killed with SIGKILL leaves its lock; release it only if no run is alive here.
for _lock in release_stale(workflow.workdir_init, workflow.is_main_process):
    logger.warning(f"Removed a stale lock left by a killed run: {_lock}")


# The working folder's config.yaml if it has one (snakemake -d elsewhere), else the workflow's.
CONFIGFILE = (
    "config.yaml"
    if os.path.exists("config.yaml")
    else f"{workflow.basedir}/config.yaml"
)


configfile: CONFIGFILE


# --config 'ks=[1,2]' arrives as strings inside lists: coerce by the schema first.
coerce_cli_types(config)
validate(config, "schemas/config.schema.yaml")


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/measure.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        rules.report.output,


# One line per planned measurement that left no number (dpscale.results), at the end.
onsuccess:
    if _summary := results.failure_summary(TARGETS):
        logger.warning(_summary)


onerror:
    if _summary := results.failure_summary(TARGETS):
        logger.warning(_summary)
