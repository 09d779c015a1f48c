"""The committed reference/h200 time to accuracy, recomputed here from its result files
with numpy and scipy only (nothing of dpscale.analysis.stateff), against what the report
reads (dpscale.report.tta.of_rule): each seed's interpolated crossing, samples to target
with Student's t interval, statistical efficiency with Fieller's interval, MLPerf's
olympic score, the E(B) line and the power law fitted over every seed, and the
progress-weighted gradient noise scale, over the launches pooled from runs/ and earlier/. A second, minimal implementation: where it and
the report's analysis disagree, one of them is wrong."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats as sps

from conftest import ROOT

H200 = ROOT / "reference" / "h200"
KS = (1, 2, 4, 8)


EVALUATION = {"tta_eval_every_epochs", "tta_eval_every_samples", "tta_eval_near_every_samples", "tta_eval_near_margin"}


def pooled(k):
    """runs/'s measurement with every earlier one (earlier/<label>/) of the same protocol
    (when it evaluated aside), newest first: their launches in that order."""
    found = [json.loads(p.read_text()) for p in [H200 / f"runs/ddp_tta/book/k{k}.json",
                                                 *H200.glob(f"earlier/*/ddp_tta/book/k{k}.json")]]
    found.sort(key=lambda r: r["finished_utc"], reverse=True)

    def proto(r):
        return {x: v for x, v in r["config"]["protocol"].items() if x != "tta_seeds" and x not in EVALUATION}
    runs = [run for r in found if proto(r) == proto(found[0]) for run in r["metrics"]["runs"]]
    return {**found[0]["metrics"], "runs": runs}


def by_seed(runs, value):
    """value(run) averaged over the launches of each seed, in the order seeds first appear
    (a seed several measurements ran counts once)."""
    groups = {}
    for r in runs:
        groups.setdefault(r["seed"], []).append(value(r))
    return [sum(v) / len(v) for v in groups.values()]


@pytest.fixture(scope="module")
def results():
    out = {k: pooled(k) for k in KS}
    assert all(len({r["seed"] for r in m["runs"]}) >= 10 for m in out.values())   # fresh seeds and 1-5
    return out


@pytest.fixture(scope="module")
def rule():
    from dpscale.report import machines, tta
    return tta.of_rule(machines.load_reference(H200), "book", None)


def crossing(curve, target, each_eval_s):
    """(samples, seconds) where the curve first reaches target, linear between the last
    evaluation below and the first at or above; the clock's training time interpolated
    and one evaluation added."""
    for prev, cur in zip(curve, curve[1:]):
        if cur["accuracy"] >= target > prev["accuracy"]:
            f = (target - prev["accuracy"]) / (cur["accuracy"] - prev["accuracy"])
            train = cur["seconds"] - prev["seconds"] - each_eval_s
            return prev["samples"] + f * (cur["samples"] - prev["samples"]), prev["seconds"] + f * train + each_eval_s
    return None, None


def samples_of(m):
    return by_seed(m["runs"], lambda r: crossing(r["curve"], m["target_accuracy"], r["eval_s"] / r["evaluations"])[0])


def fieller(a, b, va, vb, df, level=0.95):
    q = sps.t.ppf(0.5 + level / 2, df) ** 2
    A, B, C = b * b - q * vb, -2 * a * b, a * a - q * va
    root = math.sqrt(B * B - 4 * A * C)
    return sorted(((-B - root) / (2 * A), (-B + root) / (2 * A)))


def test_each_seeds_crossing_and_each_points_samples_to_target(results, rule):
    pts = {p["k"]: p for p in rule["points"]}
    for k, m in results.items():
        got = [s["samples"] for s in pts[k]["seeds"]]
        assert got == pytest.approx(samples_of(m), rel=1e-12)
        x = np.array(samples_of(m))
        half = sps.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
        assert (pts[k]["samples"], pts[k]["samples_lo"], pts[k]["samples_hi"]) == pytest.approx(
            (x.mean(), x.mean() - half, x.mean() + half), rel=1e-12)
        first = sorted(by_seed(m["runs"], lambda r: next(c["samples"] for c in r["curve"]
                                                         if c["accuracy"] >= m["target_accuracy"])))
        assert pts[k]["mlperf_samples"] == pytest.approx(np.mean(first[1:-1]))   # drop the fastest and the slowest


def test_statistical_efficiency_is_fiellers_over_the_seeds(results, rule):
    """samples(k=1) / samples(k), independent samples, Welch's df on the ratio."""
    pts = {p["k"]: p for p in rule["points"]}
    a = np.array(samples_of(results[1]))
    for k in (2, 4, 8):
        b = np.array(samples_of(results[k]))
        ma, mb, va, vb = a.mean(), b.mean(), a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
        r = ma / mb
        df = (va + r * r * vb) ** 2 / (va ** 2 / (a.size - 1) + r ** 4 * vb ** 2 / (b.size - 1))
        got = pts[k]
        assert got["statistical_efficiency"] == pytest.approx(r, rel=1e-12)
        assert [got["statistical_efficiency_lo"], got["statistical_efficiency_hi"]] == pytest.approx(
            fieller(ma, mb, va, vb, df), rel=1e-9)


