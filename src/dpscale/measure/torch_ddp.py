"""PyTorch DDP throughput: the book's weak and strong scaling (and the tuned series
beside it), DDP training with the NCCL memcpy switch (exercise 3), the bucket-size sweep
(exercise 1), and the model and training step they share.
"""
from __future__ import annotations

import contextlib
import itertools
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dpscale.analysis import costmodel, roofline, stats
from dpscale.model import tuned_model
from dpscale.model.models import read_flops, torch_resnet18
from dpscale.measure import timing
from dpscale.measure.timing import StepTimer, spread_fields, summary, sync, warmup_plan
from dpscale.measure.torch_job import (Ctx, cached_batches, load_cached, per_rank_merge, sample_gpu, seed_loader,
                                      synthetic_batch, timed_steps)


# ---------------------------------------------------------------- model

def tuned_options(ctx: Ctx, tuned: bool) -> dict:
    return ctx.spec.get("config", {}).get("tuned", {}) if tuned else {}


def build_ddp(ctx: Ctx, tuned: bool = False, model_apply=tuned_model.apply, **ddp_kwargs):
    """The DDP model of a series; model_apply turns the tuned options into the model's
    transformations (a lab probe passes its own: dpscale.lab.model_options.apply)."""
    torch.manual_seed(0)
    model = torch_resnet18().to(ctx.device)
    opts = tuned_options(ctx, tuned)
    if tuned:
        model = model_apply(model, opts)   # the cheap wins the options switch on (default: none)
        model = model.to(memory_format=torch.channels_last)
        ddp_kwargs = {**{flag: True for flag in opts.get("ddp", [])}, **ddp_kwargs}
    if mode := opts.get("compile"):   # True (inductor's default mode) or a torch.compile mode name
        # Compiled inside DDP, not torch.compile(DDP(model)): dynamo graph-breaks in
        # DDP.forward (its Logger, the skipped _inside_ddp_forward) and then traced each
        # Residual as its own frame, recompiled per width with dynamic channel counts,
        # while the stem, pool and head ran eagerly (docs/measurements/tuned-step_h200_2026-11-29.md).
        # Compiled inside, the model is one graph, and dynamo still sees the active DDP
        # module, so its DDPOptimizer splits that graph at the bucket boundaries: the
        # all-reduce of a bucket still overlaps the rest of the backward.
        model = torch.compile(model, mode=None if mode is True else mode)
    return DDP(model, device_ids=[ctx.local_rank] if ctx.cuda else None, **ddp_kwargs)


def is_tuned(ctx: Ctx) -> bool:
    """The spec's variant is one of the tuned series: its spec carries the tuned options."""
    return "tuned" in ctx.spec["config"]


def fp16(ctx: Ctx, tuned: bool) -> bool:
    return tuned_options(ctx, tuned).get("precision") == "fp16"


def autocast(ctx: Ctx, tuned: bool):
    if not tuned:
        return contextlib.nullcontext()
    return torch.autocast(ctx.device.type, dtype=torch.float16 if fp16(ctx, tuned) else torch.bfloat16)


