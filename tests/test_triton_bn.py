"""dpscale.lab.triton_bn against torch's batch_norm: the Triton statistics kernel, on a GPU
compiled, on a CPU run by Triton's interpreter."""
from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch
from torch.nn import functional as F

pytest.importorskip("triton")

from dpscale.lab import triton_bn  # noqa: E402

# The interpreter must be switched on before triton is first imported: without a GPU,
# test_in_the_interpreter reruns this file in a process started with TRITON_INTERPRET=1,
# and here the kernel tests skip.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
runs_kernels = pytest.mark.skipif(not (torch.cuda.is_available() or INTERPRETED),
                                  reason="needs a GPU, or TRITON_INTERPRET=1 from the start")


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.skipif(torch.cuda.is_available() or INTERPRETED, reason="the kernel tests run in this process")
def test_in_the_interpreter():
    from conftest import ROOT, env_with_src
    env = {**env_with_src(), "TRITON_INTERPRET": "1"}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:logging", __file__],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    summary = p.stdout.strip().splitlines()[-1]
    assert p.returncode == 0 and " passed" in summary and "1 skipped" in summary, p.stdout[-4000:]   # itself


def sample(dtype=torch.bfloat16, n=4, c=80, side=9, seed=0):
    """channels_last, C past one channel block (64), M = 324 rows: two full tiles of 128
    and a short one; a mean of twice the std, where E[x^2] - E[x]^2 would lose digits."""
    g = torch.Generator().manual_seed(seed)
    x = 2.0 + torch.randn(n, c, side, side, generator=g, dtype=torch.float64)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    return x.to(dev, dtype).contiguous(memory_format=torch.channels_last)


@runs_kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_statistics_match_a_float64_reduction(dtype):
    x = sample(dtype)
    mean, var = triton_bn.bn_stats(x)
    ref_var, ref_mean = torch.var_mean(x.double(), dim=(0, 2, 3), unbiased=False)
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    assert mean.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    torch.testing.assert_close(mean.double(), ref_mean, rtol=tol, atol=tol)
    torch.testing.assert_close(var.double(), ref_var, rtol=tol, atol=tol)


@runs_kernels
def test_mutation_a_merge_without_the_between_tile_term_is_caught(monkeypatch):
    def naive(mean_t, m2_t, M):   # averages the tiles' variances: wrong when tile means differ
        return mean_t.mean(0), (m2_t / triton_bn.BLOCK_M).mean(0)
    x = sample(torch.float64)
    x[:2] += 3.0   # the first tiles' rows sit higher
    monkeypatch.setattr(triton_bn, "_merge", naive)
    _, var = triton_bn.bn_stats(x)
    assert not torch.allclose(var, x.var(dim=(0, 2, 3), unbiased=False), rtol=1e-3)


def _pair(dtype):
    torch.manual_seed(0)
    # float32 parameters for bf16 input, as under autocast
    ref = torch.nn.BatchNorm2d(80).to(sample(dtype).device, torch.float64 if dtype == torch.float64 else torch.float32)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5), ref.bias.uniform_(-0.5, 0.5)
    return ref, triton_bn.TritonStatsBatchNorm2d.from_module(copy.deepcopy(ref))


@runs_kernels
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-9), (torch.bfloat16, 2e-2)])
def test_batchnorm_trains_like_torch(dtype, tol):
    """Outputs, input and parameter gradients, running statistics, over three training
    steps, then eval mode. bf16: against torch's BN on the same bf16 input (it too
    computes in fp32 and rounds the output and the input gradient to bf16)."""
    ref, new = _pair(dtype)
    for step in range(3):
        x = sample(dtype, seed=step)
        xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
        ys = [m(xi) for m, xi in zip((ref, new), xs)]
        g = torch.randn_like(ys[0].float()).to(dtype)
        for y in ys:
            (y.float() * g.float()).sum().backward()
        torch.testing.assert_close(ys[1].float(), ys[0].float(), rtol=tol, atol=tol)
        torch.testing.assert_close(xs[1].grad.float(), xs[0].grad.float(), rtol=tol, atol=tol)
    for name in ("weight", "bias"):
        torch.testing.assert_close(getattr(new, name).grad, getattr(ref, name).grad, rtol=tol, atol=tol * 10)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(new, name), getattr(ref, name), rtol=1e-6, atol=1e-6)
    ref.eval(), new.eval()
    x = sample(dtype, seed=9)
    torch.testing.assert_close(new(x).float(), ref(x).float(), rtol=tol, atol=tol)


@runs_kernels
def test_batchnorm_compiles_and_replaces_every_batchnorm_of_the_model():
    from dpscale.model.models import torch_resnet18
    torch.manual_seed(0)
    model = torch_resnet18().double()
    ref = copy.deepcopy(model)
    triton_bn.use_triton_stats(model)
    assert sum(isinstance(m, triton_bn.TritonStatsBatchNorm2d) for m in model.modules()) == 17
    x = torch.randn(2, 1, 16, 16, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    compiled = torch.compile(model, backend="aot_eager")
    torch.testing.assert_close(compiled(x), ref(x), rtol=1e-9, atol=1e-9)
    F.cross_entropy(compiled(x), torch.tensor([1, 2])).backward()
    F.cross_entropy(ref(x), torch.tensor([1, 2])).backward()
    grads = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-7, atol=1e-9, msg=lambda m, n=name: f"{n}: {m}")
