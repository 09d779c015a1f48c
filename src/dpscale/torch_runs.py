"""The PyTorch half of section 13.6, one function per experiment, run on every
rank under torchrun (one process per GPU; gloo processes on a CPU-only box).

Rank 0 gathers every rank's numbers and writes the one result JSON. A rank that
raises takes the job down (torchrun reports it; the watchdog keeps its log).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fcol
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from . import costmodel, data as dsdata, launch, registry, roofline, stats, tuned_model
from .models import residual_stages, torch_flops_per_sample, torch_resnet18
from .results import load_result, utc_now, write_result
from .timing import StepTimer, spread_fields, summary, sync


# ---------------------------------------------------------------- context

class Ctx:
    def __init__(self, spec: dict):
        self.spec = spec
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.cuda = spec["backend"] == "nccl"
        self.device = torch.device("cuda", self.local_rank) if self.cuda else torch.device("cpu")
        self.proto = spec["config"]["protocol"]
        self.fault = _parse_fault(os.environ.get("DPSCALE_FAULT", ""))

    def log(self, msg: str):
        print(f"[rank {self.rank}/{self.world} {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def maybe_fault(self, where: str):
        """Test hook (DPSCALE_FAULT=crash|hang[:rank=R][:at=WHERE][:job=EXP/VARIANT/kK]):
        make one rank crash or stop calling collectives, so tests can see the job fail
        or hang; with job=, only in that one job of a workflow run."""
        f = self.fault
        job = f"{self.spec['experiment']}/{self.spec['variant']}/k{self.spec['k']}"
        if (f and f.get("rank", 1) == self.rank and f.get("at", "step") == where
                and f.get("job", job) == job):
            if f["kind"] == "crash":
                raise RuntimeError(f"injected fault: rank {self.rank} crashes at {where}")
            if f["kind"] == "hang":
                self.log(f"injected fault: rank {self.rank} hangs at {where}")
                while True:
                    time.sleep(3600)

    def corrupts(self, placement: str) -> bool:
        """Test hook (DPSCALE_FAULT=wrong_sum[:rank=R][:at=in_place|out_of_place]): one
        element of rank R's all-reduce input is off, in one placement or (no at=) both."""
        f = self.fault
        return (bool(f) and f["kind"] == "wrong_sum" and f.get("rank", 1) == self.rank
                and f.get("at", placement) == placement)


def _parse_fault(text: str) -> dict | None:
    if not text:
        return None
    kind, *opts = text.split(":")
    out = {"kind": kind}
    for o in opts:
        key, _, val = o.partition("=")
        out[key] = int(val) if val.isdigit() else val
    return out


# ---------------------------------------------------------------- inputs

def load_cached(ctx: Ctx):
    arrays, meta = dsdata.load_cache(ctx.spec["inputs"]["cache"], ctx.spec["inputs"]["cache_meta"])
    n = ctx.proto["train_images"]
    x = torch.from_numpy(arrays["train_x"][:n]).to(ctx.device)   # uint8, resident on the device
    y = torch.from_numpy(arrays["train_y"][:n]).to(ctx.device)
    return x, y, meta


