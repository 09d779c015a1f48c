"""Time to accuracy: the learning-rate rules, MLPerf's scoring of several seeded
launches, and goodput (time-to-accuracy at k from samples-to-target and samples/s).

Pure functions, no torch: the worker (dpscale.measure.torch_tta) and the report
(dpscale.report.chapters.tta) both use them, and tests/test_tta.py pins them.
"""
from __future__ import annotations

import math
import statistics
from typing import Callable, Iterable

BASE_LR = 0.1          # the book's SGD learning rate (section 13.6's train loop)
LR_SCALINGS = ("constant", "linear")
MEASURES = ("seconds", "samples", "epochs")   # each scored on its own: <m>_to_target
# The same three at the crossing interpolated between the evaluations that bracket the
# target (dpscale.analysis.stateff.crossings.crossing), scored the same way: interpolated_<m>_to_target.
INTERPOLATED = tuple(f"interpolated_{m}" for m in MEASURES)


def lr_at(scaling: str, k: int, samples_seen: int, warmup_samples: int, base: float = BASE_LR) -> float:
    """The learning rate of the next step.

    constant: `base` at every global batch (the book's loop, whatever k is).
    linear: Goyal et al. 2017 (arXiv:1706.02677): the target is base x k, reached by a
    linear ramp from `base` over the first `warmup_samples` training samples (their
    gradual warm-up, per step), constant after. At k=1 both are the book's."""
    if scaling == "constant":
        return base
    if scaling != "linear":
        raise ValueError(f"lr scaling {scaling!r} is not one of {LR_SCALINGS}")
    peak = base * k
    if warmup_samples <= 0 or samples_seen >= warmup_samples:
        return peak
    return base + (peak - base) * samples_seen / warmup_samples


def draw_seeds(run_id: int, n: int) -> list[int]:
    """n distinct seeds from a run id: seed i = the first 31 bits of SHA-256("run_id:i")
    (31 bits: torch.manual_seed, numpy and the data order's generator all take it). The
    same id gives the same seeds, so a measurement is reproduced by listing them."""
    import hashlib
    out, i = [], 0
    while len(out) < n:
        seed = int.from_bytes(hashlib.sha256(f"{run_id}:{i}".encode()).digest()[:4], "big") >> 1
        if seed not in out:
            out.append(seed)
        i += 1
    return out


def score(runs: list[dict], measure: str) -> dict:
    """MLPerf's score of N launches for one measure (seconds, samples or epochs to
    target): drop the fastest and the slowest, the mean of the rest. A launch that
    did not reach the target counts as the slowest; with more than one such launch
    there is no score (value None and the reason said). Needs N >= 3.

    runs: [{"seed": s, "converged": bool, "<measure>_to_target": number | None}].
    Returns {"value", "kept_seeds", "dropped_seeds", "min", "max", "stdev", "n",
    "not_converged", "reason"}: min/max/stdev over the kept launches."""
    key = f"{measure}_to_target"
    n = len(runs)
    bad = [r["seed"] for r in runs if not r["converged"]]
    out = {"value": None, "kept_seeds": [], "dropped_seeds": [], "min": None, "max": None, "stdev": None,
           "n": n, "not_converged": bad, "reason": None}
    if len(bad) > 1:   # first: it settles the score whatever the other launches give
        out["reason"] = (f"{len(bad)} of {n} launches (seeds {', '.join(map(str, bad))}) did not reach the target; "
                         "MLPerf's rule allows one")
        return out
    if n < 3:
        out["reason"] = f"{n} launch(es): MLPerf's scoring drops the fastest and the slowest and needs at least 3"
        return out
    order = sorted(runs, key=lambda r: (not r["converged"], r[key] if r["converged"] else math.inf))
    kept = order[1:-1]
    vals = [r[key] for r in kept]
    out.update(value=statistics.fmean(vals), kept_seeds=[r["seed"] for r in kept],
               dropped_seeds=[order[0]["seed"], order[-1]["seed"]], min=min(vals), max=max(vals),
               stdev=statistics.stdev(vals) if len(vals) > 1 else 0.0)
    return out


