"""What the workflow's rules ask of each measurement, derived from the registry: the
files it reads (rule inputs) and how its worker names them (the spec's inputs), its
spec, its retry count and code digest (params values), and what it asks a cluster
for (resources). rules/common.smk only looks these up.

Every callable taking `wildcards` reads `.variant` and `.k`, as Snakemake passes them.
Parse-time light: no torch, no jax.
"""
from __future__ import annotations

import json
from pathlib import Path

from dpscale import layout, provenance, registry, results
from dpscale.data.load import SPLITS
from dpscale.plan import cluster as dscluster, specs

DATA = layout.DATA
FLOPS = f"{layout.MODEL}/flops_{{size}}px.json"
RAW = [f"{DATA}/FashionMNIST/raw/{name}" for images, labels, _n in SPLITS.values() for name in (images, labels)]


def input_files(protocol: dict) -> dict:
    """The files behind each input name of the registry (registry.INPUTS)."""
    size, tta = protocol["image_size"], protocol["tta_image_size"]
    return {"raw": RAW, "cache": f"{DATA}/fmnist_{size}px.npz", "meta": f"{DATA}/fmnist_{size}px.json",
            "flops": FLOPS.format(size=size),
            # time to accuracy reads its own size (16 px at smoke scale, 64 at paper: the same file)
            "tta_cache": f"{DATA}/fmnist_{tta}px.npz", "tta_meta": f"{DATA}/fmnist_{tta}px.json"}


def rule_inputs(exp: registry.Experiment, protocol: dict, data_mark=lambda f: f) -> dict:
    """The rule's input files: what the registry says the experiment reads. data_mark wraps
    the data files (Snakemake's ancient: their mtime reruns nothing)."""
    files = input_files(protocol)
    out = {name: [data_mark(f) for f in files[name]] if isinstance(files[name], list) else data_mark(files[name])
           for name in exp.inputs}
    for need in exp.needs:
        out[need.experiment] = layout.result_path(need.experiment, need.variant, need.k)
    return out


def job_inputs(exp: registry.Experiment, protocol: dict) -> dict:
    """The same files as the worker sees them in its spec."""
    files = input_files(protocol)
    tta = "tta_cache" in exp.inputs   # its cache is the one of its own image size
    out = {"cache": files["tta_cache" if tta else "cache"], "cache_meta": files["tta_meta" if tta else "meta"],
           "data_root": DATA}
    if "flops" in exp.inputs:
        out["flops"] = files["flops"]
    for need in exp.needs:
        out[need.experiment] = {str(need.k): layout.result_path(need.experiment, need.variant, need.k)}
    return out


def spec_of(exp: registry.Experiment, resolved: dict, fp: dict):
    """The job's spec as canonical JSON, a params value: reruns exactly when it changes."""
    inputs = job_inputs(exp, resolved["protocol"])

    def spec(wildcards) -> str:
        return specs.dumps(specs.job_spec(resolved, fp, exp.name, wildcards.variant, int(wildcards.k), inputs))
    return spec


# Seconds a SLURM job spends outside the watchdog's launches: the job step parsing the
# workflow again on the compute node, Python and torch importing, the result's seal, the
# plugin's teardown. A margin, not a measurement: it only needs to cover those.
JOB_OVERHEAD_S = 300


