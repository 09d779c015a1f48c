"""The cheap wins of dpscale.model.tuned_model compute what the seed's model computes: the
same outputs and gradients, in train mode (batch statistics) and in eval mode after
training (running statistics), eager, compiled and channels_last; and the bias drop
removes exactly the biases BatchNorm cancels. Mutations show the checks can fail."""
from __future__ import annotations

import copy

import pytest
import torch

from dpscale.lab import model_options as mo
from dpscale.model import tuned_model as tm
from dpscale.model.models import STAGES, count_torch, torch_resnet18

VARIANTS = {"stem_im2col": {"stem": "im2col"}, "stem_direct": {"stem": "direct"},
            "projection": {"projection": "slice_matmul"}, "bias_drop": {"cancelled_bias": "drop"},
            "all": {"stem": "im2col", "projection": "slice_matmul", "cancelled_bias": "drop"}}
# float64: a wrong transform is off by ~1e-2, rounding by ~1e-14; 1e-9 sits between
TOL = {"rtol": 1e-9, "atol": 1e-9}


def pair(opts, dtype=torch.float64, channels_last=False):
    torch.manual_seed(0)
    base = torch_resnet18().to(dtype)
    if channels_last:
        base = base.to(memory_format=torch.channels_last)
    return base, mo.apply(copy.deepcopy(base), opts)


def batches(n=3, dtype=torch.float64, side=16, channels_last=False):
    g = torch.Generator().manual_seed(1)
    for _ in range(n):
        x = torch.randn(8, 1, side, side, generator=g, dtype=dtype)
        yield (x.contiguous(memory_format=torch.channels_last) if channels_last else x,
               torch.randint(0, 10, (8,), generator=g))


def grads(model):
    return {n: p.grad for n, p in model.named_parameters()}


