"""BatchNorm's per-channel statistics in one Triton pass, as a custom op
(dpscale::bn_stats) with a backward, usable eagerly, under torch.compile and inside a
CUDA graph; and a BatchNorm2d whose training-mode forward takes its statistics from it.

The kernel reads a channels_last tensor as the [M = N*H*W, C] matrix it is in memory,
once: each program loads a [BLOCK_M, BLOCK_C] tile, keeps it in registers and writes
the tile's mean and M2 (sum of squared deviations from the tile's mean) per channel,
accumulated in fp32 (fp64 for fp64 input). The tiles are merged in torch (Chan et al.'s
parallel variance: M2 = sum M2_t + sum n_t (mean_t - mean)^2), a [M / BLOCK_M, C]
reduction. Trap, and why not the plain sums: var = E[x^2] - E[x]^2 over 10^6 fp32
terms loses the digits that a mean of twice the std needs; the sum of x^2 is
recoverable from the result (M (var + mean^2)) where a caller wants it.

What this is and is not: it is the statistics pass of BN as one kernel we own, the
building block for putting it into a convolution's epilogue. By itself it does not
remove a pass (inductor already reduces the statistics in one pass), so its tuned
option (batchnorm=triton_stats, dpscale.model.tuned_model) stays off until a GPU run shows
it helps. BN semantics are torch's: biased
variance to normalise, unbiased into running_var, fp32 statistics.
Triton's interpreter runs the kernel on CPU tensors when TRITON_INTERPRET=1 is set
before triton is first imported (its own library functions are decorated then).
No `from __future__ import annotations` in this module: Triton reads the kernel's
tl.constexpr annotations at runtime, and as strings every argument would be a value.
"""
import functools

import torch
from torch import nn

BLOCK_M = 128
BLOCK_C = 64
NUM_WARPS = 8   # a 128 x 64 fp32 tile in registers: 32 values a thread


try:
    import triton
    import triton.language as tl
except ImportError:   # the CPU test skips; the GPU image ships triton
    triton = tl = None


if triton is not None:
    def _partial_stats(x_ptr, mean_ptr, m2_ptr, M, C, ACC: tl.constexpr, BM: tl.constexpr,
                       BC: tl.constexpr):
        """One [BM, BC] tile of the [M, C] matrix: per-channel mean and M2 of its rows."""
        pm, pc = tl.program_id(0), tl.program_id(1)
        rows = pm * BM + tl.arange(0, BM)
        cols = pc * BC + tl.arange(0, BC)
        mask = (rows[:, None] < M) & (cols[None, :] < C)
        x = tl.load(x_ptr + rows[:, None] * C + cols[None, :], mask=mask, other=0.0).to(ACC)
        n = tl.minimum(M - pm * BM, BM).to(ACC)
        mean = tl.sum(x, axis=0) / n
        d = tl.where(mask, x - mean[None, :], 0.0)
        out = pm * C + cols
        tl.store(mean_ptr + out, mean, mask=cols < C)
        tl.store(m2_ptr + out, tl.sum(d * d, axis=0), mask=cols < C)


@functools.cache
def _kernel():
    return triton.jit(_partial_stats)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[N, C, H, W] -> the [N*H*W, C] matrix of its channels_last memory (a copy only
    when x is not channels_last already)."""
    return x.permute(0, 2, 3, 1).reshape(-1, x.shape[1])


def _merge(mean_t: torch.Tensor, m2_t: torch.Tensor, M: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Chan's merge of per-tile means and M2 [G, C] into the mean and biased variance [C]."""
    n_t = torch.full((mean_t.shape[0], 1), float(BLOCK_M), dtype=mean_t.dtype, device=mean_t.device)
    n_t[-1] = M - BLOCK_M * (mean_t.shape[0] - 1)   # the last tile may be short
    mean = (n_t * mean_t).sum(0) / M
    m2 = m2_t.sum(0) + (n_t * (mean_t - mean) ** 2).sum(0)
    return mean, m2 / M


@torch.library.custom_op("dpscale::bn_stats", mutates_args=())
def bn_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and biased variance of x [N, C, H, W] over N, H, W, in fp32
    (fp64 for fp64 input), from one read of x."""
    rows = _rows(x).contiguous()
    M, C = rows.shape
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    G = -(-M // BLOCK_M)
    mean_t = torch.empty(G, C, dtype=acc, device=x.device)
    m2_t = torch.empty(G, C, dtype=acc, device=x.device)
    _kernel()[(G, -(-C // BLOCK_C))](rows, mean_t, m2_t, M, C, ACC=tl.float64 if acc == torch.float64 else tl.float32,
                                     BM=BLOCK_M, BC=BLOCK_C, num_warps=NUM_WARPS)
    return _merge(mean_t, m2_t, M)


@bn_stats.register_fake
def _(x):
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_empty(x.shape[1], dtype=acc), x.new_empty(x.shape[1], dtype=acc)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], output[0])


def _backward(ctx, grad_mean, grad_var):
    """d mean / dx = 1/M; d var / dx = 2 (x - mean) / M: one elementwise pass over x."""
    x, mean = ctx.saved_tensors
    M = x.numel() // x.shape[1]
    grad_mean = torch.zeros_like(mean) if grad_mean is None else grad_mean
    grad_var = torch.zeros_like(mean) if grad_var is None else grad_var
    shape = (1, -1, 1, 1)
    g = (grad_mean.view(shape) + 2 * grad_var.view(shape) * (x.to(mean.dtype) - mean.view(shape))) / M
    return g.to(x.dtype)


bn_stats.register_autograd(_backward, setup_context=_setup)


def batch_norm_train(x, weight, bias, running_mean, running_var, momentum: float, eps: float):
    """F.batch_norm(training=True) with the statistics from bn_stats: the same output,
    gradients (autograd through the normalisation and bn_stats' backward) and running
    statistics (momentum update; running_var takes the unbiased variance)."""
    mean, var = bn_stats(x)
    if running_mean is not None:
        M = x.numel() // x.shape[1]
        with torch.no_grad():
            running_mean.lerp_(mean.to(running_mean.dtype), momentum)
            running_var.lerp_((var * M / max(M - 1, 1)).to(running_var.dtype), momentum)
    scale = torch.rsqrt(var + eps) * weight.to(var.dtype)
    shift = bias.to(var.dtype) - mean * scale
    return (x.to(var.dtype) * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)).to(x.dtype)


class TritonStatsBatchNorm2d(nn.BatchNorm2d):
    """nn.BatchNorm2d (affine, tracking running stats, fixed momentum) whose training
    forward takes its statistics from the Triton kernel; eval mode is torch's."""

    @classmethod
    def from_module(cls, bn: nn.BatchNorm2d) -> "TritonStatsBatchNorm2d":
        if not (bn.affine and bn.track_running_stats and bn.momentum is not None):
            raise ValueError(f"needs an affine BatchNorm2d with running stats and a momentum, got {bn}")
        new = cls(bn.num_features, bn.eps, bn.momentum, device=bn.weight.device, dtype=bn.weight.dtype)
        new.load_state_dict(bn.state_dict())
        return new

    def forward(self, x):
        if not self.training:
            return super().forward(x)
        self.num_batches_tracked.add_(1)
        return batch_norm_train(x, self.weight, self.bias, self.running_mean, self.running_var, self.momentum, self.eps)


def use_triton_stats(model: nn.Module) -> nn.Module:
    """Every BatchNorm2d of model replaced by a TritonStatsBatchNorm2d (same state), in place."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.BatchNorm2d:
                setattr(parent, name, TritonStatsBatchNorm2d.from_module(child))
    return model
