"""The forecast (dpscale.analysis.forecast): it recovers known alpha, beta, exposed
fraction and straggler spread from synthetic measurements made with noise by formulas
written here, independently of the module, and predicts the k it was not shown; a mutated
model (the overlap term dropped, the ring's 2(k-1)/k lost) is rejected by the same check.
The validation is out of sample by construction (no row reads a training measurement at
the k it predicts), moves when the fabric is wrong, sits beside two naive predictors and
reports its band's coverage. Pure and cheap: no torch, no report."""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from dpscale.analysis.forecast import check, fit, model as fc, predict
from dpscale.analysis.forecast.inputs import EPOCHS, LAUNCHES, Rate, Series, Sweep, harmonic

ROOT = Path(__file__).resolve().parents[1]
TRUE = {"alpha_s": 20e-6, "beta_Bps": 10e9, "exposed": 0.6, "sigma_s": 1.5e-3, "a_s": 2e-3, "b_s": 0.1e-3,
        "inter_Bps": 2.5e9, "inter_alpha_s": 5e-6}
BUCKETS = (2**20, 25 * 2**20, 25 * 2**20, 20 * 2**20)
B, G = 256, 512
SCHEMA = yaml.safe_load((ROOT / "schemas" / "config.schema.yaml").read_text())["properties"]["forecast"]
CFG = {**{k: v["default"] for k, v in SCHEMA["properties"].items()}, "bootstrap_draws": 40}
INTER = fit.Given(inter=fc.Fabric(TRUE["inter_alpha_s"], TRUE["inter_Bps"], 16, "test"), per_node=8, source="test",
                  inter_source="test")


def build(s, k, rule="any", given=fit.Given(), **kw):
    """fit.build on a fresh log: (model, what it read)."""
    log = []
    return fit.build(s.reading(log), k, rule, given, **kw), log


def ring(S, k, alpha, beta):
    return 0.0 if k < 2 else 2 * (k - 1) / k * S / beta + 2 * (k - 1) * alpha


def bucket_time(S, k, per_node=8):
    t = TRUE
    if k <= per_node:
        return ring(S, k, t["alpha_s"], t["beta_Bps"])
    n = k // per_node
    return ring(S, per_node, t["alpha_s"], t["beta_Bps"]) + 2 * (n - 1) / n * S / t["inter_Bps"] + \
        2 * (n - 1) * t["inter_alpha_s"]


def true_comm(k, batch):
    """Exposed communication: the fraction TRUE["exposed"] of the buckets' all-reduces in
    the node, the tier between nodes in full (what nothing measured hides: model.py)."""
    if k < 2:
        return 0.0
    inside = sum(bucket_time(S, min(k, 8)) for S in BUCKETS)
    return TRUE["exposed"] * inside + sum(bucket_time(S, k) for S in BUCKETS) - inside


@functools.cache
def e_max(k):
    """E[max of k standard normals], by Monte Carlo (not the module's integral)."""
    rng = np.random.default_rng(k)
    return float(rng.standard_normal((400_000, k)).max(axis=1).mean()) if k > 1 else 0.0


def true_step(batch, k):
    t = TRUE
    return t["a_s"] + t["b_s"] * batch + true_comm(k, batch) + t["sigma_s"] * e_max(k)


def rate(k, batch, rng, noise) -> Rate:
    reps = tuple(k * batch / true_step(batch, k) * (1 + noise * rng.standard_normal()) for _ in range(5))
    return Rate(reps[0], (), reps)


