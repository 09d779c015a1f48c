"""Which model of samples to target against the batch: the line E(B) = E_min (1 + B /
B_crit) (batch_model) and the power law E(B) = c B^alpha (power_law), weighted by how
well each predicted batches it was not fitted to, so that a forecast carries the
choice of model in its band, not only one model's fit.

    choose(points, fit_batches)   both models fitted on fit_batches, their leave-one-
                                  batch-out checks (lobo) and weights (weights)
    holdout(points, B, fit_batches)  each model and their mixture predicting batch B from
                                  fit_batches only (the weights from those batches too)
    draw_expected(set, batches, rng, n)  Monte Carlo draws of the expected samples to target
                                  over the mixture: a model per draw by its weight, then
                                  its parameters from their multivariate t
    misfit_band(draws, B, set, rng)  the between-batch misfit (batch_misfit: own or public
                                  residuals) widening a band

Weights: pseudo-BMA+ (Yao, Vehtari, Simpson and Gelman 2018, "Using stacking to average
Bayesian predictive distributions", Bayesian Analysis 13(3), section 3.2): each model's
log predictive density of every held-out batch's mean, summed over a Bayesian bootstrap
of the folds (Dirichlet(1, ..., 1) weights), soft-maxed, averaged over the bootstrap.
The bootstrap keeps a model that wins one fold by a hair from taking all the weight. It
is written here because no library the project installs does it (arviz's compare does,
from posterior draws this least-squares fit does not make).
"""
from __future__ import annotations

import functools
import math
from typing import Iterable

from dpscale.analysis.stateff import batch_misfit, batch_model, power_law
from dpscale.analysis.stateff.common import LEVEL, mvt, percentiles, reached

NAMES = {"line": "the line", "power": "the power law"}
FITS = {"line": lambda pts, level, src: batch_model.fit_batch_model(pts, level=level, sources=src),
        "power": lambda pts, level, src: power_law.fit_power_law(pts, level=level, sources=src)}
BOOTSTRAP = 4000


def predict(fit: dict, batch: float, n_seeds: int = 1, level: float | None = None) -> dict:
    """batch_model.predict's fields from either model's fit."""
    if fit["model"] == "power":
        return power_law.predict_power(fit, batch, n_seeds, level)
    return batch_model.predict(fit, batch, n_seeds, level)


def log_density(fit: dict, batch: float, mean_of_seeds: float, n_seeds: int) -> float:
    """The model's log predictive density of the mean of n_seeds new seeds at `batch`,
    per unit of samples (both models on the same scale, so they compare): the line's is
    Student's t about its mean (predict's pred band); the power law's is Student's t on
    the log, with the Jacobian 1 / mean."""
    from scipy import stats as sps
    p = predict(fit, batch, n_seeds)
    if fit["model"] == "power":
        z = (math.log(mean_of_seeds) - math.log(p["mean"])) / p["sp_log"]
        return float(sps.t.logpdf(z, fit["df"])) - math.log(p["sp_log"]) - math.log(mean_of_seeds)
    sp = math.sqrt(p["se"] ** 2 + p["sd_seed"] ** 2 / n_seeds)
    return float(sps.t.logpdf((mean_of_seeds - p["mean"]) / sp, fit["df"])) - math.log(sp)


def _fits(points: dict, level: float, sources: dict | None) -> dict:
    """Each model fitted to `points`; a model that cannot be fitted there is left out."""
    out = {}
    for name, fit in FITS.items():
        try:
            out[name] = fit(points, level, sources)
        except ValueError:
            continue
    return out


