"""The pieces of tools/lab/probe_roofline.py: the tuned DDP step and its cheap-win
variants timed side by side with the pipeline's own build_ddp and GraphedStep, the
rates the roofline needs, and the eager per-layer profile beside the roofline.
Not part of the pipeline (no experiment runs it); torch is imported here.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import os
import statistics
import time

import torch
import torch.distributed as dist

from dpscale.lab import kernel_table, layer_profile, model_options
from dpscale import registry
from dpscale.analysis import roofline
from dpscale.measure import torch_ddp as tr
from dpscale.model import tuned_model
from dpscale.model.models import torch_resnet18

WINS = {"stem": "im2col", "projection": "slice_matmul", "cancelled_bias": "drop"}
# in the order they are worth the device's minutes: the budget may stop the list early
FP16 = {**WINS, "precision": "fp16", "loss_scaling": "dynamic"}
VARIANTS = {"base": {}, "all": WINS, "stem_im2col": {"stem": "im2col"},
            "projection": {"projection": "slice_matmul"}, "bias_drop": {"cancelled_bias": "drop"},
            "stem_direct": {"stem": "direct"},
            # the tuned_fp16 series piece by piece: fp16 alone (with its loss scaling),
            # what the scaling costs, then the conv + BN statistics fused in cuDNN
            "fp16": FP16, "fp16_noscale": {**FP16, "loss_scaling": "none"},
            "fp16_genstats": {**FP16, "convbn": "cudnn_genstats"},
            "fp16_genstats_noscale": {**FP16, "convbn": "cudnn_genstats", "loss_scaling": "none"},
            "fp16_genstats_dbn": {**FP16, "convbn": "cudnn_genstats_dbn"},   # + bn1's backward sums in dgrad
            # inductor's own search over its Triton kernels' launch configurations
            "fp16_genstats_cdt": {**FP16, "convbn": "cudnn_genstats",
                                  "inductor": {"coordinate_descent_tuning": True}},
            # A bound, not the model: every BatchNorm removed. No fusion of BN's passes can
            # make the step faster than this, so it shows whether one can reach a target.
            "fp16_nobn": {**FP16, "no_batchnorm": True}, "nobn": {**WINS, "no_batchnorm": True}}
# BatchNorm's statistics in one Triton pass (dpscale.lab.triton_bn) measured slower than
# base (docs/measurements/tuned-step_h200_2026-12-01.md): off, and no longer a tuned option.
LOSS_CHECK_STEPS = 20
LOSS_REL_TOL = 0.05   # bf16, other kernels: early losses agree to ~1e-2; a wrong model is off by O(1)


def init_single_rank(smoke: bool, port: int = 29613) -> tr.Ctx:
    """One rank as torchrun would start it: NCCL on GPU 0, or gloo on the CPU (smoke)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    cuda = not smoke and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if cuda else "gloo", **({"device_id": torch.device("cuda", 0)} if cuda else {}))
    torch.backends.cudnn.benchmark = True
    torch.set_float32_matmul_precision("high")
    return tr.Ctx({"backend": "nccl" if cuda else "gloo", "config": {"protocol": {}, "tuned": {}}})


def tuned_opts(overrides: dict, smoke: bool) -> dict:
    """The tuned series' options with the model's choices at their plain defaults (the
    seed's convolutions and biases), then the variant's: `base` is the model unchanged."""
    opts = {**registry.TORCH_TUNED.options, **tuned_model.DEFAULTS, **overrides}
    if smoke:   # inductor on 2 CPU cores takes minutes; graphs need CUDA
        opts.update(compile=False, cuda_graph=False)
    return opts


def fixed_batches(ctx: tr.Ctx, n: int, batch: int, side: int) -> list:
    g = torch.Generator(device="cpu").manual_seed(0)
    return [(torch.rand(batch, 1, side, side, generator=g).to(ctx.device).contiguous(memory_format=torch.channels_last),
             torch.randint(0, 10, (batch,), generator=g).to(ctx.device)) for _ in range(n)]


def measure_rates(ctx: tr.Ctx) -> dict:
    peak, copy_Bps = tr.measure_matmul_peak(ctx), tr.measure_copy_bandwidth(ctx)
    return {"peak_flops": peak, "copy_Bps": copy_Bps,
            "bf16_matmul_peak_TFLOPs": peak and peak / 1e12, "copy_bandwidth_GBps": copy_Bps and copy_Bps / 1e9}


def roofline_rows(batch: int, side: int, peak: float | None, copy_Bps: float | None) -> list[dict]:
    rows = []
    for fusion in roofline.FUSIONS:
        t = roofline.totals(roofline.step_passes(batch, side, fusion), peak, copy_Bps)
        row = {"fusion": fusion, "GFLOP_per_step": t["flops"] / 1e9, "GB_per_step": t["bytes"] / 1e9}
        if "bound_s" in t:
            row.update(step_ms=1e3 * t["bound_s"], samples_per_s=batch / t["bound_s"],
                       compute_only_samples_per_s=batch / t["compute_s"])
        rows.append(row)
    return rows


