"""Time to accuracy under DDP: from a seeded initialisation, the book's loop (SGD, no
momentum, cross-entropy) until the test accuracy first reaches the scale's target,
under MLPerf's clock (started before the data is touched, never paused, the
evaluations on it), for each of several seeds; scored by dpscale.analysis.tta.

The step. A GPU trains with the fastest step it has, the tuned throughput series'
(the variant's `step` options, registry.TTA_STEP: bf16 autocast, channels_last, the
model's exact transformations, torch.compile, fused SGD, the whole step replayed as one
CUDA graph), built by torch_ddp's machinery (build_ddp, GraphedStep, autocast). Compile
and capture happen before the clock, on random data, and the seeded weights are put
back after (MLPerf's untimed initialisation: no training data is touched). A CPU runs
the same sharded step eager in fp32 (step_options drops the GPU-only options); the
book_fp32 variant runs the book's fp32 eager loop everywhere. The result says which
step ran (`step`, `step_txt`, `cuda_graph`).

A k above the devices present is *emulated* with DDP's semantics exactly: each
process runs m = k / processes ranks' shards one after another (ShardedStep): BatchNorm
sees each per-rank shard alone, the gradients are averaged over the global batch
(1/m per shard here, DDP's mean over the processes), and the running statistics are
rank 0's (its first shard's), which DDP broadcasts and evaluation uses.
tests/test_tta.py holds this equal to a real k=2 DDP step, for the book's step and for
the tuned one (on CPU in float64, compile and graphs off).

Evaluation: two kinds, apart. The protocol's evaluations (role "protocol") are what a
k-GPU job pays: every tta_eval_every_epochs of this k's epochs (once per epoch at paper, as
d2l's `train` evaluates) and at the budget, the test set sharded over the k ranks
(DistributedSampler's interleaving, rank r the images r, r+k, ...), each rank's correct
count all-reduced. At an emulated k each process times the pass over its first rank's
shard (10,000/k images at paper, on the device) and the reduction, as k real ranks would
run them side by side; its other ranks' shards are then passed and reduced off the clock,
only so the accuracy is the whole test set's. The launch ends at the first protocol
evaluation at or above the target (MLPerf's score). The instrument's evaluations (role
"instrument") only locate the crossing: every tta_eval_every_samples, then every
tta_eval_near_every_samples once an evaluation has come within tta_eval_near_margin of the
target (EvalSchedule), until one reaches it; they are recorded and labelled, and the
clock is stopped while they run. Each evaluation records its seconds charged to the clock
(eval_s: 0 for the instrument's) and its whole wall time (eval_wall_s). The crossing,
interpolated between the two evaluations (of either role) that bracket it
(dpscale.analysis.stateff.crossings), stands beside MLPerf's score. The GPU's state is
sampled at every evaluation.

The gradient noise scale (k >= 2): per step the mean over the k ranks of |G_small|^2
and |G_big|^2, measured inside the step (measure.noise_scale.StepNoiseProbe), then
B_simple over the steps before the target, per seed and pooled over seeds.

Heartbeat: rank 0 prints one line per evaluation to the job's log, flushed:

    [tta seed 3] epoch 2.00 samples 120,000 acc 0.8841 train 23,950 samples/s clock 5.7 s (protocol)

seed; epochs and samples trained so far (all k ranks together); the test accuracy of
this evaluation; training samples/s since the previous line (its evaluation excluded);
seconds on the job's clock (the instrument's evaluations off it); whose evaluation. `tail -f logs/ddp_tta/book/k4.log` follows a job.
"""
from __future__ import annotations

import contextlib
import copy
import math
import secrets
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dpscale.data import load as dsdata
from dpscale.analysis import tta
from dpscale.analysis.stateff import crossings, noise as gradient_noise
from dpscale.measure.noise_scale import StepNoiseProbe
from dpscale.measure.timing import sync
from dpscale.measure.torch_ddp import GraphedStep, autocast, build_ddp, graph_side_stream
from dpscale.measure.torch_job import Ctx, sample_gpu
from dpscale.model import tuned_model
from dpscale.model.models import torch_resnet18

EVAL_BATCH = 1000
# Step options only a CUDA device runs: a CPU runs the rest of the step (the model's
# transformations, channels_last, the sharded accumulation) eager in fp32 (bf16 on a CPU
# without bf16 units is emulated and slower, and the smoke protocol is calibrated in fp32).
GPU_ONLY = ("precision", "compile", "cuda_graph", "optimizer")
WARMUP_CALLS = GraphedStep.EAGER_STEPS + 2   # the eager steps, the capture, one replay


