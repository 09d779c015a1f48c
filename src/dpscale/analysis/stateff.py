"""Statistical efficiency: how many more samples a larger global batch needs to reach a
target accuracy, with intervals, a model that predicts it at batches not run, and the
time-to-accuracy forecast that follows from it.

Pure (numpy and scipy, loaded on first use; no torch). The pieces:

a. crossing(curve, target): where one seed's accuracy curve first reaches the target,
   MLPerf's way (the first evaluation at or above it) and interpolated between the
   evaluations that bracket it, with the bracket's width (the resolution).
b. ratio_over_seeds(base, other): statistical efficiency (samples to target at k=1 /
   at k) or time-to-accuracy speed-up (seconds at k=1 / at k), with a 95% interval
   over independent seeded launches; seeds that did not reach the target within the
   budget are right-censored, as MLPerf counts them.
c. noise_terms, NoiseScale, b_simple_window: the gradient noise scale of McCandlish,
   Kaplan, Amodei et al. 2018 ("An Empirical Model of Large-Batch Training", appendix
   A), from the squared norms of per-rank and averaged gradients.
d. fit_batch_model, predict, holdout, compare_b_crit: E(B) = E_min (1 + B / B_crit),
   fitted over seeds, checked out of sample and against B_simple.
e. tta_forecast: time to accuracy(k) = predicted samples to target at B = k x b over
   samples/s(k), with a joint band, the fastest k and the k that costs fewest GPU-hours.

Every interval says what it covers (`covers`): SEEDS ("independent seeded launches")
for anything over seeds, the blocks of steps of one run for the noise scale.
"""
from __future__ import annotations

import math
from typing import Iterable

from dpscale.analysis import stats, tta

LEVEL = stats.LEVEL
SEEDS = "independent seeded launches"
STEPS = ("blocks of consecutive steps of this window of one run: the minibatches' sampling noise, "
         "not other seeds or other windows")
INF = math.inf


# ---------------------------------------------------------------- a. crossing

def crossing(curve: list[dict], target: float, eval_seconds: float = 0.0,
             train_images: int | None = None) -> dict:
    """Where one seed's accuracy curve first reaches `target`.

    curve: the evaluations in order, [{"samples", "seconds", "accuracy"}, ...]
    (a result's runs[i]["curve"]). Returns
      status: "interpolated" (between two evaluations), "exact" (an evaluation is
        exactly at the target), "starts_above" (the first evaluation is already at or
        above it), "never" (no evaluation reaches it: right-censored);
      mlperf: the first evaluation at or above the target, as it is ({samples,
        seconds, accuracy, epochs}; None when never) - MLPerf's value, kept unchanged;
      samples, seconds (and epochs with train_images): the interpolated crossing;
      bracket_samples: [last evaluation below, first at or above] and
      resolution_samples, its width; fraction: where in the bracket it falls;
      best_accuracy; censored_samples / censored_seconds: how far a curve that never
        reached the target went (the budget it used).

    Linear interpolation, of samples and of seconds, between the last evaluation
    below the target and the first at or above it. It assumes the accuracy rose
    steadily (linearly in samples) across that one bracket and that samples/s was
    constant inside it. Acceptable because the bracket is narrow (half an epoch at
    paper scale) beside the samples to target (2-7 epochs), and whatever the curve
    did inside it, the crossing lies in the bracket: the error is at most the
    resolution, while MLPerf's first evaluation at or above is late by up to the
    resolution (by half of it on average). The evaluation accuracy is noisy (one
    t10k pass: the reference curves move by 1-10 points between evaluations), so the
    fraction carries that noise; it stays bounded by the bracket.

    First crossing counts: a curve that dips back below after reaching the target is
    scored at its first crossing (MLPerf stops there), and every evaluation before
    the first at or above is below, so the bracket is always the pair of consecutive
    evaluations around it. A curve that starts above has no evaluation below: the
    crossing is somewhere in (0, first evaluation]; samples and seconds are the first
    evaluation's (an upper bound) and the resolution is the whole bracket.

    eval_seconds: the duration of one evaluation, which the clock includes in each
    evaluation's seconds. 0 (default): plain linear interpolation of the clock.
    Given (a run's eval_s / evaluations), the training time inside the bracket is
    interpolated and one evaluation is added, which is what the clock would have read
    had an evaluation been placed at the crossing."""
    pts = _increasing(curve)
    out = {"target": target, "status": "never", "mlperf": None, "samples": None, "seconds": None, "epochs": None,
           "bracket_samples": None, "resolution_samples": None, "fraction": None,
           "best_accuracy": max((p["accuracy"] for p in pts), default=None),
           "censored_samples": pts[-1]["samples"] if pts else 0, "censored_seconds": pts[-1]["seconds"] if pts else 0.0}
    i = next((j for j, p in enumerate(pts) if p["accuracy"] >= target), None)
    if i is None:
        return out
    first = pts[i]
    out.update(mlperf={k: first[k] for k in ("samples", "seconds", "accuracy")}, censored_samples=None,
               censored_seconds=None)
    out["mlperf"]["epochs"] = _epochs(first["samples"], train_images)
    out.update(_from_start(first) if i == 0 else _between(pts[i - 1], first, target, eval_seconds))
    out["epochs"] = _epochs(out["samples"], train_images)
    return out


