"""Two gloo processes (torchrun) for tests/test_noise_scale.py: GradNoiseProbe's norms
against a direct computation, and its hook leaving DDP's parameters bit for bit as they
are without it. Rank 0 saves what it found.

The training loop here is torch_tta.ShardedStep's with the probe's calls where the
report says they go (shard_done after each shard's backward, step_done before the
optimiser's step); ShardedStep itself is not changed."""
from __future__ import annotations

import contextlib
import copy
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dpscale.measure.noise_scale import GradNoiseProbe

STEPS, BATCH, LR = 3, 4, 0.1


def tiny() -> nn.Module:
    """Conv, BatchNorm, a head: small, with a BatchNorm whose statistics are per shard."""
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                         nn.Flatten(), nn.Linear(16, 10))


def batches(k: int):
    """STEPS global batches of k x BATCH; rank (shard) r's part is [r*BATCH:(r+1)*BATCH]."""
    g = torch.Generator().manual_seed(3)
    return [(torch.rand(k * BATCH, 1, 6, 6, generator=g), torch.randint(0, 10, (k * BATCH,), generator=g))
            for _ in range(STEPS)]


def shards_of(X, y, ranks):
    return [(X[r * BATCH:(r + 1) * BATCH], y[r * BATCH:(r + 1) * BATCH]) for r in ranks]


def sharded_step(model, opt, shards, probe=None):
    """ShardedStep.__call__ (measure/torch_tta.py), with the probe's two calls."""
    loss_fn = nn.CrossEntropyLoss()
    opt.zero_grad(set_to_none=True)
    m = len(shards)
    for j, (X, y) in enumerate(shards):
        quiet = model.no_sync() if j < m - 1 and isinstance(model, DDP) else contextlib.nullcontext()
        with quiet:
            (loss_fn(model(X), y) / m).backward()
        if probe is not None:
            probe.shard_done()                     # <- after each shard's backward
    if probe is not None:
        probe.step_done()                          # <- before the optimiser's step
    opt.step()


def direct(net: nn.Module, shards, group, k: int):
    """Each shard's gradient by its own backward on a copy of the module: the local sum of
    |g_j|^2 and of g_j, summed over the group, give mean |G_small|^2 and |G_big|^2."""
    ref = copy.deepcopy(net)
    loss_fn = nn.CrossEntropyLoss()
    sq, total = torch.zeros((), dtype=torch.float64), None
    for X, y in shards:
        g = torch.autograd.grad(loss_fn(ref(X), y), list(ref.parameters()))
        flat = torch.cat([t.reshape(-1) for t in g])
        sq += flat.double().pow(2).sum()
        total = flat.clone() if total is None else total + flat
    dist.all_reduce(sq, group=group)
    dist.all_reduce(total, group=group)
    return float(sq) / k, float((total / k).double().pow(2).sum())


def norms_case(m: int, group, ranks_of):
    """Probe vs direct, float64, STEPS steps of k = w x m ranks (w = the group's size)."""
    w = dist.get_world_size(group)
    k = w * m
    torch.manual_seed(0)
    model = DDP(tiny(), process_group=group, bucket_cap_mb=0.0005)   # several buckets
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    probe = GradNoiseProbe(model, BATCH, ranks_per_process=m)
    want = []
    for X, y in batches(k):
        sh = shards_of(X, y, ranks_of(m))
        want.append(direct(model.module, sh, group, k))
        sharded_step(model, opt, sh, probe)
    got = probe.flush()
    assert got["k"] == k and got["b_big"] == k * BATCH and got["steps"] == STEPS
    rel = max(max(abs(a - b) / abs(b) for a, b in zip((s, g), wv))
              for s, g, wv in zip(got["g_small_sq"], got["g_big_sq"], want))
    return {"rel": rel, "got": got, "want": want}


class SummingProbe(GradNoiseProbe):
    """A mutation the equality check must see: the hook sums the ranks' gradients instead
    of averaging them (its bucket doubled before the probe's own hook halves it, w = 2)."""

    def _hook(self, group, bucket):
        bucket.buffer().mul_(dist.get_world_size())
        return super()._hook(group, bucket)


def equality_case(m: int, probe_class=GradNoiseProbe) -> float:
    """float32: the parameters after STEPS steps with the probe's hook and without it; 0.0 is bit for bit."""
    r, w = dist.get_rank(), dist.get_world_size()
    states = []
    for with_probe in (True, False):
        torch.manual_seed(0)
        model = DDP(tiny(), bucket_cap_mb=0.0005)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        probe = probe_class(model, BATCH, ranks_per_process=m) if with_probe else None
        for X, y in batches(w * m):
            sharded_step(model, opt, shards_of(X, y, range(r * m, r * m + m)), probe)
        states.append({n: t.detach().clone() for n, t in model.module.state_dict().items()})
    return max((states[0][n].double() - states[1][n].double()).abs().max().item() for n in states[0])


def main(out: str):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    r, w = dist.get_rank(), dist.get_world_size()
    found = {"equal_m1": equality_case(1), "equal_m2": equality_case(2), "summing": equality_case(1, SummingProbe)}
    torch.set_default_dtype(torch.float64)
    found["real"] = norms_case(1, None, lambda m: [r])                                  # k=2, real ranks
    found["emulated"] = norms_case(2, None, lambda m: range(r * m, r * m + m))          # k=4: 2 processes x 2
    own = [dist.new_group([i]) for i in range(w)]                                        # k=2 in one process
    found["one_process"] = norms_case(2, own[r], lambda m: range(m))
    if r == 0:
        torch.save(found, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
