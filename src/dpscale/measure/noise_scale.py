"""The gradient noise scale measured in training (McCandlish, Kaplan, Amodei et al. 2018,
"An Empirical Model of Large-Batch Training", appendix A): per step, the squared norm of
each rank's own gradient (batch b, before the all-reduce) averaged over the k ranks,
|G_small|^2, and that of the averaged gradient (batch k x b, after it), |G_big|^2.
dpscale.analysis.stateff turns them into |G|^2, tr(Sigma) and B_simple.

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
                stateff.NoiseScale(out["b_small"], out["b_big"]).update_many(out["g_small_sq"], out["g_big_sq"])

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