def _increasing(curve: list[dict]) -> list[dict]:
    """The curve as a list; ValueError unless its samples strictly increase."""
    pts = list(curve)
    for p, q in zip(pts, pts[1:]):
        if q["samples"] <= p["samples"]:
            raise ValueError(f"crossing: the curve's samples must increase ({p['samples']} then {q['samples']})")
    return pts


def _epochs(samples, train_images: int | None) -> float | None:
    return samples / train_images if train_images and samples is not None else None


def _from_start(first: dict) -> dict:
    """crossing's fields for a curve whose first evaluation is at or above the target."""
    return {"status": "starts_above", "samples": float(first["samples"]), "seconds": float(first["seconds"]),
            "bracket_samples": [0, first["samples"]], "resolution_samples": float(first["samples"])}


def _between(prev: dict, first: dict, target: float, eval_seconds: float) -> dict:
    """crossing's fields interpolated between the last evaluation below the target and the first at or above."""
    f = (target - prev["accuracy"]) / (first["accuracy"] - prev["accuracy"])   # > 0: prev below, first at/above
    train_dt = first["seconds"] - prev["seconds"] - eval_seconds
    return {"status": "exact" if first["accuracy"] == target else "interpolated", "fraction": f,
            "samples": prev["samples"] + f * (first["samples"] - prev["samples"]),
            "seconds": prev["seconds"] + f * train_dt + eval_seconds,
            "bracket_samples": [prev["samples"], first["samples"]],
            "resolution_samples": float(first["samples"] - prev["samples"])}


def seed_rows(runs: list[dict], target: float, train_images: int | None = None,
              eval_correction: bool = False) -> list[dict]:
    """One row per seed of a ddp_tta result's runs: MLPerf's values and the interpolated
    crossing beside them. A seed that never reached the target has converged False and
    None values (right-censored at censored_samples). eval_correction: pass each run's
    own evaluation time (eval_s / evaluations) to crossing()."""
    rows = []
    for r in runs:
        each = r["eval_s"] / r["evaluations"] if eval_correction and r.get("evaluations") else 0.0
        c = crossing(r["curve"], target, each, train_images)
        m = c["mlperf"] or {}
        rows.append({"seed": r["seed"], "converged": c["mlperf"] is not None, "status": c["status"],
                     "mlperf_samples": m.get("samples"), "mlperf_epochs": m.get("epochs"),
                     "mlperf_seconds": m.get("seconds"), "samples": c["samples"], "epochs": c["epochs"],
                     "seconds": c["seconds"], "resolution_samples": c["resolution_samples"],
                     "best_accuracy": c["best_accuracy"], "censored_samples": c["censored_samples"]})
    return rows


# ---------------------------------------------------------------- b. intervals over seeds

def _reached(v: float | None) -> bool:
    """Whether a seed's value says it reached the target: None, nan and inf say it did not."""
    return v is not None and math.isfinite(v)


def _as_censored(values: Iterable[float | None]):
    """Per-seed values as a float array, a seed that never reached the target (None,
    nan or inf) as +inf: slower than every seed that did."""
    import numpy as np
    a = np.array([float(v) if _reached(v) else INF for v in values])
    return a, int(np.isinf(a).sum())


def olympic(values: Iterable[float | None]) -> float | None:
    """MLPerf's score of per-seed values (None = not reached): tta.score's value."""
    runs = [{"seed": i, "converged": _reached(v), "x_to_target": v}
            for i, v in enumerate(values)]
    return tta.score(runs, "x")["value"]


def trimmed(values: Iterable[float | None]) -> dict | None:
    """The trimmed mean that MLPerf's score is (one value cut at each end; 20% at n=5)
    with Yuen's standard error from the Winsorized sample: the lowest value replaced
    by the second lowest, the highest by the second highest. A censored seed, being
    the highest, is replaced by the second highest whatever its true value, so one
    censored seed changes neither the score nor its error; two leave none (as MLPerf).
    Needs n >= 5 (h = n - 2 >= 3 kept values: Yuen's df = h - 1 >= 2)."""
    import numpy as np
    a, cens = _as_censored(values)
    n = a.size
    if n < 5 or cens > 1:
        return None
    s = np.sort(a)
    h = n - 2
    w = s.copy()
    w[0], w[-1] = s[1], s[-2]
    var = (n - 1) * float(w.var(ddof=1)) / (h * (h - 1))
    return {"value": float(s[1:-1].mean()), "var": var, "h": h, "n": n, "censored": cens}