def synthetic(ks=(1, 2, 4), noise=0.003, seed=0, sweep_scale=1.0) -> Series:
    rng = np.random.default_rng(seed)
    sweeps, probes = {}, {}
    for k in (k for k in ks if k >= 2):
        sizes = tuple(float(2**p) for p in range(20, 31))
        sweeps[k] = Sweep(sizes, tuple(sweep_scale * ring(S, k, TRUE["alpha_s"], TRUE["beta_Bps"])
                                       * (1 + noise * rng.standard_normal()) for S in sizes), k)
        probes[k] = tuple(true_comm(k, B) * (1 + 5 * noise * rng.standard_normal()) for _ in range(30))
    return Series("DDP [seed]", B, G, {k: rate(k, B, rng, noise) for k in ks},
                  {k: rate(k, G // k, rng, noise) for k in ks}, {}, TRUE["sigma_s"], "true sigma", probes, BUCKETS,
                  "test buckets", sweeps)


def test_expected_max_of_k_normals_closed_forms():
    assert fc.expected_max_normal(1) == 0.0
    assert fc.expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    assert fc.expected_max_normal(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), rel=1e-6)
    assert fc.expected_max_normal(8) == pytest.approx(e_max(8), abs=0.01)


def test_fit_recovers_alpha_beta_from_a_noisy_sweep():
    rng = np.random.default_rng(1)
    sizes = [2**p for p in range(20, 31)]
    times = [ring(s, 4, 20e-6, 100e9) * (1 + 0.01 * rng.standard_normal()) for s in sizes]
    fab = fc.fit_fabric(sizes, times, 4)
    assert fab.beta_Bps == pytest.approx(100e9, rel=0.03)
    assert fab.alpha_s == pytest.approx(20e-6, rel=0.25)


def test_recovers_exposed_fraction_straggler_and_compute():
    m, used = build(synthetic(), 4, "any")
    assert m.exposed == pytest.approx(TRUE["exposed"], rel=0.05) and m.overlap == "fraction"
    assert m.fabric.beta_Bps == pytest.approx(TRUE["beta_Bps"], rel=0.03)
    assert m.compute_b_s == pytest.approx(TRUE["b_s"], rel=0.03)
    assert {u.text() for u in used} == {"throughput k=1 (weak)", "throughput k=1 (strong)", "sweep k=4", "probe k=4",
                                        "buckets (test buckets)", "step spread k=1 (k=1's per-rank p10/p90)"}


C_RANKS = 0.08   # ranks on cores of different speeds: per-rank sd, a share of t_c


def t_c(batch):
    return TRUE["a_s"] + TRUE["b_s"] * batch


def spread_series(rng) -> Series:
    """Weak and strong points whose ranks run at speeds t_c (1 + C_RANKS z), z normal per
    rank, the step the slowest's; k=1's own steps steady (sigma 0); probes at 2 and 4 that
    record their no_sync() trials' (slowest - mean) / mean from simulated ranks."""
    def step(batch, k):
        return t_c(batch) * (1 + C_RANKS * e_max(k)) + true_comm(k, batch)

    def shares(k):
        z = 1 + C_RANKS * rng.standard_normal((30, k))
        return tuple((z.max(axis=1) - z.mean(axis=1)) / z.mean(axis=1))
    weak = {k: Rate(k * B / step(B, k), (), (k * B / step(B, k),) * 2) for k in (1, 2, 4, 8)}
    strong = {k: Rate(G / step(G / k, k), (), (G / step(G / k, k),) * 2) for k in (1, 2, 4, 8)}
    base = synthetic(ks=(1, 2, 4, 8), noise=0.0)
    return dataclasses.replace(base, weak=weak, strong=strong, sigma_s=0.0, sigma_how="k=1 steady",
                               probes={k: v for k, v in base.probes.items() if k < 8},
                               stragglers={2: shares(2), 4: shares(4)}), step


def test_the_straggler_between_ranks_from_the_probe_below_k():
    """k=8's straggler from the k=4 probe's ranks (never anything at 8): within a point of
    the truth; read from k=1's steady steps instead (the term that missed on the 16-core
    stand-in), the same row misses by several."""
    s, step = spread_series(np.random.default_rng(3))
    m, used = build(s, 8, "below_k")
    assert "probe k=4 (its ranks' no_sync() spread)" in {u.text() for u in used}
    assert all(u.k != 8 for u in used if u.kind == "probe")
    want_ms = 1e3 * C_RANKS * e_max(8) * t_c(B)
    assert 1e3 * fc.straggler_time(m, 8, B) == pytest.approx(want_ms, rel=0.15)
    truth = step(B, 1) / step(B, 8)
    assert abs(fc.weak_efficiency(m, B, 8) - truth) < 0.01
    blind, _ = build(dataclasses.replace(s, stragglers={}), 8, "below_k")
    assert abs(fc.weak_efficiency(blind, B, 8) - truth) > 0.03


def test_a_pinned_cpu_rank_hides_nothing_in_one_host_where_nothing_ran_below_k():
    """k=2 with nothing below: a series whose ranks cannot run the all-reduce beside the
    backward takes f = 1 in one host, the simulated overlap otherwise; a probe below k
    still sets f where there is one, and a prediction across nodes keeps the simulation."""
    why = "each gloo rank is pinned to its own 1 core(s)"
    pinned = dataclasses.replace(synthetic(ks=(1, 2, 4)), no_overlap=why)
    m, used = build(pinned, 2, "at_k")
    assert (m.overlap, m.exposed) == ("fraction", 1.0) and why in m.notes[-1]
    assert fit.Used("no overlap", None, why) in used and m.rules == (fit.PINNED_F1.name,)
    assert fc.exposed_comm_time(m, 2, B) == pytest.approx(fc.allreduce_time(m, 2))
    assert build(synthetic(ks=(1, 2, 4)), 2, "at_k")[0].overlap == "simulated"
    m4, _ = build(pinned, 4, "below_k")
    assert m4.exposed == pytest.approx(TRUE["exposed"], rel=0.05) and not m4.rules
    across = dataclasses.replace(pinned, internode=Sweep((2.0**20, 2.0**24), (1e-3, 1e-2), 2, 2))
    m2, _ = build(across, 2, "at_k", nodes=2, per_node=1)
    assert m2.overlap == "simulated" and m2.rules == (fit.PINNED_F1.name,)   # the exception: part of the rule


def test_a_band_carries_the_spread_of_the_mean_measured_nearest_below_k():
    """A measurement at k is held against a band with the spread of the measured mean of
    the largest k' < k that has one (cv / sqrt(n): a mean of n launches, not one launch),
    not k=1's alone (on a shared host, ranks side by side spread more)."""
    s = synthetic(ks=(1, 2, 4))
    wide = Rate(s.weak[2].value, (), tuple(s.weak[2].value * x for x in (0.8, 1.0, 1.2)))
    s = dataclasses.replace(s, weak={**s.weak, 2: wide})
    assert fit.spread(s.reading(), "weak", below=4) == pytest.approx(wide.cv() / math.sqrt(3))
    assert fit.spread(s.reading(), "weak", below=2) == pytest.approx(s.weak[1].cv() / math.sqrt(5))
    assert fit.spread(s.reading()) == pytest.approx(s.weak[1].cv() / math.sqrt(5))


def test_hierarchical_all_reduce_against_the_formula():
    intra, inter = fc.Fabric(20e-6, 100e9, 8), fc.Fabric(5e-6, 25e9, 0)
    S = 2**30
    want = ring(S, 8, 20e-6, 100e9) + 2 * 3 / 4 * S / 25e9 + 2 * 3 * 5e-6
    assert fc.hierarchical_time(S, 4, 8, intra, inter) == pytest.approx(want, rel=1e-9)
    got = fc.fit_internode([2**p for p in range(20, 30)], [fc.hierarchical_time(2**p, 4, 8, intra, inter)
                                                           for p in range(20, 30)], 4, 8, intra)
    assert got.beta_Bps == pytest.approx(25e9, rel=1e-6) and got.alpha_s == pytest.approx(5e-6, rel=1e-3)


def forecast_error_points() -> float:
    """Largest |predicted - true| weak/strong efficiency, in points, at the k the model
    was not shown: k = 8 in the node, 2 and 4 nodes of 8 (from measured k = 1, 2, 4)."""
    rows = predict.grid(synthetic(), INTER, CFG)["rows"]
    errs = []
    for r in rows:
        k = r["k"]
        if k in (8, 16, 32):
            errs.append(abs(r["weak_efficiency"] - true_step(B, 1) / true_step(B, k)))
            errs.append(abs(r["strong_efficiency"] - true_step(G, 1) / (k * true_step(G / k, k))))
    return 100 * max(errs)


def drop_overlap(monkeypatch):
    monkeypatch.setattr(fc, "exposed_comm_time", lambda m, k, batch: fc.allreduce_time(m, k))


def lose_the_ring_factor(monkeypatch):
    monkeypatch.setattr(fc, "ring_time", lambda S, k, fab: 0.0 if k <= 1 else S / fab.beta_Bps + 2 * (k - 1) * fab.alpha_s)


@pytest.mark.parametrize("mutate, accepted", [(None, True), (drop_overlap, False), (lose_the_ring_factor, False)],
                         ids=["model", "overlap-dropped", "ring-factor-lost"])
def test_forecast_of_unseen_k_accepts_the_model_and_rejects_mutants(monkeypatch, mutate, accepted):
    if mutate:
        fc._buckets_time.cache_clear()
        mutate(monkeypatch)
    try:
        assert bool(forecast_error_points() < 0.5) is accepted
    finally:
        fc._buckets_time.cache_clear()


def validated(s, given=fit.Given()):
    """Every validation row of s with its band (the misfit from its own rows only)."""
    return check.calibrate(check.validation(s, given, CFG), "test", [], CFG)


def with_stragglers(s):
    """s with its probes' ranks recorded apart at every k a probe ran, the predicted k's
    included: a row that read them there would leak."""
    rng = np.random.default_rng(11)
    return dataclasses.replace(s, stragglers={k: tuple(0.02 + 0.01 * rng.random(30)) for k in s.probes})


def test_every_validation_row_is_out_of_sample_and_lists_what_it_read():
    """No row reads anything measured at the k it predicts but the at_k rule's bare
    all-reduce, by the log of what it read (inputs.Reading); every input it used is there,
    the band's spread, the buckets and k=1's step spread included."""
    rows = validated(synthetic(ks=(1, 2, 4, 8)))
    k8 = [r for r in rows if r["k"] == 8 and r["scaling"] == "weak"]
    assert {r["rule"] for r in k8} == {"at_k", "below_k"}
    for r in rows:
        assert not check.leaks(r), (r["rule"], r["k"], r["inputs"])
        if r["rule"] == "below_k":
            assert all(u.k != r["k"] for u in r["used"]), r["inputs"]
        assert "buckets (test buckets)" in r["inputs"]
        assert r["error_points"] == pytest.approx(100 * (r["predicted"] - r["measured"]))
        assert r["predicted_lo"] < r["predicted_hi"]
        assert abs(r["error_points"]) < 1.0 or r["overlap"] == "simulated", r   # the truth here is a fraction
    straggled = check.validation(with_stragglers(synthetic(ks=(1, 2, 4, 8))), fit.Given(), CFG)
    assert straggled and not any(check.leaks(r) for r in straggled)
    below8 = next(r for r in straggled if r["k"] == 8 and r["rule"] == "below_k" and r["scaling"] == "weak")
    assert {"probe k=4 (its ranks' no_sync() spread)", "throughput k=4 (weak)", "sweep k=4"} <= set(below8["inputs"])
    # a read at k, whatever the code called it, is seen
    leaky = dict(k8[0], used=k8[0]["used"] + [fit.Used("probe", 8)])
    assert check.leaks(leaky) == ["probe k=8"]


def test_a_read_at_the_predicted_k_is_seen_whatever_its_label(monkeypatch):
    """The audit's mutation: the straggler term taken from the probe at the predicted k
    but labelled a smaller k. Under labels it passed every test; read through the log it
    is a leak."""
    def mislabelled(s, k, rule, m, rng=None):
        kp = max((x for x in s.stragglers if x < k), default=None)
        if kp is None or k not in s.stragglers:
            return fit_straggler(s, k, rule, m, rng)
        c = fc.straggler_cv(list(s.stragglers[k]), k)   # read at k ...
        return m.with_(sigma_s=0.0, straggler_cv=c, notes=m.notes + (f"straggler from the probe at k={kp}",))  # ... said kp
    fit_straggler = fit.straggler
    monkeypatch.setattr(fit, "straggler", mislabelled)
    rows = check.validation(with_stragglers(synthetic(ks=(1, 2, 4, 8))), fit.Given(), CFG)
    assert any("probe k=8 (its ranks' no_sync() spread)" in check.leaks(r) for r in rows if r["k"] == 8)


def test_a_series_read_outside_its_declared_fields_is_refused():
    r = synthetic().reading()
    with pytest.raises(AttributeError, match="not a declared input"):
        r.weak_secret
    assert r.per_rank_batch == B and not r.log   # the protocol is not a measurement
    r.sigma_s, r.buckets, list(r.probes), 2 in r.sweeps
    assert [u.kind for u in r.log] == ["step spread", "buckets"]   # keys are not reads


def test_a_fabric_ten_times_wrong_moves_every_row_that_predicts_from_it():
    """With the probe's fraction at the predicted k, alpha and beta cancelled and every DDP
    row stayed bit-identical under a fabric 10x wrong. Out of sample, a row moves when a
    fabric it predicts with is wrong: the sweep at k (at_k rows) or, where nothing ran below
    k, the one it simulates with. A row anchored on a smaller k's probe and predicting from
    that same k's sweep cancels the sweep's level (f T(k) / T(k')): what it tests is the
    fabric's growth with k, and a wrong growth moves it (the ring factor lost, below)."""
    s = synthetic(ks=(1, 2, 4, 8))
    good = {(r["scaling"], r["k"], r["rule"]): r["predicted"] for r in check.validation(s, fit.Given(), CFG)}
    for k in (2, 4, 8):
        sw = s.sweeps[k]
        wrong = dataclasses.replace(s, sweeps={**s.sweeps, k: dataclasses.replace(sw, time_s=tuple(10 * t for t in sw.time_s))})
        for r in check.validation(wrong, fit.Given(), CFG):
            moved = abs(r["predicted"] - good[(r["scaling"], r["k"], r["rule"])]) > 1e-3
            sweeps = {u.k for u in r["used"] if u.kind == "sweep"}
            cancels = sweeps == {k} and r["overlap"] == "fraction"   # anchored and predicted on one sweep
            assert moved is (k in sweeps and not cancels), (k, r["scaling"], r["k"], r["rule"], r["inputs"])


def test_a_wrong_growth_with_k_moves_the_rows_from_below(monkeypatch):
    good = {(r["scaling"], r["k"]): r["predicted"] for r in check.validation(synthetic(ks=(1, 2, 4, 8)), fit.Given(), CFG)
            if r["rule"] == "below_k"}
    fc._buckets_time.cache_clear()
    lose_the_ring_factor(monkeypatch)
    try:
        bad = [r for r in check.validation(synthetic(ks=(1, 2, 4, 8)), fit.Given(), CFG) if r["rule"] == "below_k"]
    finally:
        fc._buckets_time.cache_clear()
    assert bad and all(abs(r["predicted"] - good[(r["scaling"], r["k"])]) > 1e-3 for r in bad)


def test_overhead_naive_predictors_and_coverage_beside_each_row():
    s = synthetic(ks=(1, 2, 4, 8))
    rows = validated(s)
    r = next(x for x in rows if x["k"] == 8 and x["scaling"] == "weak" and x["rule"] == "below_k")
    e4 = s.weak[4].estimate() / (4 * s.weak[1].estimate())
    assert r["naive_constant"] == pytest.approx(e4)
    t_c = B / s.weak[1].estimate()   # the compute line passes through k=1's point at B (two batches: close)
    over4 = B / (s.weak[4].estimate() / 4) - t_c
    assert r["naive_ring"] == pytest.approx(t_c / (t_c + over4 * (14 / 8) / (6 / 4)), rel=2e-3)
    assert r["measured_overhead_ms"] > 0 and r["predicted_overhead_ms"] > 0
    bare = r["naive_bare"]   # the model's inputs, nothing hidden, no straggler
    m, _ = build(s, 8, "below_k")
    full = fc.StepModel(m.compute_a_s, m.compute_b_s, m.fabric, m.buckets)
    assert bare == pytest.approx(fc.weak_efficiency(full, B, 8))
    summ = check.summary(rows)
    assert summ["model"]["n"] == len(rows) and summ["banded"] == len(rows) and 0 <= summ["coverage"] <= 1
    assert summ["model"]["mean_abs"] < summ["naive_constant"]["mean_abs"]
    assert summ["verdict"]["winner"] == "model" and summ["verdict"]["naive_bare"]["n"] == len(rows)


def test_a_rate_is_total_samples_over_total_time_and_never_pools_launches_with_epochs():
    one = Rate(100.0, (), (100.0, 50.0))
    assert one.units()[0] == EPOCHS and one.estimate() == pytest.approx(2 / (1 / 100 + 1 / 50))
    three = Rate(100.0, ((100.0, 110.0), (90.0, 95.0), (120.0,)), (100.0, 110.0))
    kind, xs = three.units()
    assert kind == LAUNCHES and len(xs) == 3 and xs[0] == pytest.approx(harmonic([100, 110]))
    assert three.estimate() == pytest.approx(harmonic(xs))


def test_measured_once_the_band_carries_the_misfit_not_a_borrowed_spread():
    """Measured once, a row's noise is not known: its band is the inputs' draws widened by
    the misfit of other rows (whose errors count whole), never another machine's spread."""
    s = synthetic()
    once = dataclasses.replace(s, weak={k: Rate(r.value) for k, r in s.weak.items()},
                               strong={k: Rate(r.value) for k, r in s.strong.items()})
    rows = check.validation(once, fit.Given(), CFG)
    assert rows and all(r["noise"] == "not known: measured once" for r in rows)
    wrong = [dataclasses.replace(check.residual(r, "other"), error_log=0.05) for r in rows]
    banded = check.calibrate(rows, "this", wrong, CFG)
    assert all(r["misfit"] > 0.02 and r["predicted_hi"] - r["predicted_lo"] > 0.05 for r in banded)


def test_the_measured_efficiency_carries_its_own_interval_computed_on_the_ratio():
    """e(k) = mean(1/r at 1) / (k mean(1/r at k)) over launches: its 90% interval covers the
    true efficiency in about 90% of simulated series (Fieller, Welch), where a percentile
    of the two rates' own intervals or the point alone would not say; one replicate: none."""
    rng, true_e, hits, n = np.random.default_rng(7), 0.6, 0, 400
    for _ in range(n):
        one = tuple(tuple([100.0 * (1 + 0.08 * rng.standard_normal())]) for _ in range(3))
        eight = tuple(tuple([8 * 100.0 * true_e * (1 + 0.12 * rng.standard_normal())]) for _ in range(4))
        s = dataclasses.replace(synthetic(), weak={1: Rate(one[0][0], one), 8: Rate(eight[0][0], eight)})
        iv = predict.measured_interval(s, "weak", 8, 0.9)
        assert iv["lo"] < predict.measured_efficiency(s, "weak", 8) < iv["hi"] and iv["covers"] == LAUNCHES
        hits += iv["lo"] <= true_e <= iv["hi"]
    assert 0.85 <= hits / n <= 0.96, hits / n
    alone = dataclasses.replace(synthetic(), weak={1: Rate(100.0), 8: Rate(400.0, (), (400.0, 410.0))})
    iv = predict.measured_interval(alone, "weak", 8, 0.9)
    assert iv["lo"] is None and iv["hi"] is None and iv["covers"]
    rows = validated(synthetic(ks=(1, 2, 4, 8)))
    assert all(r["measured_lo"] < r["measured"] < r["measured_hi"] for r in rows)
    summ = check.summary(rows)
    assert summ["with_measured_interval"] == len(rows) and summ["measured_halfwidth_max_points"] > 0


def test_knee_is_the_last_k_at_or_above_the_threshold():
    assert fc.knee([1, 2, 4, 8], [1.0, 0.9, 0.81, 0.7], 0.8) == 4
    assert fc.knee([1, 2, 4], [1.0, 0.9, 0.85], 0.8) is None


def test_the_simulated_overlap_by_hand():
    """Buckets ready evenly over the backward, all-reduced one after another: what runs
    past the backward's end is exposed (computed here by hand for two buckets)."""
    m = fc.StepModel(0.0, 1e-3, fc.Fabric(0.0, 1e9, 2), (1e6, 3e6), backward_share=0.5)
    # t_c(10) = 10 ms, backward 5 ms; bucket 1 ready at 1.25 ms, 1 ms long; bucket 2 ready at 5 ms, 3 ms long
    assert fc.simulated_exposed(m, 2, 10) == pytest.approx(3e-3)
    quick = m.with_(fabric=fc.Fabric(0.0, 1e12, 2))
    assert fc.simulated_exposed(quick, 2, 10) == pytest.approx(3e-6)


def test_book_k4_from_k_up_to_2_within_5_points():
    from dpscale.report import book as bookmod, forecast as fcr
    m = bookmod.load(bookmod.PATH)
    f = fcr.of_machine(m, CFG, fit.Given())
    got = {(r["series"], r["scaling"]): r for r in f["validation"] if r["k"] == 4 and r["rule"] == "below_k"}
    assert set(got) == {("DDP [seed]", "weak"), ("DDP [seed]", "strong"), ("JAX [host]", "weak")}
    for r in got.values():
        assert abs(r["error_points"]) < 5 and not check.leaks(r), r


def test_cli_prints_the_forecast_and_the_validation_from_kept_results(capsys, tmp_path):
    from dpscale import cli
    out = tmp_path / "forecast.json"
    assert cli.main(["forecast", str(ROOT / "reference" / "h200x2"), "--bootstrap-draws", "10",
                     "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "== h200x2" in text and "== book" in text and "validation, every row: mean |error|" in text
    assert "DDP [seed] weak   k=2   k=1 compute + fabric at k" in text
    assert "DDP [seed] weak   k=4   k=1 compute + fabric and overlap below k only" in text   # the book's k=4
    import json
    rec = json.loads(out.read_text())
    assert rec["settings"]["bootstrap_draws"] == 10
    assert [r["k"] for r in rec["machines"][0]["series"][0]["rows"]][-1] == 128


def test_cli_reads_a_folder_named_twice_once(capsys):
    """reference/x and reference/x/ were two machines: the pooled coverage counted each row twice."""
    from dpscale import cli
    x2 = ROOT / "reference" / "h200x2"
    assert cli.main(["forecast", str(x2), f"{x2}/", "--no-book", "--bootstrap-draws", "10"]) == 0
    assert capsys.readouterr().out.count("== h200x2") == 1


def test_cli_names_a_folder_without_runs(tmp_path):
    from dpscale import cli
    with pytest.raises(SystemExit, match="has no runs/ folder"):
        cli.main(["forecast", str(tmp_path)])


@pytest.mark.parametrize("option, value, said", [
    ("--max-nodes", "0", "0 is less than the minimum of 1"),
    ("--gpus-per-node", "-1", "-1 is less than the minimum of 1"),
    ("--knee-efficiency", "80", "80.0 is greater than the maximum of 1"),
    ("--bootstrap-draws", "0", "0 is less than the minimum of 10"),
    ("--max-nodes", "100000", "100000 is greater than the maximum of 1024"),
    ("--bootstrap-draws", "ten", "'ten' is not a whole number")])
def test_cli_holds_an_option_to_the_schemas_bounds(option, value, said, capsys):
    """--max-nodes 0 forecast no node, --knee-efficiency 80 a knee of 8000%,
    --gpus-per-node 0 a math domain error: an audit's findings."""
    from dpscale import cli
    with pytest.raises(SystemExit) as e:
        cli.main(["forecast", str(ROOT / "reference" / "h200x2"), option, value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: dpscale forecast") and f"argument {option}: " in err and said in err


def test_cli_says_a_missing_input_or_an_unwritable_output_in_one_line(tmp_path):
    from dpscale import cli
    h200x2 = str(ROOT / "reference" / "h200x2")
    for argv, said in ((["forecast", h200x2, "--book", str(tmp_path / "nope.yaml")], "no such file"),
                       (["forecast", "--fabric-check", str(tmp_path)], "holds no scales.yaml"),
                       (["forecast", h200x2, "--no-book", "--bootstrap-draws", "10", "--json", str(tmp_path)],
                        "Is a directory"),
                       (["export", h200x2, "--to", str(tmp_path / "a-file" / "x.csv")], "a-file is not a folder")):
        (tmp_path / "a-file").write_text("")
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert said in str(e.value) and "\n" not in str(e.value), (argv, e.value)


FABRICS = ROOT / "reference" / "fabrics" / "nccl-tests"


def test_a_users_nccl_tests_output_forecasts_four_nodes_of_eight(capsys):
    """A one-GPU machine, never trained on several: the in-node ring from a node's
    nccl-tests table and the tier between nodes from a two-node one (real output, NVIDIA
    /nccl-tests#290), and the forecast reaches 4 nodes of 8."""
    from dpscale import cli
    assert cli.main(["forecast", str(ROOT / "reference" / "h200"), "--no-book", "--bootstrap-draws", "10",
                     "--fabric", str(FABRICS / "h100_1node_8gpu.txt"),
                     "--fabric", str(FABRICS / "h100_2node_srun_label.txt")]) == 0
    text = capsys.readouterr().out
    assert "h100_2node_srun_label.txt (16 ranks on 2 host(s)" in text
    row = next(line for line in text.splitlines() if line.split()[:3] == ["32", "4", "predicted"])
    assert "%" in row and "–%" not in row.split("predicted")[1].split()[0], row


def test_a_between_node_file_alone_leaves_the_machines_own_ring(capsys):
    """A two-node nccl-tests file covers the tier between nodes only: the machine's own
    in-node sweep stays its ring. The free link the file implies ("in-node part
    neglected") replaced it: an audit's two-core smoke run read a predicted k=2 weak
    efficiency of 94% instead of 84%, where it measured 67%."""
    from dpscale import cli
    from dpscale.report import forecast as fcr
    from dpscale.report.machines import load_reference
    m = load_reference(ROOT / "reference" / "h200x2")
    given = fcr.given_fabric([str(FABRICS / "h100_2node_srun_label.txt")])
    assert given.intra_neglected and given.explicit
    cfg = fcr.settings(None, bootstrap_draws=10)
    alone, own = fcr.of_machine(m, cfg, given), fcr.of_machine(m, cfg, fcr.default_fabric(cfg))
    in_node = [(s["series"], r["k"], r["weak_efficiency"]) for f in (alone, own) for s in f["series"] for r in s["rows"]
               if r["k"] <= 2]
    assert in_node[:len(in_node) // 2] == in_node[len(in_node) // 2:] and in_node
    assert cli.main(["forecast", str(ROOT / "reference" / "h200x2"), "--no-book", "--bootstrap-draws", "10",
                     "--fabric", str(FABRICS / "h100_2node_srun_label.txt")]) == 0
    assert "in one node: this machine's all-reduce sweep at k=2" in capsys.readouterr().out


SKIPPED_ALLREDUCE = json.dumps({"experiment": "allreduce", "variant": "memcpy", "k": 2, "status": "skipped",
                                "reason": "NCCL_SHM_USE_CUDA_MEMCPY is NCCL's; this run's backend is gloo",
                                "metrics": {}})


@pytest.mark.parametrize("body, why", [("size,count\n1,2\n", "no all-reduce rows found"), (None, "no such file"),
                                       (SKIPPED_ALLREDUCE, "status 'skipped', no sweep: NCCL_SHM_USE_CUDA_MEMCPY")])
def test_a_bad_fabric_file_gets_one_line_naming_it(tmp_path, body, why):
    from dpscale import cli
    bad = tmp_path / "fabric.txt"
    if body is not None:
        bad.write_text(body)
    with pytest.raises(SystemExit) as e:
        cli.main(["forecast", str(ROOT / "reference" / "h200"), "--no-book", "--fabric", str(bad)])
    msg = str(e.value)
    assert msg.startswith(f"dpscale forecast: {bad}") and why in msg and "\n" not in msg


def test_the_two_node_stand_in_is_predicted_from_one_node_and_its_link():
    """reference/cpu2-twonode (two network namespaces joined by a 500 Mbit/s tbf link,
    one gloo rank each): the k=2 point across the link predicted from k=1's compute and
    the link's all-reduce sweep alone, inside its band; communication over half the step."""
    from dpscale.report import forecast as fcr
    from dpscale.report.machines import load_reference
    m = load_reference(ROOT / "reference" / "cpu2-twonode")
    rows = fcr.of_machine(m, CFG, fit.Given())["validation"]
    r = next(x for x in rows if x["k"] == 2 and x["rule"] == "at_k")
    assert r["nodes"] == 2 and not check.leaks(r)
    assert {u.kind for u in r["used"] if u.k == 2} == {"internode sweep"}
    assert {u.kind for u in r["used"]} <= {"throughput", "internode sweep", "buckets", "step spread", "no overlap"}
    assert r["predicted_lo"] <= r["measured"] <= r["predicted_hi"] and abs(r["error_points"]) < 5, r
    assert r["measured_overhead_ms"] > r["compute_ms"] * 0.8   # communication over ~half the step


GH200 = FABRICS / "gh200_2node_1gpu_olivia.txt"   # NVIDIA/nccl-tests#369: two nodes of one GH200


def test_a_file_of_one_gpu_per_node_forecasts_nodes_of_one_and_says_its_source(capsys):
    """The audit: a real two-node GH200 output (one GPU per node) gave reference/h200 no
    forecast and exit 0. It builds the tier it measures: a forecast per node count, nodes
    of one device, with the tier's source named."""
    from dpscale import cli
    assert cli.main(["forecast", str(ROOT / "reference" / "h200"), "--no-book", "--bootstrap-draws", "10",
                     "--fabric", str(GH200)]) == 0
    text = capsys.readouterr().out
    assert "between nodes: gh200_2node_1gpu_olivia.txt" in text and "(given)" in text and "nodes of 1 (" in text
    rows = [line.split() for line in text.split("Time to accuracy")[0].splitlines()
            if re.match(r"\s+\d+\s+\d+\s+predicted", line)]
    assert rows and {int(r[1]) for r in rows} == set(range(2, 17)) and all(r[0] == r[1] for r in rows)
    assert all("%" in r[3] and r[3] != "–%" for r in rows)


@pytest.mark.parametrize("extra, why", [
    (["--fabric", str(FABRICS / "h100_1node_8gpu.txt")], "measures one GPU per node, so its cluster has no in-node ring"),
    (["--gpus-per-node", "8"], "measures nodes of 1 GPU(s), not the --gpus-per-node 8")])
def test_a_file_whose_layout_does_not_fit_is_refused_in_one_line(extra, why):
    from dpscale import cli
    with pytest.raises(SystemExit) as e:
        cli.main(["forecast", str(ROOT / "reference" / "h200"), "--no-book", "--fabric", str(GH200), *extra])
    msg = str(e.value)
    assert msg.startswith("dpscale forecast: ") and why in msg and "\n" not in msg


def test_a_given_file_takes_the_tier_it_covers_and_a_default_one_only_fills_a_gap():
    """h200x2 measured its own ring at k=2: the schema's default files leave it, a file the
    user gives takes it; either way the tier between nodes is the file's, and the record
    says which source each tier took."""
    from dpscale.report import forecast as fcr
    from dpscale.report.machines import load_reference
    m = load_reference(ROOT / "reference" / "h200x2")
    default = fcr.of_machine(m, CFG, fcr.default_fabric(CFG))["series"][0]["tiers"]
    given = fcr.of_machine(m, CFG, fcr.given_fabric([str(FABRICS / "h100_1node_8gpu.txt"),
                                                     str(FABRICS / "h100_2node_srun_label.txt")]))["series"][0]["tiers"]
    assert default[fit.IN_NODE] == "this machine's all-reduce sweep at k=2"
    assert "default file" in default[fit.ACROSS]
    assert given[fit.IN_NODE].startswith("h100_1node_8gpu.txt") and given[fit.IN_NODE].endswith("(given)")
    assert given[fit.ACROSS].startswith("h100_2node_srun_label.txt") and given[fit.ACROSS].endswith("(given)")
