"""Where the time of an eager training step goes, layer by layer, beside the roofline.

A torch.profiler pass over a few eager (uncompiled, uncaptured) steps. Each module's
forward runs inside a record_function range named after it (forward hooks); every
forward op records the autograd sequence number of the node it creates, and the
engine's `autograd::engine::evaluate_function: <Node>` events carry the same number,
so a backward kernel is charged to the layer whose forward made its node. A kernel
is charged through the op that launched it (its self device time), so nothing is
counted twice. On a CPU the op's self CPU time stands in for the kernels' time.

Traps: a compiled or CUDA-graphed step has no per-module ops to attribute (profile
the eager model: the kernels differ, the layers' costs do not disappear); a Residual
block's own ReLUs and add have no module, so they land on the block itself; the
gradient sums autograd does where a tensor feeds two branches land on the node that
produced the second gradient. Imports torch: for GPU probes and tests, not the pipeline.
"""
from __future__ import annotations

import contextlib

import torch

from dpscale.analysis import roofline

PREFIX = "layer::"
BACKWARD = "autograd::engine::evaluate_function: "
OUTSIDE = ("loss", "optimizer")   # ranges the caller opens around the loss and the update


@contextlib.contextmanager
def layer_ranges(model: torch.nn.Module):
    """Every named module's forward (but containers') inside record_function('layer::<name>')."""
    open_ranges: dict[str, list] = {}

    def enter(name):
        def hook(module, args):
            r = torch.autograd.profiler.record_function(PREFIX + name)
            r.__enter__()
            open_ranges.setdefault(name, []).append(r)
        return hook

    def leave(name):
        def hook(module, args, out):
            open_ranges[name].pop().__exit__(None, None, None)
        return hook
    handles = []
    for name, module in model.named_modules():
        if name and not isinstance(module, torch.nn.Sequential):   # containers run no ops of their own
            handles += [module.register_forward_pre_hook(enter(name)), module.register_forward_hook(leave(name))]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _forward_layer(event) -> str | None:
    """The innermost layer range (or loss/optimizer range) around a CPU event."""
    e = event
    while e is not None:
        if e.name.startswith(PREFIX):
            return e.name[len(PREFIX):]
        if e.name in OUTSIDE:
            return e.name
        e = e.cpu_parent
    return None


def _backward_node(event):
    e = event
    while e is not None:
        if e.name.startswith(BACKWARD):
            return e
        e = e.cpu_parent
    return None


def attribute(events, device: bool) -> dict:
    """{layer: {"forward_s", "backward_s"}} plus "_unattributed_s" and "_total_s" from a
    profiler's events; device=True sums kernels' time, else the ops' CPU time."""
    cpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    node_layer = {}
    for e in cpu:   # the layer each autograd node came from, by its sequence number
        if e.sequence_nr >= 0 and not e.name.startswith(BACKWARD) and e.sequence_nr not in node_layer:
            node_layer[e.sequence_nr] = _forward_layer(e)
    out: dict = {}
    lost = total = 0.0
    for e in cpu:
        t = (e.self_device_time_total if device else e.self_cpu_time_total) / 1e6   # us -> s
        if t <= 0:
            continue
        total += t
        node = _backward_node(e)
        layer = node_layer.get(node.sequence_nr) if node is not None else _forward_layer(e)
        if node is not None and "AccumulateGrad" in node.name:
            layer = "optimizer"   # the fp32 .grad of each parameter: the update's bytes
        if layer is None:
            lost += t
            continue
        row = out.setdefault(layer, {"forward_s": 0.0, "backward_s": 0.0})
        row["backward_s" if node is not None else "forward_s"] += t
    return {"layers": out, "_unattributed_s": lost, "_total_s": total}


def profile_step(model, step, steps: int, device: bool) -> dict:
    """attribute() over `steps` calls of step() (already warmed up), per step."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device else [])
    with layer_ranges(model), profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        if device:
            torch.cuda.synchronize()
    got = attribute(prof.events(), device)
    scale = 1.0 / steps
    for row in got["layers"].values():
        row["forward_s"] *= scale
        row["backward_s"] *= scale
    got["_unattributed_s"] *= scale
    got["_total_s"] *= scale
    return got


def table(measured: dict, batch: int, image_size: int, peak_flops: float | None, copy_Bps: float | None) -> list[dict]:
    """roofline.layer_table with this profile's times (layers outside the model too)."""
    times = {name: {"forward_ms": 1e3 * m["forward_s"], "backward_ms": 1e3 * m["backward_s"],
                    "time_ms": 1e3 * (m["forward_s"] + m["backward_s"])}
             for name, m in measured.get("layers", {}).items()}
    return roofline.layer_table(batch, image_size, peak_flops, copy_Bps, times)


kind, by_kind = roofline.kind, roofline.by_kind   # pure: the report groups the same way