def _percentiles(draws, level: float) -> tuple[float, float]:
    """The central `level` percentile interval of Monte Carlo draws, as order statistics
    (the draw at or just outside each end): a draw may be inf (B_crit of a slope <= 0),
    and interpolating between two infs is inf - inf, nan and a RuntimeWarning."""
    import numpy as np
    lo = np.percentile(draws, 50 * (1 - level), method="lower")
    hi = np.percentile(draws, 50 * (1 + level), method="higher")
    return float(lo), float(hi)


def _bootstrap_olympic(a, b, level: float, draws: int, seed: int):
    """Percentile interval of olympic(a*) / olympic(b*) over seeds resampled with
    replacement on each side; a resample with two or more censored seeds has no score
    and is left out, and with fewer than half the draws scored there is no interval.
    Returns ratio_over_seeds's ci_lo, ci_hi and method. The candidate the coverage
    simulation rejects (it is too narrow at n = 5: tests/test_stateff.py), kept for
    that comparison."""
    import numpy as np
    rng = np.random.default_rng(seed)

    def scores(x):
        r = x[rng.integers(0, x.size, (draws, x.size))]
        s = np.sort(r, axis=1)[:, 1:-1]
        return np.where(np.isinf(s).any(axis=1), np.nan, s.mean(axis=1))
    r = scores(a) / scores(b)
    r = r[np.isfinite(r)]
    lo, hi = _percentiles(r, level) if r.size >= draws // 2 else (None, None)
    return {"ci_lo": lo, "ci_hi": hi,
            "method": f"bootstrap of MLPerf's score over seeds ({draws} resamples, percentile)"}


METHODS = ("auto", "fieller_means", "fieller_trimmed", "bootstrap_olympic")


def ratio_over_seeds(base, other, level: float = LEVEL, method: str = "auto", draws: int = 2000,
                     seed: int = 0) -> dict:
    """A ratio of two points' per-seed values, base over other, with a `level`
    interval over independent seeded launches.

    Statistical efficiency at k: base = samples to target at k=1, other = at k.
    Time-to-accuracy speed-up: base = seconds to target at k=1, other = at k (real
    runs only: an emulated k's seconds are the emulating devices'; tta_forecast gives
    its time from samples/s). A seed that never reached the target is None
    (right-censored: slower than every seed that did).

    method "auto" (the default), chosen by simulation (tests/test_stateff.py; the
    figures here from 8,000 trials, 12,000 with censoring): n = 5 seeds a point,
    normal spread with each point's cv drawn from 5-15%:
    - every seed reached the target on both sides: Fieller on the seeds' means
      (stats.ratio_ci, independent samples, Welch's df): coverage 0.952, median
      width 29% of the ratio;
    - a seed on a side did not: Fieller on the trimmed means that MLPerf's scores
      are (trimmed(): Yuen's Winsorized variance, Welch-Satterthwaite df on h - 1 per
      side), which one censored seed does not move (coverage 0.950 and width 39%
      without censoring);
    - two or more on a side: no interval (MLPerf gives no score either).
    With heavy censoring (a seed misses the budget 34% of the time; 44% of points
    scored), coverage among the scored points: auto 0.93, trimmed 0.94, Fieller on
    the converged seeds only 0.89 (dropping the slowest biases it), the bootstrap
    0.84. The shortfall of the first two is selection: a point gets a score when its
    seeds were lucky, which no interval over the scored seeds can undo.
    The bootstrap of MLPerf's olympic score over seeds (method "bootstrap_olympic")
    covers 0.93 even without censoring (width 26%): at n = 5 a resample holds too few
    distinct seeds, so its percentile interval is too narrow. Rejected.
    Seeds are treated as independent across k (the same seed shares the initial
    weights and the data order, but trajectories part after the first step); with a
    positive correlation the interval is conservative.

    Returns {"value", "ci_lo", "ci_hi", "mlperf_value" (ratio of MLPerf's scores),
    "method", "n" [base, other], "censored" [base, other], "level", "covers"}; value
    is the estimator's (the ratio of means, or of trimmed means)."""
    if method not in METHODS:
        raise ValueError(f"ratio_over_seeds: method {method!r} is not one of {METHODS}")
    a, ca = _as_censored(base)
    b, cb = _as_censored(other)
    oa, ob = olympic(list(a)), olympic(list(b))
    out = {"value": None, "ci_lo": None, "ci_hi": None, "mlperf_value": oa / ob if oa and ob else None,
           "method": "", "n": [int(a.size), int(b.size)], "censored": [ca, cb], "level": level, "covers": SEEDS}
    if method == "auto":
        method = "fieller_means" if ca == cb == 0 else "fieller_trimmed"
    if method == "fieller_means":
        out.update(_fieller_means(a, b, ca, cb, level))
    elif method == "fieller_trimmed":
        out.update(_fieller_trimmed(a, b, ca, cb, level))
    else:
        out.update(_bootstrap_olympic(a, b, level, draws, seed), value=out["mlperf_value"])
    return out


