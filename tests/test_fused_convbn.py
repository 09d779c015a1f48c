"""dpscale.model.fused_convbn: BatchNorm from the convolution's own statistics.

On the CPU the op's reference kernel (torch's conv and two sums) stands in for cuDNN's
graph, so the BN arithmetic, its gradient and the running statistics are checked
exactly, in float64. The GPU tier (-m gpu) runs cuDNN's conv + genstats graph in fp16.
"""
from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from dpscale.model import fused_convbn as fc, tuned_model as tm  # noqa: E402
from dpscale.model.models import torch_resnet18  # noqa: E402

WINS = {"stem": "im2col", "projection": "slice_matmul", "cancelled_bias": "drop"}


def test_the_op_and_its_gradient_are_the_convolutions_and_their_sums():
    x = torch.randn(3, 4, 6, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 4, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: fc.conv_genstats(a, b, [2, 2], [1, 1]), (x, w))
    torch.library.opcheck(fc.conv_genstats, (x.detach(), w.detach(), [1, 1], [1, 1]))


def _pair(dtype=torch.float64):
    torch.manual_seed(0)
    ref = tm.apply(torch_resnet18().to(dtype), {"cancelled_bias": "drop"})
    return ref, tm.apply(copy.deepcopy(ref), {"convbn": "cudnn_genstats"})


def test_fused_model_is_the_same_function_gradient_and_running_statistics():
    """Train mode: output, every parameter's gradient and every running statistic as
    conv -> BatchNorm2d computes them; eval mode after a step: the same output."""
    ref, fused = _pair()
    assert tm.describe(fused)["fused_conv_bn"] == 16
    X = torch.randn(8, 1, 16, 16, dtype=torch.float64)
    a, b = ref(X), fused(X)
    torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
    (a * torch.arange(10.0, dtype=a.dtype)).sum().backward()
    (b * torch.arange(10.0, dtype=b.dtype)).sum().backward()
    grads = {n: p.grad for n, p in ref.named_parameters()}
    assert len(grads) == len(list(fused.parameters()))
    for name, p in fused.named_parameters():
        torch.testing.assert_close(p.grad, grads[fc.unfused_name(name)], rtol=1e-9, atol=1e-11, msg=name)
    bufs = dict(ref.named_buffers())
    for name, t in fused.named_buffers():
        torch.testing.assert_close(t, bufs[fc.unfused_name(name)], rtol=1e-12, atol=1e-14, msg=name)
    ref.eval(), fused.eval()
    torch.testing.assert_close(fused(X), ref(X), rtol=1e-10, atol=1e-12)


def test_mutation_statistics_over_the_wrong_axis_changes_the_output(monkeypatch):
    ref, fused = _pair()
    X = torch.randn(4, 1, 16, 16, dtype=torch.float64)
    monkeypatch.setattr(fc, "batch_norm_from_sums", _wrong_axis(fc.batch_norm_from_sums))
    assert not torch.allclose(fused(X), ref(X), rtol=1e-3, atol=1e-3)


def test_a_conv_bias_is_refused_with_the_option_that_removes_it():
    with pytest.raises(ValueError, match="cancelled_bias=drop"):
        tm.apply(torch_resnet18(), {"convbn": "cudnn_genstats"})


def _wrong_axis(real):
    """The mutation: the sums of y's channels_last buffer read as if it were NCHW (a
    descriptor given contiguous strides), then BN as usual."""
    def mutated(y, s, q, bn):
        n, c, h, w = y.shape
        flat = y.permute(0, 2, 3, 1).reshape(n, c, h * w).to(s.dtype)   # memory order, misread
        return real(y, flat.sum((0, 2)), (flat * flat).sum((0, 2)), bn)
    return mutated


# ---------------------------------------------------------------- GPU tier

STEPS = 60
LOSS_ABS_TOL = 0.02      # per step; both runs start at ~2.3 and fall below 0.5
WEIGHT_REL_TOL = 0.02    # ||fused - unfused|| / ||unfused|| per parameter tensor, after STEPS steps


def _needs_frontend():
    if reason := fc.unavailable_reason():
        pytest.skip(reason)