def cached_batches(ctx: Ctx, x, y, batch: int, epoch: int, channels_last=False):
    """Rank-sharded batches from the device-resident cache, reshuffled per epoch
    with one seed on every rank (DistributedSampler's scheme, drop_last)."""
    g = torch.Generator().manual_seed(1000 + epoch)
    perm = torch.randperm(len(x), generator=g)[ctx.rank::ctx.world].to(ctx.device)
    for i in range(len(perm) // batch):
        idx = perm[i * batch:(i + 1) * batch]
        xb = x[idx].unsqueeze(1).float().div_(255)   # == ToTensor() of the PIL image
        if channels_last:
            xb = xb.contiguous(memory_format=torch.channels_last)
        yield xb, y[idx]


def seed_loader(ctx: Ctx, batch: int):
    """The book's input path: torchvision dataset, PIL Resize, DataLoader workers,
    DistributedSampler (set_epoch per epoch)."""
    from torchvision import datasets, transforms
    dsdata.verify_raw(ctx.spec["inputs"]["data_root"])
    tf = transforms.Compose([transforms.Resize(ctx.proto["image_size"]), transforms.ToTensor()])
    ds = datasets.FashionMNIST(ctx.spec["inputs"]["data_root"], train=True, transform=tf)
    if ctx.proto["train_images"] < len(ds):
        ds = torch.utils.data.Subset(ds, range(ctx.proto["train_images"]))
    sampler = torch.utils.data.distributed.DistributedSampler(ds, ctx.world, ctx.rank)
    loader = torch.utils.data.DataLoader(ds, batch, sampler=sampler,
                                         num_workers=ctx.proto["loader_workers"])
    return sampler, loader


# ---------------------------------------------------------------- model

def tuned_options(ctx: Ctx, tuned: bool) -> dict:
    return ctx.spec.get("config", {}).get("tuned", {}) if tuned else {}


def build_ddp(ctx: Ctx, tuned: bool = False, **ddp_kwargs):
    torch.manual_seed(0)
    model = torch_resnet18().to(ctx.device)
    opts = tuned_options(ctx, tuned)
    if tuned:
        model = tuned_model.apply(model, opts)   # the cheap wins the options switch on (default: none)
        model = model.to(memory_format=torch.channels_last)
        ddp_kwargs = {**{flag: True for flag in opts.get("ddp", [])}, **ddp_kwargs}
    if mode := opts.get("compile"):   # True (inductor's default mode) or a torch.compile mode name
        # Compiled inside DDP, not torch.compile(DDP(model)): dynamo graph-breaks in
        # DDP.forward (its Logger, the skipped _inside_ddp_forward) and then traced each
        # Residual as its own frame, recompiled per width with dynamic channel counts,
        # while the stem, pool and head ran eagerly (H200: 14.0 ms/step; 11.9 inside).
        # Compiled inside, the model is one graph, and dynamo still sees the active DDP
        # module, so its DDPOptimizer splits that graph at the bucket boundaries: the
        # all-reduce of a bucket still overlaps the rest of the backward.
        model = torch.compile(model, mode=None if mode is True else mode)
    return DDP(model, device_ids=[ctx.local_rank] if ctx.cuda else None, **ddp_kwargs)


def autocast(ctx: Ctx, tuned: bool):
    if not tuned:
        return contextlib.nullcontext()
    return torch.autocast(ctx.device.type, dtype=torch.bfloat16)


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

    Why: the compiled step is ~300 kernel launches through Python. On the H200 box
    (16 host cores) issuing them took 16-25 ms per step against ~14 ms of GPU work,
    so the GPU idled. A replay is one launch. The recipe is PyTorch's whole-network
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


def make_step(ctx: Ctx, model, tuned: bool, side=None):
    """The seed's training step, (X, y) -> loss: eager, or a GraphedStep when a
    graph side stream is given."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, **({"fused": True} if tuned and ctx.cuda else {}))
    loss_fn = nn.CrossEntropyLoss()

    def step(X, y):
        with autocast(ctx, tuned):
            loss = loss_fn(model(X), y)
        loss.backward()
        opt.step()
        return loss

    if side is not None:
        return GraphedStep(step, opt, side)

    def eager(X, y):
        opt.zero_grad(set_to_none=True)
        return step(X, y)
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
    t0 = time.perf_counter()
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
            "peak_mem_MiB": torch.cuda.max_memory_allocated(ctx.device) / 2**20 if ctx.cuda else None}


def train_epochs(ctx: Ctx, model, batches_for_epoch, tuned: bool, warmup: int, repeats: int, side=None) -> dict:
    """The seed's loop: `warmup` epochs (cudnn autotune, compile, graph capture), then
    `repeats` timed epochs. This rank's numbers: seconds per timed epoch, and the
    first timed epoch's (the book's) samples, seconds and step times."""
    run_step = make_step(ctx, model, tuned, side)
    timed = []
    for epoch in range(warmup + repeats):
        e = run_epoch(ctx, run_step, batches_for_epoch(epoch))   # reshuffled per epoch, as the book's set_epoch
        rep = epoch - warmup
        ctx.log(f"epoch {epoch}: {e['samples']} samples in {e['seconds']:.2f} s = "
                f"{e['samples'] / e['seconds']:.0f} samples/s"
                + (" (warm-up)" if rep < 0 else f" (timed, repeat {rep + 1}/{repeats})"))
        if rep >= 0:
            timed.append(e)
    first, last = timed[0], timed[-1]["loss"]
    graphed = run_step if isinstance(run_step, GraphedStep) else None
    return {"samples": first["samples"], "seconds": first["seconds"],
            "samples_per_s": first["samples"] / first["seconds"],
            "seconds_repeats": [e["seconds"] for e in timed], "samples_repeats": [e["samples"] for e in timed],
            "steps": summary(first["step_ms"]), "loss_last": float(last.detach()) if last is not None else None,
            "peak_mem_MiB": max(e["peak_mem_MiB"] for e in timed) if ctx.cuda else None,
            "cuda_graph": graphed is not None and graphed.graph is not None,
            "cuda_graph_error": graphed.error if graphed is not None else None}


def ddp_throughput(ctx: Ctx, strong: bool):
    variant = ctx.spec["variant"]
    k = ctx.world
    batch = ctx.proto["global_batch"] // k if strong else ctx.proto["per_rank_batch"]
    tuned = variant == "tuned"
    side = graph_side_stream(ctx, tuned)
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        model = build_ddp(ctx, tuned=tuned, **ctx.spec.get("ddp_options", {}))
    if variant == "seed":
        sampler, loader = seed_loader(ctx, batch)

        def batches(epoch):
            sampler.set_epoch(epoch)
            return loader
    else:
        x, y, _ = load_cached(ctx)

        def batches(epoch):
            return cached_batches(ctx, x, y, batch, epoch, channels_last=tuned)
    r = train_epochs(ctx, model, batches, tuned, ctx.proto["epochs"] - 1, ctx.proto["repeats"], side=side)
    r["per_rank_batch"] = batch
    return r


def per_rank_merge(ctx: Ctx, mine: dict) -> list[dict] | None:
    rows = [None] * ctx.world
    dist.all_gather_object(rows, {"rank": ctx.rank, **mine})
    return rows


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
         "cuda_graph_error": rows[0].get("cuda_graph_error"),
         "peak_mem_MiB": max((r["peak_mem_MiB"] or 0) for r in rows) or None,
         "per_rank": rows}
    m.update(costmodel.mfu_fields(flops, m["samples_per_s_per_device"], peak))
    return m


# ---------------------------------------------------------------- experiments

def exp_ddp(ctx: Ctx, strong: bool):
    tuned = ctx.spec["variant"] == "tuned"
    peak = measure_matmul_peak(ctx) if ctx.cuda else None
    copy_Bps = measure_copy_bandwidth(ctx) if ctx.cuda and tuned else None
    mine = ddp_throughput(ctx, strong)
    rows = per_rank_merge(ctx, mine)
    flops = torch_flops_per_sample(ctx.proto["image_size"], ctx.device) if ctx.rank == 0 else None
    m = throughput_metrics(ctx, rows, flops, peak)
    if tuned:   # the bf16 roofline: only the tuned series computes in bf16
        m.update(roofline.roofline_fields(m["per_rank_batch"], ctx.proto["image_size"],
                                          m["samples_per_s_per_device"], peak, copy_Bps))
    return m


def exp_ddp_weak(ctx: Ctx):
    return exp_ddp(ctx, strong=False)


def exp_ddp_strong(ctx: Ctx):
    return exp_ddp(ctx, strong=True)


def synthetic_batch(ctx: Ctx, batch: int):
    g = torch.Generator(device="cpu").manual_seed(ctx.rank)
    s = ctx.proto["image_size"]
    X = torch.randn(batch, 1, s, s, generator=g).to(ctx.device)
    y = torch.randint(0, 10, (batch,), generator=g).to(ctx.device)
    return X, y


def timed_steps(ctx: Ctx, fn, warmup: int, steps: int):
    for _ in range(warmup):
        fn()
    sync(ctx.device)
    dist.barrier()
    timer = StepTimer(ctx.device)
    t0 = time.perf_counter()
    for i in range(steps):
        timer.mark()
        fn()
        if i == 0:
            ctx.maybe_fault("step")
    timer.mark()
    sync(ctx.device)
    return (time.perf_counter() - t0) / steps, timer.step_ms()


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


def install_comm_delay(ctx: Ctx, model) -> list[bool] | None:
    """Test hook (DPSCALE_FAULT=delay_comm:ms=M[:every=N][:rank=R]): a DDP comm hook
    that sleeps M ms at the first bucket of every N-th synced backward (N=1: all of
    them; every rank without rank=), then all-reduces as DDP's default hook does.
    Under no_sync() DDP calls no hook, so the delay lands on the synced arm only: a
    known comm cost for the probe to recover. With N > 1 the undelayed pairs are a
    control measured in the same job, under the same load. Returns the list the hook
    appends to, one flag per synced backward: whether it slept."""
    f = ctx.fault
    if not f or f["kind"] != "delay_comm" or f.get("rank", ctx.rank) != ctx.rank:
        return None
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    delay_s, every = float(f.get("ms", 50)) / 1e3, int(f.get("every", 1))
    slept: list[bool] = []

    def delayed(state, bucket):
        if bucket.index() == 0:   # once per backward
            slept.append((len(slept) + 1) % every == 0)
            if slept[-1]:
                time.sleep(delay_s)
        return allreduce_hook(state, bucket)
    model.register_comm_hook(None, delayed)
    ctx.log(f"injected delay: {1e3 * delay_s:g} ms in every {every} synced backward(s) (first bucket)")
    return slept


def trial_ms(ctx: Ctx, fn) -> float:
    """One call of fn, timed from a device sync and a barrier to a device sync."""
    sync(ctx.device)
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    sync(ctx.device)
    return 1e3 * (time.perf_counter() - t0)


def paired_trials(ctx: Ctx, synced, silent, pairs: int) -> tuple[list[float], list[float], torch.Tensor]:
    """`pairs` pairs of one synced and one no_sync() trial, synced first on even pairs
    and second on odd ones, so a slow drift (clocks, thermals, a neighbour's load)
    adds the same to both arms and cancels in the difference. Returns the slowest
    rank's ms per trial (every trial starts at a barrier: the slowest rank ends it)
    for each arm, and this rank's own [pairs, 2] times."""
    mine = torch.zeros(pairs, 2, dtype=torch.float64)
    for i in range(pairs):
        for arm in ((0, 1) if i % 2 == 0 else (1, 0)):
            mine[i, arm] = trial_ms(ctx, (synced, silent)[arm])
        if i == 0:
            ctx.maybe_fault("step")
    slowest = mine.to(ctx.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    slowest = slowest.cpu()
    return slowest[:, 0].tolist(), slowest[:, 1].tolist(), mine


def probe_metrics(synced: list[float], silent: list[float]) -> dict:
    """The paired differences, their median with its order-statistic 95% interval."""
    diffs = [a - b for a, b in zip(synced, silent)]
    mi = stats.median_interval(diffs)
    return {"pairs": len(diffs), "pair_order": "synced first on even pairs, no_sync() first on odd ones",
            "synced_ms_pairs": synced, "no_sync_ms_pairs": silent, "comm_ms_pairs": diffs,
            "comm_ms": mi["median"], "comm_ms_ci95": [mi["ci_lo"], mi["ci_hi"]],
            "comm_ms_ci95_coverage": mi["coverage"],
            "synced_ms": statistics.median(synced), "no_sync_ms": statistics.median(silent)}


def probe_predictions(ctx: Ctx, buckets: list[int]) -> dict:
    """The cost model's comm time for these buckets, priced with the k=2 all-reduce sweep."""
    path = ctx.spec["inputs"].get("allreduce", {}).get("2")
    if not path:
        return {}
    res = load_result(path)
    if res["status"] != "ok":
        return {}
    sweep = costmodel.allreduce_sweep(res["metrics"])
    return {**costmodel.predict_comm(buckets, sweep, ctx.world), "beta_source": path,
            "beta_placement": sweep["placement"]}


def exp_comm_probe(ctx: Ctx):
    """synced vs no_sync() step time in interleaved pairs: the paired difference
    estimates what communication costs a step, against the cost model's predictions."""
    model = build_ddp(ctx)
    slept = install_comm_delay(ctx, model)
    loss_fn = nn.CrossEntropyLoss()
    X, y = synthetic_batch(ctx, ctx.proto["per_rank_batch"])

    def fwd_bwd():
        model.zero_grad(set_to_none=True)
        loss_fn(model(X), y).backward()

    def silent():
        with model.no_sync():
            fwd_bwd()
    for _ in range(ctx.proto["probe_warmup"]):
        fwd_bwd()
        silent()
    synced_ms, no_sync_ms, mine = paired_trials(ctx, fwd_bwd, silent, ctx.proto["probe_pairs"])
    rows = per_rank_merge(ctx, {"synced_ms_median": statistics.median(mine[:, 0].tolist()),
                                "no_sync_ms_median": statistics.median(mine[:, 1].tolist())})
    buckets = bucket_sizes(ctx)
    n_bytes = 4 * sum(p.numel() for p in model.parameters())
    m = {**probe_metrics(synced_ms, no_sync_ms), "grad_bytes": n_bytes, "bucket_bytes": buckets,
         "per_rank": rows, "book_beta_GBps": 4.5, "pred_book_ms": 1e3 * 2 * n_bytes / 4.5e9}
    m.update(probe_predictions(ctx, buckets or [n_bytes]))
    lo, hi = m["comm_ms_ci95"]
    m["comm_vs_zero"] = stats.excludes(lo, hi, 0.0)   # True: the interval leaves 0 out
    for key in ("pred_flat_ms", "pred_ring_ms", "pred_book_ms"):
        if key in m:
            m[f"comm_vs_{key}"] = stats.excludes(lo, hi, m[key])
    if slept is not None:   # a result measured with the test hook says so, and where it slept
        w = ctx.proto["probe_warmup"]
        m["injected_delay"] = {"ms": float(ctx.fault.get("ms", 50)), "every": int(ctx.fault.get("every", 1)),
                               "delayed_pairs": [i for i, s in enumerate(slept[w:]) if s]}
    if ctx.rank == 0:
        iv = f"95% [{lo:.2f}, {hi:.2f}]" if lo is not None else "no interval"
        ctx.log(f"comm {m['comm_ms']:.2f} ms, {iv} over {m['pairs']} pairs "
                f"(medians: synced {m['synced_ms']:.2f} ms, no_sync {m['no_sync_ms']:.2f} ms)")
    return m


# ---------------------------------------------------------------- all-reduce, as nccl-tests

PLACEMENTS = ("out_of_place", "in_place")   # nccl-tests' order, per size
TIME_AGGREGATION = (
    "time_us as nccl-tests' default (-a 1, src/common.cu BenchTime): per rank, a host clock around the "
    "timed calls issued back to back, stopped after a device sync, divided by the calls; then the mean "
    "over ranks. algbw, busbw and the Avg bus bandwidth come from it. time_us_median, _ci95 and _cv: per "
    "call, the slowest rank's time (CUDA events; perf_counter on gloo), then the median over calls with "
    "its order-statistic 95% interval, and the cv")
PLACEMENT_TEXT = {
    "out_of_place": "torch.distributed._functional_collectives.all_reduce: a copy into a new output, "
                    "then the in-place all-reduce of that output",
    "in_place": "torch.distributed.all_reduce on the input"}


def allreduce_op(placement: str):
    """x -> the reduced tensor. in_place: dist.all_reduce on x. out_of_place: the
    functional all_reduce, which returns a new tensor and leaves x alone. Trap: c10d
    implements it as x.clone() into a fresh contiguous output, then the in-place
    all-reduce of that output (torch/csrc/distributed/c10d/Functional.cpp), so torch's
    out-of-place is a device copy plus NCCL's in-place kernel, where nccl-tests hands
    NCCL distinct send and receive buffers."""
    if placement == "in_place":
        def in_place(x):
            dist.all_reduce(x)
            return x
        return in_place
    return lambda x: fcol.wait_tensor(fcol.all_reduce(x, "sum", dist.group.WORLD))


def wrong_elements(ctx: Ctx, op, n: int, placement: str) -> int:
    """nccl-tests' check: every rank's input filled with rank + 1, so every element of
    the sum is k(k+1)/2; the elements that are not, summed over ranks (its #wrong)."""
    x = torch.full((n,), float(ctx.rank + 1), device=ctx.device)
    if ctx.corrupts(placement):
        x[n // 2] += 1.0   # test hook: one element of this rank's input is off
    bad = (op(x) != ctx.world * (ctx.world + 1) / 2).sum()
    dist.all_reduce(bad)
    return int(bad.item())


def call_clock(ctx: Ctx, calls: int):
    """(mark(i), read() -> ms per call) from boundary marks between back-to-back calls,
    as nccl-tests' per-iteration timing. CUDA events are made before the loop: making
    one per call would add host time to the calls being timed."""
    if ctx.cuda:
        events = [torch.cuda.Event(enable_timing=True) for _ in range(calls + 1)]
        return (lambda i: events[i].record(),
                lambda: [a.elapsed_time(b) for a, b in zip(events, events[1:])])
    stamps = [0.0] * (calls + 1)

    def mark(i):
        stamps[i] = time.perf_counter()
    return mark, lambda: [1e3 * (b - a) for a, b in zip(stamps, stamps[1:])]


def time_allreduce(ctx: Ctx, op, x, warmup: int, iters: int) -> tuple[float, list[float]]:
    """(seconds per call, nccl-tests' aggregate: mean over ranks of each rank's mean;
    ms of every call, the slowest rank's)."""
    for _ in range(warmup):
        op(x)
    sync(ctx.device)
    dist.barrier()
    mark, read = call_clock(ctx, iters)
    t0 = time.perf_counter()
    for i in range(iters):
        mark(i)
        op(x)
    mark(iters)
    sync(ctx.device)
    mean_s = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(mean_s)   # summed, then / k below: nccl-tests -a 1
    per_call = torch.tensor(read(), dtype=torch.float64, device=ctx.device)
    dist.all_reduce(per_call, op=dist.ReduceOp.MAX)   # a call ends when its slowest rank ends
    return mean_s.item() / ctx.world, per_call.tolist()


def allreduce_row(n: int, wrong: int, mean_s: float, per_call_ms: list[float], k: int) -> dict:
    size = 4 * n
    mi = stats.median_interval(per_call_ms)
    ci = [1e3 * mi["ci_lo"], 1e3 * mi["ci_hi"]] if mi["ci_lo"] is not None else [None, None]
    return {"bytes": size, "count": n, "type": "float", "redop": "sum", "root": -1,
            "time_us": 1e6 * mean_s, "time_us_median": 1e3 * mi["median"], "time_us_ci95": ci,
            "time_us_cv": summary(per_call_ms)["cv"], "iters": len(per_call_ms),
            "algbw_GBps": costmodel.algbw(size, mean_s) / 1e9,
            "busbw_GBps": costmodel.busbw(size, mean_s, k) / 1e9,
            "book_GBps": costmodel.book_beta(size, mean_s) / 1e9, "wrong": wrong}


def allreduce_metrics(table: dict, k: int) -> dict:
    rows = [r for p in PLACEMENTS for r in table[p]]
    oop = {r["bytes"]: r for r in table["out_of_place"]}
    m = {"table": table, "placements": PLACEMENT_TEXT, "time_aggregation": TIME_AGGREGATION,
         # nccl-tests' 'Avg bus bandwidth': the mean busbw over every row of both placements
         "avg_busbw_GBps": statistics.fmean(r["busbw_GBps"] for r in rows),
         "wrong_total": sum(r["wrong"] for r in rows), "correct": all(r["wrong"] == 0 for r in rows)}
    for mib in (64, 256):
        if mib * 2**20 in oop:
            m[f"busbw_GBps_{mib}MiB"] = oop[mib * 2**20]["busbw_GBps"]
    m["busbw_GBps_max"] = max(r["busbw_GBps"] for r in oop.values())
    if not m["correct"]:
        bad = "; ".join(f"{p} at {r['bytes'] / 2**20:g} MiB: {r['wrong']} wrong element(s)"
                        for p in PLACEMENTS for r in table[p] if r["wrong"])
        m["_status"] = ("failed", f"correctness check failed: wrong all-reduce sum ({bad}); expected every "
                        f"element = k(k+1)/2 = {k * (k + 1) / 2:g}")
    return m


def _nccl_float(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: the most decimals (2, 1, 0) that fit the width, else e-notation."""
    for digits in (2, 1, 0):
        text = f"{value:{width}.{digits}f}"
        if len(text) <= width:
            return text
    return f"{value:{width}.{1 if width >= 7 else 0}e}"


def nccl_header(ctx: Ctx, counts: list[int]) -> str:
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if ctx.cuda else None
    blank = f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}"
    return "\n".join([
        "# dpscale allreduce in nccl-tests' layout (all_reduce_perf, nccl-tests 2.19.6), through torch.distributed",
        f"# torch {torch.__version__}, backend {ctx.spec['backend']}" + (f" (NCCL {nccl})" if nccl else "")
        + f", {ctx.world} rank(s), one device per process",
        f"# minBytes {4 * min(counts)} maxBytes {4 * max(counts)} sizes: {len(counts)} "
        f"warmup iters: {ctx.proto['allreduce_warmup']} iters: {ctx.proto['allreduce_iters']} agg iters: 1 "
        "validation: 1 (before timing) graph: 0",
        "# time: mean over ranks of each rank's mean per call (nccl-tests -a 1); out-of-place: "
        "functional all_reduce (copy + in-place)", "#",
        f"{blank}           out-of-place                       in-place          ",
        f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}"
        + f"  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}" * 2,
        f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}"
        + f"  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}" * 2])


def nccl_line(rows: list[dict]) -> str:
    """One size, out-of-place then in-place, in nccl-tests' columns."""
    r0 = rows[0]
    return f"{r0['bytes']:12d}  {r0['count']:12d}  {'float':>8}  {'sum':>6}  {-1:6d}" + "".join(
        f"  {_nccl_float(r['time_us'], 7)}  {_nccl_float(r['algbw_GBps'], 6)}  {_nccl_float(r['busbw_GBps'], 6)}"
        f"  {r['wrong']:6g}" for r in rows)


def nccl_footer(m: dict) -> str:
    failed = sum(1 for p in PLACEMENTS for r in m["table"][p] if r["wrong"])   # nccl-tests counts tests, not elements
    return "\n".join([f"# {'Out of bounds values':<20} : {failed} {'FAILED' if failed else 'OK'}",
                      f"# {'Avg bus bandwidth':<20} : {m['avg_busbw_GBps']:g} ", "#"])


def exp_allreduce(ctx: Ctx):
    """nccl-tests' all_reduce_perf in torch.distributed: per payload, out-of-place then
    in-place, each with a correctness check, warm-up and allreduce_iters timed calls.
    Rank 0 prints the table in nccl-tests' layout (print, not ctx.log: no prefixes)."""
    counts = [int(mib * 2**20) // 4 for mib in ctx.proto["allreduce_MiB"]]
    table = {p: [] for p in PLACEMENTS}
    if ctx.rank == 0:
        print(nccl_header(ctx, counts), flush=True)
    for n in counts:
        for placement in PLACEMENTS:
            op = allreduce_op(placement)
            wrong = wrong_elements(ctx, op, n, placement)
            x = torch.empty(n, device=ctx.device).normal_()
            ctx.maybe_fault("step")
            mean_s, per_call = time_allreduce(ctx, op, x, ctx.proto["allreduce_warmup"], ctx.proto["allreduce_iters"])
            table[placement].append(allreduce_row(n, wrong, mean_s, per_call, ctx.world))
            del x
        if ctx.rank == 0:
            print(nccl_line([table[p][-1] for p in PLACEMENTS]), flush=True)
    m = allreduce_metrics(table, ctx.world)
    if ctx.rank == 0:
        print(nccl_footer(m), flush=True)
    return m


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
        del model, opt
    best = max(rows, key=lambda r: r["samples_per_s"])
    return {"sweep": rows, "best_bucket_cap_MiB": best["bucket_cap_MiB"],
            "best_samples_per_s": best["samples_per_s"]}


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
        del model, opt
        if ctx.cuda:
            torch.cuda.empty_cache()
    return {"fsdp": out["fsdp"], "ddp": out["ddp"],
            "state_ratio_fsdp_over_ddp": out["fsdp"]["state_MiB_per_rank"] / out["ddp"]["state_MiB_per_rank"],
            "zero_sizing_7B_8x80GB": costmodel.zero_table(),
            "optimizer": "SGD(lr=0.1, momentum=0.9)"}


def runtime_versions(ctx: Ctx) -> dict:
    v = {"torch": torch.__version__, "device": torch.cuda.get_device_name(ctx.device) if ctx.cuda else "cpu",
         "nccl": ".".join(map(str, torch.cuda.nccl.version())) if ctx.cuda else None,
         "cuda_runtime": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if ctx.cuda else None,
         "world_size": ctx.world, "hostname": os.uname().nodename}
    v["env"] = {k: val for k, val in os.environ.items()
                if k.startswith(("NCCL_", "TORCH_NCCL_", "TORCH_SYMM", "NVSHMEM_", "OMP_NUM"))}
    return v


def run(spec: dict, result_path: str) -> None:
    ctx = Ctx(spec)
    started = utc_now()
    if ctx.cuda:
        torch.cuda.set_device(ctx.device)
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.benchmark = True
    # before the watchdog's outer kill, so the rank that waits reports the hang
    timeout = _dt.timedelta(seconds=launch.pg_timeout_s(float(spec["limit_s"])))
    kwargs = {"device_id": ctx.device} if ctx.cuda else {}
    dist.init_process_group(spec["backend"], timeout=timeout, **kwargs)
    try:
        ctx.log(f"{spec['experiment']}/{spec['variant']} k={ctx.world} backend={spec['backend']} "
                f"device={ctx.device}")
        ctx.maybe_fault("init")
        metrics = registry.entry_point(spec["experiment"])(ctx)
        if ctx.rank == 0:   # rank 0 gates I/O: one writer, after every rank reported
            write_result(spec, result_path, metrics, started, runtime_versions(ctx))
            ctx.log(f"wrote {result_path}")
        dist.barrier()
    finally:
        dist.destroy_process_group()