def step_options(ctx: Ctx) -> dict | None:
    """The tuned options this process's step runs with: the variant's `step` (the spec's
    config.variant.step) on CUDA, without GPU_ONLY elsewhere; None: the book's fp32 eager step."""
    declared = ctx.spec["config"].get("variant", {}).get("step")
    if declared is None:
        return None
    opts = dict(declared) if ctx.cuda else {k: v for k, v in declared.items() if k not in GPU_ONLY}
    if opts.get("precision") not in (None, "bf16"):
        raise ValueError(f"time to accuracy runs bf16 or fp32, not {opts['precision']!r} (fp16 needs loss scaling)")
    return opts


def describe(opts: dict | None) -> str:
    """The step that ran, in words (the result's step_txt)."""
    if opts is None:
        return "the book's step: fp32, eager, SGD"
    words = ["bf16 autocast" if opts.get("precision") else "fp32",
             "channels_last" if opts.get("channels_last") else "",
             "torch.compile" if opts.get("compile") else "eager", "fused SGD" if opts.get("optimizer") else "SGD",
             "one CUDA graph per step" if opts.get("cuda_graph") else "",
             "model: " + ", ".join(f"{k} {v}" for k, v in tuned_model.choices(opts).items())]
    return ", ".join(w for w in words if w)


# ---------------------------------------------------------------- the step

class ShardedStep:
    """One training step of k ranks' shards, m = k / processes of them in this process.
    m = 1 is plain DDP. m > 1 accumulates the shards' gradients, each loss scaled by
    1/m, under no_sync() until the last, whose backward all-reduces (DDP's mean over
    the processes); BatchNorm normalises each shard by its own statistics (one
    forward per shard), and the running statistics after the step are those the
    first shard left (rank 0's: the other ranks' never reach the model DDP keeps).

    (X, y) -> loss, X holding this process's m shards in rank order (m x the per-rank
    batch); the caller zeroes the grads (GraphedStep does, and replays the whole call as
    one CUDA graph: every tensor it touches is allocated before or inside the capture).
    cast: the autocast context (bf16) or nullcontext; probe: a StepNoiseProbe or None."""

    def __init__(self, model, opt, m: int, cast=contextlib.nullcontext, probe=None):
        self.model, self.opt, self.m, self.cast, self.probe = model, opt, int(m), cast, probe
        self.loss_fn = nn.CrossEntropyLoss()
        self.buffers = list(model.buffers())
        self.kept = [torch.empty_like(b) for b in self.buffers] if self.m > 1 else []

    def __call__(self, X, y):
        b, m, loss = X.shape[0] // self.m, self.m, None
        for j in range(m):
            last = j == m - 1
            quiet = self.model.no_sync() if not last and isinstance(self.model, DDP) else contextlib.nullcontext()
            with quiet:
                with self.cast():
                    loss = self.loss_fn(self.model(X[j * b:(j + 1) * b]), y[j * b:(j + 1) * b])
                if j == 0 and m > 1:
                    torch._foreach_copy_(self.kept, self.buffers)   # rank 0's running statistics
                if self.probe is not None:
                    self.probe.before_backward(j, last)
                (loss / m).backward()
                if self.probe is not None:
                    self.probe.after_backward(j, last)
        if m > 1:
            torch._foreach_copy_(self.buffers, self.kept)
        if self.probe is not None:
            self.probe.step_done()
        self.opt.step()
        return loss


def step_ctx(ctx: Ctx, opts: dict) -> Ctx:
    """ctx as torch_ddp's tuned builders read it: the spec's config.tuned = the options that run here."""
    c = copy.copy(ctx)
    c.spec = {**ctx.spec, "config": {**ctx.spec["config"], "tuned": dict(opts)}}
    return c


def seeded_model(seed: int, device):
    """build_ddp's model_apply: the seeded network (the same initial weights at every k
    and for every step), then the options' function-preserving transformations."""
    def make(_, opts):
        torch.manual_seed(seed)
        return tuned_model.apply(torch_resnet18().to(device), opts)
    return make


def seeded_net(seed: int, opts: dict | None, device) -> nn.Module:
    """The network a launch of `seed` starts from, as build_model builds it (before DDP,
    compile and channels_last, none of which changes a value)."""
    if opts is None:
        torch.manual_seed(seed)
        return torch_resnet18().to(device)
    return seeded_model(seed, device)(None, opts)