def lobo(points: dict, level: float = LEVEL) -> list[dict]:
    """Leave one batch out: each batch with a converged seed predicted by each model
    fitted to the other batches (a fold needs two other batches). Per fold: {"batch",
    "n" (its converged seeds), "censored", "measured_mean", "models": {name: {"mean",
    "pred_lo", "pred_hi" (the band for the mean of n seeds), "log_density",
    "relative_error"}}}; a fold only where every model could be fitted."""
    rows = []
    for B in sorted(points):
        conv = [float(v) for v in points[B] if reached(v)]
        rest = {b: v for b, v in points.items() if b != B}
        fits = _fits(rest, level, None) if conv and len(rest) >= 2 else {}
        if not conv or set(fits) != set(FITS):
            continue
        y = sum(conv) / len(conv)
        models = {}
        for name, f in fits.items():
            p = predict(f, B, len(conv))
            models[name] = {"mean": p["mean"], "pred_lo": p["pred_lo"], "pred_hi": p["pred_hi"],
                            "log_density": log_density(f, B, y, len(conv)), "relative_error": (p["mean"] - y) / y}
        rows.append({"batch": B, "n": len(conv), "censored": len(points[B]) - len(conv), "measured_mean": y,
                     "models": models})
    return rows


def weights(folds: list[dict], draws: int = BOOTSTRAP, seed: int = 0) -> dict:
    """Pseudo-BMA+ weights of the models from lobo()'s folds (module docstring). Without
    a fold (fewer than three batches), equal weights, said so. Returns {"weights": {name:
    w}, "elpd": {name: summed log density}, "folds", "method"}."""
    import numpy as np
    from scipy.special import softmax
    names = list(FITS)
    if not folds:
        return {"weights": {n: 1 / len(names) for n in names}, "elpd": None, "folds": 0,
                "method": "equal weights: no batch can be left out (a model needs two others to be fitted)"}
    L = np.array([[f["models"][n]["log_density"] for n in names] for f in folds])
    alpha = np.random.default_rng(seed).dirichlet(np.ones(len(folds)), draws)
    w = softmax(len(folds) * alpha @ L, axis=1).mean(axis=0)
    return {"weights": dict(zip(names, map(float, w))), "elpd": dict(zip(names, map(float, L.sum(axis=0)))),
            "folds": len(folds), "method": f"pseudo-BMA+ over {len(folds)} leave-one-batch-out folds "
                                          f"({draws} Bayesian-bootstrap draws)"}


def choose(points: dict, fit_batches: Iterable[float] | None = None, level: float = LEVEL,
           sources: dict | None = None, pool=()) -> dict:
    """Both models fitted to the batches in fit_batches (default: all), weighted by their
    leave-one-batch-out scores over those same batches only. pool: "predict the next"
    residuals from elsewhere (public convergence tables: dpscale.analysis.stateff.batch_misfit),
    which misfit_band borrows where these batches give too few of their own. Returns
    {"fits": {name: fit}, "weights", "elpd", "folds", "method", "lobo" (the folds),
    "fit_batches", "points" (the fitted batches' seeds), "pool"}; ValueError when no model
    can be fitted."""
    fb = sorted(points) if fit_batches is None else sorted(fit_batches)
    pts = {B: points[B] for B in fb}
    fits = _fits(pts, level, sources)
    if not fits:
        raise ValueError(f"choose: no model can be fitted to batches {fb}")
    folds = lobo(pts, level)
    w = weights(folds)
    ws = {n: w["weights"][n] for n in fits}
    total = sum(ws.values())
    return {"fits": fits, "weights": {n: v / total for n, v in ws.items()}, "elpd": w["elpd"], "folds": w["folds"],
            "method": w["method"], "lobo": folds, "fit_batches": fb, "points": pts, "pool": tuple(pool)}


def as_set(models: dict) -> dict:
    """A choose() record, or one fit (a fit_batch_model or fit_power_law record) as a set of
    one with weight 1."""
    if "fits" in models:
        return models
    name = models.get("model", "line")
    return {"fits": {name: models}, "weights": {name: 1.0}, "elpd": None, "folds": 0, "method": "one model",
            "lobo": [], "fit_batches": list(models.get("batches", [])), "points": None, "pool": ()}


def _expected(fit: dict, params, batches):
    """The expected samples to target at each batch for each parameter draw (rows)."""
    import numpy as np
    b = np.asarray(batches, float)[None, :]
    if fit["model"] == "power":
        return np.exp(params[:, :1] + params[:, 1:2] * np.log(b) + fit["sigma"] ** 2 / 2)
    return params[:, :1] + params[:, 1:2] * b


