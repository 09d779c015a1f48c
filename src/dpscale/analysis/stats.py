"""The spread of a number, defined once for the workers and the report, on scipy.stats.

- interval(xs): median, min, max and a 95% interval for the mean over repeats
  (Student's t, scipy.stats.t: few repeats, an honest width; n = 3 multiplies the
  standard error by 4.30, not 1.96).
- median_interval(xs): the median with a distribution-free 95% interval from
  order statistics (the sign test's, scipy.stats.binom), for paired differences,
  which can be skewed.
- ratio_ci(num, den): a ratio of two means (a speedup, an efficiency, machine B
  over machine A) with a 95% interval computed on the ratio itself: Fieller's
  interval, paired (per launch or repeat index) or for two independent samples.
  Never the ends of two intervals divided: that interval covers the true ratio far
  more often than it says (tests/test_stats.py shows both by simulation).

Every interval says what its samples cover (`covers`): timed epochs within one
launch, or independent launches. An interval over epochs of one process leaves out
what changes from one launch to the next (NCCL's choices, clocks, placement).
"""
from __future__ import annotations

import math
import statistics

# numpy and scipy load on first use: the Snakefile imports the report's chapter list
# (and so this module) when it parses, which must stay light (tests/test_structure.py)
LEVEL = 0.95
WITHIN = "timed epochs within one launch"
ACROSS = "independent launches"


def interval(xs: list[float], level: float = LEVEL, covers: str = "") -> dict:
    """Median, min, max, mean and its Student-t interval; cv = stdev / mean."""
    xs = [float(x) for x in xs]
    n = len(xs)
    out = {"n": n, "median": statistics.median(xs) if xs else None, "min": min(xs, default=None),
           "max": max(xs, default=None), "mean": statistics.fmean(xs) if xs else None,
           "ci_lo": None, "ci_hi": None, "cv": None, "level": level, "covers": covers}
    if n >= 2:
        # Student's t quantile: scipy.special.stdtrit is what scipy.stats.t.ppf evaluates;
        # called directly, a throughput launch's worker does not load scipy.stats, whose
        # import is a visible part of a launch (docs/measurements/launch-cost_h200_2026-12-03.md)
        from scipy.special import stdtrit
        sd = statistics.stdev(xs)
        half = float(stdtrit(n - 1, 0.5 + level / 2)) * sd / math.sqrt(n)
        out.update(ci_lo=out["mean"] - half, ci_hi=out["mean"] + half,
                   cv=sd / out["mean"] if out["mean"] else None)
    return out