def runtime_of(exp: registry.Experiment, resolved: dict, fp: dict, locks: dict):
    """The job's wall-clock limit in minutes (`resources: runtime`, sbatch -t): the
    longest the watchdog can take before it records the job hung or failed itself (the
    wait for its devices' locks, then each launch's limit and grace), plus
    JOB_OVERHEAD_S. Derived from the job's own spec, so SLURM never ends a job before its
    watchdog can say why (a flat 90 minutes cut a paper-scale time-to-accuracy job,
    limit 5,400 s, short of it); a job recorded as skipped needs only the overhead."""
    inputs = job_inputs(exp, resolved["protocol"])

    def runtime(wildcards) -> int:
        spec = specs.job_spec(resolved, fp, exp.name, wildcards.variant, int(wildcards.k), inputs)
        watched = 0 if spec["skip_reason"] else (
            locks["wait_s"] + specs.launch_count(spec) * (float(spec["limit_s"]) + float(spec["grace_s"])))
        return -(-int(watched + JOB_OVERHEAD_S) // 60)
    return runtime


def retry_of(exp: registry.Experiment, replan=None):
    """How many attempts at the job's result failed, or found it missing or damaged,
    so far: a params value, so that a failed record is never up to date and a plain
    rerun retries exactly those jobs. replan: a dpscale.plan.replan.Replanner, which
    adds the results that are missing or damaged now (and records them, in a real run)."""

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
    def retry(wildcards) -> str:
        path = layout.result_path(exp.name, wildcards.variant, wildcards.k)
        n = replan.attempts(path) if replan is not None else results.failed_attempts(path)
        return f"failed attempts: {n}"
    return retry


def attempt_of(exp: registry.Experiment, replan):
    """The measurement's attempt-stamp input (dpscale.plan.replan.Replanner.stamp): how a
    failed attempt, or a result found missing, damaged or stale, reruns its job without
    Snakemake's metadata."""
    def attempt(wildcards) -> list[str]:
        return replan.stamp(layout.result_path(exp.name, wildcards.variant, wildcards.k))
    return attempt


def planned_of(resolved: dict, fp: dict):
    """result path -> (its job's spec now, the digest of its code, the data cache's sha256
    when the cache exists): what dpscale.plan.replan compares a result's record with."""
    def plan(result: str) -> tuple[dict, str, str | None]:
        experiment, variant, k = results.label_of(result).rsplit("/", 2)
        exp = registry.get(experiment)
        inputs = job_inputs(exp, resolved["protocol"])
        spec = specs.job_spec(resolved, fp, experiment, variant, int(k.removeprefix("k")), inputs)
        try:
            cache_sha = json.loads(Path(inputs["cache_meta"]).read_text()).get("sha256")
        except (OSError, ValueError):
            cache_sha = None
        return spec, code_of(exp), cache_sha
    return plan


def code_of(exp: registry.Experiment) -> str:
    """A digest of the code the measurement runs (dpscale.provenance): a params value,
    so a change to what that code does marks the old numbers stale and reruns them."""
    return provenance.source_digest(exp.sources)


def resources(cluster: dict, fp: dict, locks: dict, cache: dict | None = None,
              experiment: str | None = None) -> dict:
    """`resources: **...` of every measurement rule (docs/cluster.md). Local runs use only
    `measure` (profiles/default limits it to 1 at a time). A SLURM job's requests come from
    here and the config's `cluster`: profiles/slurm names no rule. tasks_per_gpu=0: else
    the SLURM plugin turns `tasks` into --ntasks-per-gpu too. lock_dir, lock_wait_s
    (dpscale.run.devices) and cache_dir (dpscale.run.caches) reach the watchdog as
    resources, not params: changing them must not rerun a measurement (no executor reads
    them; a job step gets lock_wait_s as --resources, which it meets)."""
    eff = dscluster.effective(cluster, fp)
    has_gpus = (fp.get("gpu_count") or 0) > 0

    def skipped(w) -> bool:
        """A job that only records `skipped` (specs.skip_reason): it asks for no GPUs and
        one node, whatever its k (the memcpy switch on gloo at k=8 held four nodes)."""
        return experiment is not None and specs.skip_reason(experiment, w.variant, int(w.k), fp, cluster) is not None

    def nodes(w) -> int:
        """Nodes a job spans: ceil(k / G); 1 when k fits one node or is skipped."""
        return 1 if skipped(w) else dscluster.nodes_for(int(w.k), eff)

    def gpus(w) -> int:
        """GPUs of a one-node job (sbatch --gpus=k). 0 on CPU stand-ins, for a k that is
        skipped (it runs nothing and must not wait for GPUs that do not exist), and for
        multi-node jobs, which ask per node (gres)."""
        k = int(w.k)
        return 0 if not has_gpus or skipped(w) or k > dscluster.capacity(eff) or nodes(w) > 1 else k

    def gres(w) -> str:
        """GPUs on each node of a multi-node job (sbatch --gres=gpu:G); "" otherwise."""
        return f"gpu:{eff['gpus_per_node']}" if has_gpus and nodes(w) > 1 else ""

    def tasks(w) -> int:
        """One task per node of a multi-node job (a torchrun agent or JAX process); 0 = unset."""
        return nodes(w) if nodes(w) > 1 else 0

    def mpi(w) -> str:
        """The key alone makes the SLURM plugin run a measurement in the job's batch step
        (with all of the first node's GPUs), not inside `srun -n1`; its value, set on
        multi-node jobs, makes it submit --ntasks=N, and the watchdog starts its own srun
        over all nodes (dpscale.run.command)."""
        return "srun" if nodes(w) > 1 else ""

    def cpus(w) -> int:
        """CPU stand-ins: one core per gloo process or JAX host device on a node."""
        k = int(w.k)
        return min(k, eff["gpus_per_node"]) if k <= dscluster.capacity(eff) else 1

    def slurm_extra(w) -> str:
        """Whole nodes (cluster.exclusive) for a job that measures, not one that skips."""
        return "--exclusive" if (cluster or {}).get("exclusive", True) and not skipped(w) else ""

    out = dict(gpu=gpus, gres=gres, nodes=nodes, tasks=tasks, tasks_per_gpu=0, mpi=mpi, slurm_extra=slurm_extra,
               measure=1, lock_dir=locks["dir"], lock_wait_s=locks["wait_s"], cache_dir=(cache or {}).get("dir") or "",
               **{key: cluster[key] for key in ("cpus_per_gpu", "mem_mb_per_cpu") if key in (cluster or {})})
    if not has_gpus:
        out["cpus_per_task"] = cpus   # with GPUs, cpus_per_gpu (cluster.cpus_per_gpu) applies
    return out
