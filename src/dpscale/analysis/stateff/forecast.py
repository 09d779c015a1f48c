"""Time to accuracy at each k: predicted samples to target at B = k x the per-rank batch
over samples/s(k), plus the evaluation time, with a joint band; the fastest k and the k
that costs fewest GPU-hours, and how often each is so over the draws."""
from __future__ import annotations

import math
from typing import Iterable

from dpscale.analysis.stateff import model_choice
from dpscale.analysis.stateff.common import LEVEL, SEEDS, percentiles


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


def tta_forecast(models: dict, ks: Iterable[int], per_rank_batch: int, throughput: dict,
                 eval_s_per_sample: float | dict = 0.0, level: float = LEVEL, draws: int = 20000, seed: int = 0) -> dict:
    """Time to accuracy at each k: predicted samples to target at B = k x per_rank_batch
    over samples/s(k), plus the evaluation time.

    models: model_choice.choose()'s record (the line and the power law with their
    weights), or one fit (fit_batch_model's or fit_power_law's), taken alone.
    throughput: {k: {"value", "lo", "hi", "level", "source"}} (a value and a band at
    `level`, e.g. the scaling forecast's 90% band) or {k: {"draws": [...], "source"}};
    source says where it comes from ("measured", "forecast", ...). eval_s_per_sample:
    the evaluation time on the clock per training sample (the protocol's evaluations come
    every fixed number of samples: a run's charged eval_s / samples trained), one number
    for every k or {k: seconds per sample, None where it is not known: that k untimed};
    0 to leave it out.

    The band is joint, by Monte Carlo: per draw a model by its weight and its
    parameters from the fit's multivariate t (one draw shared by every k, so the k's are
    compared on the same model and fit), widened by model_choice.misfit_band (the
    misfit's quantile shared by every k of a draw too), and
    samples/s(k) independently of it and of the other k's (an assumption: the
    forecast's errors at neighbouring k are likely correlated, which would narrow the
    comparisons). Samples are the expected samples to target (the mixture's mean; its
    band the draws' percentiles), so time is the expected time to accuracy, not one
    launch's. p_fastest carries the probability over the models: each model's share is
    beside it (p_fastest_by_model, over that model's draws).

    Returns {"rows": [one per k: k, global_batch, samples, samples_lo, samples_hi,
    samples_by_model, samples_input ("measured" | "emulated" | "predicted": whether the
    fit had seeds at that batch, and which), samples_per_s, samples_per_s_lo,
    samples_per_s_hi, samples_per_s_input, time_s, time_s_lo, time_s_hi, gpu_hours (k x
    time), gpu_hours_lo, gpu_hours_hi, speedup (time at k=1 / time at k, when k=1 is
    among ks with a samples/s) with speedup_lo, speedup_hi, p_fastest,
    p_fastest_by_model, p_cheapest, beyond_evidence], "fastest_k", "cheapest_k" (at the
    point values, among the rows within EVIDENCE x the largest fitted batch,
    "supported_batch_max": p_fastest and p_cheapest are over those rows too; None with
    "no_choice_reason" where k=1 and another k are not both timed there),
    "models" ({name: weight}), "model_method", "level", "draws", "covers", "method"}."""
    import numpy as np
    s = model_choice.as_set(models)
    ks = sorted(int(k) for k in ks)
    rng = np.random.default_rng(seed)
    batches = [k * per_rank_batch for k in ks]
    expected, which = model_choice.draw_expected(s, batches, rng, draws)
    rows, times, no_eval = [], {}, set()
    u = rng.random(draws)   # the misfit's quantile, shared across k within a draw (model_choice.misfit_band)
    for i, k in enumerate(ks):
        e_d, mf = model_choice.misfit_band(expected[:, i], batches[i], s, rng, u)
        row = _untimed_row(k, batches[i], s, e_d, level)
        row.update(misfit_rel_sd=mf and mf["rel_sd"], misfit_source=mf and mf["source"])
        spec, e_k = throughput.get(k), _eval_at(eval_s_per_sample, k)
        if spec and spec.get("value", spec.get("draws")) is not None:
            if e_k is None:
                no_eval.add(k)
            else:
                timing, times[k] = _time_to_target(k, row["samples"], e_d, spec, e_k, level, rng)
                row.update(timing)
        rows.append(row)
    return {"rows": rows, **_choice(rows, times, no_eval, max(s.get("fit_batches") or [0]) * EVIDENCE, level, which),
            "models": {model_choice.NAMES[n]: w for n, w in s["weights"].items()}, "model_method": s["method"],
            "level": level, "draws": draws, "covers": COVERS, "method": METHOD}


def _choice(rows: list[dict], times: dict, no_eval: set, top: float, level: float, which) -> dict:
    """The soonest and the cheapest k, named among the rows within `top` (EVIDENCE x the
    largest fitted batch: past it no public table checked the model; said, not named),
    each row's beyond_evidence, and the probabilities over those rows."""
    _compare_ks(rows, times, level, which)   # every row's speed-up over k=1, labelled where beyond
    for r in rows:
        r["beyond_evidence"] = bool(top) and r["global_batch"] > top
        if r["beyond_evidence"]:
            r.update(p_fastest=None, p_cheapest=None, p_fastest_by_model=None)
    named = [r for r in rows if not r["beyond_evidence"]]
    _compare_ks(named, {k: t for k, t in times.items() if any(r["k"] == k for r in named)}, level, which)
    why = _no_choice(named, no_eval)
    return {"fastest_k": None if why else _best_k(named, "time_s"),
            "cheapest_k": None if why else _best_k(named, "gpu_hours"), "no_choice_reason": why,
            "supported_batch_max": top or None}


