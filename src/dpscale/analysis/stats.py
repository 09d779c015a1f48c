"""The spread of a number, defined once for the workers and the report.

- interval(xs): median, min, max and a 95% interval for the mean over repeats
  (Student's t: few repeats, an honest width; n = 3 multiplies the standard error
  by 4.30, not 1.96).
- median_interval(xs): the median with a distribution-free 95% interval from
  order statistics (the sign test's), for paired differences, which can be skewed.
- ratio_interval(a, b): a / b with both ends propagated (the conservative
  [a_lo / b_hi, a_hi / b_lo]), for speedups and efficiencies.

Pure Python (math only): the report imports it on machines without numpy's
favourite friends, and no quantile is typed in: t comes from its distribution.
"""
from __future__ import annotations

import math
import statistics

LEVEL = 0.95


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1, a - 1
    c, d = 1.0, 1 - qab * x / qap
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1 + aa * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-14:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _betai(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Inverse of t_cdf by bisection (p in (0.5, 1))."""
    lo, hi = 0.0, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def interval(xs: list[float], level: float = LEVEL) -> dict:
    """Median, min, max, mean and its Student-t interval; cv = stdev / mean."""
    xs = [float(x) for x in xs]
    n = len(xs)
    out = {"n": n, "median": statistics.median(xs) if xs else None, "min": min(xs, default=None),
           "max": max(xs, default=None), "mean": statistics.fmean(xs) if xs else None,
           "ci_lo": None, "ci_hi": None, "cv": None, "level": level}
    if n >= 2:
        sd = statistics.stdev(xs)
        half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
        out.update(ci_lo=out["mean"] - half, ci_hi=out["mean"] + half,
                   cv=sd / out["mean"] if out["mean"] else None)
    return out


def median_interval(xs: list[float], level: float = LEVEL) -> dict:
    """The median with the widest-coverage-first order-statistic interval whose
    coverage is at least `level` (binomial, p = 1/2); ends are None below 6 values."""
    s = sorted(float(x) for x in xs)
    n = len(s)
    out = {"n": n, "median": statistics.median(s) if s else None, "ci_lo": None, "ci_hi": None,
           "coverage": None}
    # the largest j with P(X_(j) <= median <= X_(n+1-j)) >= level, X_(i) the order statistics
    best = None
    for j in range(1, n // 2 + 1):
        cover = 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2 ** n
        if cover >= level:
            best = (j, cover)
    if best:
        j, cover = best
        out.update(ci_lo=s[j - 1], ci_hi=s[n - j], coverage=cover)
    return out


def ratio_interval(a: float, a_lo: float | None, a_hi: float | None,
                   b: float, b_lo: float | None, b_hi: float | None) -> tuple[float, float | None, float | None]:
    """a / b, and its interval from both ends: [a_lo / b_hi, a_hi / b_lo]."""
    r = a / b
    if None in (a_lo, a_hi, b_lo, b_hi) or b_lo <= 0:
        return r, None, None
    return r, a_lo / b_hi, a_hi / b_lo


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
