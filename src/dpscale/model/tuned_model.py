"""Cheap wins for the tuned step, as transformations of models.torch_resnet18 that
leave the function it computes unchanged (tests/test_tuned_model.py shows it).

Each is a tuned option, switchable alone (registry.TORCH_TUNED; off by default):
  stem            "conv" | "im2col"
      The 1 -> 64, 3x3 stem runs far below the tensor cores' rate in cuDNN, a visible
      share of the step for a tiny share of the FLOPs: a 1-channel input gives cuDNN's
      implicit GEMM a reduction of only 9. Its bound is the output's write
      (docs/measurements/tuned-step_h200_2026-12-01.md).
      im2col: with one input channel the im2col matrix is the 9 shifted views of the
      padded image, stacked last: [N, H, W, 9], padded to 16 taps (bf16 tensor-core
      GEMMs want 16-byte rows; 9 x 2 bytes is not). One GEMM [N*H*W, 16] @ [16, 64] then
      writes its rows in NHWC order, which is the channels_last layout of the output: no
      transpose. The patches cost 1/4 of the output's bytes, written and read once.
      (The stem as 9 fused multiply-adds measured slower: dpscale.lab.model_options.)
  projection      "conv" | "slice_matmul"
      The 1x1 stride-2 shortcut convolutions run well under the matmul peak (the same
      report). As x[:, :, ::2, ::2]
      followed by a matmul over the channels they are, in channels_last, a plain GEMM
      [N*H/2*W/2, Cin] @ [Cin, Cout] whose rows are the output's channels_last layout.
  cancelled_bias  "keep" | "drop"
      A convolution followed by BatchNorm: in training, BN subtracts the batch mean, so
      the conv's bias cancels (its gradient is zero) and only costs a pass. Dropped, and
      folded into the BN's running_mean so that eval mode is unchanged too. Not the 1x1
      shortcut's: its output is added without BN.
  convbn          "none" | "cudnn_genstats"
      Each residual block's conv -> BN pairs as one cuDNN graph that writes the BN
      statistics from the convolution's epilogue (dpscale.model.fused_convbn): fp16
      only, so the tuned_fp16 series that switches it on also computes in fp16. Needs
      cancelled_bias=drop (a conv bias would have to be added after the statistics).
      cudnn_genstats_dbn: also bn1's backward reductions (and ReLU's backward) in
      conv2's dgrad epilogue, one more cuDNN graph (dpscale.lab.fused_dbn).
The parameters keep their names (a replacing module owns the same Parameter objects).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from dpscale.model import fused_convbn

CHOICES = {"stem": ("conv", "im2col"), "projection": ("conv", "slice_matmul"),
           "cancelled_bias": ("keep", "drop"), "convbn": ("none", "cudnn_genstats")}
DEFAULTS = {key: values[0] for key, values in CHOICES.items()}
TAPS_PADDED = 16


def choices(opts: dict) -> dict:
    """The model's options from a tuned-options dict (missing ones: the model as it is)."""
    out = {key: opts.get(key, DEFAULTS[key]) for key in CHOICES}
    for key, value in out.items():
        if value not in CHOICES[key]:
            raise ValueError(f"tuned option {key}={value!r}: expected one of {CHOICES[key]}")
    return out


def apply(model: nn.Module, opts: dict) -> nn.Module:
    """torch_resnet18 with the cheap wins that `opts` switches on, in place. The bias
    goes first, so a replaced stem sees the bias it should keep, or None."""
    c = choices(opts)
    if c["cancelled_bias"] == "drop":
        for conv, bn in cancelled_bias_pairs(model):
            drop_bias(conv, bn)
    if c["stem"] != "conv":
        model[0] = Im2colStem(model[0])
    if c["projection"] == "slice_matmul":
        for block in residual_blocks(model):
            if block.conv3 is not None:
                block.conv3 = SliceMatmulProjection(block.conv3)
    if c["convbn"] == "cudnn_genstats":
        fused_convbn.fuse(residual_blocks(model))
    return model


def describe(model: nn.Module) -> dict:
    """What a (possibly DDP-wrapped, compiled) model runs: for a probe's record."""
    inner = getattr(model, "module", model)
    inner = getattr(inner, "_orig_mod", inner)
    shortcuts = [type(b.conv3).__name__ for b in residual_blocks(inner) if b.conv3 is not None]
    return {"stem": type(inner[0]).__name__, "shortcuts": sorted(set(shortcuts)),
            "conv_biases": sum(1 for m in inner.modules() if getattr(m, "bias", None) is not None
                               and not isinstance(m, (nn.BatchNorm2d, nn.Linear))),
            "parameters": sum(p.numel() for p in inner.parameters()),
            "fused_conv_bn": sum(isinstance(m, fused_convbn.GenstatsConvBN) for m in inner.modules())}


