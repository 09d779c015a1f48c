"""dpscale.analysis.roofline against the roofline measured and computed on one H200
(../shared/reference/h200-roofline.md), and against torch.utils.flop_counter."""
from __future__ import annotations

import pytest

from dpscale.analysis import roofline
from dpscale.model.models import NUM_PARAMS, torch_flops_per_sample

# The inputs the reference file states it used ("Rates used for the bounds"): the
# measured 8192^3 bf16 matmul and the measured device-to-device copy, read + write.
PEAK_FLOPS = 790e12
COPY_BPS = 4.3e12
BATCH, SIDE = 256, 64
# What the reference file computed from them, as it states it: bytes a step (GB) and
# step time (ms) under each fusion assumption. Samples/s follow as batch / step time.
REFERENCE = {"none": (29.7, 9.67), "compiler": (21.3, 7.72), "ideal": (15.8, 6.11)}
REFERENCE_FLOPS_PER_STEP = 3404e9          # "The step is 3,404 GFLOP"
REFERENCE_STEM_ACTIVATION_BYTES = 134e6    # "One stage-1 activation ... is 134 MB at batch 256"
WITHIN = 0.03                              # "within a few percent"


def test_flops_per_step_match_the_reference_and_the_compute_only_bound():
    t = roofline.totals(roofline.step_passes(BATCH, SIDE), PEAK_FLOPS, COPY_BPS)
    assert t["flops"] == pytest.approx(REFERENCE_FLOPS_PER_STEP, rel=1e-3)
    assert t["flops"] / BATCH / 1e9 == pytest.approx(13.30, abs=0.005)
    # compute only: 4.31 ms, 59,400 samples/s, derived from the same two numbers
    assert t["compute_s"] == pytest.approx(REFERENCE_FLOPS_PER_STEP / PEAK_FLOPS, rel=1e-3)
    assert BATCH / t["compute_s"] == pytest.approx(59_400, rel=0.005)


@pytest.mark.parametrize("fusion", roofline.FUSIONS)
def test_bytes_and_bound_match_the_reference(fusion):
    gb, ms = REFERENCE[fusion]
    t = roofline.totals(roofline.step_passes(BATCH, SIDE, fusion), PEAK_FLOPS, COPY_BPS)
    assert t["bytes"] / 1e9 == pytest.approx(gb, rel=WITHIN)
    assert t["bound_s"] * 1e3 == pytest.approx(ms, rel=WITHIN)
    assert roofline.bound_samples_per_s(BATCH, SIDE, fusion, PEAK_FLOPS, COPY_BPS) == \
        pytest.approx(BATCH / (ms / 1e3), rel=WITHIN)


def test_the_bounds_order_and_barely_move_with_the_batch():
    """none < compiler < ideal < compute only; "Batch 512 or 1024 moves these bounds by under 1%"."""
    sps = {f: roofline.bound_samples_per_s(BATCH, SIDE, f, PEAK_FLOPS, COPY_BPS) for f in roofline.FUSIONS}
    assert sps["none"] < sps["compiler"] < sps["ideal"] < BATCH / (REFERENCE_FLOPS_PER_STEP / PEAK_FLOPS)
    for batch in (512, 1024):
        for f in roofline.FUSIONS:
            assert roofline.bound_samples_per_s(batch, SIDE, f, PEAK_FLOPS, COPY_BPS) == pytest.approx(sps[f], rel=0.01)


def test_one_stage1_pass_costs_31_us():
    st = roofline.Step(BATCH, "none")
    n_bytes = roofline.ACT * st.elements(64, SIDE)
    assert n_bytes == pytest.approx(REFERENCE_STEM_ACTIVATION_BYTES, rel=0.005)
    assert n_bytes / COPY_BPS * 1e6 == pytest.approx(31, abs=0.5)


def test_flops_match_torch_flop_counter():
    """The roofline's FLOPs are what torch.utils.flop_counter counts: the MFU numerator."""
    for side in (16, 64):
        passes = roofline.step_passes(2, side)
        assert roofline.totals(passes)["flops"] / 2 == torch_flops_per_sample(side)


def test_layers_are_the_models_modules_and_the_parameters_add_up():
    from dpscale.model.models import torch_resnet18
    modules = {name for name, _ in torch_resnet18().named_modules()}
    layers = {r["layer"] for r in roofline.per_layer(roofline.step_passes(BATCH, SIDE))}
    assert layers - modules == {"optimizer"}
    assert roofline.num_params() == NUM_PARAMS
    convs = [m for m in modules if m.split(".")[-1].startswith("conv")] + ["0"]
    assert sorted(c.name for c in roofline.all_convs(SIDE)) == sorted(convs)


