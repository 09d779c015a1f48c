# Helpers for every stage: the resolved config, the machine's fingerprint, the
# measurement jobs the registry declares (dpscale.registry), and what a job asks a
# cluster for. Parse-time work stays light (no torch, no jax).
# (The Snakefile put src/ on sys.path; scripts find the package themselves.)
import os
import sys
from pathlib import Path

from dpscale.plan import (
    config as dsconfig,
    fingerprint as dsfp,
    cluster as dscluster,
    specs,
)
from dpscale import provenance, registry, results
from dpscale.data import fetch as dsfetch

try:
    FP = dsfp.load(config["hardware_file"]) if config["hardware_file"] else dsfp.probe()
    RESOLVED = dsconfig.resolve(config, FP)
    LOCKS = dsconfig.resolve_locks(config, RESOLVED["scale"])
except ValueError as e:  # ConfigError, a bad hardware_file: one line, no traceback
    sys.exit(f"Invalid configuration: {e}")

if workflow.is_main_process:  # a job-mode parse on a compute node must not rewrite it
    dsfp.save_if_changed(FP, "results/fingerprint.json")
PROTO = RESOLVED["protocol"]
SIZE = PROTO["image_size"]
DATA = "results/data"
FLOPS = "results/model/flops_{size}px.json"
RAW = [
    f"{DATA}/FashionMNIST/raw/{n}"
    for n in (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    )
]
# The files behind each input name of the registry.
INPUT_FILES = {
    "raw": RAW,
    "cache": f"{DATA}/fmnist_{SIZE}px.npz",
    "meta": f"{DATA}/fmnist_{SIZE}px.json",
    "flops": FLOPS.format(size=SIZE),
    # time to accuracy reads its own size (16 px at smoke scale, 64 at paper: the same file)
    "tta_cache": f"{DATA}/fmnist_{PROTO['tta_image_size']}px.npz",
    "tta_meta": f"{DATA}/fmnist_{PROTO['tta_image_size']}px.json",
}
TARGETS = specs.targets(RESOLVED)
if workflow.is_main_process:
    for _target in TARGETS:
        if _why := results.last_failure(_target):
            logger.info(f"{_target}: the last attempt failed ({_why}); it runs again")
# Entry points, passed to each job as params.scripts (lint: no globals in shell).
# Resolved from the workflow's own folder, so `snakemake -d elsewhere` finds them, and
# written relative to the working folder: a params value, so an absolute path would
# rerun every job of a clone that was moved or copied to another machine.
SCRIPTS = os.path.relpath(Path(workflow.basedir) / "scripts")


def rule_inputs(exp):
    """The rule's input files: what the registry says the experiment reads."""
    files = {name: INPUT_FILES[name] for name in exp.inputs}
    for need in exp.needs:
        files[need.experiment] = specs.target(need.experiment, need.variant, need.k)
    return files


def job_inputs(exp):
    """The same files as the worker sees them in its spec."""
    inputs = {
        "cache": INPUT_FILES["cache"],
        "cache_meta": INPUT_FILES["meta"],
        "data_root": DATA,
    }
    if "flops" in exp.inputs:
        inputs["flops"] = INPUT_FILES["flops"]
    if "tta_cache" in exp.inputs:  # its cache is the one of its own image size
        inputs["cache"], inputs["cache_meta"] = (
            INPUT_FILES["tta_cache"],
            INPUT_FILES["tta_meta"],
        )
    for need in exp.needs:
        inputs[need.experiment] = {
            str(need.k): specs.target(need.experiment, need.variant, need.k)
        }
    return inputs


def spec_of(exp):
    """The job's spec as canonical JSON, a params value: reruns exactly when it changes."""

    def spec(wildcards):
        job = specs.job_spec(
            RESOLVED, FP, exp.name, wildcards.variant, int(wildcards.k), job_inputs(exp)
        )
        return specs.dumps(job)

    return spec