# ---------------------------------------------------------------- cancelled biases

def residual_blocks(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if all(hasattr(m, a) for a in ("conv1", "bn1", "conv2", "bn2", "conv3"))]


def cancelled_bias_pairs(model: nn.Module) -> list[tuple[nn.Conv2d, nn.BatchNorm2d]]:
    """(conv, the BatchNorm it feeds) for every conv whose output goes straight into BN:
    the stem (model[0] -> model[1]) and conv1 -> bn1, conv2 -> bn2 of each block."""
    pairs = [(model[0], model[1])]
    for block in residual_blocks(model):
        pairs += [(block.conv1, block.bn1), (block.conv2, block.bn2)]
    return pairs


def drop_bias(conv: nn.Conv2d, bn: nn.BatchNorm2d | None) -> None:
    """Remove conv's bias b. Train mode: BN(y + b) == BN(y) exactly. Eval mode: BN's
    running_mean tracked y + b, so it becomes running_mean - b, and then
    (y + b) - rm == y - (rm - b). The fold stays exact through further training: every
    update rm <- (1 - m) rm + m * batch_mean (any convex weights: momentum=None too)
    moves both sides by the same amount. bn=None drops without folding (a mutation
    the tests use: conv3, whose output is added without BN, must not lose its bias)."""
    if conv.bias is None:
        return
    if bn is not None and bn.track_running_stats:
        with torch.no_grad():
            bn.running_mean.sub_(conv.bias.to(bn.running_mean.dtype))
    conv.bias = None


# ---------------------------------------------------------------- stem

def _as_matrix(weight: torch.Tensor) -> torch.Tensor:
    """A conv weight [O, I, kh, kw] as the [O, kh*kw*I] matrix of an NHWC GEMM, through
    the channels_last order (O, kh, kw, I). Trap: a plain reshape gives the same values
    (I or kh*kw is 1 here), but its gradient comes back in the contiguous layout, and
    DDP, whose buckets follow the channels_last parameter, warns and copies it."""
    return weight.permute(0, 2, 3, 1).reshape(weight.shape[0], -1)


def _check_stem(conv: nn.Conv2d) -> None:
    if (conv.in_channels, conv.kernel_size, conv.stride, conv.padding) != (1, (3, 3), (1, 1), (1, 1)):
        raise ValueError(f"the stem transforms need a 1-channel 3x3 stride-1 pad-1 conv, got {conv}")


def shifted_taps(x: torch.Tensor) -> list[torch.Tensor]:
    """The 9 shifted views [N, H, W] of a zero-padded [N, 1, H, W] image, in the conv
    weight's (kh, kw) order: tap (i, j) at output (h, w) is x[h + i - 1, w + j - 1]."""
    h, w = x.shape[-2:]
    xp = F.pad(x[:, 0], (1, 1, 1, 1))
    return [xp[:, i:i + h, j:j + w] for i in range(3) for j in range(3)]


class Im2colStem(nn.Module):
    """The stem conv as im2col ([N, H, W, 16] patches, 9 taps and 7 zeros) and one GEMM."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        _check_stem(conv)
        self.weight, self.bias = conv.weight, conv.bias   # the same Parameters, same names

    def forward(self, x):
        patches = F.pad(torch.stack(shifted_taps(x), dim=-1), (0, TAPS_PADDED - 9))
        w = F.pad(_as_matrix(self.weight), (0, TAPS_PADDED - 9))
        return F.linear(patches, w, self.bias).permute(0, 3, 1, 2)   # NHWC rows -> NCHW view


# ---------------------------------------------------------------- projection

class SliceMatmulProjection(nn.Module):
    """A 1x1 stride-s conv as x[:, :, ::s, ::s] and a matmul over channels (NHWC GEMM)."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        if conv.kernel_size != (1, 1) or conv.padding != (0, 0) or conv.groups != 1:
            raise ValueError(f"slice_matmul needs a 1x1 unpadded conv, got {conv}")
        self.stride = conv.stride
        self.weight, self.bias = conv.weight, conv.bias

    def forward(self, x):
        sh, sw = self.stride
        xs = x[:, :, ::sh, ::sw].permute(0, 2, 3, 1)    # NHWC view; F.linear gathers it once
        return F.linear(xs, _as_matrix(self.weight), self.bias).permute(0, 3, 1, 2)