def draw_expected(models: dict, batches, rng, n: int):
    """n Monte Carlo draws of the expected samples to target at each of `batches`, over the
    mixture: a model per draw by its weight (one model for every batch of a draw, so the
    batches are compared on the same model), then its (coef) from its multivariate t.
    Returns (draws: n x len(batches), the model of each draw: n names)."""
    import numpy as np
    s = as_set(models)
    names = list(s["fits"])
    pick = rng.choice(len(names), size=n, p=[s["weights"][m] for m in names])
    out = np.empty((n, len(batches)))
    for i, name in enumerate(names):
        f = s["fits"][name]
        out[pick == i] = _expected(f, mvt(rng, f["coef"], f["cov"], f["df"], int((pick == i).sum())), batches)
    return out, np.array(names)[pick]


MIXTURE_DRAWS = 4000   # per residual: its mean and sd to well under the residuals' own spread


def residual(points: dict, batch, level: float = LEVEL, table: str = "", seed: int = 0) -> dict | None:
    """One "predict the next" residual of the mixture this module draws (batch_misfit's
    residual() is the line's): `batch` predicted from every batch of `points` below it by
    choose() over those alone, weights included. relative = (measured - the mixture's
    mean) / measured; noise_var = (sd of the mixture's draws of the mean of that batch's
    seeds / measured)^2, the part the band already carries; leverage: the line's (how far
    the prediction reaches past its batches; the power law's would need its own
    sandwich, and the line's extrapolates the same distance). None where it cannot be."""
    key = batch_misfit.held_out_key(points, batch)
    return None if key is None else batch_misfit.as_row(_residual(key, level, seed), table)


@functools.lru_cache(maxsize=4096)
def _residual(key: tuple, level: float, seed: int) -> dict | None:
    import numpy as np
    below_vals, batch, at = key
    points = {B: list(vals) for B, vals in below_vals}
    below = list(points)
    conv = [float(v) for v in at if reached(v)]
    if not conv:
        return None
    try:
        s = choose(points, below, level)
    except ValueError:
        return None
    d = _draw_seed_means(s, batch, len(conv), np.random.default_rng(seed), MIXTURE_DRAWS)
    m, mean = sum(conv) / len(conv), float(np.mean(d))
    lev = batch_misfit.leverage(points, s["fits"]["line"]["coef"], batch) if "line" in s["fits"] else 0.0
    return {"batch": batch, "fit_batches": tuple(below), "relative": (m - mean) / m,
            "noise_var": (float(np.std(d)) / m) ** 2, "leverage": lev, "model": "mixture"}


def next_residuals(points: dict, level: float = LEVEL, table: str = "") -> list[dict]:
    """Every "predict the next" residual of the mixture within `points`."""
    out = [residual(points, B, level, table) for B in sorted(points)]
    return [r for r in out if r is not None]


def misfit(s: dict, batch: float) -> dict | None:
    """The between-batch misfit at `batch` of a choose() record (batch_misfit, issue #44):
    tau, the relative sd by which a batch's mean sits off the model actually drawn (the
    mixture of the line and the power law, by their weights), estimated from its "predict
    the next" errors among the fitted batches (their own when they give
    batch_misfit.MIN_OWN, else with s["pool"], public tables' mixture residuals, beside
    them), and the leverage h by which misfit at the fitted batches reaches `batch`
    through the fit. None where nothing can be estimated (no points, no residual)."""
    pts = s.get("points")
    if not pts or "line" not in s["fits"]:
        return None
    own = next_residuals(pts)
    used, source = batch_misfit._chosen(own, s.get("pool") or (), batch_misfit.MIN_OWN)
    tau2 = batch_misfit.misfit_variance(used)
    if tau2 is None:
        return None
    h = batch_misfit.leverage(pts, s["fits"]["line"]["coef"], batch)
    return {"rel_sd": math.sqrt(tau2), "leverage": h, "k": len(used), "own": len(own), "source": source}


