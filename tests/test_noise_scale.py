"""dpscale.measure.noise_scale.StepNoiseProbe on a plain module (one process, no DDP):
the per-shard and averaged gradients' squared norms against a direct computation (one
backward per shard on a copy), through time to accuracy's own step (ShardedStep). The
DDP cases (real k=2, emulated k=2 and k=4, and the parameters bit for bit with the probe
and without) run under torchrun in tests/test_tta.py (tta_equality_worker)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from dpscale.analysis.stateff import noise
from dpscale.measure.noise_scale import StepNoiseProbe
from dpscale.measure.torch_tta import ShardedStep

REL = 1e-9     # float64: the probe's norms against the per-shard backward passes
STEPS, BATCH, M, LR = 3, 4, 3, 0.1


def tiny() -> nn.Module:
    """Conv, BatchNorm, a head: small, with a BatchNorm whose statistics are per shard."""
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                         nn.Flatten(), nn.Linear(16, 10))


def batches():
    g = torch.Generator().manual_seed(3)
    return [(torch.rand(M * BATCH, 1, 6, 6, generator=g), torch.randint(0, 10, (M * BATCH,), generator=g))
            for _ in range(STEPS)]


def direct(net: nn.Module, X, y) -> tuple[float, float]:
    """mean over the shards of |g_j|^2 and |mean_j g_j|^2, each g_j by its own backward on a copy."""
    grads = []
    for j in range(M):
        ref = copy.deepcopy(net)
        g = torch.autograd.grad(nn.CrossEntropyLoss()(ref(X[j * BATCH:(j + 1) * BATCH]), y[j * BATCH:(j + 1) * BATCH]),
                                list(ref.parameters()))
        grads.append(torch.cat([t.reshape(-1) for t in g]))
    return sum(float(g.pow(2).sum()) for g in grads) / M, float((sum(grads) / M).pow(2).sum())


def _run(probe_class=StepNoiseProbe):
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        net = tiny()
        opt = torch.optim.SGD(net.parameters(), lr=LR)
        probe = probe_class(net, BATCH, ranks_per_process=M, capacity=STEPS + 1)
        step = ShardedStep(net, opt, M, probe=probe)
        want = []
        for X, y in batches():
            want.append(direct(net, X, y))
            opt.zero_grad(set_to_none=False)
            step(X, y)
            probe.stepped()
        return probe.flush(), want
    finally:
        torch.set_default_dtype(old)


class StaleCopyProbe(StepNoiseProbe):
    """A mutation the check must see: the copy of .grad after a shard is never refreshed,
    so each shard's growth is measured against the first shard's gradients."""

    def after_backward(self, j: int, synced: bool) -> None:
        m, self.m = self.m, 1 if j > 0 else self.m   # j < m - 1 is then false: no copy after shard j > 0
        try:
            super().after_backward(j, synced)
        finally:
            self.m = m


def test_probe_on_a_plain_module_equals_per_shard_backward_passes():
    """One process, no DDP, m = 3 shards: each shard's gradient from the growth of .grad,
    the averaged gradient from .grad after the last shard; a probe that measures the
    growth against a stale copy fails the same comparison."""
    got, want = _run()
    assert got["k"] == M and got["b_small"] == BATCH and got["b_big"] == M * BATCH and got["steps"] == STEPS
    for s, b, (ws, wb) in zip(got["g_small_sq"], got["g_big_sq"], want):
        assert s == pytest.approx(ws, rel=REL) and b == pytest.approx(wb, rel=REL)
    g2, tr = noise.noise_terms(got["g_small_sq"][0], got["g_big_sq"][0], got["b_small"], got["b_big"])
    assert tr > 0      # the shards' gradients differ: the estimator sees noise
    stale, want = _run(StaleCopyProbe)
    assert max(abs(s - ws) / ws for s, (ws, _) in zip(stale["g_small_sq"], want)) > 1e-3
