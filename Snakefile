# Multi-GPU data-parallel training, measured: d2l section 13.6 as a pipeline.
#   snakemake --cores 1 report            everything, at the scale this machine suits
#   snakemake -n report                   what would run, and why
# Configuration: config.yaml, validated against schemas/config.schema.yaml.
# Experiments: src/dpscale/registry.py (one rule each, rules/measure.smk).
import os
import sys

from snakemake.utils import min_version, validate

min_version("9.0")
sys.path.insert(0, f"{workflow.basedir}/src")
from dpscale.plan import cluster as dscluster
from dpscale.plan.config import ConfigError, coerce_cli_types
from dpscale.plan.configcheck import check, check_file
from dpscale.run.lifeline import mark_snakemake
from dpscale.run.locks import release_stale
from dpscale.provenance import export_command
from dpscale.report import summary as closing

if workflow.is_main_process:  # the report names the command line that built it
    export_command(sys.argv)
mark_snakemake()  # jobs started after this process died stop at once (dpscale.run.lifeline)

# A run killed with SIGKILL leaves its lock; release it only if no run is alive here.
for _lock in release_stale(workflow.workdir_init, workflow.is_main_process):
    logger.warning(f"Removed a stale lock left by a killed run: {_lock}")


# The working folder's config.yaml if it has one (snakemake -d elsewhere), else the workflow's.
CONFIGFILE = (
    "config.yaml"
    if os.path.exists("config.yaml")
    else f"{workflow.basedir}/config.yaml"
)


# config.yaml written wrongly (a tab, an unclosed bracket): the line and the fault in one
# line, before Snakemake's loader says only "not valid JSON or YAML".
try:
    check_file(CONFIGFILE)
except ConfigError as e:
    sys.exit(f"Invalid configuration: {e}")


configfile: CONFIGFILE


# --config 'ks=[1,2]' arrives as strings inside lists: coerce by the schema first. A bad
# value, or a key written twice in a config file, stops the run with one line that names
# the key and the fix (sys.exit prints just that line); then Snakemake's validate fills
# in every default.
try:
    for _file in workflow.configfiles:
        if _file != CONFIGFILE:  # checked above, before Snakemake loaded it
            check_file(_file)
    coerce_cli_types(config)
    check(config)
except ConfigError as e:
    sys.exit(f"Invalid configuration: {e}")
validate(config, "schemas/config.schema.yaml")


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/measure.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        rules.report.output,


# Said once, as the jobs start (the executor is not known while the workflow is parsed):
# a cluster run that kept profiles/default's measure=1 (given --profile, not
# --workflow-profile) would measure one job at a time; a local run of a k that spans
# nodes (cluster.nodes) would record that job failed.
onstart:
    if _serial := dscluster.serialised_on_cluster(
        workflow.local_exec, workflow.global_resources
    ):
        logger.warning(_serial)
    if _spans := dscluster.spanning_locally(
        workflow.local_exec, RESOLVED["ks"], RESOLVED["cluster"], FP
    ):
        logger.warning(_spans)


# The run ends with the answer (dpscale.report.summary), printed after Snakemake's own
# last lines: per machine and k the speed-up in samples/s and in time to accuracy, the
# forecast's knee, what failed (with its log) and the report's path. Computed from the
# results as they are at the end: a report built from other results than these (a run
# that did not rebuild it, a result missing or damaged) is named as such, never printed.
onsuccess:
    closing.announce(
        closing.closing(
            TARGETS,
            rules.report.output.summary,
            rules.report.output.html,
            replanned=REPLAN.outcome(),
        )
    )


onerror:
    closing.announce(
        closing.closing(
            TARGETS,
            rules.report.output.summary,
            rules.report.output.html,
            snakemake_log=log,
            failed=True,
            replanned=REPLAN.outcome(),
        )
    )
