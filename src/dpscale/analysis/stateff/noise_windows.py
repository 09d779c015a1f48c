"""The gradient noise scale over the windows of training that matter, from the per-step
|G|^2 and tr(Sigma) estimates a time-to-accuracy run keeps (noise.noise_terms): any
window of each seed's run pooled over the seeds with an interval over the seeds
(window_over_seeds; per evaluation interval, near the target), and the progress-weighted
average that E(B) = E_min (1 + B / B_crit) ties to B_crit (progress_terms).

Report-time only: the worker (dpscale.measure.torch_tta) keeps the per-step records and
computes nothing here, so this module is not in its digest."""
from __future__ import annotations

from dpscale.analysis import stats
from dpscale.analysis.stateff.common import LEVEL, SEEDS


def steps_in(batch: int, start_samples: float, stop_samples: float) -> slice:
    """The steps (0-based) whose samples fall in (start_samples, stop_samples]: step s
    trains samples s x batch to (s + 1) x batch, so an evaluation after S samples follows
    step S / batch - 1."""
    return slice(int(start_samples // batch), int(stop_samples // batch))


def window_over_seeds(pairs, level: float = LEVEL) -> dict:
    """B_simple over one window of each seed's run: the sum of tr(Sigma) over the sum of
    |G|^2, pooled over the seeds, with Fieller's interval for the ratio of the seeds'
    paired sums (stats.ratio_ci, paired, df = seeds - 1): the interval covers the seeds,
    each seed's window one sample, so the spread between launches (and between their
    windows' lengths) is in it, not only the minibatches' noise.

    pairs: [(sum of tr(Sigma), sum of |G|^2, steps)] per seed, or progress_terms' per seed. Returns {"b_simple", "ci_lo", "ci_hi", "seeds", "steps",
    "mean_trace", "mean_g2", "cov", "df" (for batch_model.compare_b_crit), "method",
    "level", "covers"}."""
    import numpy as np
    pairs = [p for p in pairs if p[2] > 0]
    out = {"b_simple": None, "ci_lo": None, "ci_hi": None, "seeds": len(pairs), "steps": sum(p[2] for p in pairs),
           "mean_trace": None, "mean_g2": None, "cov": None, "df": None, "method": "", "level": level,
           "covers": SEEDS}
    if not pairs:
        out["method"] = "no step in the window"
        return out
    tr, g2 = np.array([p[0] for p in pairs], float), np.array([p[1] for p in pairs], float)
    if g2.sum() > 0:
        out["b_simple"] = float(tr.sum() / g2.sum())
    r = stats.ratio_ci(tr, g2, paired=True, level=level, covers=SEEDS)
    out.update(ci_lo=r["ci_lo"], ci_hi=r["ci_hi"], method=r["method"] + " over the seeds' windows",
               mean_trace=float(tr.mean()), mean_g2=float(g2.mean()), df=len(pairs) - 1 if len(pairs) > 1 else None,
               cov=(np.cov(tr, g2, ddof=1) / len(pairs)).tolist() if len(pairs) > 1 else None)
    return out


def progress_terms(g2_steps, trace_steps, batch: int, blocks: list[slice]) -> tuple[float, float, int]:
    """One run's terms of the progress-weighted noise scale: (sum over blocks of n_j
    tr_j / |G_B|^2_j, the same of |G|^2_j, steps), each block's per-step means.

    Why: McCandlish et al.'s per-step model (an optimal step at batch B improves the loss
    by dL_max / (1 + B_noise / B)) makes each step of a run at batch B worth
    dS_min = 1 / (1 + B_noise / B) of the fewest steps; summed over a run whose B_noise
    varies, E_min = sum B_noise dS_min and S_min = sum dS_min, so the B_crit that E(B) =
    E_min (1 + B / B_crit) fits is B_noise averaged over the run weighted by dS_min, the
    progress each step makes. With B_noise = tr / |G|^2 that average is
    sum tr / |G_B|^2 over sum |G|^2 / |G_B|^2, |G_B|^2 = |G|^2 + tr / B the expected
    squared norm of the batch's gradient (the measured |G_big|^2, always positive). Per
    block, not per step: one step's |G_B|^2 is noisy and correlated with its own |G|^2
    estimate, which would bias the weights."""
    import numpy as np
    g2, tr = np.asarray(g2_steps, float), np.asarray(trace_steps, float)
    num = den = 0.0
    steps = 0
    for sl in blocks:
        bg, bt = g2[sl], tr[sl]
        if not bg.size:
            continue
        big = float(bg.mean() + bt.mean() / batch)
        if big <= 0:
            continue
        num += bg.size * float(bt.mean()) / big
        den += bg.size * float(bg.mean()) / big
        steps += bg.size
    return num, den, steps