def build_model(ctx: Ctx, seed: int, opts: dict | None, **ddp_kwargs):
    """(the DDP model, the CUDA graph's side stream or None). opts None: the book's model."""
    if opts is None:
        net = seeded_net(seed, None, ctx.device)
        return DDP(net, device_ids=[ctx.local_rank] if ctx.cuda else None, **ddp_kwargs), None
    sctx = step_ctx(ctx, opts)
    side = graph_side_stream(sctx, True)
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        model = build_ddp(sctx, tuned=True, model_apply=seeded_model(seed, ctx.device), **ddp_kwargs)
    return model, side


class Trainer:
    """One launch's model, optimiser and step, as they run on this device.

    step(X, y, lr): one training step at learning rate lr; evaluate(x, y): rank 0's
    accuracy; warm_up(shape): compile and capture on random data, then the initial
    state back (GPU only); reseed(seed): another seed's initial state in place, so one
    job's seeds share one compilation and one captured graph."""

    def __init__(self, ctx: Ctx, seed: int, m: int, batch: int, opts: dict | None, probe_capacity: int = 0,
                 **ddp_kwargs):
        self.opts, self.m = opts, m
        self.model, side = build_model(ctx, seed, opts, **ddp_kwargs)
        self.device, self.seed = ctx.device, seed
        o = opts or {}
        self.channels_last = bool(o.get("channels_last"))
        self.cast = (lambda: autocast(step_ctx(ctx, o), True)) if o.get("precision") else contextlib.nullcontext
        params = list(self.model.parameters())
        fused = bool(o.get("optimizer"))
        # A fused SGD takes the lr as a device tensor: refilled per step, read by a replayed graph.
        self.lr = torch.tensor(tta.BASE_LR, dtype=params[0].dtype, device=params[0].device) if fused else None
        self.opt = torch.optim.SGD(params, lr=self.lr if fused else tta.BASE_LR, **({"fused": True} if fused else {}))
        k = m * (dist.get_world_size(self.model.process_group) if dist.is_initialized() else 1)
        self.probe = StepNoiseProbe(self.model, batch, m, probe_capacity) if probe_capacity and k >= 2 else None
        self.sharded = ShardedStep(self.model, self.opt, m, self.cast, self.probe)
        self.run = GraphedStep(self.sharded, self.opt, side) if side is not None else self._eager
        self.warmup_s = 0.0

    def _eager(self, X, y):
        self.opt.zero_grad(set_to_none=True)
        return self.sharded(X, y)

    def step(self, X, y, lr: float) -> bool:
        """One step; True when the noise probe's rows are full (flush before the next)."""
        if self.lr is not None:
            self.lr.fill_(lr)
        else:
            for g in self.opt.param_groups:
                g["lr"] = lr
        self.run(X, y)
        return self.probe.stepped() if self.probe is not None else False

    @property
    def graphed(self) -> GraphedStep | None:
        return self.run if isinstance(self.run, GraphedStep) else None

    def net(self) -> nn.Module:
        """The module DDP keeps, uncompiled: evaluation runs it eager (no recompile for eval mode)."""
        net = self.model.module
        return getattr(net, "_orig_mod", net)

    def inputs(self, xb: torch.Tensor) -> torch.Tensor:
        """uint8 images -> float / 255 (ToTensor), [N, 1, H, W], channels_last where the step is."""
        X = xb.unsqueeze(1).float().div_(255)
        return X.contiguous(memory_format=torch.channels_last) if self.channels_last else X

    def correct(self, x, y) -> torch.Tensor:
        """[correct, images] of one pass over (x, y) with the model this process keeps (its
        running statistics), counted on the device (no host read)."""
        net = self.net()
        net.eval()
        c = torch.zeros(2, dtype=torch.int64, device=x.device)
        with torch.no_grad(), self.cast():
            for i in range(0, len(x), EVAL_BATCH):
                c[0] += (net(self.inputs(x[i:i + EVAL_BATCH])).argmax(1) == y[i:i + EVAL_BATCH]).sum()
        c[1] = len(x)
        net.train()
        return c

    def warm_up(self, ctx: Ctx, size: int, batch: int, test_images: int, k: int = 1) -> None:
        """Compile, cudnn's autotuning and the CUDA graph's capture, before the clock: the
        step run WARMUP_CALLS times on random data (no training data touched), one
        evaluation pass of each shard length of this k (the batch shapes the sharded
        evaluation runs), then the seeded weights and statistics put back in place (the
        graph keeps reading the same tensors) and the probe's rows forgotten. GPU only:
        an eager CPU step has nothing to warm."""
        if not ctx.cuda or self.opts is None:
            return
        t0 = time.perf_counter()
        state = list(self.model.module.state_dict().values())
        initial = [t.detach().clone() for t in state]
        g = torch.Generator(device=ctx.device).manual_seed(12345)
        lengths = sorted({len(range(r, test_images, k)) for r in range(k)} | {test_images})
        n = max(self.m * batch, *lengths)
        X = torch.randint(0, 256, (n, size, size), generator=g, device=ctx.device, dtype=torch.uint8)
        y = torch.randint(0, 10, (n,), generator=g, device=ctx.device)
        for _ in range(WARMUP_CALLS):
            if self.step(self.inputs(X[:self.m * batch]), y[:self.m * batch], tta.BASE_LR):
                self.probe.reset()
        for length in lengths:
            self.correct(X[:length], y[:length])
        with torch.no_grad():
            torch._foreach_copy_(state, initial)
        if self.probe is not None:
            self.probe.reset()
        sync(ctx.device)
        self.warmup_s = time.perf_counter() - t0

    def reseed(self, seed: int) -> None:
        """Start over from `seed`'s initial weights and running statistics, copied in place
        (a captured graph reads these very tensors, so it replays the new seed's training
        without a new compile or capture): what a fresh Trainer of `seed` starts from
        (tests/test_tta.py holds the two equal). warmup_s becomes the copy's seconds."""
        t0 = time.perf_counter()
        # A stateful optimiser (momentum, Adam) would carry the last seed's buffers into
        # the next: the book's SGD has none, and anything else must reset them here.
        assert not self.opt.state, "reseed: the optimiser keeps state; reset it per seed"
        if seed != self.seed:
            mine, fresh = self.net().state_dict(), seeded_net(seed, self.opts, self.device).state_dict()
            assert mine.keys() == fresh.keys(), "reseed: the seeded network is not the one training"
            with torch.no_grad():
                torch._foreach_copy_(list(mine.values()), list(fresh.values()))
            self.seed = seed
        if self.probe is not None:
            self.probe.reset()
        sync(self.device)
        self.warmup_s = time.perf_counter() - t0


