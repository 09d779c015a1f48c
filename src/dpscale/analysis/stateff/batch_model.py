"""The statistical-efficiency model: samples to target E against the global batch B,
E(B) = E_min (1 + B / B_crit), fitted over seeds (fit_batch_model), its prediction at a
batch not run (predict), its out-of-sample check (holdout), and B_crit beside the
measured noise scale (compare_b_crit)."""
from __future__ import annotations

import math
from typing import Iterable

from dpscale.analysis import stats
from dpscale.analysis.stateff.common import INF, LEVEL, SEEDS, converged, mvt, percentiles, reached, t_quantile
from dpscale.analysis.stateff.noise import STEPS


WEIGHTINGS = ("cv", "ols")


def fit_batch_model(points: dict, weighting: str = "cv", level: float = LEVEL, sources: dict | None = None) -> dict:
    """E(B) = E_min (1 + B / B_crit) = a + b B fitted to per-seed samples to target.

    points: {global batch B (samples): [samples to target of each seed, None where the
    seed did not reach the target]}. Each seed is a replicate, so two batch sizes with
    5 seeds each leave 8 residual degrees of freedom (the seeds' spread, not the
    model's misfit, is what the residuals measure there). McCandlish et al. 2018:
    E_min = a, the fewest samples (the small-batch limit), S_min = b, the fewest
    optimisation steps (the large-batch limit), B_crit = E_min / S_min = a / b, where
    the two limits meet. They derive the relation for an LR tuned at every batch; the
    `book` rule keeps lr 0.1, so a B_crit fitted to it is that rule's, not the model's.

    weighting "cv" (default): weighted least squares with weights 1 / E(B)^2, iterated
    from the fitted mean (a constant coefficient of variation across batches). The
    seeds' spread is a spread of where a noisy accuracy curve crosses the target;
    a larger batch stretches the curve over more samples, so the same accuracy noise
    becomes a spread in samples that grows with E(B). Weights come from the model's
    mean, not from each batch's sample variance: with 5 seeds, two batches' variances
    can differ by 10x by chance alone (F(4, 4)), and such weights would chase noise.
    "ols": equal weights (a spread that does not grow with B).
    Seeds that did not reach the target are left out and counted (`censored`): that
    biases E(B) down at their batch; holdout() and the report say so.

    Intervals: t with n - 2 df (level), from the (weighted) residual variance. B_crit's
    is Fieller's for b / a (1 / B_crit, bounded as a is far from 0), inverted: when b
    is not distinguishable from 0 the upper end is inf (no batch-size cost resolved).
    covers: independent seeded launches.

    Returns {"E_min", "S_min", "B_crit": {"value", "ci_lo", "ci_hi", "note"}, "coef" [a, b],
    "cov" (2 x 2), "df", "sigma" (per-seed spread: a cv for "cv", samples for "ols"),
    "weighting", "n", "batches", "censored", "sources", "level", "covers"}."""
    import numpy as np
    if weighting not in WEIGHTINGS:
        raise ValueError(f"fit_batch_model: weighting {weighting!r} is not one of {WEIGHTINGS}")
    xs, ys, cens = converged(points)
    x, y = np.array(xs), np.array(ys)
    batches = sorted({int(b) for b in xs})
    if len(batches) < 2 or x.size < 3:
        raise ValueError(f"fit_batch_model: needs 2 batch sizes and 3 converged seeds (got batches {batches}, "
                         f"{x.size} seeds)")
    coef, cov, s2 = _least_squares(x, y, weighting)
    df = x.size - 2
    t = t_quantile(level, df)
    a, b = float(coef[0]), float(coef[1])
    va, vb, cab = float(cov[0, 0]), float(cov[1, 1]), float(cov[0, 1])
    src = {int(B): (sources or {}).get(B, "measured") for B in batches}
    return {"E_min": _t_interval(a, math.sqrt(va), t), "S_min": _t_interval(b, math.sqrt(vb), t),
            "B_crit": _b_crit(a, b, va, vb, cab, df, level), "coef": [a, b], "cov": cov.tolist(), "df": df,
            "sigma": math.sqrt(s2), "weighting": weighting, "n": int(x.size), "batches": batches, "model": "line",
            "censored": {int(k): v for k, v in cens.items()}, "sources": src, "level": level, "covers": SEEDS}


