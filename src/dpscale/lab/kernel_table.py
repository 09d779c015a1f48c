"""Where the time of a compiled, CUDA-graphed training step goes, kernel by kernel.

The per-layer table (dpscale.lab.layer_profile) needs eager ops to charge kernels to
layers; a compiled step has none, and its kernels differ from the eager ones (inductor
fuses BatchNorm's passes with the ReLUs and adds around them). So this table profiles
the step as the pipeline runs it and sorts each kernel into a kind by its name: the
convolutions (cuDNN's fprop, dgrad and wgrad, and the fused conv + statistics graph),
the GEMMs (stem, projections, head), inductor's generated kernels (reductions and
pointwise passes: BatchNorm, ReLU, add, casts), the optimiser and loss scaling, and
the rest. Traps: CUPTI sees the kernels inside a CUDA graph replay, but a kind is only
as good as the kernel names (cuDNN's change between versions: the rules below are
checked against every name a profile saw, and `other` shows what they missed).
Imports torch lazily: profile() is for GPU probes; kind(), summarize() and wall() are pure.
"""
from __future__ import annotations

from dpscale.analysis import roofline

CONV_KINDS = ("conv_fprop", "conv_dgrad", "conv_wgrad", "gemm")

# first match wins; each is (kind, substrings of the lower-cased kernel name)
RULES = (
    # inductor's names first: they carry the aten ops they fuse (convolution_backward, ...)
    ("triton_reduction", ("triton_red", "triton_per")),
    ("triton_pointwise", ("triton_poi",)),
    # cuDNN's runtime-fusion kernels: cudnn_generated_fort_native_sm90_convBwdData_pointwise_...
    ("conv_wgrad", ("wgrad", "convbwdfilter")),
    ("conv_dgrad", ("dgrad", "convbwddata")),
    ("conv_fprop", ("fprop", "convfwd", "genstats", "convolution", "conv2d", "implicit_convolve")),
    ("optimizer", ("multi_tensor", "fused_sgd", "_amp_", "foreach", "amp_update_scale", "non_finite")),
    ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "sm80_")),
    ("nccl", ("nccl",)),
    ("copy_fill", ("memcpy", "memset", "copy", "fill")),
)


def kind(name: str) -> str:
    low = name.lower()
    for k, subs in RULES:
        if any(s in low for s in subs):
            return k
    return "other"


def summarize(kernels: list[tuple[str, float, int]], steps: int, wall_s_per_step: float | None = None,
              top: int = 40) -> dict:
    """kernels: (name, total device seconds, launches) over `steps` steps. Per step: each
    kind's milliseconds and launches, the sum, and the `top` kernels by time. With the
    step's wall time, `idle_ms`: the wall the kernels did not fill (launch gaps, host)."""
    kinds: dict[str, dict] = {}
    for name, secs, n in kernels:
        k = kinds.setdefault(kind(name), {"ms": 0.0, "launches": 0})
        k["ms"] += 1e3 * secs / steps
        k["launches"] += n / steps
    total = sum(k["ms"] for k in kinds.values())
    rows = sorted(kernels, key=lambda r: -r[1])[:top]
    out = {"steps": steps, "kernel_ms_per_step": total,
           "kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1]["ms"])),
           "top": [{"kind": kind(n), "ms": 1e3 * s / steps, "launches": c / steps, "name": n[:160]}
                   for n, s, c in rows]}
    if wall_s_per_step is not None:
        out["wall_ms_per_step"] = 1e3 * wall_s_per_step
        out["idle_ms"] = 1e3 * wall_s_per_step - total
    return out


def profile(call, steps: int, sync) -> list[tuple[str, float, int]]:
    """(name, device seconds, launches) of every kernel `steps` calls of call(i) ran."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    sync()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as p:
        for i in range(steps):
            call(i)
        sync()
    return [(e.key, e.self_device_time_total / 1e6, e.count) for e in p.key_averages()
            if e.self_device_time_total > 0]


def wall(summary: dict, batch: int, image_size: int, copy_Bps: float, fusion: str = "stats_epilogue") -> dict:
    """The fastest step the measured convolutions allow under `fusion`: the kernels that
    do the step's FLOPs (cuDNN's convolutions and the GEMMs) at the times this profile
    measured, plus every other pass the fusion leaves (dpscale.analysis.roofline: BN,
    ReLU, add, pool, casts, SGD) at the measured copy bandwidth, with no gaps between
    kernels. A step with these convolutions cannot beat it: a target above it needs
    faster convolutions or a fusion that removes passes, not better elementwise kernels."""
    conv_ms = sum(summary["kinds"].get(k, {}).get("ms", 0.0) for k in CONV_KINDS)
    rest = [p for p in roofline.step_passes(batch, image_size, fusion)   # the passes without FLOPs
            if not p.flops and p.host is None]
    rest_bytes = sum(p.bytes for p in rest)
    step_ms = conv_ms + 1e3 * rest_bytes / copy_Bps
    return {"fusion": fusion, "conv_and_gemm_ms": conv_ms, "other_passes_GB": rest_bytes / 1e9,
            "other_passes_ms": 1e3 * rest_bytes / copy_Bps, "step_ms": step_ms,
            "samples_per_s": batch / (step_ms / 1e3)}