def median_interval(xs: list[float], level: float = LEVEL) -> dict:
    """The median with the narrowest order-statistic interval [X_(j), X_(n+1-j)] whose
    coverage, 1 - 2 P(Binom(n, 1/2) <= j - 1), is at least `level`; ends are None
    below 6 values (no such j exists)."""
    s = sorted(float(x) for x in xs)
    n = len(s)
    out = {"n": n, "median": statistics.median(s) if s else None, "ci_lo": None, "ci_hi": None,
           "coverage": None}
    if n == 0:
        return out
    import numpy as np
    from scipy import stats as sps
    j = np.arange(1, n // 2 + 1)
    cover = 1 - 2 * sps.binom.cdf(j - 1, n, 0.5)
    ok = j[cover >= level]
    if ok.size:
        jj = int(ok.max())
        out.update(ci_lo=s[jj - 1], ci_hi=s[n - jj], coverage=float(cover[jj - 1]))
    return out


def fieller(a: float, b: float, va: float, vb: float, cov: float, df: float,
            level: float = LEVEL) -> tuple[float | None, float | None]:
    """Fieller's interval for a / b, where a and b are estimates with variances va, vb
    and covariance cov: the theta with (a - theta b)^2 <= t^2 var(a - theta b).
    (None, None) when b is not distinguishable from 0 (the set is unbounded)."""
    from scipy import stats as sps
    t2 = float(sps.t.ppf(0.5 + level / 2, df)) ** 2
    qa, qb, qc = b * b - t2 * vb, -2 * (a * b - t2 * cov), a * a - t2 * va
    disc = qb * qb - 4 * qa * qc
    if qa <= 0 or disc < 0:
        return None, None
    root = math.sqrt(disc)
    return (-qb - root) / (2 * qa), (-qb + root) / (2 * qa)


def _welch_df(va: float, vb: float, na: int, nb: int, theta: float) -> float:
    """Welch-Satterthwaite degrees of freedom of var(a - theta b) for independent samples."""
    num = (va + theta * theta * vb) ** 2
    den = va * va / (na - 1) + theta ** 4 * vb * vb / (nb - 1)
    return num / den if den > 0 else float(na + nb - 2)


def ratio_ci(num_samples, den_samples, paired: bool = False, level: float = LEVEL, scale: float = 1.0,
             covers: str = "") -> dict:
    """mean(num) / mean(den) * scale, and its `level` interval computed on the ratio.

    paired: sample i of each comes from the same launch (or repeat index): Fieller
    with their covariance, n - 1 degrees of freedom. Otherwise the two samples are
    independent: Fieller with Welch's degrees of freedom. Without at least two samples
    on each side (or two pairs) the ratio has no interval, and `method` says why."""
    import numpy as np
    a_s, b_s = np.asarray(num_samples, float), np.asarray(den_samples, float)
    if paired and a_s.size != b_s.size:
        raise ValueError(f"ratio_ci: paired samples differ in length ({a_s.size} vs {b_s.size})")
    out = {"value": None, "ci_lo": None, "ci_hi": None, "n": [int(a_s.size), int(b_s.size)],
           "method": "", "covers": covers, "level": level}
    if not a_s.size or not b_s.size or b_s.mean() == 0:
        out["method"] = "no ratio: a side has no sample or a zero mean"
        return out
    a, b = float(a_s.mean()), float(b_s.mean())
    out["value"] = scale * a / b
    if min(a_s.size, b_s.size) < 2:
        out.update(method=f"no interval: {a_s.size} vs {b_s.size} sample(s); an interval needs 2 on each side",
                   covers="")
        return out
    if paired:
        n = a_s.size
        va, vb = a_s.var(ddof=1) / n, b_s.var(ddof=1) / n
        cov, df = float(np.cov(a_s, b_s, ddof=1)[0, 1]) / n, n - 1
        method = f"Fieller, paired ({n} pairs)"
    else:
        va, vb, cov = a_s.var(ddof=1) / a_s.size, b_s.var(ddof=1) / b_s.size, 0.0
        df = _welch_df(va, vb, a_s.size, b_s.size, a / b)
        method = f"Fieller, independent samples ({a_s.size} vs {b_s.size}, Welch df {df:.1f})"
    lo, hi = fieller(a, b, float(va), float(vb), cov, df, level)
    if lo is None:
        out["method"] = method + ": unbounded (the denominator's mean is not distinguishable from 0)"
        return out
    out.update(ci_lo=scale * lo, ci_hi=scale * hi, method=method)
    return out


def stragglers(seconds_by_rank: list[list[float]], threshold: float = 0.05) -> list[int]:
    """Ranks (positions in the list) more than `threshold` slower than the median
    rank in any repeat: a step ends when the slowest rank ends."""
    n = min((len(s) for s in seconds_by_rank), default=0)
    slow: set[int] = set()
    for i in range(n):
        col = [s[i] for s in seconds_by_rank]
        med = statistics.median(col)
        slow |= {r for r, t in enumerate(col) if t > (1 + threshold) * med}
    return sorted(slow)


def excludes(lo: float | None, hi: float | None, value: float) -> bool | None:
    """Whether an interval leaves `value` out (None: no interval)."""
    if lo is None or hi is None:
        return None
    return not lo <= value <= hi
