"""dpscale.analysis.stats: the intervals' coverage checked by simulation, and the
old interval arithmetic (dividing the ends of two intervals) shown to fail it; ratio_ci
pinned to Fieller's interval with Welch's degrees of freedom: its ends against the
textbook formulas, its coverage where a delta-method interval (a denominator a few
standard errors from 0) and pooled degrees of freedom (unequal variances and n) fail,
each run as a mutation of ratio_ci through the same assertion."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special
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


# ---------------------------------------------------------------- what pins the method
# The coverage tests above would pass a delta-method interval or pooled degrees of freedom
# as well. These pin ratio_ci to Fieller's interval with Welch-Satterthwaite degrees of
# freedom: its ends against the textbook formulas written here (not ratio_ci's quadratic),
# and its coverage where the two mutations fail, each mutation run through the same
# assertion (stats.fieller or stats._welch_df replaced, so ratio_ci itself is the mutant).
#
# Tolerances: SIM_TRIALS seeded trials estimate a coverage with binomial standard error
# sqrt(0.95 x 0.05 / 2000) = 0.0049, an upper-tail miss rate with sqrt(0.025 x 0.975 / 2000)
# = 0.0035; the bands are 3.2 of those (0.016, 0.011): a correct interval leaves either with
# probability about 0.0014. The mutants sit far outside: the delta method's upper-tail miss
# (about 0.07, from 20000 trials) 13 errors out, pooled df's coverage (about 0.85) 20.
# The test's own quantiles are scipy.special.stdtrit, the function scipy.stats.t.ppf calls
# (without its 0.25 ms of argument handling per call).

SIM_TRIALS = 2000
COVER_BAND, TAIL_BAND = 0.016, 0.011


def welch_df_textbook(a_s, b_s, theta):
    """Satterthwaite's degrees of freedom of mean(a) - theta mean(b), independent samples."""
    ua, ub = np.var(a_s, ddof=1) / len(a_s), theta**2 * np.var(b_s, ddof=1) / len(b_s)
    return (ua + ub) ** 2 / (ua**2 / (len(a_s) - 1) + ub**2 / (len(b_s) - 1))


def fieller_textbook(a_s, b_s, df, level=0.95):
    """Fieller's limits for mean(a) / mean(b), independent samples, in the g form (Fieller
    1954; Franz 2007, eq. 9): g = t^2 v_b / b^2, limits [q -+ (t / b) sqrt(v_a + q^2 v_b
    - g v_a)] / (1 - g) with q = a / b; None where g >= 1 (the set is unbounded)."""
    a, b = np.mean(a_s), np.mean(b_s)
    va, vb = np.var(a_s, ddof=1) / len(a_s), np.var(b_s, ddof=1) / len(b_s)
    t = special.stdtrit(df, 0.5 + level / 2)
    g, q = t * t * vb / (b * b), a / b
    if g >= 1:
        return None, None
    half = t / abs(b) * np.sqrt(va + q * q * vb - g * va)
    return (q - half) / (1 - g), (q + half) / (1 - g)


def fieller_set_holds(a_s, b_s, theta, df, level=0.95):
    """Whether theta is in Fieller's set (a - theta b)^2 <= t^2 (v_a + theta^2 v_b): for an
    unbounded set (ratio_ci's None) too, the whole line or the outside of two roots."""
    a, b = np.mean(a_s), np.mean(b_s)
    va, vb = np.var(a_s, ddof=1) / len(a_s), np.var(b_s, ddof=1) / len(b_s)
    t2 = special.stdtrit(df, 0.5 + level / 2) ** 2
    return (a - theta * b) ** 2 <= t2 * (va + theta**2 * vb)


def delta_method(a, b, va, vb, cov, df, level=0.95):
    """The mutation of stats.fieller: the delta method's symmetric interval q -+ t se(q),
    se(q)^2 = (v_a - 2 q cov + q^2 v_b) / b^2, never unbounded."""
    t, q = special.stdtrit(df, 0.5 + level / 2), a / b
    half = t * math.sqrt(max(va - 2 * q * cov + q * q * vb, 0.0)) / abs(b)
    return q - half, q + half


def pooled_df(va, vb, na, nb, theta):
    """The mutation of stats._welch_df: the pooled two-sample degrees of freedom."""
    return float(na + nb - 2)


def ends_are_fieller_welch(a_s, b_s) -> bool:
    r = stats.ratio_ci(a_s, b_s)
    df = welch_df_textbook(a_s, b_s, np.mean(a_s) / np.mean(b_s))
    lo, hi = fieller_textbook(a_s, b_s, df)
    return lo is not None and r["ci_lo"] is not None and np.allclose([r["ci_lo"], r["ci_hi"]], [lo, hi],
                                                                      rtol=1e-9, atol=0)


def simulate(mu_a, sd_a, n_a, mu_b, sd_b, n_b, seed, trials=SIM_TRIALS) -> dict:
    """ratio_ci's coverage of mu_a / mu_b over seeded normal samples, and how often the
    truth lies above its upper end. A None (unbounded) covers where Fieller's set holds
    the truth (the test's own check, at the textbook Welch df)."""
    rng, theta = np.random.default_rng(seed), mu_a / mu_b
    hits = above = unbounded = 0
    for a_s, b_s in zip(rng.normal(mu_a, sd_a, (trials, n_a)), rng.normal(mu_b, sd_b, (trials, n_b))):
        r = stats.ratio_ci(a_s, b_s)
        if r["ci_lo"] is None:
            unbounded += 1
            hits += bool(fieller_set_holds(a_s, b_s, theta, welch_df_textbook(a_s, b_s, a_s.mean() / b_s.mean())))
        else:
            hits += r["ci_lo"] <= theta <= r["ci_hi"]
            above += theta > r["ci_hi"]
    return {"coverage": hits / trials, "above": above / trials, "unbounded": unbounded / trials}


