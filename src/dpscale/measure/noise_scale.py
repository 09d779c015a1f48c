"""The gradient noise scale measured in training (McCandlish, Kaplan, Amodei et al. 2018,
"An Empirical Model of Large-Batch Training", appendix A): per step, the squared norm of
each rank's own gradient (batch b, before the all-reduce) averaged over the k ranks,
|G_small|^2, and that of the averaged gradient (batch k x b, after it), |G_big|^2.
dpscale.analysis.stateff.noise turns them into |G|^2, tr(Sigma) and B_simple.

StepNoiseProbe computes both inside the training step into static device buffers, so a
step captured as one CUDA graph (torch_ddp.GraphedStep) measures on every replay; time
to accuracy's ShardedStep calls it around each shard's backward, for real DDP ranks and
for emulated ones (m shards a process, each loss scaled by 1/m). Needs k = w x m >= 2
(the estimator compares batch b with k x b). BatchNorm couples the samples of a shard,
so a per-rank gradient is not an average of independent per-sample gradients; the
estimator treats it as one, as the paper's data-parallel measurement does.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def _sq(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Sum of squared L2 norms, a float64 scalar on the tensors' device (one foreach_norm)."""
    norms = torch._foreach_norm(tensors)
    return torch.stack(norms).double().pow(2).sum()


class StepNoiseProbe:
    """|G_small|^2 and |G_big|^2 of every step, measured inside the training step into static
    device buffers, so the step can still be captured and replayed as one CUDA graph
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
        """The steps since the last flush, as host floats: g_small_sq (mean over the k ranks
        of |G_small|^2), g_big_sq (|G_big|^2), one element a step; b_small, b_big (samples),
        k; steps. The one host read; a collective when w > 1 (every process calls it after
        the same steps)."""
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
