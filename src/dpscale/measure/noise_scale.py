"""The gradient noise scale measured in training (McCandlish, Kaplan, Amodei et al. 2018,
"An Empirical Model of Large-Batch Training", appendix A): per step, the squared norm of
each rank's own gradient (batch b, before the all-reduce) averaged over the k ranks,
|G_small|^2, and that of the averaged gradient (batch k x b, after it), |G_big|^2.
dpscale.analysis.stateff turns them into |G|^2, tr(Sigma) and B_simple.

Two probes: GradNoiseProbe (below) reads DDP's buckets in a comm hook and keeps Python
lists, for an eager loop; StepNoiseProbe (at the end) computes the same numbers inside
the step into static device buffers, so a step captured as one CUDA graph
(torch_ddp.GraphedStep) measures on every replay: time to accuracy uses it.

GradNoiseProbe serves both kinds of rank:
- real DDP ranks (one rank a process): a DDP communication hook reads each bucket
  before its all-reduce (this rank's gradient) and after it (the average), and changes
  nothing: it all-reduces exactly as DDP's built-in reducer does (tests/test_noise_scale.py
  holds the parameters after 3 steps equal, bit for bit, on gloo);
- emulated ranks (torch_tta.ShardedStep: m shards a process, each loss scaled by 1/m,
  accumulated under no_sync): each shard's gradient is m x the growth of the
  accumulated .grad across its backward (a copy of the grads kept from one shard to
  the next); the last shard's backward is DDP's synchronising one, whose growth the
  same hook reads from the bucket before the all-reduce overwrites it. With w > 1
  processes, each process's sum over its shards is all-reduced (summed) at flush.

A DDP model takes one comm hook, for good: the probe cannot share a model with another
hook (e.g. torch_ddp.bucket_sizes' recorder, a compression hook), and it is not tested
under torch.compile. Needs k = w x m >= 2 (the estimator compares batch b with k x b).
BatchNorm couples the samples of a shard, so a per-rank gradient is not an average of
independent per-sample gradients; the estimator treats it as one, as the paper's
data-parallel measurement does.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def _sq(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Sum of squared L2 norms, a float64 scalar on the tensors' device (one foreach_norm)."""
    norms = torch._foreach_norm(tensors)
    return torch.stack(norms).double().pow(2).sum()


