"""What the statistical-efficiency modules share: the interval level, what an interval
over seeds covers, how a seed that did not reach the target is counted, percentile
intervals of Monte Carlo draws, multivariate t draws and Student's t quantile."""
from __future__ import annotations

import math
from typing import Iterable

from dpscale.analysis import stats

LEVEL = stats.LEVEL
SEEDS = "independent seeded launches"
INF = math.inf


def reached(v: float | None) -> bool:
    """Whether a seed's value says it reached the target: None, nan and inf say it did not."""
    return v is not None and math.isfinite(v)


def as_censored(values: Iterable[float | None]):
    """Per-seed values as a float array, a seed that never reached the target (None,
    nan or inf) as +inf: slower than every seed that did. Returns (array, censored count)."""
    import numpy as np
    a = np.array([float(v) if reached(v) else INF for v in values])
    return a, int(np.isinf(a).sum())


def percentiles(draws, level: float) -> tuple[float, float]:
    """The central `level` percentile interval of Monte Carlo draws, as order statistics
    (the draw at or just outside each end): a draw may be inf (B_crit of a slope <= 0),
    and interpolating between two infs is inf - inf, nan and a RuntimeWarning."""
    import numpy as np
    lo = np.percentile(draws, 50 * (1 - level), method="lower")
    hi = np.percentile(draws, 50 * (1 + level), method="higher")
    return float(lo), float(hi)


def mvt(rng, mean, cov, df, n):
    """n draws of a multivariate t (location mean, scale cov, df)."""
    import numpy as np
    mean = np.asarray(mean, float)
    z = rng.multivariate_normal(np.zeros_like(mean), np.asarray(cov, float), size=n)
    return mean + z / np.sqrt(rng.chisquare(df, size=n) / df)[:, None]


def t_quantile(level: float, df: float) -> float:
    """Student's t multiplier of a standard error for a two-sided `level` interval."""
    from scipy import stats as sps
    return float(sps.t.ppf(0.5 + level / 2, df))


def converged(points) -> tuple[list[float], list[float], dict]:
    """{batch: [per-seed value or None]} -> the converged (B, E) pairs, as two lists, and
    the censored count per batch."""
    xs, ys, cens = [], [], {}
    for B, vals in sorted(points.items()):
        for v in vals:
            if reached(v):
                xs.append(float(B))
                ys.append(float(v))
            else:
                cens[B] = cens.get(B, 0) + 1
    return xs, ys, cens
