"""Convolution + BatchNorm with the statistics in the convolution's epilogue: one cuDNN
graph (conv_fprop then genstats: per-channel sum and sum of squares in fp32) through
cuDNN's Python frontend (`nvidia-cudnn-frontend`, the `cudnn` extra), in fp16 NHWC.

Why by hand: no well-kept library exposes this. torch's cuDNN binding has no graph API,
inductor treats cuDNN convolutions as opaque and reduces BatchNorm's statistics in a
pass of its own (a read of every BN input), and on sm_90 cuDNN 9.19 offers the fused
engine in fp16 only (bf16: CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH;
docs/measurements/tuned-fp16_h200_2026-12-02.md), hence fp16 with dynamic loss scaling, as MLPerf's
ResNet does.

The pieces:
  - `dpscale::conv_genstats(x, w, stride, padding) -> (y, sum, sumsq)`, a custom op:
    opaque to torch.compile (inductor fuses the pointwise work around it), captured by
    CUDA graphs. On CUDA it runs the cuDNN graph; elsewhere, and as the reference the
    tests compare against, torch's conv and two sums. Its backward is the convolution's
    (aten.convolution_backward) with the statistics' gradient folded in:
    dL/dy + dL/dsum + 2 y dL/dsumsq.
  - `GenstatsConvBN`, a conv whose output goes to a BatchNorm, replaced by one module:
    BN's batch mean and variance come from the sums (var = E[y^2] - E[y]^2 in fp32; the
    trap there is cancellation when |mean| >> std, harmless for conv outputs whose
    inputs are normalised: the GPU test bounds the difference), the running statistics
    update as torch's (unbiased variance, momentum), normalisation in fp32. The ReLU and
    residual add stay where the model has them, for the compiler to fuse with the apply.
  - `fuse(blocks)`: every conv -> BN pair of the residual blocks, in place. The stem
    (one input channel: no tensor-core conv) and the 1x1 shortcuts (no BN) stay.
BatchNorm's semantics are unchanged: batch statistics in training, running statistics
in eval (where the plain conv and BN run), the same parameters (BN's weight and bias
move under the conv as `.bn`; `unfused_name` maps the names back).
"""
from __future__ import annotations

import functools

import torch
from torch import nn
from torch.nn import functional as F

DTYPE = torch.float16          # the only dtype with a fused engine on sm_90 (see above)
STATS_DIMS = (0, 2, 3)         # per channel, over N, H, W


def acc_dtype(t: torch.Tensor) -> torch.dtype:
    """The accumulation dtype: fp32, or fp64 for fp64 tensors (the CPU gradcheck)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def unavailable_reason() -> str | None:
    """Why the fused op cannot run here (None: it can)."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (cuDNN's conv + genstats graph)"
    try:
        import cudnn  # noqa: F401
    except ImportError as e:
        return f"needs cuDNN's Python frontend: pip install nvidia-cudnn-frontend (the `cudnn` extra); {e}"
    return None


# ---------------------------------------------------------------- the cuDNN graph

@functools.cache
def cudnn_handle(device_index: int):
    import cudnn
    with torch.cuda.device(device_index):
        return cudnn.create_handle()


@functools.cache
def _graph(device_index: int, x_shape, x_stride, w_shape, w_stride, stride, padding):
    """conv_fprop + genstats, built and planned once per shape (heuristics A, then
    FALLBACK); returns (graph, X, W, Y, SUM, SQ, workspace bytes)."""
    import cudnn
    half, f32 = cudnn.data_type.HALF, cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=half, intermediate_data_type=f32, compute_data_type=f32,
                      handle=cudnn_handle(device_index))
    X = g.tensor(name="X", dim=list(x_shape), stride=list(x_stride), data_type=half)
    W = g.tensor(name="W", dim=list(w_shape), stride=list(w_stride), data_type=half)
    Y = g.conv_fprop(image=X, weight=W, padding=list(padding), stride=list(stride), dilation=[1, 1])
    Y.set_output(True).set_data_type(half)
    SUM, SQ = g.genstats(input=Y)
    SUM.set_output(True).set_data_type(f32)
    SQ.set_output(True).set_data_type(f32)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return g, X, W, Y, SUM, SQ, g.get_workspace_size()


