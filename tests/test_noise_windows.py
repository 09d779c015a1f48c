"""dpscale.analysis.stateff.noise_windows (pure, seconds): the progress-weighted noise
scale is the B_crit that McCandlish et al.'s per-step model gives a training run, checked
on a run simulated under that model (its E_min and S_min by scipy's quadrature, an
independent computation), where the plain step-0-to-target ratio is not; windows pooled
over seeds with Fieller's interval over the seeds; the report's windows of a run read
from the per-step records as the result keeps them."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats as sps

from dpscale.analysis.stateff import noise_windows as nw

S_MIN = 400.0                   # the fewest steps the run needs (progress u runs 0..S_MIN)


def b_noise(u):
    """The noise scale rising as the loss falls: 20 at the start, 900 near the end."""
    return 20.0 + 880.0 * (u / S_MIN) ** 2


def g2_of(u):
    """|G|^2 falling 100x over the run (the early steps' gradients are large)."""
    return 100.0 * math.exp(-math.log(100.0) * u / S_MIN)


def run_at(batch: int):
    """Per-step |G|^2 and tr(Sigma) of a run at `batch` under the per-step model: each step
    advances the progress by 1 / (1 + B_noise / B) of a fewest-steps step."""
    u, g2, tr = 0.0, [], []
    while u < S_MIN:
        b = b_noise(u)
        g2.append(g2_of(u))
        tr.append(b * g2_of(u))
        u += 1.0 / (1.0 + b / batch)
    return np.array(g2), np.array(tr)


def test_the_progress_weighted_noise_scale_is_the_runs_b_crit():
    """E_min = integral of B_noise over the progress, S_min = S_MIN (quad), so B_crit =
    E_min / S_MIN; the progress-weighted average of the per-step records of a run at any
    batch is that B_crit within 2% (blocks of 10 steps), while sum tr / sum |G|^2 from
    step 0, which the large early gradients dominate, is far below it."""
    e_min, _err = integrate.quad(b_noise, 0.0, S_MIN)
    b_crit = e_min / S_MIN
    for batch in (256, 1024, 4096):
        g2, tr = run_at(batch)
        blocks = [slice(i, i + 10) for i in range(0, g2.size, 10)]
        num, den, steps = nw.progress_terms(g2, tr, batch, blocks)
        assert steps == g2.size and num / den == pytest.approx(b_crit, rel=0.02), batch
        assert tr.sum() / g2.sum() < 0.5 * b_crit
        samples = batch * g2.size   # the model's E(B) = E_min (1 + B / B_crit), B_crit the same
        assert samples == pytest.approx(e_min + batch * S_MIN, rel=0.01)


def test_a_window_over_seeds_is_the_pooled_ratio_with_fiellers_interval_over_the_seeds():
    """Against an independent Fieller (the quadratic's roots, written out here with scipy's
    t): the seeds' paired sums, df = seeds - 1."""
    rng = np.random.default_rng(0)
    pairs = [(float(t), float(g), 50) for t, g in zip(300 + 40 * rng.standard_normal(5), 1 + 0.1 * rng.standard_normal(5))]
    got = nw.window_over_seeds(pairs)
    t_, g_ = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    n = len(pairs)
    a, b = t_.mean(), g_.mean()
    va, vb, cab = t_.var(ddof=1) / n, g_.var(ddof=1) / n, np.cov(t_, g_, ddof=1)[0, 1] / n
    q = sps.t.ppf(0.975, n - 1) ** 2
    A, B, C = b * b - q * vb, -2 * (a * b - q * cab), a * a - q * va
    lo, hi = sorted(((-B - math.sqrt(B * B - 4 * A * C)) / (2 * A), (-B + math.sqrt(B * B - 4 * A * C)) / (2 * A)))
    assert got["b_simple"] == pytest.approx(t_.sum() / g_.sum())
    assert (got["ci_lo"], got["ci_hi"]) == pytest.approx((lo, hi), rel=1e-9)
    assert got["seeds"] == 5 and got["steps"] == 250 and got["covers"] == "independent seeded launches"


def test_the_reports_windows_of_a_run():
    """dpscale.report.tta_noise.windows on two seeds' records as a result keeps them: the
    near window starts at the first evaluation within the margin and ends at the target's
    (noise_steps), the intervals follow eval_every_samples, and a seed's steps after its
    target are not read."""
    from dpscale.report import tta_noise
    B, every = 100, 1000
    g2 = [1.0] * 40 + [99.0] * 5          # the steps after step 40 (the target) must not count
    tr = [float(i) for i in range(40)] + [-1e6] * 5
    curve = [{"samples": 1000, "accuracy": 0.5}, {"samples": 2000, "accuracy": 0.86}, {"samples": 3000, "accuracy": 0.88},
             {"samples": 4000, "accuracy": 0.91}]
    run = {"noise_g2_grad_sq_steps": g2, "noise_trace_grad_sq_steps": tr, "noise_steps": 40, "curve": curve}
    p = {"k": 2, "global_batch": B, "eval_every_samples": every, "eval_near_margin": 0.05, "target": 0.9,
         "runs": [run, {**run, "noise_trace_grad_sq_steps": [2 * x for x in tr]}]}
    w = tta_noise.windows(p)
    assert w["near"]["steps"] == 2 * 20 and w["near"]["b_simple"] == pytest.approx(1.5 * np.mean(range(20, 40)))
    assert [(r["from_samples"], r["steps"]) for r in w["intervals"]] == [(0, 20), (1000, 20), (2000, 20), (3000, 20)]
    assert w["intervals"][1]["b_simple"] == pytest.approx(1.5 * np.mean(range(10, 20)))
    assert w["progress"]["steps"] == 80
