"""Time to accuracy: MLPerf's scoring, the LR rules, goodput (pure), the emulated
k-rank step against a real k=2 DDP step (and two mutations it must catch), the
planning of emulated k's, and the worker at k=1 and k=2 over gloo."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import CPU_FP, ROOT, env_with_src, free_port, make_spec, run_job
from dpscale.analysis import tta
from dpscale.plan import specs

# ---------------------------------------------------------------- scoring


def _run(seed, samples, converged=True):
    return {"seed": seed, "converged": converged, "samples_to_target": samples if converged else None}


def test_score_drops_fastest_and_slowest_and_means_the_rest():
    s = tta.score([_run(1, 500), _run(2, 100), _run(3, 300), _run(4, 900), _run(5, 400)], "samples")
    assert s["value"] == pytest.approx(400)           # (300 + 400 + 500) / 3
    assert s["dropped_seeds"] == [2, 4] and sorted(s["kept_seeds"]) == [1, 3, 5]
    assert (s["min"], s["max"]) == (300, 500)


def test_one_unconverged_launch_is_the_slowest_two_mean_no_result():
    s = tta.score([_run(1, 500), _run(2, 100), _run(3, None, False), _run(4, 200)], "samples")
    assert s["value"] == pytest.approx(350) and s["dropped_seeds"] == [2, 3]
    s = tta.score([_run(1, 500), _run(2, None, False), _run(3, None, False), _run(4, 200)], "samples")
    assert s["value"] is None and "2 of 4" in s["reason"] and s["not_converged"] == [2, 3]
    assert tta.score([_run(1, 5), _run(2, 6)], "samples")["value"] is None   # fewer than 3


def test_two_unconverged_launches_settle_the_point():
    assert not tta.settled([_run(1, None, False), _run(2, 100)])
    assert tta.settled([_run(1, None, False), _run(2, None, False)])
    s = tta.score([_run(1, None, False), _run(2, None, False)], "samples")   # the rest never launched
    assert s["value"] is None and "2 of 2" in s["reason"]


def test_linear_rule_is_not_run_at_k1_where_it_is_the_book_rule():
    resolved = {"experiments": ["ddp_tta"], "ks": [1, 2], "tuned": False, "protocol": {"tta_ks_emulated": [4]}}
    assert specs.planned(resolved) == [("ddp_tta", "book", 1), ("ddp_tta", "book", 2), ("ddp_tta", "book", 4),
                                       ("ddp_tta", "linear", 2), ("ddp_tta", "linear", 4), ("ddp_tta", "book_fp32", 1)]
    assert tta.lr_at("linear", 1, 0, 1000) == tta.lr_at("constant", 1, 0, 1000)


def test_score_fields_name_every_measure():
    runs = [dict(_run(i, 100 * i), seconds_to_target=float(i), epochs_to_target=i / 10) for i in (1, 2, 3)]
    f = tta.score_fields(runs)
    assert f["tta_s"] == f["seconds_to_target"] == 2.0 and f["epochs_to_target"] == pytest.approx(0.2)
    assert f["scored"] and f["no_result_reason"] is None


def test_lr_rules():
    assert tta.lr_at("constant", 8, 0, 1000) == 0.1
    assert tta.lr_at("linear", 8, 0, 1000) == pytest.approx(0.1)
    assert tta.lr_at("linear", 8, 500, 1000) == pytest.approx(0.45)
    assert tta.lr_at("linear", 8, 1000, 1000) == pytest.approx(0.8)
    assert tta.lr_at("linear", 1, 10, 1000) == pytest.approx(0.1)


def test_goodput_splits_into_hardware_and_statistical_efficiency():
    pts = [{"k": 1, "samples_to_target": 1000, "eval_s": 1.0}, {"k": 2, "samples_to_target": 1500, "eval_s": 1.0},
           {"k": 4, "samples_to_target": 3000, "emulated": True}]
    rows = tta.goodput(pts, tta.measured_provider({1: 100.0, 2: 180.0}))
    one, two, four = rows
    assert one["time_to_accuracy_s"] == pytest.approx(11.0) and two["time_to_accuracy_s"] == pytest.approx(1500 / 180 + 1)
    assert two["statistical_efficiency"] == pytest.approx(2 / 3) and two["hardware_efficiency"] == pytest.approx(0.9)
    assert two["goodput_efficiency"] == pytest.approx(0.6)
    assert four["samples_per_s_source"] == "not measured" and four["time_to_accuracy_s"] is None
    forecast = tta.chained(tta.measured_provider({1: 100.0}), lambda k: (95.0 * k, "forecast"))
    assert tta.goodput(pts, forecast)[2]["samples_per_s_source"] == "forecast"


# ---------------------------------------------------------------- emulation = DDP

TOL = 1e-9   # max |difference| of any parameter or buffer after 3 steps, in float64 (tta_equality_worker)


@pytest.fixture(scope="module")
def real_k2(tmp_path_factory):
    out = tmp_path_factory.mktemp("tta") / "real.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(ROOT / "tests/tta_equality_worker.py"), str(out)]
    p = subprocess.run(cmd, env=env_with_src(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return torch.load(out)


def _emulated(step_of_shards):
    import tta_equality_worker as w
    from dpscale.model.models import torch_resnet18
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        model = torch_resnet18()
        opt = torch.optim.SGD(model.parameters(), lr=w.LR)
        for X, y in w.global_batches():
            step_of_shards(model, opt, [(X[:w.BATCH], y[:w.BATCH]), (X[w.BATCH:], y[w.BATCH:])])
        return w.state(model)
    finally:
        torch.set_default_dtype(old)


def _max_diff(a, b):
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def test_emulated_k2_step_equals_real_ddp_and_mutations_fail(real_k2):
    from dpscale.measure.torch_tta import ShardedStep

    def emulated(model, opt, shards):
        ShardedStep(model, opt)(shards, 0.1)

    def global_bn(model, opt, shards):   # mutation: BatchNorm over the whole global batch
        ShardedStep(model, opt)([(torch.cat([x for x, _ in shards]), torch.cat([y for _, y in shards]))], 0.1)

    def summed(model, opt, shards):      # mutation: gradients summed over the ranks, not averaged
        ShardedStep(model, opt)(shards, 0.1 * len(shards))   # == lr x sum for plain SGD

    assert _max_diff(real_k2, _emulated(emulated)) < TOL
    for mutant in (global_bn, summed):
        assert _max_diff(real_k2, _emulated(mutant)) > 1e-3, mutant.__name__


# ---------------------------------------------------------------- planning and the worker

def test_k_above_the_devices_is_emulated_not_skipped(tiny_data):
    s = make_spec(tiny_data, "ddp_tta", 4, "book", proto=TTA_TINY)
    assert s["skip_reason"] is None and s["processes"] == 2 and specs.processes(s) == 2
    assert "processes" not in make_spec(tiny_data, "ddp_tta", 2, "book", proto=TTA_TINY)
    assert make_spec(tiny_data, "ddp_weak", 4, "cached")["skip_reason"]   # the others still skip


# Tiny, to keep CI short: a target any network passes at its first evaluation (a few of
# 32 test images right), so every seed converges after 32 samples. That learning
# reaches a real target is the smoke DAG's job (16 px real data, target 0.6).
TTA_TINY = {"tta_image_size": 16, "tta_train_images": 64, "tta_test_images": 32, "tta_per_rank_batch": 8,
            "tta_target": 0.01, "tta_eval_every_samples": 32, "tta_max_epochs": 1, "tta_seeds": [1, 2, 3],
            "tta_warmup_epochs": 0.5, "tta_ks_emulated": [], "tta_timeout_s": 120}


@pytest.mark.parametrize("k,variant", [(1, "book"), (2, "linear"), (4, "book")])
def test_tta_worker_scores_its_seeds(tiny_data, tmp_path, k, variant):
    """k=1 and k=2 are real DDP over gloo; k=4 on this 2-device stand-in is emulated (2 x 2 ranks)."""
    rc, res, log = run_job(make_spec(tiny_data, "ddp_tta", k, variant, proto=TTA_TINY), tmp_path)
    assert rc == 0 and res["status"] == "ok", log[-3000:]
    m = res["metrics"]
    assert m["lr_rule"] == variant and m["seeds"] == [1, 2, 3] and m["target_accuracy"] == 0.01
    assert m["emulated"] is (k == 4) and m["processes"] == min(k, 2) and m["global_batch"] == 8 * k
    assert m["eval_every_samples"] == 32 and len(m["runs"]) == 3
    for r in m["runs"]:
        assert r["converged"] and r["curve"][0]["samples"] == max(32, 8 * k) == r["samples_to_target"]
        assert 0 < r["eval_s"] < r["seconds_to_target"]   # the evaluation is on the clock
    assert m["scored"] and m["samples_to_target"] == max(32, 8 * k) and m["tta_s"] > 0


def test_a_settled_point_launches_no_more_seeds(monkeypatch):
    """Seeds 1 and 2 miss the target: seed 3 is not launched, and the result says why
    there is no score. (The launch itself runs in the worker tests above.)"""
    from types import SimpleNamespace
    from dpscale.measure import torch_tta
    launched = []

    def launch(ctx, seed):
        launched.append(seed)
        return {"seed": seed, "converged": seed > 2, "eval_s": 0.1, **{f"{m}_to_target": None if seed <= 2 else 1.0
                                                                        for m in tta.MEASURES}}
    monkeypatch.setattr(torch_tta, "one_launch", launch)
    ctx = SimpleNamespace(proto=TTA_TINY, spec={"k": 1, "variant": "book", "config": {"variant": {"lr_scaling": "constant"}}},
                          world=1, rank=0)
    m = torch_tta.exp_tta(ctx)
    assert launched == [1, 2] and m["not_launched_seeds"] == [3] and [r["seed"] for r in m["runs"]] == [1, 2]
    assert not m["scored"] and m["no_result_reason"].endswith("seeds 3 not launched (the score was settled)")
    launched.clear()
    m = torch_tta.exp_tta(SimpleNamespace(**{**vars(ctx), "proto": {**TTA_TINY, "tta_seeds": [3, 4, 1]}}))
    assert launched == [3, 4, 1] and m["not_launched_seeds"] == [] and m["scored"]   # one miss: all launched


def test_too_few_images_for_the_largest_k_names_the_key():
    from dpscale.plan import config
    # smoke: 2,000 images, 16 a rank: k=128 needs 2,048 for one global batch
    cfg = {"scale": "smoke", "ks": [1, 2, 128], "hardware_file": None, "tuned": "auto", "experiments": "all",
           "watchdog": {"hang_timeout_s": "auto", "grace_s": 15}, "data": {"source": "auto"},
           "scales": {"smoke": {"global_batch": 128}}}
    with pytest.raises(config.ConfigError, match=r"scales.smoke.tta_train_images: 2000 images .* 2048"):
        config.resolve(cfg, CPU_FP)
    cfg["scales"]["smoke"]["tta_train_images"] = 2048
    assert config.resolve(cfg, CPU_FP)["protocol"]["tta_train_images"] == 2048
