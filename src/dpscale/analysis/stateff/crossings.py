"""Where one seed's accuracy curve first reaches the target: MLPerf's way (the first
evaluation at or above it) and interpolated between the evaluations that bracket it,
with the bracket's width (the resolution); one row per seed of a ddp_tta result."""
from __future__ import annotations


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
        where the points carry a role, the first *protocol* evaluation at or above it
        (the instrument's evaluations only locate the crossing; None when no protocol
        evaluation reached it);
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
    had an evaluation been placed at the crossing. Points that carry a role charge
    their own eval_s instead (a protocol evaluation's sharded pass; 0 for the
    instrument's, which the clock does not see)."""
    pts = _increasing(curve)
    out = {"target": target, "status": "never", "mlperf": None, "samples": None, "seconds": None, "epochs": None,
           "bracket_samples": None, "resolution_samples": None, "fraction": None,
           "best_accuracy": max((p["accuracy"] for p in pts), default=None),
           "censored_samples": pts[-1]["samples"] if pts else 0, "censored_seconds": pts[-1]["seconds"] if pts else 0.0}
    i = next((j for j, p in enumerate(pts) if p["accuracy"] >= target), None)
    if i is None:
        return out
    first = pts[i]
    out.update(censored_samples=None, censored_seconds=None, mlperf=_score(pts[i:], target, train_images))
    out.update(_from_start(first) if i == 0 else _between(pts[i - 1], first, target, eval_seconds))
    out["epochs"] = _epochs(out["samples"], train_images)
    return out


def _score(pts: list[dict], target: float, train_images: int | None) -> dict | None:
    """MLPerf's score: the first protocol evaluation at or above the target (a point with
    no role is the protocol's), as it is."""
    score = next((p for p in pts if p["accuracy"] >= target and p.get("role", "protocol") == "protocol"), None)
    if score is None:
        return None
    return {**{k: score[k] for k in ("samples", "seconds", "accuracy")}, "epochs": _epochs(score["samples"], train_images)}


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
    if "role" in first:   # the clock charged this evaluation its own eval_s (0: the instrument's)
        eval_seconds = first["eval_s"]
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



def per_seed(rows: list[dict]) -> list[dict]:
    """seed_rows with a seed that several measurements ran collapsed to one row, the mean
    of its launches (converged only where every launch was; its values then the means),
    in the order seeds first appear; "launches" says how many. A repeated seed is one
    seed, not several independent ones."""
    by: dict = {}
    for r in rows:
        by.setdefault(r["seed"], []).append(r)
    out = []
    for seed, group in by.items():
        if len(group) == 1:
            out.append({**group[0], "launches": 1})
            continue
        conv = all(g["converged"] for g in group)
        row = {**group[0], "converged": conv, "launches": len(group),
               "status": "mean of " + ", ".join(g["status"] for g in group)}
        for key in ("mlperf_samples", "mlperf_epochs", "mlperf_seconds", "samples", "epochs", "seconds",
                    "resolution_samples", "best_accuracy"):
            vals = [g[key] for g in group]
            row[key] = sum(vals) / len(vals) if None not in vals and (conv or key == "best_accuracy") else None
        row["censored_samples"] = None if conv else max(g["censored_samples"] or 0 for g in group)
        out.append(row)
    return out
