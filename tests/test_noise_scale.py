"""dpscale.measure.noise_scale: the per-rank and averaged gradients' squared norms that
the gradient noise scale needs, against a direct computation (one backward per shard),
for real DDP ranks (2 gloo processes), emulated ranks (2 processes x 2 shards, and 2
shards in one process), and a plain module; and the DDP hook leaving the parameters
bit for bit as DDP leaves them without it."""
from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from torch import nn

from conftest import ROOT, env_with_src, free_port
import noise_scale_worker as w
from dpscale.analysis.stateff import noise
from dpscale.measure.noise_scale import GradNoiseProbe

REL = 1e-9     # float64: the probe's norms against the per-shard backward passes


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("noise") / "found.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(ROOT / "tests/noise_scale_worker.py"), str(out)]
    p = subprocess.run(cmd, env=env_with_src(), capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return torch.load(out, weights_only=False)


@pytest.mark.multiproc
def test_the_hook_changes_no_parameter_bit(gloo_run):
    """float32, 3 steps, several buckets: with and without the probe's hook, plain DDP
    (k=2) and emulated (2 processes x 2 shards under no_sync); a hook that sums instead of
    averaging fails the same comparison."""
    assert gloo_run["equal_m1"] == 0.0 and gloo_run["equal_m2"] == 0.0
    assert gloo_run["summing"] > 1e-3          # the mutation (gradients summed, not averaged) is seen


@pytest.mark.multiproc
@pytest.mark.parametrize("case", ["real", "emulated", "one_process"])
def test_probe_norms_equal_the_per_shard_gradients(gloo_run, case):
    """real: k=2 DDP ranks (the hook alone); emulated: k=4 as 2 processes x 2 shards (the
    growth of .grad, the hook for the last shard, the local sums all-reduced at flush);
    one_process: k=2 as 2 shards of a one-process DDP group."""
    found = gloo_run[case]
    assert found["rel"] < REL, found
    g = found["got"]
    g2, tr = noise.noise_terms(g["g_small_sq"][0], g["g_big_sq"][0], g["b_small"], g["b_big"])
    assert tr > 0      # the per-shard gradients differ: the estimator sees noise


def test_probe_on_a_plain_module_equals_per_shard_backward_passes():
    """One process, no DDP, m = 3 shards: the shards' gradients from the growth of .grad,
    the averaged gradient from .grad after the last shard."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        net = w.tiny()
        opt = torch.optim.SGD(net.parameters(), lr=w.LR)
        probe = GradNoiseProbe(net, w.BATCH, ranks_per_process=3)
        want = []
        for X, y in w.batches(3):
            sh = w.shards_of(X, y, range(3))
            grads = []
            for Xs, ys in sh:
                ref = copy.deepcopy(net)
                g = torch.autograd.grad(nn.CrossEntropyLoss()(ref(Xs), ys), list(ref.parameters()))
                grads.append(torch.cat([t.reshape(-1) for t in g]))
            want.append((sum(float(g.pow(2).sum()) for g in grads) / 3, float((sum(grads) / 3).pow(2).sum())))
            w.sharded_step(net, opt, sh, probe)
        got = probe.flush()
        assert got["k"] == 3 and got["b_small"] == w.BATCH and got["b_big"] == 3 * w.BATCH
        for s, b, (ws, wb) in zip(got["g_small_sq"], got["g_big_sq"], want):
            assert s == pytest.approx(ws, rel=REL) and b == pytest.approx(wb, rel=REL)
        assert probe.flush()["steps"] == 0
        X, y = w.batches(3)[0]
        opt.zero_grad()
        nn.CrossEntropyLoss()(net(X), y).backward()
        with pytest.raises(RuntimeError, match="expected 3"):
            probe.step_done()               # shard_done() was never called
    finally:
        torch.set_default_dtype(old)