class GradNoiseProbe:
    """Per-step |G_small|^2 and |G_big|^2 of a training loop, without a host sync per step.

    probe = GradNoiseProbe(model, per_rank_batch, ranks_per_process=m)   # after DDP(...)
    per step:   [zero_grad]  for each shard: forward, (loss / m).backward(), probe.shard_done()
                probe.step_done()                                   # before opt.step()
    every so often, on every process at the same step (a collective when w > 1):
                out = probe.flush()   # {"g_small_sq": [...], "g_big_sq": [...], "b_small", "b_big", "k", "steps"}
                noise.NoiseScale(out["b_small"], out["b_big"]).update_many(out["g_small_sq"], out["g_big_sq"])

    With m = 1 under DDP, shard_done() may be left out (the hook sees the whole step).
    A model that is not DDP (one process, m shards) is measured from .grad alone.

    Cost per step (ResNet-18: 11.2 M parameters, 45 MB of fp32 gradients):
    - hook (every DDP step): DDP's all-reduce issued from Python instead of C++ (one
      callback per bucket) plus two norms per bucket (read 2 x 45 MB): ~20 us of HBM
      time on an H200 beside a 46 ms step (estimated, not measured here);
    - emulated shards: per shard, one subtraction, one norm and one copy of the grads
      (~6 x 45 MB of traffic, ~60-100 us on an H200, ~0.2% of a shard's forward and
      backward) and 2 x 45 MB more memory (the kept copy and the difference);
    - per step: two float64 scalars kept on the device; flush(): one all-reduce of the
      steps' local sums (n floats, only when w > 1) and one copy to the host (the one
      sync), so flush where the loop already syncs (torch_tta: at each evaluation)."""

    def __init__(self, model, per_rank_batch: int, ranks_per_process: int = 1, process_group=None):
        self.model, self.m, self.b_small = model, int(ranks_per_process), int(per_rank_batch)
        self.ddp = isinstance(model, DDP)
        self.group = process_group if process_group is not None else (
            getattr(model, "process_group", None) if self.ddp else None)
        self.world = dist.get_world_size(self.group) if self.ddp else 1
        self.k = self.world * self.m
        self.b_big = self.k * self.b_small
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._pos = {p.data_ptr(): i for i, p in enumerate(self.params)}
        self._kept: list[torch.Tensor] | None = None     # the grads after the previous shard (allocated once)
        self._have_prev = False
        self._small: list[torch.Tensor] = []             # this step: m^2 |growth|^2 of each shard
        self._big: list[torch.Tensor] = []               # this step: |averaged bucket|^2 of each bucket
        self._synced = False                              # this step's synchronising backward has run
        self._shards = 0                                  # shards measured this step
        self._steps: list[torch.Tensor] = []
        if self.ddp:
            model.register_comm_hook(self.group, self._hook)

    # ---------------------------------------------------------------- the hook

    def _hook(self, group, bucket):
        """This rank's part of the bucket before the all-reduce, the average after it.
        The all-reduce is the built-in reducer's: grad x (1 / w), then a sum over the
        group (with no hook DDP multiplies while copying into the bucket; here the bucket
        holds the raw grads and is multiplied in place: the same product)."""
        grads = bucket.gradients()
        if self._have_prev:
            kept = [self._kept[self._pos[p.data_ptr()]] for p in bucket.parameters()]
            local = _sq(torch._foreach_sub(grads, kept))
        else:
            local = _sq([bucket.buffer()])
        self._small.append(local * (self.m * self.m))
        if not self._synced:            # the first bucket of this backward: one more shard measured
            self._synced, self._shards = True, self._shards + 1
        buf = bucket.buffer()
        g = group if group is not None else dist.group.WORLD
        buf.mul_(1.0 / dist.get_world_size(g))
        fut = dist.all_reduce(buf, group=g, async_op=True).get_future()

        def averaged(f):
            t = f.value()[0]
            self._big.append(_sq([t]))
            return t
        return fut.then(averaged)

    # ---------------------------------------------------------------- the loop's calls

    def shard_done(self) -> None:
        """After each shard's backward. A backward that went through the hook (DDP's
        synchronising one: the last shard's, or plain DDP's only one) was measured
        there, and this call does nothing; otherwise the shard's gradient is m x the
        growth of .grad since the previous shard (or since zero_grad)."""
        if self._synced:
            return
        cur = [p.grad for p in self.params]
        if any(g is None for g in cur):
            raise RuntimeError("GradNoiseProbe.shard_done: a parameter has no gradient after the backward "
                               "(unused parameters are not supported)")
        grow = _sq(torch._foreach_sub(cur, self._kept)) if self._have_prev else _sq(cur)
        self._small.append(grow * (self.m * self.m))
        self._shards += 1
        if self._kept is None:
            self._kept = [torch.empty_like(g) for g in cur]
        torch._foreach_copy_(self._kept, cur)
        self._have_prev = True

    def step_done(self) -> None:
        """After the step's last backward (before opt.step()): keeps this step's two
        numbers on the device, the local sum of the shards' |g|^2 and |G_big|^2."""
        if self._shards != self.m:
            raise RuntimeError(f"GradNoiseProbe.step_done: {self._shards} shard gradient(s) measured this step, "
                               f"expected {self.m} (call shard_done() after each shard's backward)")
        if self._synced:
            big = torch.stack(self._big).sum()
        else:                       # not DDP: .grad is the mean over this process's shards, the global batch
            big = _sq([p.grad for p in self.params])
        self._steps.append(torch.stack([torch.stack(self._small).sum(), big]))
        self._small, self._big, self._synced, self._have_prev, self._shards = [], [], False, False, 0

    def flush(self) -> dict:
        """The steps since the last flush, as host floats: g_small_sq (mean over the k
        ranks of |G_small|^2) and g_big_sq (|G_big|^2), one element per step; b_small,
        b_big (samples), k. A collective when w > 1: every process calls it after the
        same steps."""
        out = {"g_small_sq": [], "g_big_sq": [], "b_small": self.b_small, "b_big": self.b_big, "k": self.k,
               "steps": len(self._steps)}
        if not self._steps:
            return out
        t = torch.stack(self._steps)
        small = t[:, 0].contiguous()
        if self.world > 1:
            dist.all_reduce(small, group=self.group)
        both = torch.stack([small / self.k, t[:, 1]], 1).cpu().tolist()
        self._steps = []
        out["g_small_sq"] = [s for s, _ in both]
        out["g_big_sq"] = [b for _, b in both]
        return out


