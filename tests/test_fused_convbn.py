"""dpscale.model.fused_convbn and fused_dbn: BatchNorm from the convolution's own
statistics, and bn1's backward reductions in conv2's dgrad.

On the CPU the op's reference kernel (torch's conv and two sums) stands in for cuDNN's
graph, so the BN arithmetic, its gradient and the running statistics are checked
exactly, in float64. The GPU tier (-m gpu) runs cuDNN's conv + genstats graph in fp16.
"""
from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from dpscale.lab import fused_dbn as fd, model_options as mo  # noqa: E402
from dpscale.model import fused_convbn as fc, tuned_model as tm  # noqa: E402
from dpscale.model.models import torch_resnet18  # noqa: E402

WINS = {"stem": "im2col", "projection": "slice_matmul", "cancelled_bias": "drop"}
FUSED = ("cudnn_genstats", "cudnn_genstats_dbn")


def test_the_op_and_its_gradient_are_the_convolutions_and_their_sums():
    x = torch.randn(3, 4, 6, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 4, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: fc.conv_genstats(a, b, [2, 2], [1, 1]), (x, w))
    torch.library.opcheck(fc.conv_genstats, (x.detach(), w.detach(), [1, 1], [1, 1]))


def _bn_inputs(c=4, dtype=torch.float64):
    torch.manual_seed(0)
    y = torch.randn(3, c, 6, 6, dtype=dtype).contiguous(memory_format=torch.channels_last)
    return y, 1 + 0.3 * torch.randn(c, dtype=dtype), 0.3 * torch.randn(c, dtype=dtype)


def test_the_backward_op_is_the_dgrad_masked_by_relu_and_its_two_sums():
    """dgrad_drelu_dbn against torch's own autograd of conv(relu(y * scale + shift)):
    dt is the gradient at y * scale + shift, and its sums are the gradients of shift and
    scale (times y)."""
    y, scale, shift = _bn_inputs()
    w = torch.randn(5, 4, 3, 3, dtype=torch.float64)
    g = torch.randn(3, 5, 6, 6, dtype=torch.float64)
    t = (y * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)).requires_grad_()
    torch.nn.functional.conv2d(torch.relu(t), w, None, 1, 1).backward(g)
    dt, sdt, sdty = fd.dgrad_drelu_dbn(g, w, y, scale, shift, [1, 1], [1, 1])
    torch.testing.assert_close(dt, t.grad)
    torch.testing.assert_close(sdt, t.grad.sum((0, 2, 3)))
    torch.testing.assert_close(sdty, (t.grad * y).sum((0, 2, 3)))
    torch.library.opcheck(fd.dgrad_drelu_dbn, (g, w, y, scale, shift, [1, 1], [1, 1]))


def test_the_bnrelu_conv_op_and_its_gradient_are_conv_of_relu_of_bn():
    """gradcheck against the op's own function, conv_genstats(relu(y * scale + shift)),
    through the gradient its backward assembles from dgrad_drelu_dbn."""
    y, scale, shift = _bn_inputs()
    w = torch.randn(5, 4, 3, 3, dtype=torch.float64)
    a = torch.relu(y * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1))
    ins = tuple(t.clone().requires_grad_() for t in (y, scale, shift, w))
    assert torch.autograd.gradcheck(lambda *t: fd.bnrelu_conv_genstats(a, *t, [1, 1], [1, 1]), ins)
    torch.library.opcheck(fd.bnrelu_conv_genstats, (a, y, scale, shift, w, [1, 1], [1, 1]))


def _pair(convbn="cudnn_genstats", dtype=torch.float64):
    torch.manual_seed(0)
    ref = mo.apply(torch_resnet18().to(dtype), {"cancelled_bias": "drop"})
    return ref, mo.apply(copy.deepcopy(ref), {"convbn": convbn})


@pytest.mark.parametrize("convbn", FUSED)
def test_fused_model_is_the_same_function_gradient_and_running_statistics(convbn):
    """Train mode: output, every parameter's gradient and every running statistic as
    conv -> BatchNorm2d computes them; eval mode after a step: the same output."""
    ref, fused = _pair(convbn)
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