def _least_squares(x, y, weighting: str):
    """fit_batch_model's line y = a + b x: the coefficients, their covariance and the
    residual variance (weighted, n - 2 df). "cv" iterates the weights 1 / mean^2 from
    the fitted mean until they settle (at most 50 rounds); "ols" stops at equal weights."""
    import numpy as np
    X = np.column_stack([np.ones_like(x), x])
    w = np.ones_like(x)
    for _ in range(50):
        coef = np.linalg.solve(X.T @ (w[:, None] * X), X.T @ (w * y))
        if weighting == "ols":
            break
        mu = X @ coef
        if np.any(mu <= 0):
            raise ValueError("fit_batch_model: the fitted E(B) is not positive at a measured batch")
        w_new = 1.0 / mu ** 2
        if np.allclose(w_new, w, rtol=1e-12, atol=0):
            break
        w = w_new
    resid = y - X @ coef
    s2 = float(np.sum(w * resid ** 2) / (x.size - 2))
    return coef, s2 * np.linalg.inv(X.T @ (w[:, None] * X)), s2



def _t_interval(value: float, sd: float, t: float) -> dict:
    """value +- t sd."""
    return {"value": value, "ci_lo": value - t * sd, "ci_hi": value + t * sd}


def _b_crit(a: float, b: float, va: float, vb: float, cab: float, df: int, level: float) -> dict:
    """B_crit = a / b with Fieller's interval for b / a (1 / B_crit) inverted, and a note
    where that interval leaves B_crit unbounded or undefined."""
    inv_lo, inv_hi = stats.fieller(b, a, vb, va, cab, df, level)
    if inv_lo is None:
        return {"value": a / b if b > 0 else INF, "ci_lo": None, "ci_hi": None,
                "note": "unbounded: E_min not distinguishable from 0"}
    if inv_hi <= 0:
        return {"value": None, "ci_lo": None, "ci_hi": None,
                "note": "E falls with B over the measured batches: no critical batch"}
    return {"value": a / b if b > 0 else INF, "ci_lo": 1.0 / inv_hi, "ci_hi": 1.0 / inv_lo if inv_lo > 0 else INF,
            "note": "" if inv_lo > 0 else "b not distinguishable from 0: no upper bound"}


def predict(fit: dict, batch: float, n_seeds: int = 1, level: float | None = None) -> dict:
    """E at global batch `batch` from a fit_batch_model fit, with two bands.

    conf_lo/conf_hi: the confidence band of the mean E(B), the expected samples to
    target over seeds: what the forecast table should show, since the question "will
    k GPUs reach the target sooner" is about the expected outcome, and it narrows as
    seeds are added. pred_lo/pred_hi: the prediction band for the mean of `n_seeds`
    new seeds (1: a single launch), which adds the seeds' own spread (sd_seed at this
    B): the band a new measurement of n seeds should fall in, so the one holdout()
    checks against."""
    import numpy as np
    level = fit["level"] if level is None else level
    x = np.array([1.0, float(batch)])
    cov = np.array(fit["cov"])
    mean = float(x @ np.array(fit["coef"]))
    se = math.sqrt(float(x @ cov @ x))
    sd_seed = fit["sigma"] * mean if fit["weighting"] == "cv" else fit["sigma"]
    t = t_quantile(level, fit["df"])
    sp = math.sqrt(se * se + sd_seed * sd_seed / n_seeds)
    return {"batch": float(batch), "mean": mean, "se": se, "conf_lo": mean - t * se, "conf_hi": mean + t * se,
            "pred_lo": mean - t * sp, "pred_hi": mean + t * sp, "sd_seed": sd_seed, "n_seeds": n_seeds,
            "level": level, "source": fit["sources"].get(int(batch), "predicted") if float(batch).is_integer()
            else "predicted"}


