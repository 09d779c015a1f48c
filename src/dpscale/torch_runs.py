"""The PyTorch half of section 13.6, one function per experiment, run on every
rank under torchrun (one process per GPU; gloo processes on a CPU-only box).

Rank 0 gathers every rank's numbers and writes the one result JSON. A rank that
raises takes the job down (torchrun reports it; the watchdog keeps its log).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from . import costmodel, data as dsdata, registry, roofline, tuned_model
from .models import residual_stages, torch_flops_per_sample, torch_resnet18
from .results import load_result, utc_now, write_result
from .timing import StepTimer, summary, sync


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
        """Test hook (DPSCALE_FAULT=crash|hang[:rank=R][:at=WHERE]): make one rank
        crash or stop calling collectives, so tests can see the job fail or hang."""
        f = self.fault
        if f and f.get("rank", 1) == self.rank and f.get("at", "step") == where:
            if f["kind"] == "crash":
                raise RuntimeError(f"injected fault: rank {self.rank} crashes at {where}")
            if f["kind"] == "hang":
                self.log(f"injected fault: rank {self.rank} hangs at {where}")
                while True:
                    time.sleep(3600)


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


def train_epochs(ctx: Ctx, model, batches_for_epoch, tuned: bool, epochs: int, side=None):
    """The seed's loop. Epoch 0 warms up (cudnn autotune, compile, graph capture);
    the last is timed."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, **({"fused": True} if tuned and ctx.cuda else {}))
    loss_fn = nn.CrossEntropyLoss()

    def step(X, y):
        with autocast(ctx, tuned):
            loss = loss_fn(model(X), y)
        loss.backward()
        opt.step()
        return loss

    graphed = GraphedStep(step, opt, side) if side is not None else None
    out = {}
    for epoch in range(epochs):
        timer, n, last = StepTimer(ctx.device), 0, None
        if ctx.cuda:
            torch.cuda.reset_peak_memory_stats(ctx.device)
        sync(ctx.device)
        t0 = time.perf_counter()
        for i, (X, y) in enumerate(batches_for_epoch(epoch)):
            timer.mark()
            X, y = X.to(ctx.device), y.to(ctx.device)
            if graphed is not None:
                last = graphed(X, y)
            else:
                opt.zero_grad(set_to_none=True)
                last = step(X, y)
            n += X.shape[0]
            if i == 1:
                ctx.maybe_fault("step")
        timer.mark()
        sync(ctx.device)   # this is a sync point: the clock stops when the GPU is done
        dt = time.perf_counter() - t0
        ctx.log(f"epoch {epoch}: {n} samples in {dt:.2f} s = {n / dt:.0f} samples/s"
                + (" (warm-up)" if epoch < epochs - 1 else ""))
        out = {"samples": n, "seconds": dt, "samples_per_s": n / dt,
               "steps": summary(timer.step_ms()), "loss_last": float(last.detach()) if last is not None else None,
               "peak_mem_MiB": torch.cuda.max_memory_allocated(ctx.device) / 2**20 if ctx.cuda else None,
               "cuda_graph": graphed is not None and graphed.graph is not None,
               "cuda_graph_error": graphed.error if graphed is not None else None}
    return out


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
    r = train_epochs(ctx, model, batches, tuned, ctx.proto["epochs"], side=side)
    r["per_rank_batch"] = batch
    return r


def per_rank_merge(ctx: Ctx, mine: dict) -> list[dict] | None:
    rows = [None] * ctx.world
    dist.all_gather_object(rows, {"rank": ctx.rank, **mine})
    return rows