def measure_matmul_peak(ctx: Ctx, n: int = 8192, iters: int = 20) -> float | None:
    """bf16 dense matmul FLOP/s on this GPU, measured now: the MFU denominator."""
    if not ctx.cuda:
        return None
    a = torch.randn(n, n, device=ctx.device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=ctx.device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(ctx.device)
    t0 = time.perf_counter()
    for _ in range(iters):
        a @ b
    sync(ctx.device)
    return 2 * n ** 3 * iters / (time.perf_counter() - t0)


def measure_copy_bandwidth(ctx: Ctx, n_bytes: int = 1 << 30, iters: int = 20) -> float | None:
    """Device-to-device copy bandwidth, bytes read + written per second, measured now:
    the roofline's memory rate. One buffer 20x the H200's 50 MB L2 (no cache hits),
    copied after a warm-up, each copy timed by its own CUDA events; the median."""
    if not ctx.cuda:
        return None
    src = torch.empty(n_bytes, device=ctx.device, dtype=torch.uint8).random_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in events:
        a.record()
        dst.copy_(src)
        b.record()
    sync(ctx.device)
    ms = sorted(a.elapsed_time(b) for a, b in events)
    del src, dst
    torch.cuda.empty_cache()   # 2 GiB back before the run whose peak memory is reported
    return 2 * n_bytes / (ms[len(ms) // 2] / 1e3)


# ---------------------------------------------------------------- DDP throughput

def graph_side_stream(ctx: Ctx, tuned: bool):
    """The side stream of a CUDA-graphed tuned run (None otherwise). DDP must be
    built on it, and its eager warm-up must run on it, before the capture."""
    if ctx.cuda and tuned_options(ctx, tuned).get("cuda_graph"):
        return torch.cuda.Stream(ctx.device)
    return None


class GraphedStep:
    """The whole training step (forward, backward with DDP's all-reduce hooks, the
    fused SGD update) captured once as one CUDA graph, then replayed for every batch.

    Why: the compiled step is ~300 kernel launches through Python, and issuing them
    took longer than the GPU work (docs/measurements/tuned-step_h200_2026-11-29.md), so the
    GPU idled. A replay is one launch. The recipe is PyTorch's whole-network
    capture ("CUDA semantics", Usage with DistributedDataParallel): DDP built on a
    side stream, at least 11 eager DDP iterations on that stream, the capture on it too,
    and grads set to None so backward allocates them from the graph's memory pool.
    Every call is still one real training step on its batch: the capture itself runs
    nothing, so the capturing call replays once.
    """

    EAGER_STEPS = 11

    def __init__(self, step, opt, side):
        self.step, self.opt, self.side = step, opt, side
        self.calls, self.graph, self.error = 0, None, None
        self.X = self.y = self.loss = None

    def __call__(self, X, y):
        if self.X is None:
            self.X, self.y = torch.empty_like(X), torch.empty_like(y)   # keeps channels_last
        self.X.copy_(X)   # inputs live at fixed addresses: the graph reads these
        self.y.copy_(y)
        if self.calls == self.EAGER_STEPS and self.graph is None and self.error is None:
            self.capture()
        if self.graph is not None:
            self.graph.replay()
            loss = self.loss   # overwritten in place by every replay
        else:
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                self.opt.zero_grad(set_to_none=True)
                loss = self.step(self.X, self.y)
            torch.cuda.current_stream().wait_stream(self.side)
        self.calls += 1
        return loss

    def capture(self):
        self.opt.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=self.side):   # records only: nothing runs here
                self.loss = self.step(self.X, self.y)
        except RuntimeError as e:   # recorded in the result; the run goes on uncaptured
            self.error = f"{type(e).__name__}: {e}"
            print(f"CUDA graph capture failed, continuing without it: {self.error}", flush=True)
            return
        self.graph = graph


def train_step(ctx: Ctx, model, opt, tuned: bool):
    """(X, y) -> loss: forward, backward, update (the caller zeroes the grads). In fp16,
    with dynamic loss scaling (torch.amp.GradScaler): fused SGD takes the scale and the
    inf check as tensors, so no step reads a value back to the host and the whole step
    still captures as one CUDA graph; a step with an inf or NaN gradient is skipped and
    the scale halves, as the scaler does everywhere."""
    loss_fn = nn.CrossEntropyLoss()
    scaling = fp16(ctx, tuned) and ctx.cuda and tuned_options(ctx, tuned).get("loss_scaling") == "dynamic"
    scaler = torch.amp.GradScaler(ctx.device.type) if scaling else None

    def step(X, y):
        with autocast(ctx, tuned):
            loss = loss_fn(model(X), y)
        if scaler is None:
            loss.backward()
            opt.step()
            return loss
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss
    step.scaler = scaler
    return step


def make_step(ctx: Ctx, model, tuned: bool, side=None):
    """The seed's training step, (X, y) -> loss: eager, or a GraphedStep when a
    graph side stream is given."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, **({"fused": True} if tuned and ctx.cuda else {}))
    step = train_step(ctx, model, opt, tuned)

    if side is not None:
        return GraphedStep(step, opt, side)

    def eager(X, y):
        opt.zero_grad(set_to_none=True)
        return step(X, y)
    eager.step = step
    return eager


def run_epoch(ctx: Ctx, run_step, batches) -> dict:
    """One pass over `batches`, timed from a barrier to a device sync."""
    timer, n, last = StepTimer(ctx.device), 0, None
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)
    sync(ctx.device)
    # Every rank starts its clock together. Without this a rank that arrives late
    # starts late and, DDP's ranks being in lockstep, ends with the others: it would
    # read fastest, and the one that waited for it slowest.
    dist.barrier()
    t0, t0_unix = time.perf_counter(), time.time()   # the wall clock: the watchdog's spawn is on it
    for i, (X, y) in enumerate(batches):
        timer.mark()
        X, y = X.to(ctx.device), y.to(ctx.device)
        last = run_step(X, y)
        n += X.shape[0]
        if i == 1:
            ctx.maybe_fault("step")
    timer.mark()
    sync(ctx.device)   # this is a sync point: the clock stops when the GPU is done
    return {"samples": n, "seconds": time.perf_counter() - t0, "step_ms": timer.step_ms(), "loss": last,
            "t0_unix": t0_unix,
            "peak_mem_MiB": torch.cuda.max_memory_allocated(ctx.device) / 2**20 if ctx.cuda else None}


def warmup_batches(batches_for_epoch, i: int, steps: int | None, tail: int = 0):
    """Warm-up pass i: epoch i's batches whole (None), or its first `steps`, going round
    epoch i again where one epoch has fewer, then a batch of `tail` samples: an epoch
    whose last batch is short (the book's DataLoader keeps it: 60,000 = 234 x 256 + 96)
    meets a new shape there, and cudnn.benchmark autotunes every convolution for it.
    Left to the first timed epoch, that autotuning was timed as training
    (docs/measurements/launch-cost_h200_2026-12-03.md)."""
    if steps is None:
        yield from batches_for_epoch(i)
        return
    last = None
    for last in itertools.islice(itertools.chain.from_iterable(batches_for_epoch(i) for _ in itertools.count()),
                                 steps):
        yield last
    if tail and last is not None and tail < len(last[0]):
        yield last[0][:tail], last[1][:tail]


def train_epochs(ctx: Ctx, model, batches_for_epoch, tuned: bool, warmup: list[int | None], repeats: int,
                 side=None, tail: int = 0) -> dict:
    """The seed's loop: the warm-up passes (timing.warmup_plan: cudnn autotune, compile,
    graph capture; a pass of steps ends with a batch of `tail` samples, the epoch's short
    last batch), then `repeats` timed epochs. This rank's numbers: seconds per timed
    epoch, and the first timed epoch's (the book's) samples, seconds and step times."""
    if side is not None and None not in warmup and sum(warmup) < GraphedStep.EAGER_STEPS + 2:
        raise ValueError(f"protocol warmup_steps={sum(warmup)}: the CUDA-graphed step is captured at call "
                         f"{GraphedStep.EAGER_STEPS + 1} and first replayed at {GraphedStep.EAGER_STEPS + 2}; "
                         f"warm up at least {GraphedStep.EAGER_STEPS + 2} steps, or the capture is timed")
    run_step = make_step(ctx, model, tuned, side)
    timed, warm_s = [], 0.0
    for i, steps in enumerate(warmup):
        e = run_epoch(ctx, run_step, warmup_batches(batches_for_epoch, i, steps, tail))
        warm_s += e["seconds"]
        ctx.log(f"warm-up {i + 1}/{len(warmup)}: " + ("epoch " if steps is None else f"{steps} steps, ")
                + (f"then one of the epoch's last batch, {tail}, " if steps is not None and tail else "")
                + f"{e['samples']} samples in {e['seconds']:.2f} s = {e['samples'] / e['seconds']:.0f} samples/s")
    for rep in range(repeats):
        epoch = len(warmup) + rep
        sample_gpu(ctx, f"before timed repeat {rep + 1}")
        e = run_epoch(ctx, run_step, batches_for_epoch(epoch))   # reshuffled per epoch, as the book's set_epoch
        sample_gpu(ctx, f"after timed repeat {rep + 1}")
        ctx.log(f"epoch {epoch}: {e['samples']} samples in {e['seconds']:.2f} s = "
                f"{e['samples'] / e['seconds']:.0f} samples/s (timed, repeat {rep + 1}/{repeats})")
        timed.append(e)
    timing.mark("timed epochs")
    first, last = timed[0], timed[-1]["loss"]
    graphed = run_step if isinstance(run_step, GraphedStep) else None
    return {"samples": first["samples"], "seconds": first["seconds"],
            "samples_per_s": first["samples"] / first["seconds"],
            "seconds_repeats": [e["seconds"] for e in timed], "samples_repeats": [e["samples"] for e in timed],
            "steps": summary(first["step_ms"]), "loss_last": float(last.detach()) if last is not None else None,
            "peak_mem_MiB": max(e["peak_mem_MiB"] for e in timed) if ctx.cuda else None,
            "first_timed_step_unix": first["t0_unix"],   # the end of this launch's start (dpscale.run.launches)
            "warmup_steps": warmup, "warmup_s": warm_s,
            "cuda_graph": graphed is not None and graphed.graph is not None,
            "cuda_graph_error": graphed.error if graphed is not None else None,
            **loss_scale_fields(run_step.step.scaler)}


def loss_scale_fields(scaler) -> dict:
    """fp16's dynamic loss scale at the end of the run (absent without one): a scale
    that collapsed towards 0 means overflowing gradients, every step skipped."""
    return {} if scaler is None else {"loss_scale_last": float(scaler.get_scale())}


def ddp_throughput(ctx: Ctx, strong: bool):
    k = ctx.world
    batch = ctx.proto["global_batch"] // k if strong else ctx.proto["per_rank_batch"]
    tuned = is_tuned(ctx)
    side = graph_side_stream(ctx, tuned)
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        model = build_ddp(ctx, tuned=tuned)
    timing.mark("model")
    tail = 0
    if ctx.spec["config"]["variant"]["input"] == "loader":
        sampler, loader = seed_loader(ctx, batch)
        tail = len(sampler) % batch   # the DataLoader keeps a short last batch

        def batches(epoch):
            sampler.set_epoch(epoch)
            return loader
    else:
        x, y, _ = load_cached(ctx)

        def batches(epoch):
            return cached_batches(ctx, x, y, batch, epoch, channels_last=tuned)
    timing.mark("data")
    r = train_epochs(ctx, model, batches, tuned, warmup_plan(ctx.proto), ctx.proto["repeats"], side=side, tail=tail)
    r["per_rank_batch"] = batch
    return r


STRAGGLER = 0.05   # a rank this much slower than the median rank, in any repeat, is flagged


def throughput_metrics(ctx: Ctx, rows: list[dict], flops: int | None, peak: float | None) -> dict:
    """Throughput from the per-rank rows of train_epochs. An epoch ends when its slowest
    rank ends, so timed epoch i gives every rank's samples over the longest rank's
    seconds (the book summed per-rank samples/s, each rank on its own clock, which
    overstates the job's rate when the clocks differ). samples_per_s is the first
    timed epoch, the book's figure; the other repeats give its spread."""
    n = min(len(r["seconds_repeats"]) for r in rows)
    longest = [max(r["seconds_repeats"][i] for r in rows) for i in range(n)]
    sps = [sum(r["samples_repeats"][i] for r in rows) / longest[i] for i in range(n)]
    secs = [r["seconds_repeats"][:n] for r in rows]
    lag = max(max(col) / statistics.median(col) - 1 for col in zip(*secs))
    slowest = max(rows, key=lambda r: r["seconds"])   # in the first timed epoch
    m = {"samples_per_s": sps[0], "repeats": n, **spread_fields("samples_per_s", sps),
         "samples_per_s_per_device": sps[0] / ctx.world,
         "per_rank_batch": rows[0]["per_rank_batch"], "global_batch": rows[0]["per_rank_batch"] * ctx.world,
         "epoch_s": longest[0], "epoch_s_repeats": longest,
         "slow_ranks": stats.stragglers(secs, STRAGGLER), "straggler_threshold": STRAGGLER,
         "slowest_rank_lag_max": lag,   # max over repeats of slowest / median rank seconds - 1
         # the step times are the slowest rank's, in the first timed epoch
         "step_ms_rank": slowest["rank"], "step_ms_median": slowest["steps"]["median_ms"],
         "step_ms_p10": slowest["steps"]["p10_ms"], "step_ms_p90": slowest["steps"]["p90_ms"],
         "loss_last": rows[0]["loss_last"], "cuda_graph": rows[0].get("cuda_graph", False),
         "warmup_steps": rows[0].get("warmup_steps"), "warmup_s": max(r.get("warmup_s") or 0 for r in rows),
         **({"loss_scale_last": rows[0]["loss_scale_last"]} if "loss_scale_last" in rows[0] else {}),
         "cuda_graph_error": rows[0].get("cuda_graph_error"),
         "peak_mem_MiB": max((r["peak_mem_MiB"] or 0) for r in rows) or None,
         "per_rank": [{k: v for k, v in r.items() if k != "first_timed_step_unix"} for r in rows]}
    if stamps := [r["first_timed_step_unix"] for r in rows if r.get("first_timed_step_unix") is not None]:
        m["first_timed_step_unix"] = max(stamps)   # the last rank there; the watchdog makes it start_s
    m.update(costmodel.mfu_fields(flops, m["samples_per_s_per_device"], peak))
    return m


# ---------------------------------------------------------------- experiments

def exp_ddp(ctx: Ctx, strong: bool):
    tuned = is_tuned(ctx)
    peak = measure_matmul_peak(ctx) if ctx.cuda else None
    copy_Bps = measure_copy_bandwidth(ctx) if ctx.cuda and tuned else None
    timing.mark("matmul and copy rates")
    mine = ddp_throughput(ctx, strong)
    rows = per_rank_merge(ctx, mine)
    flops = read_flops(ctx.spec["inputs"]["flops"], ctx.proto["image_size"]) if ctx.rank == 0 else None
    m = throughput_metrics(ctx, rows, flops, peak)
    if tuned:   # the roofline of 16-bit compute (bf16 and fp16 move the same bytes at the same rate)
        m.update(roofline.roofline_fields(m["per_rank_batch"], ctx.proto["image_size"],
                                          m["samples_per_s_per_device"], peak, copy_Bps))
    return m


def exp_ddp_weak(ctx: Ctx):
    return exp_ddp(ctx, strong=False)


def exp_ddp_strong(ctx: Ctx):
    return exp_ddp(ctx, strong=True)


def bucket_sizes(ctx: Ctx, **ddp_kwargs) -> list[int]:
    """The gradient buckets (bytes) DDP really all-reduces, in order.

    DDP puts every gradient in one bucket at construction and rebuilds the buckets
    in backward order after the first iteration; its logging data keeps only the
    construction-time sizes. So a throwaway replica with a recording comm hook runs
    two steps and reports what the second one sent."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    seen: list[list[int]] = [[]]

    def record(state, bucket):
        seen[-1].append(bucket.buffer().numel() * bucket.buffer().element_size())
        return allreduce_hook(state, bucket)
    model = build_ddp(ctx, **ddp_kwargs)
    model.register_comm_hook(None, record)
    X, y = synthetic_batch(ctx, 2)
    for _ in range(2):
        seen.append([])
        nn.functional.cross_entropy(model(X), y).backward()
    del model
    return seen[-1]


def exp_memcpy_training(ctx: Ctx):
    """Exercise 3: the weak-scaling DDP run with NCCL_SHM_USE_CUDA_MEMCPY=1 set.
    On the book's box this wedges within seconds; the watchdog records that."""
    r = ddp_throughput(ctx, strong=False)
    rows = per_rank_merge(ctx, r)
    return throughput_metrics(ctx, rows, None, None)


def step_ms_ci95(steps_ms: list[float]) -> list[float | None]:
    """The order-statistic 95% interval of the median step time ([None, None] below 6 steps)."""
    mi = stats.median_interval(steps_ms)
    return [mi["ci_lo"], mi["ci_hi"]]


def exp_bucket_sweep(ctx: Ctx):
    """Exercise 1: DDP throughput against bucket_cap_mb, on device-resident batches."""
    batch = ctx.proto["per_rank_batch"]
    X, y = synthetic_batch(ctx, batch)
    loss_fn = nn.CrossEntropyLoss()
    rows = []
    for cap in ctx.proto["bucket_cap_MiB"]:
        model = build_ddp(ctx, bucket_cap_mb=cap)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step():
            opt.zero_grad(set_to_none=True)
            loss_fn(model(X), y).backward()
            opt.step()
        mean_s, steps = timed_steps(ctx, step, max(2, ctx.proto["sweep_steps"] // 5), ctx.proto["sweep_steps"])
        t = torch.tensor(mean_s, dtype=torch.float64, device=ctx.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        st = summary(steps)
        sizes = bucket_sizes(ctx, bucket_cap_mb=cap)
        rows.append({"bucket_cap_MiB": cap, "n_buckets": len(sizes), "bucket_bytes": sizes,
                     "samples_per_s": batch * ctx.world / t.item(), "step_ms_median": st["median_ms"],
                     "step_ms_ci95": step_ms_ci95(steps), "step_ms_p10": st["p10_ms"], "step_ms_p90": st["p90_ms"],
                     "step_ms_rank": ctx.rank})   # rank 0's steps: the rows written are rank 0's
        if ctx.rank == 0:
            ctx.log(f"bucket_cap_mb={cap}: {rows[-1]['samples_per_s']:.0f} samples/s")
        model = opt = None   # free this one before the next is built
    best = max(rows, key=lambda r: r["samples_per_s"])
    return {"sweep": rows, "best_bucket_cap_MiB": best["bucket_cap_MiB"],
            "best_samples_per_s": best["samples_per_s"]}