def test_the_line_and_the_power_law_over_every_seed(results, rule):
    """The line by least squares with weights 1 / E(B)^2 iterated to convergence, B_crit
    = a / b; the power law by numpy.polyfit on the logs."""
    x = np.array([m["global_batch"] for m in results.values() for _ in samples_of(m)], float)
    y = np.array([v for m in results.values() for v in samples_of(m)])
    X = np.column_stack([np.ones_like(x), x])
    w = np.ones_like(x)
    for _ in range(200):
        coef = np.linalg.lstsq(X * np.sqrt(w)[:, None], y * np.sqrt(w), rcond=None)[0]
        w = 1 / (X @ coef) ** 2
    assert rule["fit"]["coef"] == pytest.approx(list(coef), rel=1e-8)
    assert rule["fit"]["B_crit"]["value"] == pytest.approx(coef[0] / coef[1], rel=1e-8)
    slope, icpt = np.polyfit(np.log(x), np.log(y), 1)
    assert rule["models"]["fits"]["power"]["coef"] == pytest.approx([icpt, slope], rel=1e-9)


def test_the_progress_weighted_noise_scale(results, rule):
    """Per seed, per evaluation interval j of eval_every_samples up to its target: n_j steps,
    mean |G|^2 g_j and tr(Sigma) t_j; each step weighs 1 / (1 + B_noise / B), so the
    average is sum n_j t_j / (g_j + t_j / B) over sum n_j g_j / (g_j + t_j / B), pooled over
    the seeds; Fieller's interval over the seeds' paired sums."""
    rows = {(r["k"], r["window"]): r for r in rule["noise"]}
    for k in (2, 4, 8):
        m = results[k]
        B, every = m["global_batch"], m["eval_every_samples"]
        num, den = [], []
        for r in m["runs"]:
            g2, tr, n = np.array(r["noise_g2_grad_sq_steps"]), np.array(r["noise_trace_grad_sq_steps"]), r["noise_steps"]
            edges = list(range(0, n * B, every)) + [n * B]
            sl = [slice(lo // B, hi // B) for lo, hi in zip(edges, edges[1:])]
            big = [g2[s].mean() + tr[s].mean() / B for s in sl]
            num.append(sum(len(g2[s]) * tr[s].mean() / gb for s, gb in zip(sl, big)))
            den.append(sum(len(g2[s]) * g2[s].mean() / gb for s, gb in zip(sl, big)))
        num, den = np.array(num), np.array(den)
        got = rows[(k, "progress")]
        assert got["b_noise"] == pytest.approx(num.sum() / den.sum(), rel=1e-9)
        n = num.size
        q = sps.t.ppf(0.975, n - 1) ** 2
        a, b = num.mean(), den.mean()
        va, vb, cab = num.var(ddof=1) / n, den.var(ddof=1) / n, np.cov(num, den, ddof=1)[0, 1] / n
        A, Bq, C = b * b - q * vb, -2 * (a * b - q * cab), a * a - q * va
        root = math.sqrt(Bq * Bq - 4 * A * C)
        assert [got["b_noise_lo"], got["b_noise_hi"]] == pytest.approx(
            sorted(((-Bq - root) / (2 * A), (-Bq + root) / (2 * A))), rel=1e-9)


def test_the_reports_reading_keeps_the_workers_records(results, rule):
    """Each seed's MLPerf samples are its result's own (the worker's) and its interpolated
    crossing comes no later; k = 2, 4, 8 emulated; every k >= 4 predicted from the smaller
    k only lies inside its band, and the mixture's band holds every out-of-sample row."""
    pts = {p["k"]: p for p in rule["points"]}
    assert sorted(pts) == list(KS) and all(pts[k]["emulated"] for k in (2, 4, 8))
    for k, p in pts.items():
        assert [s["mlperf_samples"] for s in p["seeds"]] == pytest.approx(
            by_seed(results[k]["runs"], lambda r: r["samples_to_target"]), rel=1e-12)
        assert all(s["samples"] <= s["mlperf_samples"] for s in p["seeds"] if s["converged"])
    forward = {h["k"]: h for h in rule["holdout"] if h["check"] == "forward"}
    assert forward[4]["from_ks"] == [1, 2] and forward[8]["from_ks"] == [1, 2, 4]
    assert all(h["inside_band"] and h["band_lo"] < h["predicted_epochs"] < h["band_hi"] for h in rule["holdout"])


def test_e_is_the_protocols_sharded_evaluations_recomputed_from_each_record(rule):
    """e(k), the evaluation seconds per training sample on the clock, recomputed from the
    newest measurement's per-evaluation records: only the protocol's evaluations charge
    the clock, each the pass over one rank's shard (test_images / k images, k emulated or
    not) and the reduction; the instrument's, which only locate the crossing, charge
    nothing. Fails where a refinement evaluation is charged or the pass is not sharded. A
    measurement made before the two were apart (no role on its evaluations) gives no e:
    the clock form is not shown there, rather than one that measures the instrument."""
    pts = {p["k"]: p for p in rule["points"]}
    newest = {k: max([H200 / f"runs/ddp_tta/book/k{k}.json", *H200.glob(f"earlier/*/ddp_tta/book/k{k}.json")],
                     key=lambda f: json.loads(f.read_text())["finished_utc"]) for k in KS}
    for k in KS:
        m = json.loads(newest[k].read_text())["metrics"]
        evals = [pt for run in m["runs"] for pt in run["curve"]]
        if not all("role" in pt for pt in evals):
            assert pts[k]["eval_s_per_sample"] is None and rule["eval_s_per_sample"][k] is None
            assert k == 1 or pts[k]["speedup"] is None
            continue
        protocol = [pt for pt in evals if pt["role"] == "protocol"]
        instrument = [pt for pt in evals if pt["role"] == "instrument"]
        assert protocol and instrument and len(protocol) + len(instrument) == len(evals)
        assert all(pt["eval_s"] == 0 and pt["eval_images"] == 0 for pt in instrument)
        assert all(pt["eval_images"] == len(range(0, m["test_images"], k)) and pt["eval_s"] > 0 for pt in protocol)
        # the protocol's cadence: once per epoch of this k (whole global batches)
        epoch = (m["train_images"] // m["global_batch"]) * m["global_batch"]
        for run in m["runs"]:
            marks = [pt["samples"] for pt in run["curve"] if pt["role"] == "protocol"]
            assert marks == [epoch * (i + 1) for i in range(len(marks))], (k, marks)
        e = sum(pt["eval_s"] for pt in protocol) / sum(run["samples_trained"] for run in m["runs"])
        assert pts[k]["eval_s_per_sample"] == pytest.approx(e, rel=1e-12)
        assert rule["eval_s_per_sample"][k] == pytest.approx(e, rel=1e-12)