def test_an_epilogue_is_free_on_a_compute_bound_kernel_and_costs_its_bytes_on_a_memory_bound_one():
    peak, bw = 1.0, 1.0
    fast = roofline.Pass("a", "fprop", "forward", flops=10.0, bytes=2.0)
    slow = roofline.Pass("b", "fprop", "forward", flops=1.0, bytes=5.0)
    hidden = roofline.Pass("a", "bn_bwd_reduce", "backward", 0.0, 3.0, host=("a", "fprop"))
    costly = roofline.Pass("b", "bn_bwd_reduce", "backward", 0.0, 3.0, host=("b", "fprop"))
    bounds = roofline.pass_bounds([fast, slow, hidden, costly], peak, bw)
    assert bounds == [(10.0, "compute"), (5.0, "memory"), (0.0, "compute"), (3.0, "memory")]
    with pytest.raises(KeyError):
        roofline.pass_bounds([hidden], peak, bw)


def test_per_layer_rows_sum_to_the_step():
    passes = roofline.step_passes(BATCH, SIDE, "compiler")
    rows = roofline.per_layer(passes, PEAK_FLOPS, COPY_BPS)
    t = roofline.totals(passes, PEAK_FLOPS, COPY_BPS)
    assert sum(r["bound_s"] for r in rows) == pytest.approx(t["bound_s"])
    assert sum(r["bytes"] for r in rows) == pytest.approx(t["bytes"])
    by = {r["layer"]: r for r in rows}
    # the stem conv (1 input channel) and the 1x1 shortcuts are memory-bound, the 3x3 convs not
    assert by["0"]["binds"] == by["resnet_block2.0.conv3"]["binds"] == "memory"
    assert by["resnet_block1.0.conv1"]["binds"] == by["resnet_block4.1.conv2"]["binds"] == "compute"
    assert all("bound_s" not in r for r in roofline.per_layer(passes))   # CPU: no rates, bounds only


def test_roofline_fields_beside_mfu():
    m = roofline.roofline_fields(BATCH, SIDE, 21_551.0, PEAK_FLOPS, COPY_BPS)
    ideal = roofline.bound_samples_per_s(BATCH, SIDE, "ideal", PEAK_FLOPS, COPY_BPS)
    assert m["roofline_samples_per_s"] == pytest.approx(ideal)
    assert m["roofline_fraction"] == pytest.approx(21_551.0 / ideal)
    assert 0.5 < m["roofline_fraction"] < 0.55   # the reference: 0.51 of the 41,900 bound
    assert m["roofline_samples_per_s_compiler"] < m["roofline_samples_per_s"]
    assert m["copy_bandwidth_GBps"] == pytest.approx(4300) and m["roofline_fusion"] == "ideal"
    cpu = roofline.roofline_fields(4, 16, 100.0, None, None)   # no measured rates: no bound
    assert "roofline_samples_per_s" not in cpu and "roofline_fraction" not in cpu
    assert cpu["roofline_bytes_per_sample_MB"] > 0
    with pytest.raises(ValueError, match="fusion 'magic'"):
        roofline.step_passes(BATCH, SIDE, "magic")


def test_stats_epilogue_is_the_compiler_step_less_what_the_fusion_removes():
    """tuned_fp16's assumption: the compiler's passes, less each residual block's BN
    statistics pass (one read of the conv's output, now in its epilogue) and the bias
    gradients of the convs whose bias BN cancels (all but the 1x1 shortcuts)."""
    got = roofline.totals(roofline.step_passes(BATCH, SIDE, "stats_epilogue"))["bytes"]
    compiler = roofline.step_passes(BATCH, SIDE, "compiler")
    removed = sum(p.bytes for p in compiler if p.op == "bn_stats" and p.layer != "1")
    removed += sum(p.bytes for p in compiler if p.op == "bias_grad" and not p.layer.endswith("conv3"))
    assert removed > 0 and got == pytest.approx(sum(p.bytes for p in compiler) - removed)
    ideal = roofline.totals(roofline.step_passes(BATCH, SIDE, "ideal"))["bytes"]
    assert ideal < got
    with pytest.raises(ValueError, match="stats_epilogue"):
        roofline.step_passes(BATCH, SIDE, "fused")