@pytest.mark.parametrize("shape", [(64, 64, 64, 1), (128, 128, 32, 1), (64, 128, 64, 2), (512, 512, 8, 1)])
@pytest.mark.gpu
def test_cudnn_graph_matches_torch_conv_and_sums(shape):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    _needs_frontend()
    cin, cout, hw, stride = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(32, cin, hw, hw, device="cuda", generator=g).half().contiguous(memory_format=torch.channels_last)
    w = (torch.randn(cout, cin, 3, 3, device="cuda", generator=g) / (3 * cin ** 0.5)).half() \
        .contiguous(memory_format=torch.channels_last)
    y, s, q = fc.conv_genstats(x, w, [stride, stride], [1, 1])
    ref = torch.nn.functional.conv2d(x.float(), w.float(), None, stride, 1)
    assert y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2)
    yf = y.float()
    torch.testing.assert_close(s, yf.sum((0, 2, 3)), rtol=1e-3, atol=1e-1)
    torch.testing.assert_close(q, (yf * yf).sum((0, 2, 3)), rtol=1e-3, atol=1e-1)


def _train_fp16(convbn: str, steps: int = STEPS):
    """The tuned model (cheap wins), channels_last, fp16 autocast with dynamic loss
    scaling, eager SGD at lr 0.05 on 4 fixed batches of 64 (32 x 32): the losses and
    the model."""
    from torch.nn import functional as F
    torch.manual_seed(0)
    model = tm.apply(torch_resnet18(), {**WINS, "convbn": convbn}).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, fused=True)
    scaler = torch.amp.GradScaler("cuda")
    gen = torch.Generator().manual_seed(1)
    data = [(torch.rand(64, 1, 32, 32, generator=gen).cuda().contiguous(memory_format=torch.channels_last),
             torch.randint(0, 10, (64,), generator=gen).cuda()) for _ in range(4)]
    losses = []
    for i in range(steps):
        X, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(X), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss.detach()))
    return model, losses


def _differences(fused, fused_losses, plain, plain_losses) -> tuple[float, float]:
    """(worst per-step loss difference, worst per-tensor relative weight difference)."""
    loss_diff = max(abs(a - b) for a, b in zip(fused_losses, plain_losses))
    ref = dict(plain.named_parameters())
    weight_diff = max(float((p - ref[fc.unfused_name(n)]).norm() / ref[fc.unfused_name(n)].norm().clamp_min(1e-12))
                      for n, p in fused.named_parameters())
    return loss_diff, weight_diff


@pytest.mark.gpu
def test_fused_fp16_step_trains_like_the_unfused_step(monkeypatch):
    """60 fp16 steps with the conv + BN statistics from cuDNN's graph against the same
    steps through cuDNN's conv and torch's BatchNorm: every step's loss within 0.02 and
    every weight tensor within 2% (fp16 rounding, amplified over the run, stays well
    inside both: the GPU run prints the measured differences). The mutation, the
    statistics read over the wrong axis, must fail."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    _needs_frontend()
    plain, plain_losses = _train_fp16("none")
    fused, fused_losses = _train_fp16("cudnn_genstats")
    assert plain_losses[-1] < 0.5 * plain_losses[0], plain_losses   # it trains: a test that can fail
    loss_diff, weight_diff = _differences(fused, fused_losses, plain, plain_losses)
    print(f"fused vs unfused over {STEPS} fp16 steps: loss diff max {loss_diff:.2e}, weight diff max {weight_diff:.2e}")
    assert loss_diff <= LOSS_ABS_TOL and weight_diff <= WEIGHT_REL_TOL, (loss_diff, weight_diff)
    monkeypatch.setattr(fc, "batch_norm_from_sums", _wrong_axis(fc.batch_norm_from_sums))
    loss_diff, weight_diff = _differences(*_train_fp16("cudnn_genstats"), plain, plain_losses)
    print(f"mutated (wrong axis): loss diff max {loss_diff:.2e}, weight diff max {weight_diff:.2e}")
    assert loss_diff > LOSS_ABS_TOL or weight_diff > WEIGHT_REL_TOL
