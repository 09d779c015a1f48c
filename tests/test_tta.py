"""Time to accuracy: MLPerf's scoring, the LR rules, goodput (pure), the emulated
k-rank step against a real k=2 DDP step (and two mutations it must catch), the
planning of emulated k's, and the worker at k=1 and k=2 over gloo."""
from __future__ import annotations

import re
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
    """One torchrun of tests/tta_equality_worker.py: the real k=2 runs (book's step and
    tuned step), the emulated tuned step and its mutants, the noise probe's cases."""
    out = tmp_path_factory.mktemp("tta") / "real.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(ROOT / "tests/tta_equality_worker.py"), str(out)]
    p = subprocess.run(cmd, env=env_with_src(), capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    found = torch.load(out, weights_only=False)
    return {**torch.load(f"{out}.rank1", weights_only=False), **found}


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
            opt.zero_grad(set_to_none=True)
            step_of_shards(model, opt, X, y)
        return w.state(model)
    finally:
        torch.set_default_dtype(old)


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


@pytest.mark.slow
@pytest.mark.multiproc
def test_emulated_k2_step_equals_real_ddp_and_mutations_fail(real_k2):
    """The book's step: both shards in one process (m = 2) against two DDP ranks."""
    from dpscale.measure.torch_tta import ShardedStep

    def emulated(model, opt, X, y):
        ShardedStep(model, opt, 2)(X, y)

    def global_bn(model, opt, X, y):   # mutation: BatchNorm over the whole global batch
        ShardedStep(model, opt, 1)(X, y)

    def summed(model, opt, X, y):      # mutation: gradients summed over the ranks, not averaged
        for g in opt.param_groups:
            g["lr"] = 0.2              # == lr x sum for plain SGD
        ShardedStep(model, opt, 2)(X, y)

    assert _max_diff(real_k2["plain"], _emulated(emulated)) < TOL
    for mutant in (global_bn, summed):
        assert _max_diff(real_k2["plain"], _emulated(mutant)) > 1e-3, mutant.__name__


@pytest.mark.slow
@pytest.mark.multiproc
def test_the_tuned_step_emulated_equals_it_under_real_ddp_and_mutations_fail(real_k2):
    """The step a GPU runs, less compile and the CUDA graph (tuned_model's transformations,
    channels_last, fused SGD with a tensor lr; bf16 autocast leaves float64 alone):
    emulated k=2 (one process, 2 shards) against real k=2 DDP, fused SGD and plain; the
    same two mutations fail it."""
    real = real_k2["tuned_real"]
    assert _max_diff(real, real_k2["tuned_emulated"]) < TOL
    assert _max_diff(real, real_k2["tuned_emulated_unfused"]) < TOL
    for mutant in ("mutant_global_bn", "mutant_summed"):
        assert _max_diff(real, real_k2[mutant]) > 1e-3, mutant


@pytest.mark.slow
@pytest.mark.multiproc
def test_the_tuned_step_trains_as_the_books_step(real_k2):
    """Real k=2 DDP: the tuned step ends where the book's step ends. Its model dropped
    the convolutions' biases that BatchNorm cancels and folded them into running_mean
    (dpscale.model.tuned_model.drop_bias), so those compare through the fold: the book's
    bias keeps its initial value (its gradient is 0 up to rounding)."""
    from dpscale.model import tuned_model
    from dpscale.model.models import torch_resnet18
    plain, tuned = real_k2["plain"], real_k2["tuned_real"]
    torch.manual_seed(0)
    ref = torch_resnet18().double()
    names = {id(m): n for n, m in ref.named_modules()}
    folded = {}
    for conv, bn in tuned_model.cancelled_bias_pairs(ref):
        folded[f"{names[id(bn)]}.running_mean"] = f"{names[id(conv)]}.bias"
    assert set(plain) - set(tuned) == set(folded.values())
    diffs = [(plain[k] - tuned[k] - (plain[folded[k]] if k in folded else 0)).abs().max().item()
             for k in tuned]
    assert max(diffs) < TOL


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("case", ["w2m1", "w2m2", "w1m2"])
def test_the_noise_probe_in_the_tuned_step_equals_a_direct_computation(real_k2, case):
    """StepNoiseProbe's per-step numbers against each shard's gradient by its own
    backward: w2m1, real k=2 (the synchronising backward, read by the hooks); w1m2,
    emulated k=2 in one process (the growth of .grad); w2m2, k=4 as 2 x 2 (both)."""
    found = real_k2["noise"][case]
    assert found["rel"] < 1e-9, found
    g = found["got"]
    assert g["steps"] == 2 and g["k"] == (2 if case != "w2m2" else 4)
    from dpscale.analysis.stateff import noise
    g2, tr = noise.noise_terms(g["g_small_sq"][0], g["g_big_sq"][0], g["b_small"], g["b_big"])
    assert tr > 0


@pytest.mark.slow
@pytest.mark.multiproc
def test_the_noise_probe_changes_no_parameter_bit(real_k2):
    """float32, with the probe and without: w2m2 reads the hooks (the synchronising backward)
    and the growth of .grad (the first shard); w1m2 the growth through DDP over one process."""
    assert real_k2["bits"] == {"w2m2": 0.0, "w1m2": 0.0}


def _trained(tr, steps: int = 3, m: int = 2, b: int = 4) -> dict:
    """steps on fixed random batches (16 px), then the network's state."""
    g = torch.Generator().manual_seed(7)
    for _ in range(steps):
        X = torch.randint(0, 256, (m * b, 16, 16), generator=g, dtype=torch.uint8)
        tr.step(tr.inputs(X), torch.randint(0, 10, (m * b,), generator=g), 0.1)
    return {k: v.detach().clone() for k, v in tr.net().state_dict().items()}


@pytest.mark.parametrize("tuned", [True, False])
def test_a_reseeded_trainer_trains_as_a_fresh_one(monkeypatch, tuned):
    """One job's seeds share one Trainer (one compile, one captured graph on a GPU):
    seed 1 trained, then reseed(2), trains bit for bit as a Trainer built for seed 2, in
    the same tensors (a graph reads those); without the copy (the mutation) it does not.
    CPU, emulated k=2 with the noise probe: the step a CPU runs (the tuned step's CPU part,
    and the book's)."""
    import torch.distributed as dist
    from types import SimpleNamespace
    from dpscale import registry
    from dpscale.measure import torch_tta
    opts = {k: v for k, v in registry.TTA_STEP.items() if k not in torch_tta.GPU_ONLY} if tuned else None
    ctx = SimpleNamespace(device=torch.device("cpu"), cuda=False, local_rank=0, rank=0, spec={"config": {}})
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        tr = torch_tta.Trainer(ctx, 1, 2, 4, opts, probe_capacity=8)
        ptrs = {k: v.data_ptr() for k, v in tr.net().state_dict().items()}
        _trained(tr)
        tr.reseed(2)
        assert {k: v.data_ptr() for k, v in tr.net().state_dict().items()} == ptrs
        assert tr.probe.pending == 0
        again = _trained(tr)
        fresh = _trained(torch_tta.Trainer(ctx, 2, 2, 4, opts, probe_capacity=8))
        assert again.keys() == fresh.keys() and all(torch.equal(again[k], fresh[k]) for k in fresh)
        real = torch_tta.seeded_net
        monkeypatch.setattr(torch_tta, "seeded_net", lambda seed, o, dev: real(1, o, dev))
        stale = torch_tta.Trainer(ctx, 1, 2, 4, opts, probe_capacity=8)
        _trained(stale)
        stale.reseed(2)   # the mutation: seed 1's weights copied in
        assert not all(torch.equal(v, fresh[k]) for k, v in _trained(stale).items())
    finally:
        dist.destroy_process_group()


def test_an_epochs_order_is_distributed_samplers_interleaving():
    """epoch_order's row s = the shards of this process's ranks at step s, in rank order:
    rank r's batch perm[r::k][s*b:(s+1)*b], as the book's DistributedSampler gives it."""
    from dpscale.measure.torch_tta import epoch_order
    perm = torch.randperm(203, generator=torch.Generator().manual_seed(1))
    k, b = 4, 5
    for ranks in ([0], [1], [2, 3], [0, 1, 2, 3]):
        order = epoch_order(perm, k, b, ranks)
        assert order.shape == (203 // (k * b), len(ranks) * b)
        for s in range(len(order)):
            want = torch.cat([perm[r::k][s * b:(s + 1) * b] for r in ranks])
            assert torch.equal(order[s], want)


def test_the_protocol_evaluates_at_its_cadence_and_the_instrument_only_until_the_crossing():
    """Protocol evaluations every tta_eval_every_epochs of this k's epochs (here 0.5 of 400
    samples: every 200) and at the budget; the instrument's every 100, then every 25 once
    within 0.1 of the target, and none after an evaluation reached it."""
    from dpscale.measure.torch_tta import EvalSchedule
    p = {"tta_eval_every_epochs": 0.5, "tta_train_images": 400, "tta_per_rank_batch": 10,
         "tta_eval_every_samples": 100, "tta_eval_near_every_samples": 25, "tta_eval_near_margin": 0.1,
         "tta_target": 0.9}
    s = EvalSchedule(p, 1)
    seen, due = 0, []
    accs = iter([0.5, 0.81, 0.7, 0.85, 0.95, 0.93, 0.96])
    while len(due) < 7:
        seen += 10
        role = s.role(seen, 10_000)
        if role:
            due.append((seen, role))
            s.done(seen, next(accs))
    assert due == [(100, "instrument"), (200, "protocol"), (230, "instrument"), (250, "instrument"),
                   (280, "instrument"), (400, "protocol"), (600, "protocol")]
    off = EvalSchedule({**p, "tta_eval_every_samples": 0, "tta_eval_near_every_samples": 0}, 1)
    assert off.role(100, 10_000) is None and off.role(150, 150) == "protocol"   # the budget's end is the protocol's
    # k=3: an epoch is 13 steps of 30 (390 samples, drop_last), so the cadence is 195 samples
    assert EvalSchedule(p, 3).next_protocol == 195


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
            "tta_target": 0.01, "tta_eval_every_epochs": 0.5, "tta_eval_every_samples": 32, "tta_eval_near_every_samples": 16,
            "tta_eval_near_margin": 0.05, "tta_max_epochs": 1, "tta_seeds": [1, 2, 3],
            "tta_warmup_epochs": 0.5, "tta_ks_emulated": [], "tta_timeout_s": 120}


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("k,variant", [(1, "book"), (2, "linear"), (4, "book"), (1, "book_fp32")])
def test_tta_worker_scores_its_seeds(tiny_data, tmp_path, k, variant):
    """k=1 and k=2 are real DDP over gloo; k=4 on this 2-device stand-in is emulated (2 x 2 ranks)."""
    drawn = variant == "linear"   # tta_seeds a number: that many seeds drawn fresh from the job's run id
    spec = make_spec(tiny_data, "ddp_tta", k, variant, proto={**TTA_TINY, "tta_seeds": 3} if drawn else TTA_TINY)
    if variant == "book_fp32":   # planned on a CPU and skipped there (it *is* the CPU's step); its code path runs here
        assert spec["skip_reason"] == "book_fp32 needs a CUDA GPU"
        spec["skip_reason"] = None
    rc, res, log = run_job(spec, tmp_path)
    assert rc == 0 and res["status"] == "ok", log[-3000:]
    m = res["metrics"]
    assert m["lr_rule"] == variant and m["target_accuracy"] == 0.01
    if drawn:
        assert isinstance(m["run_id"], int) and m["seeds"] == tta.draw_seeds(m["run_id"], 3)
    else:
        assert m["run_id"] is None and m["seeds"] == [1, 2, 3]
    assert [r["seed"] for r in m["runs"]] == m["seeds"]
    assert m["emulated"] is (k == 4) and m["processes"] == min(k, 2) and m["global_batch"] == 8 * k
    assert m["eval_every_samples"] == 32 and len(m["runs"]) == 3
    for r in m["runs"]:
        assert r["converged"] and r["curve"][0]["samples"] == max(32, 8 * k) == r["samples_to_target"]
        assert 0 < r["eval_s"] < r["seconds_to_target"]   # the protocol's evaluation is on the clock
        assert [pt["role"] for pt in r["curve"]] == ["protocol"] and r["protocol_evaluations"] == 1
        assert r["crossing_status"] == "starts_above" and r["interpolated_samples_to_target"] == r["samples_to_target"]
        assert r["curve"][0]["eval_s"] == r["eval_s"] and r["curve"][0]["train_samples_per_s"] > 0
    assert m["scored"] and m["samples_to_target"] == max(32, 8 * k) and m["tta_s"] > 0
    assert m["interpolated_samples_to_target"] == m["samples_to_target"]
    assert m["crossing_resolution_samples_max"] == max(32, 8 * k)
    assert m["evaluations_total"] == 3 and 0 < m["eval_share_of_clock"] < 1
    assert m["eval_s_per_evaluation"] == pytest.approx(m["eval_s_total"] / 3)
    # which step ran: the CPU's part of the tuned step, or the book's fp32 loop
    assert m["cuda_graph"] is False and m["cuda_graph_error"] is None
    if variant == "book_fp32":
        assert m["step"] is None and m["step_txt"].startswith("the book's step")
    else:
        assert m["step"]["channels_last"] and "compile" not in m["step"] and "precision" not in m["step"]
        assert m["step_txt"].startswith("fp32, channels_last, eager, SGD")
    assert m["noise_probe"] is (k >= 2)
    if k >= 2:
        assert m["b_simple_samples_covers"] and m["noise_steps"] == 3 * max(1, 32 // (8 * k))
        assert all(len(r["noise_g2_grad_sq_steps"]) == r["noise_steps"] for r in m["runs"])
    beats = [line for line in log.splitlines() if "[tta seed " in line]
    assert len(beats) == 3 and re.search(rf"\[tta seed {m['seeds'][0]}\] epoch 0\.\d\d samples [\d,]+ acc \d\.\d{{4}} train "
                                         r"[\d,]+ samples/s clock \d+\.\d s", beats[0]), beats


def test_a_settled_point_launches_no_more_seeds(monkeypatch):
    """Seeds 1 and 2 miss the target: seed 3 is not launched, and the result says why
    there is no score. (The launch itself runs in the worker tests above.)"""
    from types import SimpleNamespace
    from dpscale.measure import torch_tta
    launched = []

    def launch(ctx, seed):
        launched.append(seed)
        return {"seed": seed, "converged": seed > 2, "eval_s": 0.1, "evaluations": 1, "eval_s_max": 0.1, "clock_s": 1.0,
                "protocol_evaluations": 1, "instrument_evaluations": 0, "instrument_s": 0.0,
                "cuda_graph": False, "warmup_s": 0.0, "crossing_resolution_samples": None,
                **{f"{m}_to_target": None if seed <= 2 else 1.0 for m in tta.MEASURES + tta.INTERPOLATED}}
    monkeypatch.setattr(torch_tta, "one_launch", lambda ctx, seed, tr: launch(ctx, seed))
    monkeypatch.setattr(torch_tta, "trainer", lambda ctx, seed, tr: None)
    ctx = SimpleNamespace(proto=TTA_TINY, spec={"k": 1, "variant": "book", "config": {"variant": {"lr_scaling": "constant"}}},
                          world=1, rank=0)
    m = torch_tta.exp_tta(ctx)
    assert launched == [1, 2] and m["not_launched_seeds"] == [3] and [r["seed"] for r in m["runs"]] == [1, 2]
    assert not m["scored"] and m["no_result_reason"].endswith("seeds 3 not launched (the score was settled)")
    launched.clear()
    m = torch_tta.exp_tta(SimpleNamespace(**{**vars(ctx), "proto": {**TTA_TINY, "tta_seeds": [3, 4, 1]}}))
    assert launched == [3, 4, 1] and m["not_launched_seeds"] == [] and m["scored"]   # one miss: all launched


def test_a_measurement_draws_fresh_seeds_from_its_run_id_unless_they_are_listed(monkeypatch):
    """tta_seeds a number: each job draws a new 63-bit run id (rank 0's, broadcast) and that
    many distinct 31-bit seeds from it, the same seeds for the same id; a list is used as
    listed, with no run id. The job's protocol (its Snakemake params) is the same for both
    draws."""
    from types import SimpleNamespace
    from dpscale.measure import torch_tta
    monkeypatch.setattr(torch_tta.dist, "broadcast", lambda t, src: None)
    ctx = SimpleNamespace(proto={**TTA_TINY, "tta_seeds": 5}, rank=0, device=torch.device("cpu"))
    (a, ida), (b, idb) = torch_tta.seeds_of(ctx), torch_tta.seeds_of(ctx)
    assert ida != idb and not set(a) & set(b) and len(set(a)) == len(a) == 5
    assert a == tta.draw_seeds(ida, 5) and all(0 <= s < 2 ** 31 for s in a + b)
    assert tta.draw_seeds(ida, 3) == a[:3]
    assert torch_tta.seeds_of(SimpleNamespace(proto=TTA_TINY)) == ([1, 2, 3], None)


def test_too_few_images_for_the_largest_k_names_the_key():
    from dpscale.plan import config
    # smoke: 2,000 images, 8 a rank: k=256 needs 2,048 for one global batch
    cfg = {"scale": "smoke", "ks": [1, 2, 256], "hardware_file": None, "tuned": "auto", "experiments": "all",
           "watchdog": {"hang_timeout_s": "auto", "grace_s": 15}, "data": {"source": "auto"},
           "scales": {"smoke": {"global_batch": 256}}}
    with pytest.raises(config.ConfigError, match=r"scales.smoke.tta_train_images: 2000 images .* 2048"):
        config.resolve(cfg, CPU_FP)
    cfg["scales"]["smoke"]["tta_train_images"] = 2048
    assert config.resolve(cfg, CPU_FP)["protocol"]["tta_train_images"] == 2048


def test_b_simple_pooled_over_seeds_keeps_each_block_within_one_seed():
    """One run: the same ratio as b_simple_window. Two runs: the ratio of the means over
    every step, the interval from blocks cut within each run (20 blocks of 10 steps)."""
    import numpy as np
    from dpscale.analysis.stateff import noise
    rng = np.random.default_rng(0)
    runs = [(rng.normal(2.0, 0.3, 100), rng.normal(50.0, 5.0, 100)), (rng.normal(1.0, 0.3, 37), rng.normal(60.0, 5, 37))]
    one = noise.b_simple_pooled(runs[:1])
    assert one["b_simple"] == pytest.approx(noise.b_simple_window(*runs[0])["b_simple"])
    both = noise.b_simple_pooled(runs)
    g2, tr = np.concatenate([r[0] for r in runs]), np.concatenate([r[1] for r in runs])
    assert both["b_simple"] == pytest.approx(tr.mean() / g2.mean()) and both["steps"] == 137
    assert both["blocks"] == 20 and both["ci_lo"] < both["b_simple"] < both["ci_hi"] and both["covers"] == noise.POOLED
    assert noise.b_simple_pooled([([1.0], [2.0])])["ci_lo"] is None


def test_interpolated_crossings_are_scored_as_mlperf_scores():
    runs = [{"seed": s, "converged": True, **{f"{m}_to_target": v for m in tta.INTERPOLATED}} for s, v in
            ((1, 3.0), (2, 1.0), (3, 2.0))]
    f = tta.score_measures(runs, tta.INTERPOLATED)
    assert f["interpolated_samples_to_target"] == 2.0 and f["interpolated_epochs_to_target_kept_seeds"] == [3]


# ---------------------------------------------------------------- the job's clock, not the instrument's

class _SlowTrainer:
    """A Trainer stand-in whose pass takes `per_image_s` a test image (a real clock, no
    network) and counts every image right: what evaluation() times is then readable off
    the number of images each pass saw."""
    probe = None

    def __init__(self, per_image_s: float):
        self.per_image_s, self.passes = per_image_s, []

    def correct(self, x, y):
        import time as _t
        _t.sleep(self.per_image_s * len(x))
        self.passes.append(len(x))
        return torch.tensor([len(x), len(x)], dtype=torch.int64)


@pytest.fixture
def one_process_group(tmp_path):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("k", [1, 4, 8])
def test_a_protocol_evaluation_charges_one_ranks_shard_and_the_instrument_charges_nothing(one_process_group, k):
    """At k ranks emulated in one process, the clock is charged the pass over one rank's
    shard (test_images / k images) and the reduction, as k ranks run it side by side: never
    the whole set's pass, nor a one-device time divided by k. An instrument's evaluation
    (locating the crossing) charges nothing and the clock does not advance for it. The
    accuracy is the whole test set's either way."""
    from types import SimpleNamespace
    from dpscale.measure import torch_tta
    n, per_image = 200, 0.0004
    ctx = SimpleNamespace(spec={"k": k}, world=1, rank=0, device=torch.device("cpu"),
                          proto={"tta_train_images": 1000}, gpu=None)
    xt, yt = torch.zeros(n, 4, 4), torch.zeros(n, dtype=torch.int64)
    tr = _SlowTrainer(per_image)
    curve = torch_tta.Curve(ctx, 7, 0.0, 0.0)
    acc = torch_tta.evaluation(ctx, tr, curve, 100, xt, yt, None, "protocol")
    assert acc == 1.0 and sorted(tr.passes) == sorted(len(range(r, n, k)) for r in range(k))   # every image once
    p = curve.points[-1]
    shard = len(range(0, n, k))
    assert p["role"] == "protocol" and p["eval_images"] == shard
    # charged: one shard's pass (sleep-timed), not the set's, and more than the set's time / k's floor
    assert per_image * shard <= p["eval_s"] < per_image * shard + 0.25 * per_image * n + 0.02
    if k > 1:
        assert p["eval_wall_s"] >= per_image * n and p["eval_s"] < p["eval_wall_s"]
    clock_before = p["seconds"]
    torch_tta.evaluation(ctx, tr, curve, 200, xt, yt, None, "instrument")
    q = curve.points[-1]
    assert q["role"] == "instrument" and q["eval_s"] == 0 and q["eval_images"] == 0
    assert q["eval_wall_s"] >= per_image * n
    # the clock moved by the training time between the two (none here), not by the instrument's pass
    assert q["seconds"] - clock_before < 0.02 < per_image * n


@pytest.mark.slow
@pytest.mark.multiproc
def test_an_emulated_job_charges_its_sharded_protocol_evaluations_and_not_the_instruments(tiny_data, tmp_path):
    """k=4 emulated on 2 gloo processes (2 ranks each), a target no network reaches, one
    epoch of 64 images at a global batch of 32: the instrument evaluates at 32 samples, the
    protocol at 64 (its cadence, once per epoch, and the budget). From the result's own
    per-evaluation records: the instrument's charges nothing, the protocol's pass is one
    rank's shard (32 test images / 4), and e, as the report computes it
    (report.tta.eval_per_sample), is the protocol's charged seconds over the samples trained."""
    from dpscale.report import tta as rtta
    proto = {**TTA_TINY, "tta_target": 0.999, "tta_eval_every_epochs": 1, "tta_eval_every_samples": 32,
             "tta_eval_near_every_samples": 0, "tta_seeds": [1, 2]}
    spec = make_spec(tiny_data, "ddp_tta", 4, "book", proto=proto)
    rc, res, log = run_job(spec, tmp_path)
    assert rc == 0 and res["status"] == "ok", log[-3000:]
    m = res["metrics"]
    assert m["emulated"] and m["processes"] == 2 and m["ranks_per_process"] == 2
    for run in m["runs"]:
        roles = [(pt["samples"], pt["role"]) for pt in run["curve"]]
        assert roles == [(32, "instrument"), (64, "protocol")], roles
        inst, prot = run["curve"]
        assert inst["eval_s"] == 0 and inst["eval_images"] == 0 and inst["eval_wall_s"] > 0
        assert prot["eval_images"] == 32 // 4 and 0 < prot["eval_s"] <= prot["eval_wall_s"]
        assert run["eval_s"] == prot["eval_s"] and run["instrument_evaluations"] == 1
        # the clock between the two: the training between them and the protocol's charged pass, nothing else
        assert prot["seconds"] - inst["seconds"] == pytest.approx(32 / prot["train_samples_per_s"] + prot["eval_s"])
        assert run["instrument_s"] == pytest.approx(inst["eval_wall_s"] + prot["eval_wall_s"] - prot["eval_s"])
    e = sum(pt["eval_s"] for run in m["runs"] for pt in run["curve"] if pt["role"] == "protocol") / \
        sum(run["samples_trained"] for run in m["runs"])
    assert rtta.eval_per_sample({"clock_runs": m["runs"]}) == pytest.approx(e, rel=1e-12)
    assert m["protocol_evaluations_total"] == 2 and m["instrument_evaluations_total"] == 2
