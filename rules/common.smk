# Helpers for every stage: the resolved config, the machine's fingerprint, job
# specs and targets. Parse-time work stays light (no torch, no jax).
# (The Snakefile put src/ on sys.path; scripts find the package themselves.)
import os
from pathlib import Path

from snakemake.exceptions import WorkflowError

from dpscale import config as dsconfig, fingerprint as dsfp, launch, specs

try:
    FP = dsfp.load(config["hardware_file"]) if config["hardware_file"] else dsfp.probe()
    RESOLVED = dsconfig.resolve(config, FP)
except ValueError as e:  # ConfigError, bad hardware_file
    raise WorkflowError(f"Invalid configuration: {e}")

dsfp.save_if_changed(FP, "results/fingerprint.json")
PROTO = RESOLVED["protocol"]
SIZE = PROTO["image_size"]
DATA = "results/data"
CACHE = f"{DATA}/fmnist_{SIZE}px.npz"
CACHE_META = f"{DATA}/fmnist_{SIZE}px.json"
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
TARGETS = specs.targets(RESOLVED)
# Entry points, passed to each job as params.scripts (lint: no globals in shell).
# Relative to the working folder: a params value, so an absolute path would rerun
# every job of a clone that was moved or copied to another machine.
SCRIPTS = os.path.relpath(Path(workflow.basedir) / "scripts")


def job_inputs(experiment, variant, k):
    inputs = {"cache": CACHE, "cache_meta": CACHE_META, "data_root": DATA}
    if experiment == "ddp_comm_probe":
        inputs["allreduce"] = {"2": "results/runs/allreduce/default/k2.json"}
    if experiment == "jax_weak":
        inputs["flops"] = FLOPS.format(size=SIZE)
    return inputs


def spec_of(experiment):
    """The job's spec as canonical JSON, a params value: reruns exactly when it changes."""

    def spec(wildcards):
        variant = wildcards.get("variant", "default")
        k = int(wildcards.k)
        return specs.dumps(
            specs.job_spec(
                RESOLVED, FP, experiment, variant, k, job_inputs(experiment, variant, k)
            )
        )

    return spec


# ---- What a measurement job asks a cluster for (profiles/slurm, docs/cluster.md).
# Local runs use only `measure` (profiles/default limits it to 1 at a time).
# {"nodes": most a job may span, "gpus_per_node": G (null in the config: the fingerprint's)}
CLUSTER = launch.effective(RESOLVED["cluster"], FP)
HAS_GPUS = (FP.get("gpu_count") or 0) > 0


def nodes_of(wildcards):
    """Nodes a job spans: ceil(k / G); 1 when k fits one node or is skipped."""
    return launch.nodes_for(int(wildcards.k), CLUSTER)


def gpus_of(wildcards):
    """GPUs of a one-node job (sbatch --gpus=k). 0 on CPU stand-ins, for a k that
    is skipped (it runs nothing and must not wait for GPUs that do not exist), and
    for multi-node jobs, which ask per node (gres_of)."""
    k = int(wildcards.k)
    if not HAS_GPUS or k > launch.capacity(CLUSTER) or nodes_of(wildcards) > 1:
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
    own srun over all nodes (dpscale.launch)."""
    return "srun" if nodes_of(wildcards) > 1 else ""


def cpus_of(wildcards):
    """CPU stand-ins: one core per gloo process or JAX host device on a node."""
    k = int(wildcards.k)
    return min(k, CLUSTER["gpus_per_node"]) if k <= launch.capacity(CLUSTER) else 1


# `resources: **MEASURE` in every measurement rule. tasks_per_gpu=0: without it
# the plugin turns `tasks` into --ntasks-per-gpu as well, on a GPU job.
MEASURE = dict(
    gpu=gpus_of,
    gres=gres_of,
    nodes=nodes_of,
    tasks=tasks_of,
    tasks_per_gpu=0,
    mpi=mpi_of,
    measure=1,
)
if not HAS_GPUS:
    MEASURE["cpus_per_task"] = cpus_of  # with GPUs, the profile's cpus_per_gpu applies


# torchrun under the watchdog: one process per device, rank logs under logs/.
# When k spans nodes (the spec carries `launch`), the watchdog turns this into
# srun + one torchrun agent per node, c10d rendezvous (dpscale.launch).
TORCHRUN = (
    "python {params.scripts}/watchdog.py --spec {params.spec:q} --result {output.json}"
    " --rank-logs {log}.ranks --"
    " torchrun --standalone --nproc-per-node={wildcards.k}"
    " --log-dir {log}.ranks --redirects 3 --tee 3"
    " {params.scripts}/torch_worker.py --spec {params.spec:q} --result {output.json}"
    " > {log} 2>&1"
)