def _fieller_means(a, b, ca: int, cb: int, level: float) -> dict:
    """ratio_over_seeds's fields by Fieller on the seeds' means: no interval when a seed
    on either side did not reach the target (ca, cb censored)."""
    if ca or cb:
        return {"method": "Fieller on means: no interval, a seed did not reach the target (use fieller_trimmed)"}
    r = stats.ratio_ci(a, b, level=level, covers=SEEDS)
    return {"value": r["value"], "ci_lo": r["ci_lo"], "ci_hi": r["ci_hi"], "method": "Fieller on means: " + r["method"]}


def _fieller_trimmed(a, b, ca: int, cb: int, level: float) -> dict:
    """ratio_over_seeds's fields by Fieller on the trimmed means (trimmed()), independent
    sides, Welch-Satterthwaite df on h - 1 a side."""
    ta, tb = trimmed(list(a)), trimmed(list(b))
    if ta is None or tb is None:
        return {"method": "Fieller on trimmed means: no interval (needs at least 5 seeds a side and at most one "
                          f"that did not reach the target; censored {ca} and {cb})"}
    theta = ta["value"] / tb["value"]
    va, vb = ta["var"], tb["var"]
    den = va * va / (ta["h"] - 1) + theta ** 4 * vb * vb / (tb["h"] - 1)
    df = (va + theta * theta * vb) ** 2 / den if den > 0 else float(ta["h"] + tb["h"] - 2)
    lo, hi = stats.fieller(ta["value"], tb["value"], va, vb, 0.0, df, level)
    return {"value": theta, "ci_lo": lo, "ci_hi": hi,
            "method": f"Fieller on trimmed means (Yuen, {a.size} vs {b.size} seeds, censored {ca} and {cb}, "
                      f"Welch df {df:.1f})" + ("" if lo is not None else ": unbounded")}


def statistical_efficiency(samples_k1, samples_k, **kw) -> dict:
    """Samples to target at k=1 over samples to target at k (global batch k x b), per
    seed lists (None = not reached); ratio_over_seeds's fields."""
    return ratio_over_seeds(samples_k1, samples_k, **kw)


def speedup(seconds_k1, seconds_k, **kw) -> dict:
    """Time to accuracy at k=1 over time to accuracy at k, from measured seconds per
    seed (real runs, on the clock); ratio_over_seeds's fields."""
    return ratio_over_seeds(seconds_k1, seconds_k, **kw)


# ---------------------------------------------------------------- c. gradient noise scale

def noise_terms(g_small_sq, g_big_sq, b_small: float, b_big: float):
    """Unbiased estimates of |G|^2 and tr(Sigma) from one step (McCandlish et al. 2018,
    appendix A; scalars or numpy arrays, one element per step).

    g_small_sq: |G_small|^2, the squared norm of a per-rank gradient (batch b_small),
    averaged over the ranks (or shards); g_big_sq: |G_big|^2, that of the gradient
    averaged over all of them (batch b_big = k x b_small). With E|G_B|^2 = |G|^2 +
    tr(Sigma)/B:
      |G|^2     = (b_big |G_big|^2 - b_small |G_small|^2) / (b_big - b_small)
      tr(Sigma) = (|G_small|^2 - |G_big|^2) / (1/b_small - 1/b_big)
    Either can come out negative on one step (they are unbiased, not positive)."""
    if not b_big > b_small > 0:
        raise ValueError(f"noise_terms: needs b_big > b_small > 0 (got {b_big}, {b_small}): k >= 2 ranks or shards")
    g2 = (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small)
    tr = (g_small_sq - g_big_sq) / (1.0 / b_small - 1.0 / b_big)
    return g2, tr


