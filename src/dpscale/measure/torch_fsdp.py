"""FSDP2 beside DDP: training state per rank, peak memory and throughput, and the ZeRO
sizing of exercise 5.
"""
from __future__ import annotations

import torch
from torch import nn

from dpscale.analysis import costmodel
from dpscale.model.models import residual_stages, torch_resnet18
from dpscale.measure.timing import summary, sync
from dpscale.measure.torch_ddp import build_ddp, step_ms_ci95
from dpscale.measure.torch_job import Ctx, per_rank_merge, synthetic_batch, timed_steps


def _state_bytes(model, opt) -> dict:
    def local(t):
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()
    params = sum(local(p) for p in model.parameters())
    grads = sum(local(p.grad) for p in model.parameters() if p.grad is not None)
    states = sum(local(v) for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    return {"params_MiB": params / 2**20, "grads_MiB": grads / 2**20, "optimizer_MiB": states / 2**20}


def exp_fsdp(ctx: Ctx):
    """FSDP2 (fully_shard per residual stage, then the root, over a 1-D DeviceMesh)
    beside DDP, same steps, same batches; SGD with momentum so there is optimizer
    state to shard."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    batch = ctx.proto["per_rank_batch"]
    X, y = synthetic_batch(ctx, batch)
    loss_fn = nn.CrossEntropyLoss()
    out = {}
    for name in ("fsdp", "ddp"):
        torch.manual_seed(0)
        if name == "fsdp":
            mesh = init_device_mesh(ctx.device.type, (ctx.world,))
            model = torch_resnet18().to(ctx.device)
            for stage in residual_stages(model):
                fully_shard(stage, mesh=mesh)
            fully_shard(model, mesh=mesh)
        else:
            model = build_ddp(ctx)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step():
            opt.zero_grad(set_to_none=False)   # keep grads: we count their bytes
            loss_fn(model(X), y).backward()
            opt.step()
        for _ in range(2):
            step()
        if ctx.cuda:
            sync(ctx.device)
            torch.cuda.reset_peak_memory_stats(ctx.device)
        mean_s, steps = timed_steps(ctx, step, 0, ctx.proto["sweep_steps"])
        st = summary(steps)
        mine = {**_state_bytes(model, opt), "step_ms_median": st["median_ms"], "step_ms_ci95": step_ms_ci95(steps),
                "samples_per_s": batch / mean_s,
                "peak_mem_MiB": torch.cuda.max_memory_allocated(ctx.device) / 2**20 if ctx.cuda else None}
        rows = per_rank_merge(ctx, mine)
        slowest = max(rows, key=lambda r: r["step_ms_median"])
        out[name] = {"samples_per_s": sum(r["samples_per_s"] for r in rows),
                     "step_ms_median": slowest["step_ms_median"], "step_ms_ci95": slowest["step_ms_ci95"],
                     "step_ms_rank": slowest["rank"],
                     "peak_mem_MiB_max": max((r["peak_mem_MiB"] or 0) for r in rows) or None,
                     "state_MiB_per_rank": max(r["params_MiB"] + r["grads_MiB"] + r["optimizer_MiB"] for r in rows),
                     "per_rank": rows}
        if ctx.rank == 0:
            ctx.log(f"{name}: {out[name]['samples_per_s']:.0f} samples/s, state "
                    f"{out[name]['state_MiB_per_rank']:.1f} MiB/rank, peak {out[name]['peak_mem_MiB_max']}")
        model = opt = None   # free this one before the next is built
        if ctx.cuda:
            torch.cuda.empty_cache()
    return {"fsdp": out["fsdp"], "ddp": out["ddp"],
            "state_ratio_fsdp_over_ddp": out["fsdp"]["state_MiB_per_rank"] / out["ddp"]["state_MiB_per_rank"],
            "zero_sizing_7B_8x80GB": costmodel.zero_table(),
            "optimizer": "SGD(lr=0.1, momentum=0.9)"}