# ---------------------------------------------------------------- data and evaluation

def layout(ctx: Ctx) -> tuple[int, list[int]]:
    """(k, the ranks this process runs): process p of w runs ranks p*m .. p*m+m-1."""
    k = int(ctx.spec["k"])
    m = k // ctx.world
    return k, list(range(ctx.rank * m, ctx.rank * m + m))


def epoch_order(perm: torch.Tensor, k: int, batch: int, ranks: list[int]) -> torch.Tensor:
    """[steps, m x batch]: row s holds this process's ranks' batches at step s, in rank
    order. Rank r's batch at step s is perm[r::k][s*batch:(s+1)*batch] (DistributedSampler's
    interleaving, drop_last): element (s, i) of rank r is perm[(s*batch + i)*k + r]."""
    steps = len(perm) // (k * batch)
    grid = perm[:steps * batch * k].view(steps, batch, k)
    return grid[:, :, ranks].transpose(1, 2).reshape(steps, len(ranks) * batch)


def stage_data(ctx: Ctx):
    """The cache, read from disk onto the device: on the clock (MLPerf)."""
    arrays, _ = dsdata.load_cache(ctx.spec["inputs"]["cache"], ctx.spec["inputs"]["cache_meta"], verify=False)
    n, nt = ctx.proto["tta_train_images"], ctx.proto["tta_test_images"]
    dev = ctx.device
    return (torch.from_numpy(arrays["train_x"][:n]).to(dev), torch.from_numpy(arrays["train_y"][:n]).to(dev),
            torch.from_numpy(arrays["test_x"][:nt]).to(dev), torch.from_numpy(arrays["test_y"][:nt]).to(dev))