def _release():
    """After the caller dropped its references: free the model, its graph pool, dynamo's cache."""
    gc.collect()
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def time_variant(ctx: tr.Ctx, overrides: dict, batches: list, steps: int, reps: int, smoke: bool,
                 lr: float = 0.1, profile_steps: int = 0) -> dict:
    """_time_variant, then its model, graph and compiled code freed before the next one.
    An `inductor` entry in overrides: torch._inductor.config settings for this variant."""
    overrides = dict(overrides)
    with torch._inductor.config.patch(overrides.pop("inductor", {})):
        out = _time_variant(ctx, overrides, batches, steps, reps, smoke, lr, profile_steps)
    _release()
    return out


def _time_variant(ctx: tr.Ctx, overrides: dict, batches: list, steps: int, reps: int, smoke: bool,
                  lr: float = 0.1, profile_steps: int = 0) -> dict:
    """Build the tuned DDP model with `overrides`, run LOSS_CHECK_STEPS steps (compile,
    GraphedStep's eager steps, the capture) recording each loss, then `reps` timed
    repeats of `steps` steps between synchronisations; samples/s of each repeat; then,
    with profile_steps, the kernel table of that many more steps (dpscale.lab.kernel_table).
    lr: the pipeline's 0.1; the smoke run's batches of 4 diverge at it."""
    ctx.spec["config"]["tuned"] = tuned_opts(overrides, smoke)
    side = tr.graph_side_stream(ctx, True)
    t0 = time.perf_counter()
    apply = functools.partial(model_options.apply, no_batchnorm=overrides.get("no_batchnorm", False))
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        model = tr.build_ddp(ctx, tuned=True, model_apply=apply)
    opt = torch.optim.SGD(model.parameters(), lr=lr, **({"fused": True} if ctx.cuda else {}))
    step = tr.train_step(ctx, model, opt, True)   # train_epochs' step
    graphed = tr.GraphedStep(step, opt, side) if side is not None else None

    def call(i):
        X, y = batches[i % len(batches)]
        if graphed is not None:
            return graphed(X, y)
        opt.zero_grad(set_to_none=True)
        return step(X, y)
    losses = [float(call(i).detach()) for i in range(LOSS_CHECK_STEPS)]
    warm_s = time.perf_counter() - t0
    rates = []
    for _ in range(reps):
        tr.sync(ctx.device)
        t = time.perf_counter()
        for i in range(steps):
            call(i)
        tr.sync(ctx.device)
        rates.append(steps * batches[0][0].shape[0] / (time.perf_counter() - t))
    kernels = None
    if profile_steps:
        wall = batches[0][0].shape[0] / statistics.median(rates)
        kernels = kernel_table.summarize(kernel_table.profile(call, profile_steps, lambda: tr.sync(ctx.device)),
                                         profile_steps, wall)
    return {"kernels": kernels, "samples_per_s_median": statistics.median(rates), "samples_per_s_min": min(rates),
            "samples_per_s_max": max(rates), "repeats": reps, "steps_per_repeat": steps,
            "losses": losses, "warm_s": warm_s, "model": tuned_model.describe(model),
            "cuda_graph": bool(graphed and graphed.graph is not None),
            "cuda_graph_error": graphed.error if graphed else None}


def loss_check(base: list[float], other: list[float]) -> dict:
    """The variant trains like the base: the loss difference at each of the first steps
    (same weights, same batches) as a fraction of the base's first loss (a fraction of
    each step's own loss would blow up wherever a loss nears zero), worst over the
    last five of them."""
    rel = [abs(o - b) / abs(base[0]) for b, o in zip(base, other)]
    worst = max(rel[-5:])
    return {"loss_rel_diff_steps": rel, "loss_rel_diff_last5_max": worst, "loss_ok": worst <= LOSS_REL_TOL,
            "loss_rel_tol": LOSS_REL_TOL}


def eager_layer_profile(ctx: tr.Ctx, overrides: dict, batch: list, steps: int) -> dict:
    out = _eager_layer_profile(ctx, overrides, batch, steps)
    _release()
    return out


def _eager_layer_profile(ctx: tr.Ctx, overrides: dict, batch: list, steps: int, warmup: int = 3) -> dict:
    """The per-layer profile of the eager 16-bit channels_last step (no DDP, no compile,
    no graph, no loss scaling), the transformed model when overrides ask for the wins."""
    from torch.autograd.profiler import record_function
    ctx.spec["config"]["tuned"] = tuned_opts(overrides, smoke=not ctx.cuda)   # autocast reads its precision
    torch.manual_seed(0)
    model = model_options.apply(torch_resnet18(), overrides).to(ctx.device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, **({"fused": True} if ctx.cuda else {}))
    X, y = batch

    def step():
        opt.zero_grad(set_to_none=True)
        with tr.autocast(ctx, True):
            out = model(X)
            with record_function("loss"):
                loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        with record_function("optimizer"):
            opt.step()
    for _ in range(warmup):
        step()
    tr.sync(ctx.device)
    return layer_profile.profile_step(model, step, steps, device=ctx.cuda)
