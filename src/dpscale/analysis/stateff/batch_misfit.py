"""The E(B) model's own error: a between-batch misfit term, estimated out of sample, added
to the prediction band of stateff's statistical-efficiency model.

stateff.predict's band holds the seeds' spread and the fit's uncertainty: what the data
say *if* E(B) = a + b B is the true curve. On MLPerf's published convergence tables it
is not (docs/public-convergence.md: the band covers about half of the batches it
predicts). This module adds the model's error as a relative variance tau^2 beside
them, estimated from errors the model made out of sample:

- residuals: "predict the next" within the fit's own inputs. Each of the fit's batches
  with at least two batches below it is predicted from those below only (stateff.holdout);
  its relative error r = (measured - predicted) / measured and the part of it the band
  already claims, v = (the band's sd / measured)^2 (the seeds' spread of that mean and the
  fit's uncertainty), are one residual. Every residual records the batches it used.
- the misfit is a relative error of each batch's mean, independent between batches, of
  variance tau^2. It reaches a prediction twice: at the predicted batch itself, and
  through the fit, whose batches carry it too; the second grows with how far the
  prediction extrapolates (leverage h, computed for stateff's weighting). A residual's
  misfit variance is tau^2 (1 + h).
- tau^2 solves sum r^2 / (v + tau^2 (1 + h)) = k over the k residuals (the Paule-Mandel
  moment estimator of meta-analysis with the mean held at 0: a biased model's bias is
  error the band must carry too, so it is not taken out), 0 where the band's own variance
  already explains the residuals (sum r^2 / v <= k).
- own or pooled: a fit with at least MIN_OWN residuals of its own uses them; with fewer,
  its own ones and a pool from elsewhere (other tables' residuals: the caller says which,
  and every row says which it took).
- the widened band: mean +- q sqrt(sp^2 + tau^2 (1 + h0) mean^2), where sp is stateff's
  prediction sd, h0 the prediction's leverage and q Student's t at the Welch-Satterthwaite
  df of the two parts (the fit's n - 2 for sp, k for tau^2, as for a variance estimated
  from k values around a known mean).

Without the leverage (tau^2 alone), a synthetic table whose misfit is exactly this model
(tests/test_convergence.py) gave 87% coverage on predictions from 2-4 batches and 99% on
those from more: one average tau^2 cannot serve both; with it, both are at 94%.

MIN_OWN = 3 was set before any result was seen: the fewest residuals for which a t
quantile at 95% (t(3) = 3.18) gives a band of usable width; it is not tuned.
"""
from __future__ import annotations

import functools
import math
from typing import Iterable

from dpscale.analysis.stateff import batch_model, common

LEVEL = common.LEVEL
MIN_OWN = 3
WHAT = ("between-batch misfit of E(B) = a + b B: the relative error of predicting each batch from the "
        "smaller ones, beyond the seeds' spread and the fit's uncertainty")


def _t(level: float, df: float) -> float:
    from scipy import stats as sps
    return float(sps.t.ppf(0.5 + level / 2, df))


def leverage(points: dict, coef, batch: float) -> float:
    """How much misfit at the fit's own batches moves the prediction at `batch`, relative
    to misfit at `batch` itself: h = x0' V x0 / E0^2, where V is the covariance of
    stateff's (a, b) when each fit batch's mean is off by an independent relative error of
    variance 1 (seeds at batch B weigh n_B / E(B)^2 in stateff's cv fit, so V is the
    sandwich A^-1 (sum w_B^2 E_B^2 x x') A^-1, A = sum w_B x x'). A prediction near the
    fit's batches has h < 1; one far beyond them, h >> 1. Written here: no library has it."""
    import numpy as np
    a, b = float(coef[0]), float(coef[1])
    A, S = np.zeros((2, 2)), np.zeros((2, 2))
    for B, vals in points.items():
        n, e = sum(1 for v in vals if v is not None and math.isfinite(v)), a + b * float(B)
        if not n or e <= 0:
            continue
        x = np.array([1.0, float(B)])
        A += n / e ** 2 * np.outer(x, x)
        S += n * n / e ** 2 * np.outer(x, x)
    inv, x0, e0 = np.linalg.inv(A), np.array([1.0, float(batch)]), a + b * float(batch)
    return float(x0 @ inv @ S @ inv @ x0) / e0 ** 2


def residual(points: dict, batch, weighting: str = "cv", level: float = LEVEL, table: str = "") -> dict | None:
    """One out-of-sample residual: `batch` predicted from every batch of `points` below it
    (stateff.holdout), or None where it cannot be (fewer than 2 below, a failed fit, no
    converged seed). Relative to the measured mean, as an error in percent is; `leverage`
    is the prediction's h (leverage())."""
    key = held_out_key(points, batch)
    return None if key is None else as_row(_residual(key, weighting, level), table)


def held_out_key(points: dict, batch) -> tuple | None:
    """What a "predict the next" residual reads, as a memo key: the batches below `batch`
    with their seeds, the batch and its own seeds; None with fewer than 2 below. A table's
    rows (convergence_check) each ask again for the residuals below them, and misfit()
    for the same residuals at every k of a forecast: the same fits (this module's and
    model_choice's residuals are memoised on it)."""
    below = [B for B in sorted(points) if B < batch]
    if len(below) < 2:
        return None
    return tuple((B, tuple(points[B])) for B in below), batch, tuple(points.get(batch, ()))