class NoiseScale:
    """The online form, for a training loop: a few floats per step.

    update(g_small_sq, g_big_sq) per step (or update_many with a flushed block of steps:
    dpscale.measure.noise_scale.GradNoiseProbe.flush). B_simple = tr(Sigma) / |G|^2,
    smoothed as the paper does: exponential moving averages of the numerator and of
    the denominator separately (decay `beta` per step, Adam's bias correction, which
    cancels in the ratio), then their ratio. With keep=True the per-step estimates are
    kept (two floats a step) for window(), which gives B_simple over a range of steps
    with an interval."""

    def __init__(self, b_small: float, b_big: float, beta: float = 0.99, keep: bool = True):
        noise_terms(0.0, 0.0, b_small, b_big)            # checks the batches
        self.b_small, self.b_big, self.beta, self.keep = float(b_small), float(b_big), float(beta), keep
        self.steps, self._g2, self._tr = 0, 0.0, 0.0
        self.g2_steps: list[float] = []
        self.trace_steps: list[float] = []

    def update(self, g_small_sq: float, g_big_sq: float) -> None:
        g2, tr = noise_terms(float(g_small_sq), float(g_big_sq), self.b_small, self.b_big)
        self._g2 = self.beta * self._g2 + (1 - self.beta) * g2
        self._tr = self.beta * self._tr + (1 - self.beta) * tr
        self.steps += 1
        if self.keep:
            self.g2_steps.append(g2)
            self.trace_steps.append(tr)

    def update_many(self, g_small_sq: Iterable[float], g_big_sq: Iterable[float]) -> None:
        for s, b in zip(g_small_sq, g_big_sq):
            self.update(s, b)

    @property
    def g2(self) -> float | None:
        """The smoothed |G|^2 (bias-corrected EMA)."""
        return self._g2 / (1 - self.beta ** self.steps) if self.steps else None

    @property
    def trace(self) -> float | None:
        """The smoothed tr(Sigma) (bias-corrected EMA)."""
        return self._tr / (1 - self.beta ** self.steps) if self.steps else None

    @property
    def b_simple(self) -> float | None:
        """EMA(tr Sigma) / EMA(|G|^2), in samples; None until the smoothed |G|^2 is positive."""
        return self._tr / self._g2 if self.steps and self._g2 > 0 else None

    def state(self) -> dict:
        return {"steps": self.steps, "g2": self.g2, "trace": self.trace, "b_simple": self.b_simple,
                "beta": self.beta, "b_small": self.b_small, "b_big": self.b_big}

    def window(self, start: int = 0, stop: int | None = None, blocks: int = 10, level: float = LEVEL) -> dict:
        if not self.keep:
            raise ValueError("NoiseScale.window: the per-step estimates were not kept (keep=False)")
        return b_simple_window(self.g2_steps[start:stop], self.trace_steps[start:stop], blocks, level)


def b_simple_window(g2_steps, trace_steps, blocks: int = 10, level: float = LEVEL) -> dict:
    """B_simple over a window of steps: mean tr(Sigma) / mean |G|^2 over the window's
    per-step estimates (noise_terms), with a `level` interval: the window cut into
    `blocks` runs of consecutive steps (numpy.array_split), each block's two means a
    pair, and Fieller's interval for the ratio of the paired means (stats.ratio_ci,
    paired: the block's covariance of numerator and denominator enters; df = blocks -
    1). Blocks, not steps, so that the correlation of neighbouring steps (similar
    weights, similar gradients) stays inside a block.

    covers (STEPS): the minibatches' sampling noise within this window of one run,
    blocks treated as independent. Not other seeds, and not other windows: B_simple
    grows as the loss falls, so the window is part of the answer (say which).
    No interval (ci None) when the mean |G|^2 is not distinguishable from 0: the
    gradient's signal is below what the window can measure.

    Returns {"b_simple", "ci_lo", "ci_hi", "trace", "g2", "steps", "blocks", "df",
    "mean_trace", "mean_g2", "cov" (2 x 2 covariance of those two block-mean means),
    "method", "level", "covers"}."""
    import numpy as np
    g2, tr = np.asarray(g2_steps, float), np.asarray(trace_steps, float)
    n = g2.size
    out = {"b_simple": None, "ci_lo": None, "ci_hi": None, "trace": float(tr.mean()) if n else None,
           "g2": float(g2.mean()) if n else None, "steps": int(n), "blocks": 0, "df": None, "mean_trace": None,
           "mean_g2": None, "cov": None, "method": "", "level": level, "covers": STEPS}
    if out["g2"] is not None and out["g2"] > 0:
        out["b_simple"] = out["trace"] / out["g2"]
    nb = min(blocks, n)
    if nb < 2:
        out["method"] = f"no interval: {n} step(s)"
        return out
    tb = np.array([c.mean() for c in np.array_split(tr, nb)])
    gb = np.array([c.mean() for c in np.array_split(g2, nb)])
    r = stats.ratio_ci(tb, gb, paired=True, level=level, covers=STEPS)
    cov = np.cov(tb, gb, ddof=1) / nb
    out.update(blocks=nb, df=nb - 1, mean_trace=float(tb.mean()), mean_g2=float(gb.mean()), cov=cov.tolist(),
               ci_lo=r["ci_lo"], ci_hi=r["ci_hi"], method=f"{r['method']} over blocks of consecutive steps")
    return out


