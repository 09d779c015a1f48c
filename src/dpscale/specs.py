"""Which jobs the workflow asks for, and the spec each job receives.

A spec is what a measurement depends on and nothing else: it is passed to the
rule as a plain `params:` value, so Snakemake reruns a job exactly when its spec
changes (a new GPU model, a new torch, a changed protocol number), and never for
an unrelated change (another rule's settings, more GPUs for another k).
"""
from __future__ import annotations

import json

from . import fingerprint as fpmod, launch

TORCH = ("ddp_weak", "ddp_strong", "ddp_comm_probe", "allreduce", "ddp_memcpy_training",
         "ddp_bucket_sweep", "fsdp")
JAX = ("jax_weak", "jax_hlo", "jax_equality")

# The protocol numbers each experiment reads.
PROTOCOL_KEYS = {
    "ddp_weak": ("image_size", "train_images", "epochs", "per_rank_batch", "loader_workers"),
    "ddp_strong": ("image_size", "train_images", "epochs", "global_batch", "loader_workers"),
    "ddp_comm_probe": ("image_size", "per_rank_batch", "probe_warmup", "probe_steps"),
    "allreduce": ("allreduce_MiB", "allreduce_warmup", "allreduce_iters"),
    "ddp_memcpy_training": ("image_size", "train_images", "epochs", "per_rank_batch"),
    "ddp_bucket_sweep": ("image_size", "per_rank_batch", "bucket_cap_MiB", "sweep_steps"),
    "fsdp": ("image_size", "per_rank_batch", "sweep_steps"),
    "jax_weak": ("image_size", "train_images", "epochs", "per_rank_batch"),
    "jax_hlo": ("image_size", "train_images", "per_rank_batch"),
    "jax_equality": ("image_size", "train_images", "per_rank_batch"),
}

# Variables each variant runs with. The shared-memory transport is only used when
# peer-to-peer is off, so the memcpy variant turns P2P off too.
MEMCPY_ENV = {"NCCL_SHM_USE_CUDA_MEMCPY": "1", "NCCL_P2P_DISABLE": "1"}
VARIANT_ENV = {("allreduce", "memcpy"): MEMCPY_ENV, ("ddp_memcpy_training", "default"): MEMCPY_ENV}

# The tuned series. DDP's gradient_as_bucket_view and static_graph are off (opt in by
# variant): with them the rank log said "Grad strides do not match bucket view
# strides" (channels_last weights vs contiguous bucket views), and their one H200
# timing, 13,282 samples/s, was taken before the CUDA graph, when the step was
# host-bound, so it says nothing about them either way.
# cuda_graph: the whole step is captured and replayed (torch_runs.GraphedStep): the
# compiled step is host-bound on a 16-core H200 box (16-25 ms to issue ~14 ms of GPU work).
TUNED_OPTIONS = {"precision": "bf16", "channels_last": True, "compile": True, "cuda_graph": True,
                 "data": "device-resident cache", "optimizer": "fused SGD", "ddp": []}
JAX_TUNED_OPTIONS = {"precision": "bf16 compute, float32 parameters and loss",
                     "data": "device-resident cache",
                     "dispatch": "jax.jit over the flat nnx.split state, donated buffers"}


def variants(experiment: str, tuned: bool) -> list[str]:
    if experiment in ("ddp_weak", "ddp_strong"):
        return ["seed", "cached"] + (["tuned"] if tuned else [])
    if experiment == "jax_weak":
        return ["host", "device"] + (["tuned"] if tuned else [])
    if experiment == "allreduce":
        return ["default", "memcpy"]
    return ["default"]


def ks_for(experiment: str, ks: list[int]) -> list[int]:
    multi = sorted(k for k in ks if k >= 2)
    if experiment in ("ddp_comm_probe", "allreduce", "jax_hlo"):
        return multi
    if experiment in ("ddp_memcpy_training", "ddp_bucket_sweep"):
        return multi[:1] if 2 not in multi else [2]   # the book's exercises use k=2
    if experiment == "jax_equality":
        return [2]   # k=1 vs k=2, inside one job
    return sorted(ks)


def targets(resolved: dict, root: str = "results/runs") -> list[str]:
    out = []
    for exp in resolved["experiments"]:
        for variant in variants(exp, resolved["tuned"]):
            for k in ks_for(exp, resolved["ks"]):
                out.append(f"{root}/{exp}/{variant}/k{k}.json")
    return out


def skip_reason(experiment: str, variant: str, k: int, fp: dict,
                cluster: dict | None = None) -> str | None:
    gpus = fp.get("gpu_count") or 0
    eff = launch.effective(cluster, fp)
    nodes, per_node = eff["nodes"], eff["gpus_per_node"]
    if k > nodes * per_node:
        if nodes > 1:
            return (f"k={k} needs {k} devices; cluster.nodes={nodes} x {per_node} per node "
                    f"give {nodes * per_node}")
        what = (f"{per_node} GPU(s)" if gpus else
                f"{per_node} CPU core(s), and a CPU stand-in runs one process or host device per core")
        return f"k={k} needs {k} devices; this machine has {what}"
    if (experiment, variant) in VARIANT_ENV and not gpus:
        return ("NCCL_SHM_USE_CUDA_MEMCPY is a setting of NCCL's shared-memory transport; "
                "the gloo backend used without GPUs has no equivalent")
    return None


def job_spec(resolved: dict, fp: dict, experiment: str, variant: str, k: int, inputs: dict) -> dict:
    family = "torch" if experiment in TORCH else "jax"
    proto = {key: resolved["protocol"][key] for key in PROTOCOL_KEYS[experiment]}
    if experiment in ("ddp_weak", "ddp_strong") and variant != "seed":
        proto.pop("loader_workers")
    limit = resolved["watchdog"]["hang_timeout_s"]
    if experiment == "ddp_memcpy_training":
        limit = resolved["protocol"]["memcpy_timeout_s"]
    spec = {
        "experiment": experiment, "variant": variant, "k": k,
        "backend": fpmod.backend_for(fp, family),
        "config": {"scale": resolved["scale"], "protocol": proto},
        "fingerprint": fpmod.subset(fp, family, k),
        "env": VARIANT_ENV.get((experiment, variant), {}),
        "limit_s": limit, "grace_s": resolved["watchdog"]["grace_s"],
        "inputs": inputs, "skip_reason": skip_reason(experiment, variant, k, fp, resolved.get("cluster")),
    }
    multi = launch.layout(k, launch.effective(resolved.get("cluster"), fp))
    if multi and not spec["skip_reason"]:
        spec["launch"] = multi   # only multi-node specs carry it: one-node specs stay as they were
    if variant == "tuned":
        spec["config"]["tuned"] = JAX_TUNED_OPTIONS if family == "jax" else TUNED_OPTIONS
    return spec


def dumps(spec: dict) -> str:
    """Canonical JSON: the same spec always gives the same params string."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))