def broadcast_float(ctx: Ctx, value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.broadcast(t, 0)
    return float(t.item())


def epoch_samples(p: dict, k: int) -> int:
    """Samples one epoch trains at k: whole global batches only (epoch_order drops the rest)."""
    return (p["tta_train_images"] // (k * p["tta_per_rank_batch"])) * k * p["tta_per_rank_batch"]


class EvalSchedule:
    """When to evaluate, and for whom: role() is "protocol" every tta_eval_every_epochs of
    this k's epochs (epoch_samples) and at the budget (charged to the job's clock; the
    launch ends at the first at or above the target), "instrument" every
    tta_eval_every_samples (0: never), then every tta_eval_near_every_samples once an
    evaluation has come within tta_eval_near_margin of the target (for good: the accuracy
    is noisy, and the crossing should not fall in a coarse bracket because one evaluation
    dipped) until one reaches the target (off the clock: they only locate the crossing),
    else None."""

    def __init__(self, p: dict, k: int):
        self.cadence = p["tta_eval_every_epochs"] * epoch_samples(p, k)
        self.every, self.near = p["tta_eval_every_samples"] or 0, p["tta_eval_near_every_samples"] or 0
        self.margin, self.target = p["tta_eval_near_margin"], p["tta_target"]
        self.next_protocol = self.cadence
        self.next = self.every or math.inf
        self.fine = self.crossed = False

    def role(self, seen: int, budget: float) -> str | None:
        if seen >= self.next_protocol or seen >= budget:
            return "protocol"
        if not self.crossed and seen >= self.next:
            return "instrument"
        return None

    def done(self, seen: int, accuracy: float) -> None:
        if accuracy >= self.target:
            self.crossed = True
        if self.near and accuracy >= self.target - self.margin and not self.fine:
            self.fine, self.next = True, seen
        while self.next_protocol <= seen:
            self.next_protocol += self.cadence
        step = self.near if self.fine else self.every
        while step and self.next <= seen:
            self.next += step


class Curve:
    """One launch's evaluations on the job's clock (the instrument's time taken off it),
    and the heartbeat line of each."""

    def __init__(self, ctx: Ctx, seed: int, t0: float, started: float):
        self.ctx, self.seed, self.t0 = ctx, seed, t0
        self.points: list[dict] = []
        self.off = 0.0               # seconds the clock was stopped for the instrument
        self.last = (0, started)     # (samples, wall time) at the end of the previous evaluation

    def clock(self, wall: float) -> float:
        return wall - self.t0 - self.off

    def add(self, seen: int, acc: float, role: str, e0: float, charged_s: float, e1: float,
            b_simple: float | None, charged_images: int) -> None:
        n = self.ctx.proto["tta_train_images"]
        train_s = e0 - self.last[1]
        sps = (seen - self.last[0]) / train_s if train_s > 0 else None
        self.off += (e1 - e0) - charged_s
        self.points.append({"samples": seen, "epochs": seen / n, "seconds": self.clock(e1), "accuracy": acc,
                            "role": role, "eval_s": charged_s, "eval_wall_s": e1 - e0,
                            "eval_images": charged_images if role == "protocol" else 0,
                            "train_samples_per_s": sps, "b_simple_ema_samples": b_simple})
        self.last = (seen, e1)
        if self.ctx.rank == 0:
            print(f"[tta seed {self.seed}] epoch {seen / n:.2f} samples {seen:,} acc {acc:.4f} train "
                  f"{sps or 0:,.0f} samples/s clock {self.clock(e1):.1f} s ({role})", flush=True)


def absorb(noise, flushed: dict) -> None:
    if noise is not None:
        noise.update_many(flushed["g_small_sq"], flushed["g_big_sq"])


def shard(x: torch.Tensor, rank: int, k: int) -> torch.Tensor:
    """Rank `rank`'s shard of the test set at k: DistributedSampler's interleaving, unpadded
    (every image counted once)."""
    return x[rank::k]


def evaluation(ctx: Ctx, tr: Trainer, curve: Curve, seen: int, xt, yt, noise, role: str) -> float:
    """One evaluation, the test set sharded over the k ranks as a k-GPU job runs it: the
    pass over this process's first rank's shard and the all-reduce of the counts, timed
    between two synchronisations (charged to the clock for a protocol evaluation); at an
    emulated k, this process's other ranks' shards after, off the clock, so the accuracy
    is the whole test set's. Then the probe's steps flushed and the GPU's state sampled."""
    k, ranks = layout(ctx)
    sync(ctx.device)
    e0 = time.perf_counter()
    first = tr.correct(shard(xt, ranks[0], k), shard(yt, ranks[0], k))
    dist.all_reduce(first)
    sync(ctx.device)
    e_charged = time.perf_counter()
    rest = torch.zeros_like(first)
    for r in ranks[1:]:
        rest += tr.correct(shard(xt, r, k), shard(yt, r, k))
    if len(ranks) > 1:
        dist.all_reduce(rest)
    total = (first + rest).tolist()          # the one host read
    e1 = time.perf_counter()
    if total[1] != len(xt):
        raise RuntimeError(f"evaluation: the shards counted {total[1]} images, the test set has {len(xt)}")
    acc = total[0] / total[1]
    if tr.probe is not None:
        absorb(noise, tr.probe.flush())
    sample_gpu(ctx, f"seed {curve.seed} evaluation {len(curve.points) + 1} ({seen} samples, {role})")
    curve.add(seen, acc, role, e0, (e_charged - e0) if role == "protocol" else 0.0, e1,
              noise.b_simple if noise is not None else None, len(range(ranks[0], len(xt), k)))
    return acc


# ---------------------------------------------------------------- one launch

def train(ctx: Ctx, tr: Trainer, curve: Curve, data, noise) -> int:
    """Train until a protocol evaluation reaches the target or the epoch budget is spent;
    the samples trained."""
    p, scaling = ctx.proto, ctx.spec["config"]["variant"]["lr_scaling"]
    k, ranks = layout(ctx)
    batch, target = p["tta_per_rank_batch"], p["tta_target"]
    x, y, xt, yt = data
    warmup = int(p.get("tta_warmup_epochs", 0) * p["tta_train_images"])
    budget = p["tta_max_epochs"] * p["tta_train_images"]
    schedule = EvalSchedule(p, k)
    seen, epoch, done = 0, 0, False
    while not done and seen < budget:
        g = torch.Generator().manual_seed(curve.seed * 100_003 + epoch)   # the same order on every rank
        order = epoch_order(torch.randperm(len(x), generator=g).to(ctx.device), k, batch, ranks)
        for idx in order:
            if tr.step(tr.inputs(x[idx]), y[idx], tta.lr_at(scaling, k, seen, warmup)):
                absorb(noise, tr.probe.flush())
            seen += k * batch
            role = schedule.role(seen, budget)
            if role is not None:
                acc = evaluation(ctx, tr, curve, seen, xt, yt, noise, role)
                schedule.done(seen, acc)
                done = (role == "protocol" and acc >= target) or seen >= budget
                if done:
                    break
        epoch += 1
    return seen


def trainer(ctx: Ctx, seed: int, tr: Trainer | None = None) -> Trainer:
    """The job's Trainer, at `seed`'s initial state: built, compiled and captured for the
    first seed (Trainer.warm_up), reseeded in place for each later one (MLPerf's untimed
    initialisation either way: before the clock, no training data touched)."""
    if tr is not None:
        tr.reseed(seed)
        return tr
    p = ctx.proto
    k, ranks = layout(ctx)
    batch = p["tta_per_rank_batch"]
    gap = min(x for x in (p["tta_eval_every_samples"], p["tta_eval_every_epochs"] * epoch_samples(p, k)) if x)
    capacity = int(gap) // (k * batch) + 2   # the probe's rows between two evaluations
    tr = Trainer(ctx, seed, len(ranks), batch, step_options(ctx), probe_capacity=capacity)
    tr.warm_up(ctx, p["tta_image_size"], batch, p["tta_test_images"], k)
    return tr


def one_launch(ctx: Ctx, seed: int, tr: Trainer) -> dict:
    """One seeded launch of `tr` (at `seed`'s initial state): until the first evaluation
    at or above the target, or the epoch budget. The clock starts before the data is
    staged and never stops; every evaluation is on it (its share recorded as eval_s)."""
    p = ctx.proto
    k, _ = layout(ctx)
    batch = p["tta_per_rank_batch"]
    noise = gradient_noise.NoiseScale(batch, k * batch) if tr.probe is not None else None
    sync(ctx.device)
    dist.barrier()
    t0 = time.perf_counter()                       # MLPerf's run_start: before the data is touched
    data = stage_data(ctx)
    curve = Curve(ctx, seed, t0, time.perf_counter())
    seen = train(ctx, tr, curve, data, noise)
    rec = launch_record(ctx, seed, curve.points, seen, noise)
    g = tr.graphed
    rec.update(warmup_s=tr.warmup_s, cuda_graph=g is not None and g.graph is not None,
               cuda_graph_error=g.error if g is not None else None)
    ctx.log(f"seed {seed}: " + (f"{p['tta_target']:.0%} at {rec['samples_to_target']} samples "
                                f"({rec['epochs_to_target']:.2f} epochs, {rec['seconds_to_target']:.1f} s; interpolated "
                                f"{rec['interpolated_epochs_to_target']:.3f} epochs)" if rec["converged"] else
                                f"not converged in {seen} samples; best {rec['best_accuracy']:.1%}"))
    return rec


def launch_record(ctx: Ctx, seed: int, curve: list[dict], seen: int, noise) -> dict:
    """A launch's record: MLPerf's first evaluation at or above the target (samples,
    seconds, epochs _to_target), the crossing interpolated between the two evaluations
    that bracket it (interpolated_*_to_target, with its resolution), the evaluations'
    cost, and the noise scale over the steps before the target."""
    p = ctx.proto
    k = int(ctx.spec["k"])
    c = crossings.crossing(curve, p["tta_target"], 0.0, p["tta_train_images"])
    first = c["mlperf"]
    n = p["tta_train_images"]
    protocol = [pt for pt in curve if pt["role"] == "protocol"]
    rec = {"seed": seed, "converged": first is not None,
           "seconds_to_target": first["seconds"] if first else None,
           "samples_to_target": first["samples"] if first else None,
           "epochs_to_target": first["epochs"] if first else None,
           "interpolated_seconds_to_target": c["seconds"], "interpolated_samples_to_target": c["samples"],
           "interpolated_epochs_to_target": c["epochs"], "crossing_status": c["status"],
           "crossing_bracket_samples": c["bracket_samples"], "crossing_resolution_samples": c["resolution_samples"],
           "crossing_resolution_epochs": c["resolution_samples"] / n if c["resolution_samples"] else None,
           "eval_s": sum(pt["eval_s"] for pt in curve), "evaluations": len(curve),
           "eval_s_max": max(pt["eval_s"] for pt in curve),
           "protocol_evaluations": len(protocol), "instrument_evaluations": len(curve) - len(protocol),
           "instrument_s": sum(pt["eval_wall_s"] - pt["eval_s"] for pt in curve),
           "eval_every_epochs": p["tta_eval_every_epochs"], "eval_every_samples_protocol": epoch_samples(p, k)
           * p["tta_eval_every_epochs"],
           "clock_s": curve[-1]["seconds"], "samples_trained": seen,
           "best_accuracy": max(pt["accuracy"] for pt in curve), "curve": curve}
    steps = first["samples"] // (k * p["tta_per_rank_batch"]) if first else None
    rec.update(noise_record(noise, steps))
    return rec


def noise_record(noise, steps: int | None) -> dict:
    """B_simple over the launch's steps up to the target (all of them when it was not
    reached), with its interval over blocks of consecutive steps; the per-step |G|^2 and
    tr(Sigma) estimates kept for other windows and for pooling over seeds."""
    if noise is None:
        return {}
    w = noise.window(0, steps)
    return {"b_simple_samples": w["b_simple"], "b_simple_samples_ci_lo": w["ci_lo"],
            "b_simple_samples_ci_hi": w["ci_hi"], "noise_steps": w["steps"],
            "noise_g2_grad_sq": w["g2"], "noise_trace_grad_sq": w["trace"],
            "b_simple_ema_samples": noise.b_simple,
            "noise_g2_grad_sq_steps": noise.g2_steps, "noise_trace_grad_sq_steps": noise.trace_steps}


# ---------------------------------------------------------------- the point: every seed

def seeds_of(ctx: Ctx) -> tuple[list[int], int | None]:
    """The launches' seeds and the run id they were drawn from: tta_seeds as listed (to
    reproduce a measurement; run id None), or that many drawn fresh (tta.draw_seeds) from
    a random id rank 0 makes now and broadcasts, so each measurement's seeds are new while
    the job's params stay the same (Snakemake reruns nothing for it)."""
    want = ctx.proto["tta_seeds"]
    if isinstance(want, list):
        return [int(s) for s in want], None
    t = torch.tensor([secrets.randbits(63) if ctx.rank == 0 else 0], dtype=torch.int64, device=ctx.device)
    dist.broadcast(t, 0)
    run_id = int(t.item())
    return tta.draw_seeds(run_id, int(want)), run_id


def exp_tta(ctx: Ctx) -> dict:
    """Every seed of the protocol, one launch after another, scored as MLPerf does."""
    p = ctx.proto
    k, ranks = layout(ctx)
    seeds, run_id = seeds_of(ctx)
    runs, not_launched, tr = [], [], None
    for seed in seeds:
        if tta.settled(runs):     # two launches did not converge: no score whatever the rest give
            not_launched.append(seed)
            continue
        tr = trainer(ctx, seed, tr)
        runs.append(one_launch(ctx, seed, tr))
    scored = tta.score_fields(runs)
    if not_launched:
        scored["no_result_reason"] += f"; seeds {', '.join(map(str, not_launched))} not launched (the score was settled)"
    conv = [r for r in runs if r["converged"]]
    scaling = ctx.spec["config"]["variant"]["lr_scaling"]
    opts = step_options(ctx)
    return {"lr_rule": ctx.spec["variant"], "lr_scaling": scaling, "lr_base": tta.BASE_LR,
            "lr_peak": tta.lr_at(scaling, k, 1 << 62, 0), "warmup_epochs": p.get("tta_warmup_epochs", 0),
            "target_accuracy": p["tta_target"], "seeds": seeds, "run_id": run_id,
            "eval_every_epochs": p["tta_eval_every_epochs"], "eval_every_samples": p["tta_eval_every_samples"],
            "eval_near_every_samples": p["tta_eval_near_every_samples"],
            "eval_near_margin": p["tta_eval_near_margin"], "max_epochs": p["tta_max_epochs"],
            "train_images": p["tta_train_images"], "test_images": p["tta_test_images"],
            "image_size": p["tta_image_size"], "per_rank_batch": p["tta_per_rank_batch"],
            "global_batch": k * p["tta_per_rank_batch"],
            "not_launched_seeds": not_launched, "emulated": len(ranks) > 1, "processes": ctx.world,
            "ranks_per_process": len(ranks),
            "eval_s_mean": sum(r["eval_s"] for r in conv) / len(conv) if conv else None,
            **step_fields(opts, runs), **eval_fields(runs), **scored,
            **tta.score_measures(runs, tta.INTERPOLATED), **resolution_fields(runs), **noise_fields(runs),
            "runs": runs}


def step_fields(opts: dict | None, runs: list[dict]) -> dict:
    """Which step ran: the options that applied on this device, in words, and whether
    every launch replayed it as a CUDA graph (the first capture error otherwise)."""
    errors = [r["cuda_graph_error"] for r in runs if r.get("cuda_graph_error")]
    return {"step": opts, "step_txt": describe(opts), "cuda_graph": bool(runs) and all(r["cuda_graph"] for r in runs),
            "cuda_graph_error": errors[0] if errors else None,
            "warmup_s_mean": sum(r["warmup_s"] for r in runs) / len(runs) if runs else None,
            "warmup_s_total": sum(r["warmup_s"] for r in runs)}


def eval_fields(runs: list[dict]) -> dict:
    """The evaluations over every launch: the protocol's (charged to the job's clock: seconds
    in all, per evaluation, their share of the clock) and the instrument's (off it: how many,
    and the seconds the clock was stopped for them)."""
    n = sum(r["protocol_evaluations"] for r in runs)
    total, clock = sum(r["eval_s"] for r in runs), sum(r["clock_s"] for r in runs)
    return {"evaluations_total": sum(r["evaluations"] for r in runs), "protocol_evaluations_total": n,
            "instrument_evaluations_total": sum(r["instrument_evaluations"] for r in runs),
            "instrument_s_total": sum(r["instrument_s"] for r in runs),
            "eval_s_total": total, "eval_s_per_evaluation": total / n if n else None,
            "eval_s_per_evaluation_max": max((r["eval_s_max"] for r in runs), default=None),
            "eval_share_of_clock": total / clock if clock else None}


def resolution_fields(runs: list[dict]) -> dict:
    """The widest bracket any seed's interpolated crossing fell in (samples and epochs)."""
    res = [r for r in runs if r["crossing_resolution_samples"] is not None]
    worst = max(res, key=lambda r: r["crossing_resolution_samples"]) if res else None
    return {"crossing_resolution_samples_max": worst["crossing_resolution_samples"] if worst else None,
            "crossing_resolution_epochs_max": worst["crossing_resolution_epochs"] if worst else None}


def noise_fields(runs: list[dict]) -> dict:
    """B_simple pooled over the seeds (each seed's steps before its target), with the
    interval over blocks of consecutive steps of those windows; absent at k = 1."""
    have = [r for r in runs if "noise_g2_grad_sq_steps" in r]
    if not have:
        return {"noise_probe": False}
    windows = [(r["noise_g2_grad_sq_steps"][:r["noise_steps"]], r["noise_trace_grad_sq_steps"][:r["noise_steps"]])
               for r in have]
    w = gradient_noise.b_simple_pooled(windows)
    return {"noise_probe": True, "noise_scale": w,   # the whole record: report.tta sets it beside B_crit
            "b_simple_samples": w["b_simple"], "b_simple_samples_ci_lo": w["ci_lo"], "b_simple_samples_ci_hi": w["ci_hi"], "b_simple_samples_covers": w["covers"],
            "b_simple_method_txt": w["method"], "noise_steps": w["steps"],
            "noise_g2_grad_sq": w["g2"], "noise_trace_grad_sq": w["trace"],
            "noise_window_txt": "each seed's steps up to its first evaluation at or above the target "
                                "(all its steps when it did not reach it)"}