POOLED = ("blocks of consecutive steps of each seed's window, pooled over the seeds' launches: the minibatches' "
          "sampling noise within those windows, not other windows")


def b_simple_pooled(windows, blocks: int = 10, level: float = LEVEL) -> dict:
    """B_simple over several runs' windows (one per seed): mean tr(Sigma) / mean |G|^2
    over every step of every window, and its interval from blocks of consecutive steps
    cut within each run (up to `blocks` a run, so no block straddles two seeds), their
    paired means under Fieller (stats.ratio_ci). windows: [(g2_steps, trace_steps)].
    Returns b_simple_window's keys (mean_trace, mean_g2 and cov of the blocks' means too,
    for compare_b_crit), covers POOLED."""
    import numpy as np
    tb, gb, g2_all, tr_all = [], [], [], []
    for g2_steps, trace_steps in windows:
        g2, tr = np.asarray(g2_steps, float), np.asarray(trace_steps, float)
        g2_all.append(g2)
        tr_all.append(tr)
        nb = min(blocks, g2.size)
        tb += [c.mean() for c in np.array_split(tr, nb)] if nb else []
        gb += [c.mean() for c in np.array_split(g2, nb)] if nb else []
    g2, tr = (np.concatenate(g2_all), np.concatenate(tr_all)) if g2_all else (np.zeros(0), np.zeros(0))
    out = {"b_simple": None, "ci_lo": None, "ci_hi": None, "g2": float(g2.mean()) if g2.size else None,
           "trace": float(tr.mean()) if tr.size else None, "steps": int(g2.size), "runs": len(g2_all),
           "blocks": len(tb), "df": None, "method": "", "level": level, "covers": POOLED}
    if out["g2"] is not None and out["g2"] > 0:
        out["b_simple"] = out["trace"] / out["g2"]
    if len(tb) < 2:
        out["method"] = f"no interval: {len(tb)} block(s)"
        return out
    r = stats.ratio_ci(np.array(tb), np.array(gb), paired=True, level=level, covers=POOLED)
    cov = np.cov(np.array(tb), np.array(gb), ddof=1) / len(tb)
    out.update(df=len(tb) - 1, ci_lo=r["ci_lo"], ci_hi=r["ci_hi"], mean_trace=float(np.mean(tb)),
               mean_g2=float(np.mean(gb)), cov=cov.tolist(),
               method=f"{r['method']} over blocks of consecutive steps within each seed's window")
    return out


# ---------------------------------------------------------------- d. the statistical-efficiency model

WEIGHTINGS = ("cv", "ols")