def as_row(r: dict | None, table: str) -> dict | None:
    """A memoised residual as its caller's own row (the memo's is shared, so copied)."""
    return None if r is None else {"table": table, **r, "fit_batches": list(r["fit_batches"])}


@functools.lru_cache(maxsize=4096)
def _residual(key: tuple, weighting: str, level: float) -> dict | None:
    below_vals, batch, at = key
    points = {B: list(vals) for B, vals in below_vals}
    below = list(points)
    if at:
        points[batch] = list(at)
    try:
        h = batch_model.holdout(points, batch, fit_batches=below, weighting=weighting, level=level)
    except ValueError:
        return None
    if h["measured_mean"] is None:
        return None
    pr, m = h["predicted"], h["measured_mean"]
    sp = (pr["pred_hi"] - pr["mean"]) / _t(level, h["fit"]["df"])
    return {"batch": batch, "fit_batches": tuple(h["fit"]["batches"]),
            "relative": (m - pr["mean"]) / m, "noise_var": (sp / m) ** 2,
            "leverage": leverage({B: points[B] for B in below}, h["fit"]["coef"], batch)}


def next_residuals(points: dict, weighting: str = "cv", level: float = LEVEL, table: str = "") -> list[dict]:
    """Every "predict the next" residual within `points` (the fit's inputs): each batch
    with at least two below it, from those below only."""
    out = [residual(points, B, weighting, level, table) for B in sorted(points)]
    return [r for r in out if r is not None]


def misfit_variance(residuals: Iterable[dict]) -> float | None:
    """tau^2: the relative variance the residuals show beyond their own noise_var, by the
    Paule-Mandel moment equation with the mean held at 0 (scipy's brentq solves it);
    None without residuals. Written here: scipy has no random-effects variance."""
    from scipy.optimize import brentq
    rs = [(r["relative"] ** 2, r["noise_var"], 1.0 + r["leverage"]) for r in residuals]
    k = len(rs)
    if not k:
        return None

    def excess(tau2: float) -> float:
        return sum(r2 / (v + tau2 * g) if v + tau2 * g > 0 else (0.0 if r2 == 0 else math.inf)
                   for r2, v, g in rs) - k

    if excess(0.0) <= 0:
        return 0.0
    hi = sum(r2 for r2, _, _ in rs)   # g >= 1, so excess(hi) <= 1 - k <= 0: the root lies in (0, hi]
    return float(brentq(excess, 1e-300, hi)) if excess(hi) < 0 else hi


def _satterthwaite(a: float, df_a: float, m: float, df_m: float) -> float:
    """Welch-Satterthwaite df of the sum of two variance estimates (by hand: scipy has none)."""
    if m <= 0:
        return df_a
    return (a + m) ** 2 / (a * a / df_a + m * m / df_m)


def _chosen(own: list[dict], pool: Iterable[dict], min_own: int) -> tuple[list[dict], str]:
    if len(own) >= min_own:
        return own, "own"
    seen = {(r["table"], r["batch"], tuple(r["fit_batches"])) for r in own}
    extra = [r for r in pool if (r["table"], r["batch"], tuple(r["fit_batches"])) not in seen]
    return own + extra, "pooled" if extra else "own"


def widened(points: dict, batch: float, n_seeds: int = 1, level: float = LEVEL, weighting: str = "cv",
            pool: Iterable[dict] = (), min_own: int = MIN_OWN, table: str = "") -> dict:
    """E at `batch` from stateff.fit_batch_model(points) with the band that carries the
    model's own error.

    points: the fit's inputs, {global batch: [per-seed samples to target, None = not
    reached]} (only what the prediction may use: in a holdout, the batches below the one
    predicted). pool: residuals from elsewhere (next_residuals of other tables), used only
    when `points` give fewer than `min_own` of their own.

    Returns {"fit", "predicted" (stateff.predict for the mean of n_seeds), "mean",
    "band_lo", "band_hi" (the widened band), "sd" (its total sd), "q", "df", "misfit":
    {"rel_sd" (tau), "k", "source" ("own" | "pooled" | "none"), "residuals" (table, batch,
    fit_batches of each residual used)}, "level", "covers"}. With no residual at all the
    band is stateff's and misfit.source says "none"."""
    fit = batch_model.fit_batch_model(points, weighting=weighting, level=level)
    pr = batch_model.predict(fit, batch, n_seeds=n_seeds, level=level)
    used, source = _chosen(next_residuals(points, weighting, level, table), pool, min_own)
    tau2 = misfit_variance(used)
    sp2 = ((pr["pred_hi"] - pr["mean"]) / _t(level, fit["df"])) ** 2
    lev = leverage(points, fit["coef"], batch)
    m2 = 0.0 if tau2 is None else tau2 * (1.0 + lev) * pr["mean"] ** 2
    df = _satterthwaite(sp2, fit["df"], m2, len(used))
    q, sd = _t(level, df), math.sqrt(sp2 + m2)
    return {"fit": fit, "predicted": pr, "mean": pr["mean"], "band_lo": pr["mean"] - q * sd,
            "band_hi": pr["mean"] + q * sd, "sd": sd, "q": q, "df": df, "level": level,
            "misfit": {"rel_sd": None if tau2 is None else math.sqrt(tau2), "leverage": lev, "k": len(used),
                       "source": "none" if tau2 is None else source,
                       "residuals": [{k: r[k] for k in ("table", "batch", "fit_batches")} for r in used]},
            "covers": f"{common.SEEDS}, the fit's uncertainty and the {WHAT}"}
