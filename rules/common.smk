# Helpers for every stage: the resolved config, the machine's fingerprint, job
# specs and targets. Parse-time work stays light (no torch, no jax).
# (The Snakefile put src/ on sys.path; scripts find the package themselves.)
import os
from pathlib import Path

from snakemake.exceptions import WorkflowError

from dpscale import config as dsconfig, fingerprint as dsfp, specs

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


def gpus_of(wildcards):
    """GPUs a job holds: k where GPUs exist (SLURM gres), 0 on CPU stand-ins."""
    return int(wildcards.k) if (FP.get("gpu_count") or 0) > 0 else 0


# torchrun under the watchdog: one process per device, rank logs under logs/.
TORCHRUN = (
    "python {params.scripts}/watchdog.py --spec {params.spec:q} --result {output.json}"
    " --rank-logs {log}.ranks --"
    " torchrun --standalone --nproc-per-node={wildcards.k}"
    " --log-dir {log}.ranks --redirects 3 --tee 3"
    " {params.scripts}/torch_worker.py --spec {params.spec:q} --result {output.json}"
    " > {log} 2>&1"
)