def _points(points) -> tuple[list[float], list[float], dict]:
    """{batch: [per-seed value or None]} -> the converged (B, E) pairs and the censored count per batch."""
    xs, ys, cens = [], [], {}
    for B, vals in sorted(points.items()):
        for v in vals:
            if _reached(v):
                xs.append(float(B))
                ys.append(float(v))
            else:
                cens[B] = cens.get(B, 0) + 1
    return xs, ys, cens


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
    xs, ys, cens = _points(points)
    x, y = np.array(xs), np.array(ys)
    batches = sorted({int(b) for b in xs})
    if len(batches) < 2 or x.size < 3:
        raise ValueError(f"fit_batch_model: needs 2 batch sizes and 3 converged seeds (got batches {batches}, "
                         f"{x.size} seeds)")
    coef, cov, s2 = _least_squares(x, y, weighting)
    df = x.size - 2
    t = _t_quantile(level, df)
    a, b = float(coef[0]), float(coef[1])
    va, vb, cab = float(cov[0, 0]), float(cov[1, 1]), float(cov[0, 1])
    src = {int(B): (sources or {}).get(B, "measured") for B in batches}
    return {"E_min": _t_interval(a, math.sqrt(va), t), "S_min": _t_interval(b, math.sqrt(vb), t),
            "B_crit": _b_crit(a, b, va, vb, cab, df, level), "coef": [a, b], "cov": cov.tolist(), "df": df,
            "sigma": math.sqrt(s2), "weighting": weighting, "n": int(x.size), "batches": batches,
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


def _t_quantile(level: float, df: float) -> float:
    """Student's t multiplier of a standard error for a two-sided `level` interval."""
    from scipy import stats as sps
    return float(sps.t.ppf(0.5 + level / 2, df))


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
    t = _t_quantile(level, fit["df"])
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
    conv = [float(v) for v in vals if _reached(v)]
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
        sp = (one["pred_hi"] - one["mean"]) / _t_quantile(level, fit["df"])
        p = float(sps.t.sf((budget - one["mean"]) / sp, fit["df"]))
        out["p_seed_over_budget"] = p
        out["p_censored_as_seen"] = float(sps.binom.sf(cens - 1, len(vals), p)) if vals else None
    return out


def _mvt(rng, mean, cov, df, n):
    """n draws of a multivariate t (location mean, scale cov, df)."""
    import numpy as np
    mean = np.asarray(mean, float)
    z = rng.multivariate_normal(np.zeros_like(mean), np.asarray(cov, float), size=n)
    return mean + z / np.sqrt(rng.chisquare(df, size=n) / df)[:, None]


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
           "covers": f"{SEEDS} (B_crit) and {STEPS} (B_simple)"}
    if not out["b_crit"] or not out["b_simple"] or noise.get("cov") is None:
        out["method"] = "no ratio: B_crit or B_simple is missing or not positive"
        return out
    rng = np.random.default_rng(seed)
    ab = _mvt(rng, [a, b], fit["cov"], fit["df"], draws)
    tg = _mvt(rng, [noise["mean_trace"], noise["mean_g2"]], noise["cov"], noise["df"], draws)
    with np.errstate(divide="ignore", invalid="ignore"):
        bc = np.where(ab[:, 1] > 0, ab[:, 0] / ab[:, 1], np.inf)
        bs = np.where(tg[:, 1] > 0, tg[:, 0] / tg[:, 1], np.inf)
        r = np.where(np.isinf(bs), 0.0, bc / bs)
    lo, hi = _percentiles(r, level)
    ratio = out["b_crit"] / out["b_simple"]
    out.update(ratio=ratio, ci_lo=lo, ci_hi=hi, log10_ratio=math.log10(ratio) if ratio > 0 else None,
               same_order=abs(math.log10(ratio)) <= 1 if ratio > 0 and math.isfinite(ratio) else False)
    return out


# ---------------------------------------------------------------- e. time to accuracy forecast

def _throughput_draws(rng, spec: dict, n: int):
    """samples/s draws from {"draws": [...]} (resampled) or {"value", "lo", "hi", "level"}:
    a lognormal with median value and the band's ends as its level quantiles (their
    mean log spread; a band that is not given, or zero, gives the value itself)."""
    import numpy as np
    from scipy import stats as sps
    if spec.get("draws") is not None:
        d = np.asarray(spec["draws"], float)
        return d[rng.integers(0, d.size, n)]
    v, lo, hi = spec["value"], spec.get("lo"), spec.get("hi")
    if not lo or not hi or hi <= lo:
        return np.full(n, float(v))
    z = float(sps.norm.ppf(0.5 + spec.get("level", LEVEL) / 2))
    sigma = (math.log(hi) - math.log(lo)) / (2 * z)
    return float(v) * np.exp(sigma * rng.standard_normal(n))


def tta_forecast(fit: dict, ks: Iterable[int], per_rank_batch: int, throughput: dict,
                 eval_s_per_sample: float = 0.0, level: float = LEVEL, draws: int = 20000, seed: int = 0) -> dict:
    """Time to accuracy at each k: predicted samples to target at B = k x per_rank_batch
    (fit_batch_model) over samples/s(k), plus the evaluation time.

    throughput: {k: {"value", "lo", "hi", "level", "source"}} (a value and a band at
    `level`, e.g. the scaling forecast's 90% band) or {k: {"draws": [...], "source"}};
    source says where it comes from ("measured", "forecast", ...). eval_s_per_sample:
    the evaluation time on the clock per training sample (evaluations come every fixed
    number of samples: a run's eval_s / samples trained), 0 to leave it out.

    The band is joint, by Monte Carlo: E(B)'s mean from the fit's multivariate t (one
    draw of (a, b) shared by every k, so the k's are compared on the same model) and
    samples/s(k) independently of it and of the other k's (an assumption: the
    forecast's errors at neighbouring k are likely correlated, which would narrow the
    comparisons). The samples band is the confidence band of the mean (predict()),
    so time is the expected time to accuracy, not one launch's.

    Returns {"rows": [one per k: k, global_batch, samples, samples_lo, samples_hi,
    samples_input ("measured" | "emulated" | "predicted": whether the fit had seeds at
    that batch, and which), samples_per_s, samples_per_s_lo, samples_per_s_hi,
    samples_per_s_input, time_s, time_s_lo, time_s_hi, gpu_hours (k x time),
    gpu_hours_lo, gpu_hours_hi, speedup (time at k=1 / time at k, when k=1 is among
    ks with a samples/s) with speedup_lo, speedup_hi, p_fastest, p_cheapest], "fastest_k",
    "cheapest_k" (at the point values), "level", "draws", "covers", "method"}."""
    import numpy as np
    ks = sorted(int(k) for k in ks)
    rng = np.random.default_rng(seed)
    ab = _mvt(rng, fit["coef"], fit["cov"], fit["df"], draws)
    rows, times = [], {}
    for k in ks:
        B = k * per_rank_batch
        p = predict(fit, B, level=level)
        row = _untimed_row(k, B, p)
        spec = throughput.get(k)
        if spec and spec.get("value", spec.get("draws")) is not None:
            timing, times[k] = _time_to_target(k, p["mean"], ab[:, 0] + ab[:, 1] * B, spec, eval_s_per_sample,
                                               level, rng)
            row.update(timing)
        rows.append(row)
    _compare_ks(rows, times, level)
    return {"rows": rows, "fastest_k": _best_k(rows, "time_s"), "cheapest_k": _best_k(rows, "gpu_hours"),
            "level": level, "draws": draws, "covers": f"{SEEDS} (samples to target); the throughput band as given",
            "method": "Monte Carlo: the fit's (a, b) and samples/s(k) drawn independently; percentile bands"}