class StepNoiseProbe:
    """GradNoiseProbe's two numbers, measured inside the training step into static device
    buffers, so the step can still be captured and replayed as one CUDA graph
    (torch_ddp.GraphedStep): no Python list grows per step, no comm hook, no future
    callback, no host read. What the step runs is the same on every call, so a
    capture records it once and every replay measures again.

    The step calls (dpscale.measure.torch_tta.ShardedStep):
        before_backward(j, synced)   before shard j's backward (synced: DDP's synchronising one)
        after_backward(j, synced)    after it
        step_done()                  after the last, before the optimiser's step
    and the loop, outside the (captured) step:
        stepped()                    after each step: counts it on the host
        flush()                      at each evaluation, on every process (a collective when w > 1)

    Shard j's gradient is m x the growth of .grad across its backward (each loss is scaled
    by 1/m): for a backward that does not all-reduce (no_sync, or DDP over one process,
    whose all-reduce changes no value), read after it with three foreach kernels (sub,
    norm, copy into `kept`). DDP's synchronising backward over w > 1 processes overwrites
    .grad with the average, so there the growth is read before: a post-accumulate-grad
    hook per parameter (armed only then) writes grad - kept into `local` as soon as the
    parameter's gradient is accumulated, which is before DDP's own hook copies it into
    its bucket. |G_big|^2 is .grad after the last backward: the mean over the global batch.

    The gradients are only read: the parameters stay bit for bit as without the probe
    (tests/test_tta.py). Memory: one copy of the gradients (`kept`, m > 1) and one more
    (`local`, w > 1). Per step `capacity` rows are kept on the device; the loop flushes
    before they fill (stepped() says when)."""

    def __init__(self, model, per_rank_batch: int, ranks_per_process: int, capacity: int):
        self.m, self.b_small = int(ranks_per_process), int(per_rank_batch)
        ddp = isinstance(model, DDP)
        self.group = getattr(model, "process_group", None) if ddp else None
        self.world = dist.get_world_size(self.group) if ddp else 1
        self.k = self.world * self.m
        self.b_big = self.k * self.b_small
        self.params = [p for p in model.parameters() if p.requires_grad]
        dev = self.params[0].device
        self.kept = [torch.zeros_like(p) for p in self.params] if self.m > 1 else []
        self.local = [torch.zeros_like(p) for p in self.params] if self.world > 1 else []
        self.acc = torch.zeros((), dtype=torch.float64, device=dev)     # this step: sum over shards of |g_j|^2
        self.rows = torch.zeros(capacity, 2, dtype=torch.float64, device=dev)
        self.idx = torch.zeros(1, dtype=torch.long, device=dev)        # the next row, counted on the device
        self.capacity, self.pending, self._j, self._armed = int(capacity), 0, 0, False
        if self.world > 1:
            for i, p in enumerate(self.params):
                p.register_post_accumulate_grad_hook(self._reader(i))

    def _reader(self, i: int):
        def read(p):
            if self._armed:   # DDP's synchronising backward: this process's growth, before the all-reduce
                if self._j > 0:
                    torch.sub(p.grad, self.kept[i], out=self.local[i])
                else:
                    self.local[i].copy_(p.grad)
        return read

    def before_backward(self, j: int, synced: bool) -> None:
        self._j, self._armed = j, synced and self.world > 1

    def after_backward(self, j: int, synced: bool) -> None:
        cur = [p.grad for p in self.params]
        if self._armed:
            grow = _sq(self.local)
        elif j > 0:
            torch._foreach_sub_(self.kept, cur)      # in place: kept = -(this shard's growth), no 45 MB allocated
            grow = _sq(self.kept)
        else:
            grow = _sq(cur)
        self._armed = False
        if j == 0:
            self.acc.copy_(grow)
        else:
            self.acc.add_(grow)
        if j < self.m - 1:
            torch._foreach_copy_(self.kept, cur)

    def step_done(self) -> None:
        big = _sq([p.grad for p in self.params])
        row = torch.stack([self.acc * (self.m * self.m), big]).unsqueeze(0)
        self.rows.index_copy_(0, self.idx, row)
        self.idx.add_(1)

    def stepped(self) -> bool:
        """Count one step (host); True when the rows are full and the loop must flush()
        before the next step (every process at the same step: they count alike)."""
        self.pending += 1
        return self.pending >= self.capacity

    def reset(self) -> None:
        """Forget the steps not flushed (a warm-up's)."""
        self.idx.zero_()
        self.pending = 0

    def flush(self) -> dict:
        """The steps since the last flush, as GradNoiseProbe.flush gives them: g_small_sq
        (mean over the k ranks of |G_small|^2), g_big_sq (|G_big|^2), one element a step."""
        out = {"g_small_sq": [], "g_big_sq": [], "b_small": self.b_small, "b_big": self.b_big, "k": self.k,
               "steps": self.pending}
        if not self.pending:
            return out
        rows = self.rows[:self.pending]
        small = rows[:, 0].contiguous()
        if self.world > 1:
            dist.all_reduce(small, group=self.group)
        both = torch.stack([small / self.k, rows[:, 1]], 1).cpu().tolist()   # the one host read
        self.reset()
        out["g_small_sq"] = [s for s, _ in both]
        out["g_big_sq"] = [b for _, b in both]
        return out