def holds_nominal(sim: dict, tails: bool = True) -> bool:
    ok = abs(sim["coverage"] - 0.95) <= COVER_BAND
    return ok and (abs(sim["above"] - 0.025) <= TAIL_BAND if tails else True)


# A denominator whose mean is 4 of its standard errors from 0 (n = 30 a side, numerator cv 2%)
NOISY_DEN = {"mu_a": 10.0, "sd_a": 0.2 * math.sqrt(30), "n_a": 30, "mu_b": 4 / math.sqrt(30), "sd_b": 1.0, "n_b": 30}
# Welch's case: 3 numerator samples with a large spread against 8 tight denominator ones
UNEQUAL = {"mu_a": 10.0, "sd_a": 3.0, "n_a": 3, "mu_b": 5.0, "sd_b": 0.2, "n_b": 8}


def _draw(case, seed):
    rng = np.random.default_rng(seed)
    return rng.normal(case["mu_a"], case["sd_a"], case["n_a"]), rng.normal(case["mu_b"], case["sd_b"], case["n_b"])


def test_noisy_denominator_ends_are_fiellers_not_the_delta_methods(monkeypatch):
    """One draw of the noisy-denominator case: ratio_ci's ends are Fieller's (textbook g
    form, Welch df) to 1e-9; the interval is asymmetric, its upper arm over 1.5 times the
    lower; the delta method's interval, symmetric, stops far below Fieller's upper end."""
    a_s, b_s = _draw(NOISY_DEN, 3)
    assert 3 < b_s.mean() / (b_s.std(ddof=1) / math.sqrt(30)) < 6   # a few standard errors from 0
    r = stats.ratio_ci(a_s, b_s)
    q = a_s.mean() / b_s.mean()
    assert ends_are_fieller_welch(a_s, b_s)
    assert (r["ci_hi"] - q) > 1.5 * (q - r["ci_lo"])
    with monkeypatch.context() as m:
        m.setattr(stats, "fieller", delta_method)
        d = stats.ratio_ci(a_s, b_s)
        assert not ends_are_fieller_welch(a_s, b_s)          # the assertion fails on the mutant
    assert d["ci_hi"] - q == pytest.approx(q - d["ci_lo"]) and d["ci_hi"] < r["ci_hi"] - 0.2 * (r["ci_hi"] - q)


def test_noisy_denominator_fieller_holds_coverage_where_the_delta_method_misses(monkeypatch):
    """Seeded, 2000 trials: ratio_ci covers 95% within the band and misses above 2.5% of the
    time; the delta method (stats.fieller replaced) covers about 93% and misses above about
    7%, all on one side: the same assertion rejects it."""
    sim = simulate(**NOISY_DEN, seed=11)
    assert holds_nominal(sim), sim
    assert 0.005 < sim["unbounded"] < 0.06, sim                 # some sets unbounded, counted by the set
    with monkeypatch.context() as m:
        m.setattr(stats, "fieller", delta_method)
        mutant = simulate(**NOISY_DEN, seed=11)
    assert not holds_nominal(mutant), mutant
    assert mutant["coverage"] < 0.95 and mutant["above"] > 0.025 + TAIL_BAND, mutant


def test_unequal_variances_ends_use_welch_df_not_pooled(monkeypatch):
    """3 wide numerator samples against 8 tight ones: the Welch-Satterthwaite df is about 2,
    pooled df 9. ratio_ci's ends and its stated df are Welch's; with pooled df (stats.
    _welch_df replaced) the interval is much narrower and the assertion fails."""
    a_s, b_s = _draw(UNEQUAL, 5)
    r = stats.ratio_ci(a_s, b_s)
    df = welch_df_textbook(a_s, b_s, a_s.mean() / b_s.mean())
    assert df < 3 and f"Welch df {df:.1f}" in r["method"]
    assert ends_are_fieller_welch(a_s, b_s)
    with monkeypatch.context() as m:
        m.setattr(stats, "_welch_df", pooled_df)
        p = stats.ratio_ci(a_s, b_s)
        assert not ends_are_fieller_welch(a_s, b_s)          # the assertion fails on the mutant
    assert (p["ci_lo"], p["ci_hi"]) == pytest.approx(fieller_textbook(a_s, b_s, 9), rel=1e-9)
    assert p["ci_hi"] - p["ci_lo"] < 0.7 * (r["ci_hi"] - r["ci_lo"])


def test_unequal_variances_welch_holds_coverage_where_pooled_df_under_covers(monkeypatch):
    """Seeded, 2000 trials of the unequal case: ratio_ci covers 95% within the band; with
    pooled df it covers about 85%, and the same assertion rejects it."""
    sim = simulate(**UNEQUAL, seed=12)
    assert holds_nominal(sim, tails=False) and sim["unbounded"] == 0, sim
    with monkeypatch.context() as m:
        m.setattr(stats, "_welch_df", pooled_df)
        mutant = simulate(**UNEQUAL, seed=12)
    assert not holds_nominal(mutant, tails=False), mutant
    assert mutant["coverage"] < 0.90, mutant
