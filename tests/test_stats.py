"""dpscale.analysis.stats: the intervals' coverage checked by simulation, and the
old interval arithmetic (dividing the ends of two intervals) shown to fail it."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from dpscale.analysis import stats

TRIALS = 1000
BAND = 0.02


def _throughputs(rng, trials=TRIALS):
    """Per trial: k=2 and k=1 samples/s, lognormal, 3-5 repeats each side, each side's
    noise (cv) drawn from 0.5% to 5% on its own; the true ratio of means is known."""
    for _ in range(trials):
        n_a, n_b = rng.integers(3, 6, size=2)
        s_a, s_b = rng.uniform(0.005, 0.05, size=2)
        mu_a, mu_b = np.log(9000.0), np.log(5000.0)
        true = np.exp(mu_a + s_a ** 2 / 2) / np.exp(mu_b + s_b ** 2 / 2)
        yield rng.lognormal(mu_a, s_a, n_a), rng.lognormal(mu_b, s_b, n_b), true


def _coverage(interval_of, seed=20) -> float:
    rng = np.random.default_rng(seed)
    hits = [lo <= true <= hi for a, b, true in _throughputs(rng) for lo, hi in [interval_of(a, b)]]
    return float(np.mean(hits))


def _ratio(a, b):
    r = stats.ratio_ci(a, b)
    return r["ci_lo"], r["ci_hi"]


def _divided_ends(a, b):
    """The old stats.ratio_interval: [a_lo / b_hi, a_hi / b_lo] from two t intervals."""
    ia, ib = stats.interval(a), stats.interval(b)
    return ia["ci_lo"] / ib["ci_hi"], ia["ci_hi"] / ib["ci_lo"]


def test_ratio_interval_covers_the_true_ratio_95_percent():
    assert abs(_coverage(_ratio) - 0.95) <= BAND


def test_dividing_interval_ends_fails_the_coverage_test():
    """The mutation: interval arithmetic covers almost always (99% here), so its '95%' is not one."""
    cov = _coverage(_divided_ends)
    assert not abs(cov - 0.95) <= BAND and cov > 0.98


def test_paired_ratio_covers_95_percent():
    """Pairs from the same launch share its noise (correlation 0.7); Fieller uses the covariance."""
    rng = np.random.default_rng(7)
    hits = []
    for _ in range(TRIALS):
        n = rng.integers(3, 6)
        z = rng.standard_normal((2, n))
        shared = 0.7 * z[0] + np.sqrt(1 - 0.7 ** 2) * z[1]
        a, b = np.exp(np.log(9000.0) + 0.03 * z[0]), np.exp(np.log(5000.0) + 0.03 * shared)
        r = stats.ratio_ci(a, b, paired=True)
        hits.append(r["ci_lo"] <= 1.8 <= r["ci_hi"])
    assert abs(np.mean(hits) - 0.95) <= BAND
    unpaired = stats.ratio_ci(a, b)
    assert r["ci_hi"] - r["ci_lo"] < unpaired["ci_hi"] - unpaired["ci_lo"]   # pairing narrows it


def test_ratio_ci_fields_scale_and_plain_no_interval():
    r = stats.ratio_ci([200.0, 210.0, 190.0], [100.0, 101.0, 99.0], scale=0.5, covers=stats.WITHIN)
    assert r["value"] == pytest.approx(1.0) and r["ci_lo"] < 1.0 < r["ci_hi"] and r["n"] == [3, 3]
    assert r["covers"] == stats.WITHIN and r["method"].startswith("Fieller, independent")
    one = stats.ratio_ci([200.0], [100.0, 101.0], covers=stats.WITHIN)
    assert one["value"] == pytest.approx(200 / 100.5) and one["ci_lo"] is None and one["ci_hi"] is None
    assert one["method"].startswith("no interval: 1 vs 2") and one["covers"] == ""
    wild = stats.ratio_ci([1.0, 2.0], [0.1, 10.0])       # a denominator not distinguishable from 0
    assert wild["ci_lo"] is None and "unbounded" in wild["method"]
    with pytest.raises(ValueError, match="paired samples differ"):
        stats.ratio_ci([1.0, 2.0], [1.0], paired=True)


def test_t_interval_and_median_interval_match_scipy():
    iv = stats.interval([100.0, 110.0, 90.0], covers=stats.WITHIN)
    lo, hi = sps.t.interval(0.95, 2, loc=100.0, scale=10.0 / 3 ** 0.5)
    assert (iv["ci_lo"], iv["ci_hi"]) == (pytest.approx(lo), pytest.approx(hi)) and iv["covers"] == stats.WITHIN
    xs = list(range(1, 21))[::-1]                     # n=20: [X_(6), X_(15)], coverage 0.9586
    mi = stats.median_interval(xs)
    assert (mi["ci_lo"], mi["ci_hi"]) == (6.0, 15.0) and mi["coverage"] == pytest.approx(0.958610, abs=1e-6)
    assert stats.median_interval([1, 2, 3, 4, 5])["ci_lo"] is None      # 1 - 2/32 < 0.95
    assert stats.median_interval([1, 2, 3, 4, 5, 6])["coverage"] == pytest.approx(1 - 2 / 64)