def _out_shape(x: torch.Tensor, w: torch.Tensor, stride, padding) -> tuple[int, int, int, int]:
    n, _, h, wd = x.shape
    kh, kw = w.shape[-2:]
    return (n, w.shape[0], (h + 2 * padding[0] - kh) // stride[0] + 1, (wd + 2 * padding[1] - kw) // stride[1] + 1)


def empty_outputs(x, w, stride, padding):
    y = torch.empty(_out_shape(x, w, stride, padding), dtype=x.dtype, device=x.device,
                    memory_format=torch.channels_last)
    c, acc = w.shape[0], acc_dtype(x)
    return y, x.new_empty((c,), dtype=acc), x.new_empty((c,), dtype=acc)


@torch.library.custom_op("dpscale::conv_genstats", mutates_args=())
def conv_genstats(x: torch.Tensor, w: torch.Tensor, stride: list[int], padding: list[int]) \
        -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference (CPU, and any device without the cuDNN graph): torch's conv, then
    the per-channel sum and sum of squares of its output in fp32."""
    y = F.conv2d(x, w, None, stride, padding).contiguous(memory_format=torch.channels_last)
    yf = y.to(acc_dtype(y))
    return y, yf.sum(STATS_DIMS), (yf * yf).sum(STATS_DIMS)


@conv_genstats.register_kernel("cuda")
def _conv_genstats_cuda(x, w, stride, padding):
    import cudnn
    if x.dtype != DTYPE or w.dtype != DTYPE:
        raise TypeError(f"dpscale::conv_genstats runs in {DTYPE} on CUDA, got x {x.dtype}, w {w.dtype}")
    x = x.contiguous(memory_format=torch.channels_last)
    w = w.contiguous(memory_format=torch.channels_last)
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    g, X, W, Y, SUM, SQ, ws_bytes = _graph(dev, tuple(x.shape), tuple(x.stride()), tuple(w.shape),
                                           tuple(w.stride()), tuple(stride), tuple(padding))
    y, s, q = empty_outputs(x, w, stride, padding)
    ws = torch.empty(max(1, ws_bytes), dtype=torch.uint8, device=x.device)
    handle = cudnn_handle(dev)
    # Trap: the handle keeps the stream it was given last. Inside a CUDA graph capture the
    # current stream is the capture's side stream; a kernel on any other is not recorded.
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(x.device).cuda_stream)
    g.execute({X: x, W: w, Y: y, SUM: s.view(1, -1, 1, 1), SQ: q.view(1, -1, 1, 1)}, ws, handle=handle)
    return y, s, q


@conv_genstats.register_fake
def _conv_genstats_fake(x, w, stride, padding):
    return empty_outputs(x, w, stride, padding)


def _setup(ctx, inputs, output):
    x, w, stride, padding = inputs
    ctx.save_for_backward(x, w, output[0])
    ctx.stride, ctx.padding = list(stride), list(padding)


def stats_grad(y, gy, gsum, gsq) -> torch.Tensor:
    """The gradient reaching y, the conv's output, from (y, sum, sum of squares):
    dL/dy + dL/dsum + 2 y dL/dsumsq, in y's dtype and channels_last."""
    c = y.shape[1]
    acc = acc_dtype(y)
    g = gy.to(acc) if gy is not None else torch.zeros_like(y, dtype=acc)
    if gsum is not None:
        g = g + gsum.view(1, c, 1, 1)
    if gsq is not None:
        g = g + 2 * y.to(acc) * gsq.view(1, c, 1, 1)
    return g.to(y.dtype).contiguous(memory_format=torch.channels_last)


def _backward(ctx, gy, gsum, gsq):
    x, w, y = ctx.saved_tensors
    g = stats_grad(y, gy, gsum, gsq)
    dx, dw, _ = torch.ops.aten.convolution_backward(g, x, w, None, ctx.stride, ctx.padding, [1, 1], False,
                                                    [0, 0], 1, [ctx.needs_input_grad[0], ctx.needs_input_grad[1], False])
    return dx, dw, None, None


conv_genstats.register_autograd(_backward, setup_context=_setup)


# ---------------------------------------------------------------- BatchNorm from the sums

def batch_norm_from_sums(y: torch.Tensor, s: torch.Tensor, q: torch.Tensor, bn: nn.BatchNorm2d) -> torch.Tensor:
    """BN in training mode, given y's per-channel sum and sum of squares (bn_train's output)."""
    return bn_train(y, s, q, bn)[0]


def bn_train(y: torch.Tensor, s: torch.Tensor, q: torch.Tensor, bn: nn.BatchNorm2d):
    """BN in training mode from y's per-channel sums: (y * scale + shift, scale, shift),
    per channel, in fp32, the output in y's dtype; normalised with the biased variance,
    the running statistics updated with the unbiased one (torch's)."""
    m = y.numel() // y.shape[1]
    mean = s / m
    var = (q / m - mean * mean).clamp_min(0)
    if bn.track_running_stats and bn.running_mean is not None:
        with torch.no_grad():
            bn.num_batches_tracked.add_(1)
            momentum = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
            bn.running_mean.lerp_(mean.detach(), momentum)
            bn.running_var.lerp_(var.detach() * (m / max(m - 1, 1)), momentum)
    scale = torch.rsqrt(var + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight
    shift = -mean * scale + (bn.bias if bn.bias is not None else 0)
    return (y.to(acc_dtype(y)) * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)).to(y.dtype), scale, shift


class GenstatsConvBN(nn.Module):
    """conv -> bn as one module: the conv's statistics from its own epilogue in training."""

    def __init__(self, conv: nn.Conv2d, bn: nn.BatchNorm2d):
        super().__init__()
        if conv.bias is not None or conv.groups != 1 or conv.dilation != (1, 1):
            raise ValueError(f"GenstatsConvBN needs a bias-free, ungrouped, undilated conv (drop the "
                             f"bias BN cancels first: cancelled_bias=drop), got {conv}")
        self.weight = conv.weight   # the same Parameter: the optimiser and DDP see no new one
        self.stride, self.padding = list(conv.stride), list(conv.padding)
        self.bn = bn

    def forward(self, x):
        if not self.training:
            return self.bn(F.conv2d(x, self.weight.to(x.dtype), None, self.stride, self.padding))
        dtype = DTYPE if x.is_cuda else x.dtype
        y, s, q = conv_genstats(x.to(dtype), self.weight.to(dtype), self.stride, self.padding)
        return batch_norm_from_sums(y, s, q, self.bn)


def fuse(blocks: list[nn.Module]) -> None:
    """Every conv1 -> bn1 and conv2 -> bn2 of these residual blocks as GenstatsConvBN
    (the BN left in place becomes an Identity), in place."""
    for block in blocks:
        for conv_name, bn_name in (("conv1", "bn1"), ("conv2", "bn2")):
            setattr(block, conv_name, GenstatsConvBN(getattr(block, conv_name), getattr(block, bn_name)))
            setattr(block, bn_name, nn.Identity())


def unfused_name(name: str) -> str:
    """A fused model's parameter or buffer name as the unfused model spells it:
    ...conv1.bn.weight -> ...bn1.weight."""
    for i in ("1", "2"):
        name = name.replace(f"conv{i}.bn.", f"bn{i}.")
    return name