COVERS = f"{SEEDS} (samples to target), the choice of model and the between-batch misfit; the throughput band as given"
METHOD = ("Monte Carlo: a model per draw by its weight, its coefficients from its fit, and samples/s(k), drawn "
          "independently; percentile bands")


# How far past the largest measured global batch a forecast still names a k: on MLPerf's
# public tables (docs/public-convergence.md) no prediction reached past 4x, and past 2x
# the model did worse than the naive previous batch (issue #52: 71% against 31% error).
EVIDENCE = 2.0


def _eval_at(eval_s_per_sample: float | dict, k: int) -> float | None:
    return eval_s_per_sample.get(k) if isinstance(eval_s_per_sample, dict) else eval_s_per_sample


def _untimed_row(k: int, batch: int, s: dict, samples_d, level: float) -> dict:
    """tta_forecast's row at k: the expected samples to target (the mixture's mean of the
    models' predictions, each beside it) with the draws' band; its time fields empty."""
    by = {n: model_choice.predict(f, batch, level=level) for n, f in s["fits"].items()}
    lo, hi = percentiles(samples_d, level)
    src = next(iter(by.values()))["source"]
    return {"k": k, "global_batch": batch, "samples": sum(s["weights"][n] * p["mean"] for n, p in by.items()),
            "samples_lo": lo, "samples_hi": hi, "samples_by_model": {n: p["mean"] for n, p in by.items()},
            "samples_input": src, "samples_per_s": None, "samples_per_s_lo": None,
            "samples_per_s_hi": None, "samples_per_s_input": "not measured", "time_s": None, "time_s_lo": None,
            "time_s_hi": None, "gpu_hours": None, "gpu_hours_lo": None, "gpu_hours_hi": None, "speedup": None,
            "speedup_lo": None, "speedup_hi": None, "p_fastest": None, "p_fastest_by_model": None,
            "p_cheapest": None}


def _time_to_target(k: int, samples: float, samples_d, spec: dict, eval_s_per_sample: float, level: float, rng):
    """A row's samples/s and time fields at k, and the time draws: samples to target
    (the point, and one draw per draw of the fit) over samples/s drawn from `spec`."""
    import numpy as np
    s_d = _throughput_draws(rng, spec, samples_d.size)
    v = spec["value"] if spec.get("value") is not None else float(np.median(s_d))
    t_d = samples_d / s_d + eval_s_per_sample * samples_d
    t = samples / v + eval_s_per_sample * samples
    slo, shi = percentiles(s_d, level) if spec.get("draws") is not None else (spec.get("lo"), spec.get("hi"))
    tlo, thi = percentiles(t_d, level)
    return {"samples_per_s": float(v), "samples_per_s_lo": None if slo is None else float(slo),
            "samples_per_s_hi": None if shi is None else float(shi), "samples_per_s_input": spec.get("source", "given"),
            "time_s": t, "time_s_lo": tlo, "time_s_hi": thi, "gpu_hours": k * t / 3600, "gpu_hours_lo": k * tlo / 3600,
            "gpu_hours_hi": k * thi / 3600}, t_d


def _compare_ks(rows: list[dict], times: dict, level: float, which) -> None:
    """Fills, on the same joint draws, each timed row's p_fastest and p_cheapest (the
    share of draws where its k has the least time, or GPU-hours), p_fastest_by_model
    (the same among each model's draws; which: the model of each draw) and, when k=1 is
    timed, its speed-up over k=1 with a percentile band."""
    import numpy as np
    timed = [r["k"] for r in rows if r["k"] in times]
    if not timed:
        return
    T = np.column_stack([times[k] for k in timed])
    G = T * np.array(timed, float)[None, :]
    first = T.argmin(1)
    fast, cheap = np.bincount(first, minlength=len(timed)), np.bincount(G.argmin(1), minlength=len(timed))
    draws = T.shape[0]
    for i, k in enumerate(timed):
        r = next(r for r in rows if r["k"] == k)
        r.update(p_fastest=float(fast[i] / draws), p_cheapest=float(cheap[i] / draws),
                 p_fastest_by_model={str(n): float(np.mean(first[which == n] == i)) for n in np.unique(which)})
        if 1 in times:
            lo, hi = percentiles(times[1] / times[k], level)
            r1 = next(r for r in rows if r["k"] == 1)
            r.update(speedup=r1["time_s"] / r["time_s"], speedup_lo=lo, speedup_hi=hi)


def _no_choice(rows: list[dict], no_eval: set) -> str:
    """Why no k can be named soonest or cheapest ('' where one can): a choice compares k=1
    with at least one other k, each timed (a samples/s to divide by, and the evaluation's
    cost per sample where it is charged: no_eval, the k's without it)."""
    timed = [r["k"] for r in rows if r["time_s"] is not None]
    if 1 not in timed and 1 in no_eval:
        return "the evaluation's cost at k=1 was not measured as a job pays it"
    if 1 not in timed:
        return "no samples/s at k=1: nothing to compare the other k's with"
    if len(timed) < 2:
        return "samples/s at k=1 alone: no other k to compare it with"
    return ""


def _best_k(rows: list[dict], key: str) -> int | None:
    """The k whose `key` is least among the rows that have one."""
    return min((r for r in rows if r[key] is not None), key=lambda r: r[key], default={}).get("k")