def throughput_metrics(ctx: Ctx, rows: list[dict], flops: int | None, peak: float | None) -> dict:
    total = sum(r["samples_per_s"] for r in rows)   # the book sums per-rank samples/s
    m = {"samples_per_s": total, "samples_per_s_per_device": total / ctx.world,
         "per_rank_batch": rows[0]["per_rank_batch"], "global_batch": rows[0]["per_rank_batch"] * ctx.world,
         "step_ms_median": rows[0]["steps"]["median_ms"], "step_ms_p10": rows[0]["steps"]["p10_ms"],
         "step_ms_p90": rows[0]["steps"]["p90_ms"], "epoch_s": max(r["seconds"] for r in rows),
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


def exp_comm_probe(ctx: Ctx):
    """synced vs no_sync() step time: the difference estimates what communication costs."""
    model = build_ddp(ctx)
    loss_fn = nn.CrossEntropyLoss()
    X, y = synthetic_batch(ctx, ctx.proto["per_rank_batch"])

    def fwd_bwd():
        model.zero_grad(set_to_none=True)
        loss_fn(model(X), y).backward()

    def silent():
        with model.no_sync():
            fwd_bwd()
    w, n = ctx.proto["probe_warmup"], ctx.proto["probe_steps"]
    synced, synced_steps = timed_steps(ctx, fwd_bwd, w, n)
    unsynced, unsynced_steps = timed_steps(ctx, silent, w, n)
    rows = per_rank_merge(ctx, {"synced_ms": 1e3 * synced, "no_sync_ms": 1e3 * unsynced,
                                "synced_steps": summary(synced_steps),
                                "no_sync_steps": summary(unsynced_steps)})
    buckets = bucket_sizes(ctx)
    n_bytes = 4 * sum(p.numel() for p in model.parameters())
    synced_ms = max(r["synced_ms"] for r in rows)     # the slowest rank sets the pace
    no_sync_ms = max(r["no_sync_ms"] for r in rows)
    m = {"synced_ms": synced_ms, "no_sync_ms": no_sync_ms, "comm_ms": synced_ms - no_sync_ms,
         "grad_bytes": n_bytes, "bucket_bytes": buckets, "per_rank": rows,
         "book_beta_GBps": 4.5, "pred_book_ms": 1e3 * 2 * n_bytes / 4.5e9}
    sweeps = ctx.spec["inputs"].get("allreduce", {})
    k2 = sweeps.get("2")
    if k2:
        res = load_result(k2)
        if res["status"] == "ok":
            sweep = {"bytes": [r["bytes"] for r in res["metrics"]["sweep"]],
                     "time_s": [r["time_ms_median"] / 1e3 for r in res["metrics"]["sweep"]]}
            m.update(costmodel.predict_comm(buckets or [n_bytes], sweep, ctx.world))
            m["beta_source"] = k2
    return m


def exp_allreduce(ctx: Ctx):
    """nccl-tests' protocol, in torch.distributed: per payload, a correctness check,
    warm-up, then >= 20 timed iterations; algbw and busbw from the median."""
    k, rows = ctx.world, []
    expected = k * (k + 1) / 2
    wrong = (ctx.fault or {}).get("kind") == "wrong_sum" and (ctx.fault or {}).get("rank", 1) == ctx.rank
    all_ok = True
    for mib in ctx.proto["allreduce_MiB"]:
        n = int(mib * 2**20) // 4
        x = torch.full((n,), float(ctx.rank + 1), device=ctx.device)
        if wrong:
            x[n // 2] += 1.0   # test hook: one element of one rank's input is off
        dist.all_reduce(x)
        bad = (x != expected).sum()
        dist.all_reduce(bad)   # every rank's verdict, summed
        ok = int(bad.item()) == 0
        all_ok &= ok
        x.normal_()
        ctx.maybe_fault("step")
        for _ in range(ctx.proto["allreduce_warmup"]):
            dist.all_reduce(x)
        sync(ctx.device)
        dist.barrier()
        times = []
        if ctx.cuda:
            evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                   for _ in range(ctx.proto["allreduce_iters"])]
            for a, b in evs:
                a.record()
                dist.all_reduce(x)
                b.record()
            sync(ctx.device)
            times = [a.elapsed_time(b) for a, b in evs]
        else:
            for _ in range(ctx.proto["allreduce_iters"]):
                t0 = time.perf_counter()
                dist.all_reduce(x)   # gloo on CPU tensors: synchronous
                times.append(1e3 * (time.perf_counter() - t0))
        # a collective ends together on every rank: iteration i took the slowest rank's time
        per_rank = torch.tensor(times, dtype=torch.float64, device=ctx.device)
        dist.all_reduce(per_rank, op=dist.ReduceOp.MAX)
        st = summary(per_rank.tolist())
        t = st["median_ms"] / 1e3
        size = n * 4
        rows.append({"MiB": mib, "bytes": size, "time_ms_median": 1e3 * t,
                     "time_ms_p10": st["p10_ms"], "time_ms_p90": st["p90_ms"], "iters": st["n"],
                     "algbw_GBps": costmodel.algbw(size, t) / 1e9,
                     "busbw_GBps": costmodel.busbw(size, t, k) / 1e9,
                     "book_GBps": costmodel.book_beta(size, t) / 1e9, "correct": ok})
        if ctx.rank == 0:
            r = rows[-1]
            ctx.log(f"{size:>12d} B  {r['time_ms_median']:9.3f} ms  algbw {r['algbw_GBps']:8.2f}  "
                    f"busbw {r['busbw_GBps']:8.2f} GB/s  {'OK' if ok else 'WRONG SUM'}")
    m = {"sweep": rows, "correct": all_ok}
    by = {r["MiB"]: r for r in rows}
    for mib in (64, 256):
        if mib in by:
            m[f"busbw_GBps_{mib}MiB"] = by[mib]["busbw_GBps"]
    m["busbw_GBps_max"] = max(r["busbw_GBps"] for r in rows)
    if not all_ok:
        bad = [r["MiB"] for r in rows if not r["correct"]]
        m["_status"] = ("failed", f"correctness check failed: wrong all-reduce sum at {bad} MiB "
                        f"(expected every element = k(k+1)/2 = {expected:g})")
    return m


def exp_memcpy_training(ctx: Ctx):
    """Exercise 3: the weak-scaling DDP run with NCCL_SHM_USE_CUDA_MEMCPY=1 set.
    On the book's box this wedges within seconds; the watchdog records that."""
    r = ddp_throughput(ctx, strong=False)
    rows = per_rank_merge(ctx, r)
    return throughput_metrics(ctx, rows, None, None)


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
                     "step_ms_p10": st["p10_ms"], "step_ms_p90": st["p90_ms"]})
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
        mine = {**_state_bytes(model, opt), "step_ms_median": st["median_ms"],
                "samples_per_s": batch / mean_s,
                "peak_mem_MiB": torch.cuda.max_memory_allocated(ctx.device) / 2**20 if ctx.cuda else None}
        rows = per_rank_merge(ctx, mine)
        out[name] = {"samples_per_s": sum(r["samples_per_s"] for r in rows),
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
    timeout = _dt.timedelta(seconds=float(spec["limit_s"]))
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
