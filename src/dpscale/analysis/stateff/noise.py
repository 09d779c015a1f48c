"""The gradient noise scale of McCandlish, Kaplan, Amodei et al. 2018 ("An Empirical
Model of Large-Batch Training", appendix A), from the squared norms of per-rank and
averaged gradients: per step (noise_terms), online (NoiseScale), over a window of steps
with an interval (b_simple_window), pooled over seeds (b_simple_pooled)."""
from __future__ import annotations

from typing import Iterable

from dpscale.analysis import stats
from dpscale.analysis.stateff.common import LEVEL

STEPS = ("blocks of consecutive steps of this window of one run: the minibatches' sampling noise, "
         "not other seeds or other windows")


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
    dpscale.measure.noise_scale.StepNoiseProbe.flush). B_simple = tr(Sigma) / |G|^2,
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