def retry_of(exp):
    """How many attempts at the job's result failed so far: a params value, so that a
    failed record is never up to date and a plain rerun retries exactly those jobs."""

    # Why a count, read before the run, and not a mark on the failed record:
    # - Snakemake records params as they were when the DAG was built, before the job
    #   ran. A token "the record failed" would be recorded by the retry, and differ
    #   again once the record is ok: one more, needless rerun after every retry. The
    #   count (one line per failed attempt in k<k>.failures, results.record_failure)
    #   changes only when an attempt fails, so each failure reruns its job once.
    # - An epoch mtime on the record does not work: Snakemake 9 touches a job's
    #   outputs when it ends (dag.check_and_touch_output), and its mtime trigger skips
    #   an input that is newer but has the checksum it recorded (allreduce reads one
    #   small JSON, the resize cache's sidecar).
    # Checked with Snakemake 9.27: tests/test_isolation.py's crash test dry-runs
    # exactly the failed job after the failure, and nothing after its retry.
    def retry(wildcards):
        target = specs.target(exp.name, wildcards.variant, wildcards.k)
        return f"failed attempts: {results.failed_attempts(target)}"

    return retry


def code_of(exp):
    """A digest of the code the measurement runs (dpscale.provenance): a params value,
    so a change to what that code does marks the old numbers stale and reruns them."""
    return provenance.source_digest(exp.sources)


# ---- What a measurement job asks a cluster for (profiles/slurm, docs/cluster.md).
# Local runs use only `measure` (profiles/default limits it to 1 at a time).
# {"nodes": most a job may span, "gpus_per_node": G (null in the config: the fingerprint's)}
CLUSTER = dscluster.effective(RESOLVED["cluster"], FP)
HAS_GPUS = (FP.get("gpu_count") or 0) > 0


def nodes_of(wildcards):
    """Nodes a job spans: ceil(k / G); 1 when k fits one node or is skipped."""
    return dscluster.nodes_for(int(wildcards.k), CLUSTER)


def gpus_of(wildcards):
    """GPUs of a one-node job (sbatch --gpus=k). 0 on CPU stand-ins, for a k that
    is skipped (it runs nothing and must not wait for GPUs that do not exist), and
    for multi-node jobs, which ask per node (gres_of)."""
    k = int(wildcards.k)
    if not HAS_GPUS or k > dscluster.capacity(CLUSTER) or nodes_of(wildcards) > 1:
        return 0
    return k


def gres_of(wildcards):
    """GPUs on each node of a multi-node job (sbatch --gres=gpu:G); "" otherwise."""
    multi = HAS_GPUS and nodes_of(wildcards) > 1
    return f"gpu:{CLUSTER['gpus_per_node']}" if multi else ""


def tasks_of(wildcards):
    """One task per node of a multi-node job (a torchrun agent or JAX process); 0 = unset."""
    n = nodes_of(wildcards)
    return n if n > 1 else 0


def mpi_of(wildcards):
    """The key alone makes the SLURM plugin run a measurement in the job's batch
    step (with all of the first node's GPUs), not inside `srun -n1`; its value, set
    on multi-node jobs, makes it submit --ntasks=N, and the watchdog starts its
    own srun over all nodes (dpscale.run.command)."""
    return "srun" if nodes_of(wildcards) > 1 else ""


def cpus_of(wildcards):
    """CPU stand-ins: one core per gloo process or JAX host device on a node."""
    k = int(wildcards.k)
    return min(k, CLUSTER["gpus_per_node"]) if k <= dscluster.capacity(CLUSTER) else 1


# `resources: **MEASURE` in every measurement rule. tasks_per_gpu=0: without it
# the plugin turns `tasks` into --ntasks-per-gpu as well, on a GPU job. lock_dir and
# lock_wait_s reach the watchdog (dpscale.run.devices) as resources, not params: changing
# them must not rerun a measurement. No executor reads them (the SLURM plugin maps
# only names it knows; a job step gets lock_wait_s as --resources, which it meets).
MEASURE = dict(
    gpu=gpus_of,
    gres=gres_of,
    nodes=nodes_of,
    tasks=tasks_of,
    tasks_per_gpu=0,
    mpi=mpi_of,
    measure=1,
    lock_dir=LOCKS["dir"],
    lock_wait_s=LOCKS["wait_s"],
)
if not HAS_GPUS:
    MEASURE["cpus_per_task"] = cpus_of  # with GPUs, the profile's cpus_per_gpu applies
