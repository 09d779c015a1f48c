"""The power law beside the line: E(B) = c B^alpha, samples to target against the global
batch, fitted over seeds as log E = log c + alpha log B (least squares on the logs).

Why this second model: E(B) = E_min (1 + B / B_crit) (batch_model) is McCandlish et al.'s
for an LR tuned at every batch; the book's rule keeps lr 0.1, and nothing says its
samples to target grow linearly in B. A power law fits reference/h200's 20 seeds as
well as the line, and extrapolates very differently (at 4 nodes of 8 it predicts 0.6x
the line's samples): which one to believe is part of the forecast's uncertainty
(model_choice weighs them by their out-of-sample scores).

Least squares on the logs is the maximum-likelihood fit for a constant coefficient of
variation with lognormal seeds (the line's "cv" weighting, in logs); its residual sd s
is the per-seed cv. The expected samples to target is exp(mu + s^2 / 2) (the mean of a
lognormal), not exp(mu) (its median): the line fits the mean, so this does too.
"""
from __future__ import annotations

import math

from dpscale.analysis.stateff.common import LEVEL, SEEDS, converged, t_quantile


def fit_power_law(points: dict, level: float = LEVEL, sources: dict | None = None) -> dict:
    """log E = a + alpha log B over every converged seed (points: {batch: [per-seed samples
    to target, None where not reached]}), t intervals with n - 2 df.

    Returns {"model": "power", "coef" [log c, alpha], "cov" (2 x 2), "df", "sigma" (the
    residual sd of log E: the per-seed cv), "alpha": {"value", "ci_lo", "ci_hi"}, "n",
    "batches", "censored", "sources", "level", "covers"}."""
    import numpy as np
    xs, ys, cens = converged(points)
    batches = sorted({int(b) for b in xs})
    if len(batches) < 2 or len(xs) < 3:
        raise ValueError(f"fit_power_law: needs 2 batch sizes and 3 converged seeds (got batches {batches}, "
                         f"{len(xs)} seeds)")
    x, y = np.log(np.array(xs)), np.log(np.array(ys))
    X = np.column_stack([np.ones_like(x), x])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    df = x.size - 2
    s2 = float(np.sum((y - X @ coef) ** 2) / df)
    cov = s2 * np.linalg.inv(X.T @ X)
    t = t_quantile(level, df)
    half = t * math.sqrt(float(cov[1, 1]))
    return {"model": "power", "coef": [float(coef[0]), float(coef[1])], "cov": cov.tolist(), "df": df,
            "sigma": math.sqrt(s2), "alpha": {"value": float(coef[1]), "ci_lo": float(coef[1]) - half,
                                              "ci_hi": float(coef[1]) + half},
            "n": int(x.size), "batches": batches, "censored": {int(k): v for k, v in cens.items()},
            "sources": {int(B): (sources or {}).get(B, "measured") for B in batches}, "level": level,
            "covers": SEEDS}


def predict_power(fit: dict, batch: float, n_seeds: int = 1, level: float | None = None) -> dict:
    """E at `batch` from fit_power_law, with batch_model.predict's fields. The bands are t
    intervals on log E carried back (so they are not symmetric about the mean): conf_*,
    of the expected E(B); pred_*, of the mean of n_seeds new seeds, whose log has the
    seeds' variance s^2 / n added (the log of a mean of lognormal seeds, taken as normal:
    the cv is 10-20% here). se: the standard error of the expected E, delta method."""
    import numpy as np
    level = fit["level"] if level is None else level
    x = np.array([1.0, math.log(float(batch))])
    mu = float(x @ np.array(fit["coef"]))
    se_log = math.sqrt(float(x @ np.array(fit["cov"]) @ x))
    s2 = fit["sigma"] ** 2
    mean = math.exp(mu + s2 / 2)
    t = t_quantile(level, fit["df"])
    sp_log = math.sqrt(se_log ** 2 + s2 / n_seeds)
    return {"batch": float(batch), "mean": mean, "se": mean * se_log, "se_log": se_log, "sp_log": sp_log,
            "conf_lo": mean * math.exp(-t * se_log), "conf_hi": mean * math.exp(t * se_log),
            "pred_lo": mean * math.exp(-t * sp_log), "pred_hi": mean * math.exp(t * sp_log),
            "sd_seed": mean * fit["sigma"], "n_seeds": n_seeds, "level": level,
            "source": fit["sources"].get(int(batch), "predicted") if float(batch).is_integer() else "predicted"}