def train_side_by_side(base, other, steps=3, lr=0.05, check=True):
    """SGD steps on both models with the same batches; with check, every step's outputs
    and the gradients of the parameters both have must agree. Returns the dropped
    parameters' gradients in base (the ones `other` no longer has)."""
    opts = [torch.optim.SGD(m.parameters(), lr=lr) for m in (base, other)]
    dropped = {}
    for x, y in batches(steps):
        outs = []
        for m, opt in zip((base, other), opts):
            opt.zero_grad(set_to_none=True)
            out = m(x)
            torch.nn.functional.cross_entropy(out, y).backward()
            outs.append(out)
        if check:
            torch.testing.assert_close(outs[1], outs[0], **TOL)
            g0, g1 = grads(base), grads(other)
            for name in g1:
                torch.testing.assert_close(g1[name], g0[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")
            dropped = {n: g for n, g in g0.items() if n not in g1}
        for opt in opts:
            opt.step()
    return dropped


@pytest.mark.parametrize("name", VARIANTS)
def test_transform_matches_in_train_mode_and_in_eval_mode_after_training(name):
    base, other = pair(VARIANTS[name])
    dropped = train_side_by_side(base, other)
    # BN cancels a dropped bias: its gradient in the seed's model is zero up to rounding
    for n, g in dropped.items():
        assert g.abs().max() < 1e-12, n
    base.eval(), other.eval()
    x, _ = next(batches(1))
    torch.testing.assert_close(other(x), base(x), **TOL)


def test_parameter_count_drops_by_exactly_the_cancelled_biases():
    # the stem's 64 and, in every stage, conv1 and conv2 of both blocks: 4 x cout
    expected = STAGES[0][0] + sum(4 * cout for _, cout, _ in STAGES)
    base, other = pair(VARIANTS["bias_drop"])
    assert count_torch(base) - count_torch(other) == expected == 3904
    for name in ("stem_im2col", "stem_direct", "projection"):
        base, other = pair(VARIANTS[name])
        assert [n for n, _ in other.named_parameters()] == [n for n, _ in base.named_parameters()]


def test_mutation_dropping_the_shortcut_bias_breaks_equality(monkeypatch):
    """conv3 (the 1x1 shortcut) is added without BN: its bias is not cancelled."""
    pairs = tm.cancelled_bias_pairs

    def with_conv3(model):
        return pairs(model) + [(b.conv3, None) for b in tm.residual_blocks(model) if b.conv3 is not None]
    monkeypatch.setattr(tm, "cancelled_bias_pairs", with_conv3)
    base, other = pair(VARIANTS["bias_drop"])
    x, _ = next(batches(1))
    assert not torch.allclose(other(x), base(x), **TOL)
    with pytest.raises(AssertionError):
        train_side_by_side(*pair(VARIANTS["bias_drop"]), steps=1)


def test_mutation_dropping_biases_without_the_running_mean_fold_breaks_eval_mode(monkeypatch):
    monkeypatch.setattr(tm, "drop_bias", lambda conv, bn: setattr(conv, "bias", None))
    base, other = pair(VARIANTS["bias_drop"])
    train_side_by_side(base, other)           # train mode still agrees: BN cancels the bias
    base.eval(), other.eval()
    x, _ = next(batches(1))
    assert not torch.allclose(other(x), base(x), **TOL)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["stem_direct", "all"])   # "all" holds the other three
def test_transform_compiles_and_keeps_channels_last(name):
    """torch.compile (aot_eager: dynamo and autograd tracing, no code generation) of the
    transformed float32 channels_last model: its outputs against the seed's model in
    float64, its gradients against the same model run eagerly (in float32 a ReLU near
    zero may flip between two roundings and move a gradient by 1e-3: the float64 test
    above is the one that compares gradients across formulations); then under bf16
    autocast, where the direct stem must cast its own output."""
    base, other = pair(VARIANTS[name], dtype=torch.float32, channels_last=True)
    eager, ref = copy.deepcopy(other), copy.deepcopy(base).double()
    compiled = torch.compile(other, backend="aot_eager")
    x, y = next(batches(1, dtype=torch.float32, channels_last=True))
    out_c, out_e = compiled(x), eager(x)
    torch.testing.assert_close(out_c.double(), ref(x.double()), rtol=1e-4, atol=1e-5)
    torch.nn.functional.cross_entropy(out_c, y).backward()
    torch.nn.functional.cross_entropy(out_e, y).backward()
    ge = grads(eager)
    for n, g in grads(other).items():
        torch.testing.assert_close(g, ge[n], rtol=1e-4, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = base(x), compiled(x)
        stem = compiled._orig_mod[0](x)
    assert stem.dtype == torch.bfloat16 and stem.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got.float(), want.float(), rtol=0.05, atol=0.05)


def test_unknown_choice_is_one_clear_error():
    with pytest.raises(ValueError, match=r"stem='winograd'.*'im2col'"):
        tm.choices({"stem": "winograd"})
    assert tm.choices({}) == {"stem": "conv", "projection": "conv", "cancelled_bias": "keep", "convbn": "none"}


def test_build_ddp_applies_the_options(monkeypatch):
    """The tuned DDP model is the transformed one when the registry's options ask for it."""
    import torch.distributed as dist
    from conftest import free_port

    from dpscale import registry
    from dpscale.measure import torch_ddp as tr
    for key, val in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, val)
    assert tm.choices(registry.TORCH_TUNED.options) == {**tm.DEFAULTS, **VARIANTS["all"]}   # on: each measured faster
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        opts = {**registry.TORCH_TUNED.options, "compile": False, **VARIANTS["all"]}
        ctx = tr.Ctx({"backend": "gloo", "config": {"protocol": {}, "tuned": opts}})
        model = tr.build_ddp(ctx, tuned=True).module
        assert isinstance(model[0], tm.Im2colStem) and model[0].bias is None
        assert isinstance(model.resnet_block2[0].conv3, tm.SliceMatmulProjection)
        assert count_torch(model) == count_torch(torch_resnet18()) - 3904
        assert model.resnet_block1[0].conv1.weight.is_contiguous(memory_format=torch.channels_last)
    finally:
        dist.destroy_process_group()