def holdout(points: dict, predict_batch: float, fit_batches: Iterable[float] | None = None,
            weighting: str = "cv", budget: float | None = None, level: float = LEVEL) -> dict:
    """Out-of-sample check: fit on the smaller batches only (default: every batch below
    predict_batch), predict E at predict_batch, compare with what was measured there.

    Returns {"predict_batch", "fit_batches", "fit", "predicted" (predict() with n_seeds =
    the seeds that reached the target there), "measured_mean" (their mean),
    "measured_n", "censored_n", "error" (predicted - measured), "relative_error",
    "inside_band" (the measured mean inside the prediction band for that many seeds),
    "p_seed_over_budget" and "p_censored_as_seen" when a budget is given}.

    Censored seeds at predict_batch: the mean of those that converged is biased low
    (said: measured_is_lower_bound); with a budget (the samples a seed may train),
    p_seed_over_budget is the model's probability that one new seed needs more than
    the budget (its single-seed predictive t), and p_censored_as_seen that at least
    as many of the launched seeds as were censored miss it (binomial on that
    probability): a small value means the model is too optimistic there."""
    from scipy import stats as sps
    fb = sorted(fit_batches) if fit_batches is not None else [B for B in points if B < predict_batch]
    fit = fit_batch_model({B: points[B] for B in fb}, weighting=weighting, level=level)
    vals = points.get(predict_batch, [])
    conv = [float(v) for v in vals if reached(v)]
    cens = len(vals) - len(conv)
    pred = predict(fit, predict_batch, n_seeds=max(len(conv), 1))
    out = {"predict_batch": predict_batch, "fit_batches": fb, "fit": fit, "predicted": pred, "measured_mean": None,
           "measured_n": len(conv), "censored_n": cens, "error": None, "relative_error": None, "inside_band": None,
           "measured_is_lower_bound": cens > 0 and bool(conv), "band": f"prediction band for the mean of "
           f"{pred['n_seeds']} seed(s)", "p_seed_over_budget": None, "p_censored_as_seen": None}
    if conv:
        m = sum(conv) / len(conv)
        out.update(measured_mean=m, error=pred["mean"] - m, relative_error=(pred["mean"] - m) / m,
                   inside_band=pred["pred_lo"] <= m <= pred["pred_hi"])
    if budget is not None:
        one = predict(fit, predict_batch, n_seeds=1)
        sp = (one["pred_hi"] - one["mean"]) / t_quantile(level, fit["df"])
        p = float(sps.t.sf((budget - one["mean"]) / sp, fit["df"]))
        out["p_seed_over_budget"] = p
        out["p_censored_as_seen"] = float(sps.binom.sf(cens - 1, len(vals), p)) if vals else None
    return out



def compare_b_crit(fit: dict, noise: dict, level: float = LEVEL, draws: int = 20000, seed: int = 0) -> dict:
    """B_crit (fit_batch_model) over B_simple (b_simple_window), with an interval.

    McCandlish et al. find B_crit of the same order of magnitude as the noise scale
    (B_simple tracks it within a small factor); this reports the ratio and its
    interval and does not force agreement. Monte Carlo over both estimates,
    independent (different data: the seeds' samples to target, and the gradients of
    one run's window): (a, b) from the fit's multivariate t (df n - 2), (mean tr,
    mean |G|^2) from the blocks' bivariate t (df blocks - 1); percentile interval. A
    draw with b <= 0 has B_crit = inf, one with |G|^2 <= 0 a B_simple of inf.

    Returns {"ratio", "ci_lo", "ci_hi", "log10_ratio", "same_order" (|log10| <= 1 at
    the point), "b_crit", "b_simple", "method", "level", "covers"}."""
    import numpy as np
    a, b = fit["coef"]
    out = {"ratio": None, "ci_lo": None, "ci_hi": None, "log10_ratio": None, "same_order": None,
           "b_crit": fit["B_crit"]["value"], "b_simple": noise.get("b_simple"), "level": level,
           "method": f"Monte Carlo ({draws} draws), the fit and the noise scale independent",
           "covers": f"{SEEDS} (B_crit) and {noise.get('covers') or STEPS} (the noise scale)"}
    if not out["b_crit"] or not out["b_simple"] or noise.get("cov") is None:
        out["method"] = "no ratio: B_crit or B_simple is missing or not positive"
        return out
    rng = np.random.default_rng(seed)
    ab = mvt(rng, [a, b], fit["cov"], fit["df"], draws)
    tg = mvt(rng, [noise["mean_trace"], noise["mean_g2"]], noise["cov"], noise["df"], draws)
    with np.errstate(divide="ignore", invalid="ignore"):
        bc = np.where(ab[:, 1] > 0, ab[:, 0] / ab[:, 1], np.inf)
        bs = np.where(tg[:, 1] > 0, tg[:, 0] / tg[:, 1], np.inf)
        r = np.where(np.isinf(bs), 0.0, bc / bs)
    lo, hi = percentiles(r, level)
    ratio = out["b_crit"] / out["b_simple"]
    out.update(ratio=ratio, ci_lo=lo, ci_hi=hi, log10_ratio=math.log10(ratio) if ratio > 0 else None,
               same_order=abs(math.log10(ratio)) <= 1 if ratio > 0 and math.isfinite(ratio) else False)
    return out

