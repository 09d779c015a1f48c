# Helpers for every stage, looked up, not defined here: the resolved config and the
# machine's fingerprint (dpscale.plan.config, .fingerprint), and what each measurement
# reads, receives and asks a cluster for (dpscale.plan.jobs, from dpscale.registry).
# Parse-time work stays light (no torch, no jax).
# (The Snakefile put src/ on sys.path; scripts find the package themselves.)
import os
import sys
from pathlib import Path

from dpscale.plan import config as dsconfig, fingerprint as dsfp, jobs, replan, specs
from dpscale import layout, provenance, registry, results
from dpscale.data import fetch as dsfetch
from dpscale.run import caches as dsrun_caches

try:
    FP = dsfp.load(config["hardware_file"]) if config["hardware_file"] else dsfp.probe()
    RESOLVED = dsconfig.resolve(config, FP)
    LOCKS = dsconfig.resolve_locks(config, RESOLVED["scale"])
    CACHE = dsconfig.resolve_cache(config)  # compilation caches: a resource, like LOCKS
except ValueError as e:  # ConfigError, a bad hardware_file: one line, no traceback
    sys.exit(f"Invalid configuration: {e}")
if config["hardware_file"] and workflow.is_main_process:
    if _unstated := dsfp.unstated_warning(config["hardware_file"], FP):
        logger.warning(_unstated)

PROTO = RESOLVED["protocol"]
DATA, FLOPS, RAW = jobs.DATA, jobs.FLOPS, jobs.RAW
INPUT_FILES = jobs.input_files(PROTO)
TARGETS = specs.targets(RESOLVED)
if workflow.is_main_process:
    logger.info(specs.plan_line(RESOLVED, FP))
    if _no_base := specs.no_base_warning(RESOLVED):
        logger.warning(_no_base)
    for _target in TARGETS:
        if _why := results.last_failure(_target):
            logger.info(f"{_target}: the last attempt failed ({_why}); it runs again")
# A result missing although the last report read it, damaged, failed, or measured by
# other code or another protocol than the plan's, is measured again (dpscale.plan.replan):
# its attempt stamp, an input of its measurement, and the report's key, an output of the
# report, change name, so Snakemake reruns both with or without its metadata.
REPLAN = replan.Replanner(
    TARGETS,
    jobs.planned_of(RESOLVED, FP),
    dry=lambda: workflow.dryrun,
    main=workflow.is_main_process,
    say=logger.warning,
)
# Entry points, passed to each job as params.scripts (lint: no globals in shell).
# Resolved from the workflow's own folder, so `snakemake -d elsewhere` finds them, and
# written relative to the working folder: a params value, so an absolute path would
# rerun every job of a clone that was moved or copied to another machine.
SCRIPTS = os.path.relpath(Path(workflow.basedir) / "scripts")
# Every job's Python keeps its bytecode where the environment forbids writing it beside
# the sources (dpscale.run.caches.bytecode_env): a job would compile torch from source.
os.environ.update(dsrun_caches.bytecode_env(CACHE["dir"], os.environ))


# `resources: **measure_resources(exp)` in every measurement rule (dpscale.plan.jobs.resources)
def measure_resources(exp):
    return jobs.resources(RESOLVED["cluster"], FP, LOCKS, CACHE, exp.name)


def report_stamps(allowed_rules):
    """The report's stamp inputs (dpscale.plan.replan): every result's attempt stamp and the
    machine's, those a run may make (`--allowed-rules report` builds from what exists).
    """
    machine = layout.machine_stamp(dsfp.digest(FP))
    can = (
        not allowed_rules or "machine_stamp" in allowed_rules or os.path.exists(machine)
    )
    return REPLAN.stamps(allowed_rules) + ([machine] if can else [])
