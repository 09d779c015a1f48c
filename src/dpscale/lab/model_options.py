"""Model options that no pipeline variant selects, measured and kept for the probes:
the stem as nine fused multiply-adds (`stem: direct`) and bn1's backward sums in
conv2's dgrad (`convbn: cudnn_genstats_dbn`, dpscale.lab.fused_dbn). Both were slower
(docs/measurements/: tuned-step_h200_2026-12-01.md and tuned-fp16_h200_2026-12-02.md). A probe applies
them on top of dpscale.model.tuned_model, so neither sits in a measurement's digest.
"""
from __future__ import annotations

import torch
from torch import nn

from dpscale.lab import fused_dbn
from dpscale.model import tuned_model
from dpscale.model.tuned_model import _as_matrix, _check_stem, residual_blocks, shifted_taps

LAB_CHOICES = {"stem": ("direct",), "convbn": ("cudnn_genstats_dbn",)}
# what the pipeline's model must already be for a lab option to apply on top of it
BASE = {("convbn", "cudnn_genstats_dbn"): "none"}


def split(opts: dict) -> tuple[dict, dict]:
    """(the options tuned_model knows, the lab's own), from one options dict."""
    lab = {k: v for k, v in opts.items() if v in LAB_CHOICES.get(k, ())}
    base = {k: (BASE.get((k, v), tuned_model.DEFAULTS.get(k)) if k in lab else v) for k, v in opts.items()}
    return base, lab


def apply(model: nn.Module, opts: dict, no_batchnorm: bool = False) -> nn.Module:
    """tuned_model.apply with the lab's options too (a probe passes it to
    measure.torch_ddp.build_ddp as `model_apply`); no_batchnorm: every BatchNorm2d an
    Identity (a bound for the probes, not a model)."""
    base, lab = split(opts)
    model = tuned_model.apply(model, base)
    if lab.get("stem") == "direct":
        model[0] = DirectStem(model[0])
    if lab.get("convbn") == "cudnn_genstats_dbn":
        fused_dbn.fuse(model, residual_blocks(model))
    if no_batchnorm:
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.BatchNorm2d):
                    setattr(parent, name, nn.Identity())
    return model


def _autocast_dtype(x: torch.Tensor) -> torch.dtype:
    """What a conv would compute in here: autocast's dtype when it is on (pointwise ops
    are not autocast, so the direct stem casts itself), else the input's dtype."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype



class DirectStem(nn.Module):
    """The stem conv as 9 broadcast multiply-adds, for the compiler to fuse into one kernel."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        _check_stem(conv)
        self.weight, self.bias = conv.weight, conv.bias

    def forward(self, x):
        dtype = _autocast_dtype(x)
        w = _as_matrix(self.weight).to(x.dtype)
        y = self.bias.to(x.dtype) if self.bias is not None else 0
        for k, tap in enumerate(shifted_taps(x)):
            y = y + tap[..., None] * w[:, k]   # [N, H, W, 1] * [C]: NHWC
        return y.to(dtype).permute(0, 3, 1, 2)