def _untimed_row(k: int, batch: int, p: dict) -> dict:
    """tta_forecast's row at k from predict()'s samples to target, its time fields empty."""
    return {"k": k, "global_batch": batch, "samples": p["mean"], "samples_lo": p["conf_lo"],
            "samples_hi": p["conf_hi"], "samples_input": p["source"], "samples_per_s": None, "samples_per_s_lo": None,
            "samples_per_s_hi": None, "samples_per_s_input": "not measured", "time_s": None, "time_s_lo": None,
            "time_s_hi": None, "gpu_hours": None, "gpu_hours_lo": None, "gpu_hours_hi": None, "speedup": None,
            "speedup_lo": None, "speedup_hi": None, "p_fastest": None, "p_cheapest": None}


def _time_to_target(k: int, samples: float, samples_d, spec: dict, eval_s_per_sample: float, level: float, rng):
    """A row's samples/s and time fields at k, and the time draws: samples to target
    (the point, and one draw per draw of the fit) over samples/s drawn from `spec`."""
    import numpy as np
    s_d = _throughput_draws(rng, spec, samples_d.size)
    v = spec["value"] if spec.get("value") is not None else float(np.median(s_d))
    t_d = samples_d / s_d + eval_s_per_sample * samples_d
    t = samples / v + eval_s_per_sample * samples
    slo, shi = _percentiles(s_d, level) if spec.get("draws") is not None else (spec.get("lo"), spec.get("hi"))
    tlo, thi = _percentiles(t_d, level)
    return {"samples_per_s": float(v), "samples_per_s_lo": None if slo is None else float(slo),
            "samples_per_s_hi": None if shi is None else float(shi), "samples_per_s_input": spec.get("source", "given"),
            "time_s": t, "time_s_lo": tlo, "time_s_hi": thi, "gpu_hours": k * t / 3600, "gpu_hours_lo": k * tlo / 3600,
            "gpu_hours_hi": k * thi / 3600}, t_d


def _compare_ks(rows: list[dict], times: dict, level: float) -> None:
    """Fills, on the same joint draws, each timed row's p_fastest and p_cheapest (the
    share of draws where its k has the least time, or GPU-hours) and, when k=1 is
    timed, its speed-up over k=1 with a percentile band."""
    import numpy as np
    timed = [r["k"] for r in rows if r["k"] in times]
    if not timed:
        return
    T = np.column_stack([times[k] for k in timed])
    G = T * np.array(timed, float)[None, :]
    fast, cheap = np.bincount(T.argmin(1), minlength=len(timed)), np.bincount(G.argmin(1), minlength=len(timed))
    draws = T.shape[0]
    for i, k in enumerate(timed):
        r = next(r for r in rows if r["k"] == k)
        r.update(p_fastest=float(fast[i] / draws), p_cheapest=float(cheap[i] / draws))
        if 1 in times:
            lo, hi = _percentiles(times[1] / times[k], level)
            r1 = next(r for r in rows if r["k"] == 1)
            r.update(speedup=r1["time_s"] / r["time_s"], speedup_lo=lo, speedup_hi=hi)


def _best_k(rows: list[dict], key: str) -> int | None:
    """The k whose `key` is least among the rows that have one."""
    return min((r for r in rows if r[key] is not None), key=lambda r: r[key], default={}).get("k")