def misfit_band(draws, batch: float, s: dict, rng, u=None):
    """Draws of the samples to target at `batch` (the expected value in the forecast; the
    mean of n new seeds in holdout()), already carrying the models, their fits and the
    seeds, widened by the between-batch misfit (misfit()): each draw times (1 + e), e =
    tau sqrt(1 + h) x Student's t with as many df as residuals estimated tau (a relative
    error of the mean, as batch_misfit's band has it; a draw kept above 5% of itself, a
    sample count being positive). u: one uniform per draw, shared by every batch of a
    forecast, so that a draw's misfit is the same quantile of its t at every batch (a
    model that sits off the data sits off at each k of one draw alike: drawn afresh per k
    the errors would cancel in the comparison of k's); None: drawn here. Returns (draws,
    the misfit record or None: unchanged)."""
    from scipy import stats as sps
    m = misfit(s, batch)
    if m is None or m["rel_sd"] == 0:
        return draws, m
    t = rng.standard_t(m["k"], size=len(draws)) if u is None else sps.t.ppf(u, m["k"])
    e = m["rel_sd"] * math.sqrt(1.0 + m["leverage"]) * t
    return draws * (1.0 + e).clip(min=0.05), m


def holdout(points: dict, predict_batch: float, fit_batches: Iterable[float], level: float = LEVEL,
            draws: int = 20000, seed: int = 0, pool=()) -> dict:
    """Each model, and their mixture, predicting the mean of the seeds that converged at
    predict_batch from fit_batches alone (the weights from those batches' own folds).

    Returns {"weights", "method", "models": {name: {"mean", "pred_lo", "pred_hi",
    "relative_error", "inside_band"}}, "combined": the same for the mixture (its band the
    level percentiles of draws of the mean of n seeds, through misfit_band), "measured_mean",
    "measured_n"}."""
    import numpy as np
    s = choose(points, fit_batches, level, pool=pool)
    conv = [float(v) for v in points.get(predict_batch, []) if reached(v)]
    n = max(len(conv), 1)
    y = sum(conv) / len(conv) if conv else None
    out = {"weights": s["weights"], "method": s["method"], "measured_mean": y, "measured_n": len(conv), "models": {}}
    for name, f in s["fits"].items():
        p = predict(f, predict_batch, n, level)
        out["models"][name] = _scored(p["mean"], p["pred_lo"], p["pred_hi"], y)
    rng = np.random.default_rng(seed)
    d = _draw_seed_means(s, predict_batch, n, rng, draws)
    d, out["misfit"] = misfit_band(d, predict_batch, s, rng)
    lo, hi = percentiles(d, level)
    mean = sum(s["weights"][m] * out["models"][m]["mean"] for m in s["fits"])
    out["combined"] = _scored(mean, lo, hi, y)
    return out


def _scored(mean: float, lo: float, hi: float, measured: float | None) -> dict:
    return {"mean": mean, "pred_lo": lo, "pred_hi": hi,
            "relative_error": None if measured is None else (mean - measured) / measured,
            "inside_band": None if measured is None else lo <= measured <= hi}


def _draw_seed_means(s: dict, batch: float, n_seeds: int, rng, draws: int):
    """Draws of the mean of n_seeds new seeds at `batch` over the mixture: each model's
    predictive t (its fit's error and the seeds' spread), a model per draw by its weight."""
    import numpy as np
    names = list(s["fits"])
    pick = rng.choice(len(names), size=draws, p=[s["weights"][m] for m in names])
    out = np.empty(draws)
    for i, name in enumerate(names):
        f, k = s["fits"][name], int((pick == i).sum())
        p = predict(f, batch, n_seeds)
        t = rng.standard_t(f["df"], k)
        out[pick == i] = (p["mean"] * np.exp(p["sp_log"] * t) if name == "power"
                          else p["mean"] + math.sqrt(p["se"] ** 2 + p["sd_seed"] ** 2 / n_seeds) * t)
    return out