@pytest.mark.parametrize("convbn", FUSED)
def test_mutation_statistics_over_the_wrong_axis_changes_the_output(monkeypatch, convbn):
    ref, fused = _pair(convbn)
    X = torch.randn(4, 1, 16, 16, dtype=torch.float64)
    monkeypatch.setattr(fc, "bn_train", _wrong_axis(fc.bn_train))
    assert not torch.allclose(fused(X), ref(X), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("convbn", FUSED)
def test_a_conv_bias_is_refused_with_the_option_that_removes_it(convbn):
    with pytest.raises(ValueError, match="cancelled_bias=drop"):
        mo.apply(torch_resnet18(), {"convbn": convbn})


def test_mutation_a_relu_mask_from_the_wrong_sign_changes_the_gradients(monkeypatch):
    """The dBN op's mask is not a formality: masked where t <= 0 instead of t > 0, the
    gradients differ (the forward, which the op does not touch, does not)."""
    ref, fused = _pair("cudnn_genstats_dbn")
    X = torch.randn(4, 1, 16, 16, dtype=torch.float64)
    real = fd.dgrad_drelu_dbn

    def flipped(g, w, y, scale, shift, stride, padding):
        return real(g, w, y, -scale, -shift, stride, padding)
    monkeypatch.setattr(fd, "dgrad_drelu_dbn", flipped)
    a, b = ref(X), fused(X)
    torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
    a.sum().backward()
    b.sum().backward()
    grads = {n: p.grad for n, p in ref.named_parameters()}
    assert any(not torch.allclose(p.grad, grads[fc.unfused_name(n)], rtol=1e-3, atol=1e-6)
               for n, p in fused.named_parameters())


def _wrong_axis(real):
    """The mutation: the sums of y's channels_last buffer read as if it were NCHW (a
    descriptor given contiguous strides), then BN as usual."""
    def mutated(y, s, q, bn):   # bn_train's signature
        n, c, h, w = y.shape
        flat = y.permute(0, 2, 3, 1).reshape(n, c, h * w).to(s.dtype)   # memory order, misread
        return real(y, flat.sum((0, 2)), (flat * flat).sum((0, 2)), bn)
    return mutated


# ---------------------------------------------------------------- GPU tier

STEPS = 60
LOSS_ABS_TOL = 0.02      # the bound's floor, per step (the losses start at ~2.3)
WEIGHT_REL_TOL = 0.005   # the bound's floor, ||w - w_fp32|| / ||w_fp32|| over all weights


def _needs_frontend():
    if reason := fc.unavailable_reason():
        pytest.skip(reason)


@pytest.mark.parametrize("shape", [(64, 64, 64, 1), (128, 128, 32, 1), (64, 128, 64, 2), (512, 512, 8, 1)])
@pytest.mark.gpu
def test_cudnn_graph_matches_torch_conv_and_sums(shape):
    """cuDNN's conv + genstats on fp16 NHWC against torch's conv of the same fp16 inputs
    in fp32. Bounds: y to fp16's rounding (rel 2^-11) plus the accumulation order; the
    sums to 1e-3 of the sum of |y| and of y^2 (the rounding of every term to fp16, all
    of one sign, would reach 5e-4)."""
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
    y_err = float((y.float() - ref).abs().max() / ref.abs().max())
    s_err = float((s - ref.sum((0, 2, 3))).abs().max() / ref.abs().sum((0, 2, 3)).min())
    q_err = float((q - (ref * ref).sum((0, 2, 3))).abs().max() / (ref * ref).sum((0, 2, 3)).min())
    print(f"conv_genstats {shape}: y {y_err:.1e} of max|y|, sum {s_err:.1e} of sum|y|, sumsq {q_err:.1e}; "
          f"channels_last {y.is_contiguous(memory_format=torch.channels_last)}")
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert y_err < 5e-3 and s_err < 1e-3 and q_err < 1e-3, (y_err, s_err, q_err)


@pytest.mark.parametrize("c,hw", [(64, 64), (128, 32), (512, 8)])
@pytest.mark.gpu
def test_cudnn_dgrad_graph_matches_torch_dgrad_mask_and_sums(c, hw):
    """cuDNN's dgrad -> ReLU backward -> two sums on fp16 NHWC against torch's dgrad of
    the same fp16 inputs in fp32, masked and summed in fp32. Bounds as for the forward
    graph: dt to fp16's rounding plus the accumulation order (5e-3 of max|dt|), the sums
    to 1e-3 of the sums of |dt| and |dt * y|."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    _needs_frontend()
    gen = torch.Generator(device="cuda").manual_seed(0)
    cl = dict(memory_format=torch.channels_last)
    y = torch.randn(32, c, hw, hw, device="cuda", generator=gen).half().contiguous(**cl)
    g = (torch.randn(32, c, hw, hw, device="cuda", generator=gen) * 1e-2).half().contiguous(**cl)
    w = (torch.randn(c, c, 3, 3, device="cuda", generator=gen) / (3 * c ** 0.5)).half().contiguous(**cl)
    scale = 1 + 0.1 * torch.randn(c, device="cuda", generator=gen)
    shift = 0.1 * torch.randn(c, device="cuda", generator=gen)
    dt, sdt, sdty = fd.dgrad_drelu_dbn(g, w, y, scale, shift, [1, 1], [1, 1])
    da = torch.ops.aten.convolution_backward(g.float(), y.float(), w.float(), None, [1, 1], [1, 1], [1, 1], False,
                                             [0, 0], 1, [True, False, False])[0]
    rt = torch.where(y.float() * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1) > 0, da, 0)
    errs = (float((dt.float() - rt).abs().max() / rt.abs().max()),
            float((sdt - rt.sum((0, 2, 3))).abs().max() / rt.abs().sum((0, 2, 3)).min()),
            float((sdty - (rt * y.float()).sum((0, 2, 3))).abs().max() / (rt * y.float()).abs().sum((0, 2, 3)).min()))
    print(f"dgrad_drelu_dbn c={c} {hw}x{hw}: dt {errs[0]:.1e} of max|dt|, sums {errs[1]:.1e}, {errs[2]:.1e}")
    assert dt.is_contiguous(memory_format=torch.channels_last)
    assert errs[0] < 5e-3 and errs[1] < 1e-3 and errs[2] < 1e-3, errs


def _train(convbn: str, fp16: bool = True, steps: int = STEPS):
    """The tuned model (cheap wins), channels_last, eager SGD at lr 0.05 on 4 fixed batches
    of 64 (32 x 32), in fp16 autocast with dynamic loss scaling or in fp32: the model and
    its losses. The scale starts at 2^10, not GradScaler's 2^16: there the first steps
    overflow, and two runs that skip different steps are not comparable step by step."""
    from torch.nn import functional as F
    torch.manual_seed(0)
    model = mo.apply(torch_resnet18(), {**WINS, "convbn": convbn}).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, fused=True)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 10, enabled=fp16)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.rand(64, 1, 32, 32, generator=gen).cuda().contiguous(memory_format=torch.channels_last),
             torch.randint(0, 10, (64,), generator=gen).cuda()) for _ in range(4)]
    losses = []
    for i in range(steps):
        X, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=fp16):
            loss = F.cross_entropy(model(X), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss.detach()))
    return model, losses


def _distance(a, a_losses, b, b_losses) -> tuple[float, float]:
    """(worst per-step loss difference, ||weights_a - weights_b|| / ||weights_b|| over all
    parameters at the end)."""
    loss_diff = max(abs(x - y) for x, y in zip(a_losses, b_losses))
    ref = {fc.unfused_name(n): p.detach() for n, p in b.named_parameters()}
    diff = sum(float((p.detach() - ref[fc.unfused_name(n)]).pow(2).sum()) for n, p in a.named_parameters())
    return loss_diff, (diff / sum(float(p.pow(2).sum()) for p in ref.values())) ** 0.5


@pytest.mark.parametrize("convbn", FUSED)
@pytest.mark.gpu
def test_fused_fp16_step_trains_like_the_unfused_step(monkeypatch, convbn):
    """60 fp16 steps with the conv + BN statistics from cuDNN's graph against the same
    steps through cuDNN's conv and torch's BatchNorm, both measured from the fp32 run of
    the unfused model: the fused run may stray from fp32 at most twice as far as the
    unfused fp16 run does (fp16's own rounding, amplified over the run, is the yardstick),
    in every step's loss and in the final weights. The mutation, the statistics read
    over the wrong axis, must fail the same bound."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    _needs_frontend()
    ref32 = _train("none", fp16=False)
    assert ref32[1][-1] < 0.5 * ref32[1][0], ref32[1]   # it trains: a test that can fail
    plain = _distance(*_train("none"), *ref32)
    bound = (max(2 * plain[0], LOSS_ABS_TOL), max(2 * plain[1], WEIGHT_REL_TOL))
    fused = _distance(*_train(convbn), *ref32)
    monkeypatch.setattr(fc, "bn_train", _wrong_axis(fc.bn_train))
    mutated = _distance(*_train(convbn), *ref32)
    print(f"{convbn}, from fp32 over {STEPS} steps (loss diff max, weight rel diff): unfused fp16 {plain[0]:.2e} {plain[1]:.2e}; "
          f"fused fp16 {fused[0]:.2e} {fused[1]:.2e}; mutated {mutated[0]:.2e} {mutated[1]:.2e}; "
          f"bound {bound[0]:.2e} {bound[1]:.2e}")
    assert fused[0] <= bound[0] and fused[1] <= bound[1]
    assert mutated[0] > bound[0] or mutated[1] > bound[1]