def settled(runs: list[dict]) -> bool:
    """Whether the launches so far settle the point as no result (more than one did
    not converge): the seeds after them cannot change it, so they are not launched."""
    return sum(not r["converged"] for r in runs) > 1


def score_measures(runs: list[dict], measures: Iterable[str]) -> dict:
    """Each measure scored MLPerf's way, flat: <m>_to_target with _min, _max, _stdev and
    _kept_seeds (the olympic score of each launch's <m>_to_target)."""
    out = {}
    for m in measures:
        s = score(runs, m)
        name = f"{m}_to_target"
        out[name] = s["value"]
        out.update({f"{name}_{f}": s[f] for f in ("min", "max", "stdev", "kept_seeds")})
    return out


def score_fields(runs: list[dict]) -> dict:
    """Every measure scored, flat, as the result's metrics carry them:
    seconds_to_target (= tta_s), samples_to_target, epochs_to_target, each with
    _min, _max, _stdev, _kept_seeds; `scored` and `no_result_reason`."""
    out = score_measures(runs, MEASURES)
    s = score(runs, MEASURES[-1])
    out["scored"], out["no_result_reason"] = s["value"] is not None, s["reason"]
    out["not_converged_seeds"] = s["not_converged"]
    out["tta_s"] = out["seconds_to_target"]
    return out


# ---------------------------------------------------------------- goodput

# (samples/s or None, where it comes from: "measured" | "forecast" | "not measured")
Provider = Callable[[int], tuple[float | None, str]]


def measured_provider(samples_per_s: dict[int, float]) -> Provider:
    """samples/s(k) where k ran (e.g. this machine's ddp_weak results), else not measured.
    The scaling forecast, when it exists, is another Provider: goodput takes any."""
    def provide(k: int):
        v = samples_per_s.get(k)
        return (v, "measured") if v else (None, "not measured")
    return provide


def chained(*providers: Provider) -> Provider:
    """The first provider that knows k (measured first, then a forecast)."""
    def provide(k: int):
        for p in providers:
            v, src = p(k)
            if v is not None:
                return v, src
        return None, "not measured"
    return provide


def goodput(points: Iterable[dict], provider: Provider) -> list[dict]:
    """Time to accuracy and goodput efficiency per k.

    points: [{"k", "samples_to_target", "eval_s", "emulated"}] (eval_s: the mean
    evaluation time spent before the target, on the clock). For each k:
    time_to_accuracy_s = samples_to_target / samples_per_s(k) + eval_s;
    statistical efficiency = samples_to_target(1) / samples_to_target(k);
    hardware efficiency = samples_per_s(k) / (k x samples_per_s(1)) (the book's
    weak-scaling efficiency); goodput efficiency = their product, which is also
    time_to_accuracy(1) / (k x time_to_accuracy(k)) without the evaluation."""
    pts = sorted(points, key=lambda p: p["k"])
    base = next((p for p in pts if p["k"] == 1), None)
    sps1, _ = provider(1)
    rows = []
    for p in pts:
        k, n = p["k"], p.get("samples_to_target")
        sps, src = provider(k)
        stat = base["samples_to_target"] / n if base and base.get("samples_to_target") and n else None
        hw = sps / (k * sps1) if sps and sps1 else None
        rows.append({"k": k, "emulated": bool(p.get("emulated")), "samples_to_target": n,
                     "samples_per_s": sps, "samples_per_s_source": src,
                     "time_to_accuracy_s": n / sps + (p.get("eval_s") or 0.0) if n and sps else None,
                     "statistical_efficiency": stat, "hardware_efficiency": hw,
                     "goodput_efficiency": stat * hw if stat is not None and hw is not None else None})
    return rows
