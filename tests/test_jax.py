"""The JAX experiments (dpscale.measure.jax_weak and jax_checks via scripts/jax_worker.py), launched as the
workflow launches them (watchdog + worker, spec from specs.job_spec) on the tiny
synthetic cache. Every run is a fresh process: XLA reads XLA_FLAGS (the number of
host devices) once, when jax starts, so it cannot be changed inside pytest."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import CPU_FP, ROOT, TINY, make_spec, run_job

from dpscale.model.models import NUM_PARAMS
from dpscale.results import validate_result

# Tiny on purpose: a CPU step of the full ResNet-18 costs ~0.3-1 s even at 16x16.
PROTO = {"train_images": 8, "per_rank_batch": 4}   # image_size 16, epochs 2, repeats 2 from conftest.TINY


def run_ok(tiny_data, tmp_path, experiment, k, variant="default", proto=None) -> dict:
    rc, res, log = run_job(make_spec(tiny_data, experiment, k, variant, limit_s=180, proto={**PROTO, **(proto or {})}),
                           tmp_path)
    assert rc == 0, log[-4000:]
    validate_result(res)
    assert res["status"] == "ok", res.get("reason")
    assert len(res["runtime"]["devices"]) == k and res["runtime"]["platform"] == "cpu"
    assert res["backend"] == "xla-cpu" and res["data"]["source"] == "synthetic"
    return res["metrics"]


# ---------------------------------------------------------------- units (no devices)

def test_compare_updates_flags_a_k_times_update():
    from dpscale.measure.jax_checks import REL_THRESHOLD, compare_updates
    rng = np.random.default_rng(0)
    d1 = {"a": rng.normal(0, 1e-2, (3, 4)), "b": rng.normal(0, 1e-3, 5)}
    rounding = {n: v + rng.normal(0, 1e-7, v.shape) for n, v in d1.items()}
    assert compare_updates(d1, rounding)["passed"]
    for k in (2, 4):
        bad = compare_updates(d1, {n: k * v for n, v in d1.items()})
        assert not bad["passed"]
        assert bad["rel_diff"] == pytest.approx(k - 1) and bad["rel_diff"] > REL_THRESHOLD


def test_parse_allreduces_reads_tuples_async_and_dtypes():
    from dpscale.measure.jax_checks import other_collectives, parse_allreduces
    hlo = "\n".join([
        "  %all-reduce.1 = (f32[64]{0}, f32[3,3,1,64]{3,2,1,0}, /*index=2*/bf16[10]{0}) "
        "all-reduce(%a, %b, %c), channel_id=2, to_apply=%add",
        # older XLA: an async start typed by its results (the book's printout)
        "  %all-reduce-start.34 = f32[6447680]{0} all-reduce-start(%wrapped_concatenate.34), channel_id=5",
        "  %all-reduce-done.34 = f32[6447680]{0} all-reduce-done(%all-reduce-start.34)",
        # jax 0.11 on GPUs: typed (operands, results); each counted once
        "  %all-reduce-start.35 = ((f32[4724235]{0}), f32[4724235]{0}) all-reduce-start(%w.35), channel_id=7",
        "  %all-reduce-done.35 = f32[4724235]{0} all-reduce-done(%all-reduce-start.35)",
        "  %all-reduce-start.36 = ((f32[64]{0}, f32[64]{0}), (f32[64]{0}, f32[64]{0})) all-reduce-start(%x, %y)",
        "  %ar = f32[] all-reduce(%s), to_apply=%add",
        "  %ag = f32[8,4]{1,0} all-gather(%x), dimensions={0}",
    ])
    ops = parse_allreduces(hlo)
    assert [op["elements"] for op in ops] == [64 + 576 + 10, 6447680, 4724235, 128, 1]
    assert ops[0]["operands"] == 3 and ops[0]["bytes_by_dtype"] == {"f32": 4 * 640, "bf16": 20}
    assert ops[1]["bytes"] == 4 * 6447680 and ops[1]["async"] and not ops[0]["async"]
    assert other_collectives(hlo) == {"all-gather": 1}


def test_worker_help_says_what_it_sets():
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "jax_worker.py"), "--help"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0
    assert "--spec" in p.stdout and "XLA_FLAGS" in p.stdout and "jax_equality" in p.stdout


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine may have GPUs")
def test_gpu_backend_without_gpus_fails_loudly(tiny_data, tmp_path):
    """CPU numbers must never be recorded under xla-gpu."""
    gpu_fp = {**CPU_FP, "gpu_count": 2, "gpu_model": "NVIDIA H200"}   # two: on one GPU a lone k=1 series is skipped before it runs
    rc, res, log = run_job(make_spec(tiny_data, "jax_weak", 1, "device", proto=PROTO, fp=gpu_fp), tmp_path)
    assert rc == 0 and res["status"] == "failed" and res["metrics"] == {}
    assert "needs gpu devices" in log and res["reason"].startswith("RuntimeError: backend xla-gpu needs gpu devices")


# ---------------------------------------------------------------- experiments

# k=1 on the device-resident cache, the variants at k=2: jax_job has no branch on k or on
# the variant by k (a k=1 host case repeated k=2's, 17 CPU-s of command 2)
@pytest.mark.parametrize("k, variant, warm", [
    (1, "device", 5),   # warmup_steps 5: round an epoch of 2 steps again
    pytest.param(2, "host", None, marks=pytest.mark.multiproc),
    pytest.param(2, "device", None, marks=pytest.mark.multiproc),
    pytest.param(2, "tuned", 3, marks=pytest.mark.multiproc),   # bf16 + donated jax.jit state
])
@pytest.mark.slow
def test_weak(tiny_data, tmp_path, k, variant, warm):
    m = run_ok(tiny_data, tmp_path, "jax_weak", k, variant, proto={"warmup_steps": warm})
    b, warmup, repeats = PROTO["per_rank_batch"], TINY["epochs"] - 1, TINY["repeats"]
    assert m["samples_per_s"] > 0 and m["samples_per_s_per_device"] == pytest.approx(m["samples_per_s"] / k)
    assert m["global_batch"] == k * b and m["steps_per_epoch"] == PROTO["train_images"] // (k * b)
    warm_n = m["steps_per_epoch"] if warm is None else warm
    assert m["warmup_steps"] == [warm] and [e["samples"] for e in m["epochs"]] == \
        [warm_n * k * b] * warmup + [m["steps_per_epoch"] * k * b] * repeats
    # the book's warm-up epoch, then `repeats` timed ones: the first is the book's figure
    assert [e["repeat"] for e in m["epochs"]] == [None] * warmup + list(range(repeats))
    assert m["repeats"] == repeats and m["samples_per_s_repeats"][0] == m["samples_per_s"]
    assert m["samples_per_s_repeats"] == [e["samples_per_s"] for e in m["epochs"][warmup:]]
    lo, hi = m["samples_per_s_ci95"]
    assert lo <= m["samples_per_s_mean"] <= hi and m["epoch_s"] == m["epochs"][warmup]["seconds"]
    assert 0 < m["step_ms_p10"] <= m["step_ms_median"] <= m["step_ms_p90"]
    assert m["first_step_s"] > 0 and np.isfinite(m["loss_last"]) and m["dispatch_ms_median"] > 0
    assert ("tuned_options" in m) == (variant == "tuned")
    # the roofline beside MFU in tuned results; without measured rates (CPU) bytes only
    assert ("roofline_bytes_per_sample_MB" in m) == (variant == "tuned")
    assert "roofline_samples_per_s" not in m and "roofline_fraction" not in m
    # MFU's numerator is the counted FLOPs (rule model_flops); the bf16 matmul peak that
    # divides it is measured on GPUs only, so a CPU run has no mfu
    assert m["flops_per_sample"] == json.loads((tiny_data / "flops_16px.json").read_text())["flops_per_sample"]
    assert m["achieved_TFLOPs_per_device"] == pytest.approx(m["flops_per_sample"] * m["samples_per_s_per_device"] / 1e12)
    assert "mfu" not in m


def test_mfu_refuses_a_count_for_another_image_size(tiny_data, tmp_path):
    from dpscale.measure import jax_job
    spec = make_spec(tiny_data, "jax_weak", 1, "host", proto={"image_size": 32})
    with pytest.raises(ValueError, match=r"counts 16px images, the protocol asks for 32px"):
        jax_job.mfu_metrics(jax_job.Ctx(spec), 100.0, 1e15)
    m = jax_job.mfu_metrics(jax_job.Ctx(make_spec(tiny_data, "jax_weak", 1, "host")), 1000.0, 2e15)
    assert m["mfu"] == pytest.approx(m["flops_per_sample"] * 1000.0 / 2e15)


@pytest.mark.slow
@pytest.mark.multiproc
def test_hlo_counts_the_gradient_allreduce(tiny_data, tmp_path):
    m = run_ok(tiny_data, tmp_path, "jax_hlo", 2)
    assert m["n_allreduce"] >= 1 and len(m["allreduce_elements"]) == m["n_allreduce"]
    assert m["grad_floats"] == NUM_PARAMS
    # XLA combines the gradient sums into one or two big all-reduces (one on CPU,
    # two on GPUs as in the book); the small rest is batch-norm statistics.
    assert 0.95 < m["largest_two_over_grad"] < 1.05
    assert m["total_elements"] >= NUM_PARAMS and m["total_bytes"] >= 4 * NUM_PARAMS
    assert m["other_collectives"] == {}
    assert "CPU 0" in m["sharding_batch_txt"] and "CPU 1" in m["sharding_batch_txt"]
    assert "CPU 0,1" in m["sharding_weight_txt"] and m["weight_sharding"] == "P()"
    assert "\x1b[" not in m["sharding_batch_txt"]


@pytest.mark.slow
@pytest.mark.multiproc
def test_equality_passes_and_flags_summed_gradients(tiny_data, tmp_path):
    m = run_ok(tiny_data, tmp_path, "jax_equality", 2)
    assert m["passed"] and m["rel_diff"] < m["threshold"] and m["max_abs_update"] > 0
    assert m["broken_flagged"] is True and not m["broken"]["passed"]
    assert m["broken"]["rel_diff"] == pytest.approx(1.0, abs=0.1)   # k-1 times the update at k=2
