"""The forecast checked against what it did not use: every measured k >= 2 of a series
predicted by each rule that can (fit.RULES: the fabric at k; only what ran below k),
with what each row read (its log, inputs.Reading), the overhead in ms beside the
efficiency, three naive predictors beside the model, the band's coverage, and the
measured efficiency's own interval (an error inside it is the measurement's, not the model's).

Out of sample: a row never reads a throughput or probe measured at the k it predicts;
the `at_k` rule's one input at k is the bare all-reduce there (a collective, not the
training it predicts), and `leaks` says so of any row whose log breaks this, whatever
the code that read it called it.

Naive predictors, so a reader sees whether the model earns its terms:
  constant   the efficiency measured at the largest k' < k (100% where k' = 1)
  ring       the overhead measured at the largest k' >= 2 below k, times the ring's
             growth 2(k-1)/k / (2(k'-1)/k')
  bare       the model's own inputs with nothing hidden and no straggler: k=1's compute
             plus the whole all-reduce of the buckets at k (f = 1)
Per machine, `verdict` names the predictor that did best out of sample there; where a
naive one did, the report leads with it.

A rule chosen after its author saw rows (fit.CHOSEN) is scored only on rows measured
after the choice: each row says which chosen rules it used and whether it may score them.
"""
from __future__ import annotations

import statistics

import numpy as np

from dpscale.analysis.forecast import fit, misfit, model as fc, predict
from dpscale.analysis.forecast.inputs import Series

RULE_TEXT = {"at_k": "k=1 compute + fabric at k", "below_k": "k=1 compute + fabric and overlap below k only"}
NAIVE = {"naive_constant": "the efficiency at the largest smaller k", "naive_ring": "the ring-scaled overhead",
         "naive_bare": "the fully exposed all-reduce"}
MODEL = "the model"


def measured_utc(s: Series, scaling: str, k: int) -> str:
    """When the row's measured efficiency was measured: the earlier of its two points."""
    stamps = [s.rates(scaling)[x].started_utc for x in (1, k)]
    return min(stamps) if all(stamps) else ""


def eligibility(rules: tuple, when: str) -> dict:
    """Which rules chosen after seeing data (fit.CHOSEN) a row used, and whether it may
    score them: only if it was measured after every one of them was chosen."""
    if not rules:
        return {"chosen_rules": [], "scores_chosen_rules": None}
    ok = bool(when) and all(when > fit.CHOSEN[r].chosen_utc for r in rules)
    return {"chosen_rules": list(rules), "scores_chosen_rules": ok}


def row(s: Series, scaling: str, k: int, rule: str, given: fit.Given, cfg: dict) -> dict | None:
    """One validation row: the point prediction, its draws (for the band: misfit.py sets
    it, `calibrate`), the naive predictions, and the log of what it read."""
    nodes, g = s.nodes_at(k), (k // s.nodes_at(k) if s.nodes_at(k) > 1 else int(cfg["gpus_per_node"]))
    log: list = []
    rd = s.reading(log)
    m = fit.build(rd, k, rule, given, nodes=nodes, per_node=g)
    if m is None or m.fabric is None or (nodes > 1 and m.internode is None):
        return None
    pred, meas = predict.point(m, s, scaling, k), predict.measured(s, scaling, k, m)
    if pred is None or meas is None:
        return None
    logd, noise = predict.log_draws(predict.draws(rd, k, rule, given, cfg, nodes=nodes, per_node=g), rd, scaling, k, cfg)
    out = {"series": s.name, "scaling": scaling, "k": k, "nodes": nodes, "rule": rule, "method": RULE_TEXT[rule],
           "predicted": pred["efficiency"], "measured": meas["efficiency"],
           "error_points": 100 * (pred["efficiency"] - meas["efficiency"]),
           "predicted_overhead_ms": pred["overhead_ms"], "measured_overhead_ms": meas["overhead_ms"],
           **{key: pred[key] for key in ("compute_ms", "exposed_comm_ms", "straggler_ms")},
           "overlap": m.overlap, "exposed_fraction": m.exposed if m.overlap == "fraction" else None,
           "beta_busbw_GBps": m.fabric.beta_Bps / 1e9 if m.fabric.beta_Bps != float("inf") else None,
           "how": list(m.notes), "noise": noise or "not known: measured once", "measured_utc": measured_utc(s, scaling, k),
           "_log_draws": logd, "used": list(dict.fromkeys(log))}
    out["inputs"] = sorted({u.text() for u in out["used"]})
    out.update(eligibility(m.rules, out["measured_utc"]))
    mi = predict.measured_interval(s, scaling, k, cfg["band_level"])
    out.update(measured_lo=mi["lo"], measured_hi=mi["hi"], measured_covers=mi["covers"])
    # The measurement's own uncertainty: an error inside it is not the model's to explain.
    out["predicted_in_measured"] = (mi["lo"] <= out["predicted"] <= mi["hi"]) if mi["lo"] is not None else None
    nv = predict.naive(s, scaling, k, m)
    out.update(nv, **{f"{key}_error_points": (100 * (v - out["measured"]) if v is not None else None)
                      for key, v in nv.items()})
    return out


def validation(s: Series, given: fit.Given, cfg: dict) -> list[dict]:
    """Every measured k >= 2 (with k=1 measured) of both scalings, by every rule that
    builds; each row's band still to be set (`calibrate`)."""
    rows = []
    for scaling in predict.SCALINGS:
        for k in sorted(x for x in s.rates(scaling) if x >= 2 and 1 in s.rates(scaling)):
            rows += [r for rule in ("at_k", "below_k") if (r := row(s, scaling, k, rule, given, cfg))]
    return rows


def residual(r: dict, machine: str) -> misfit.Residual:
    """A row as the misfit reads it: its log error, its draws' variance, what it read."""
    d = r["_log_draws"]["efficiency"]
    return misfit.Residual(machine, r["series"], r["scaling"], r["k"], float(np.log(r["predicted"] / r["measured"])),
                           float(np.var(d, ddof=1)) if len(d) > 1 else 0.0,
                           frozenset((u.kind, u.k, u.what) for u in r["used"]))


def calibrate(rows: list[dict], machine: str, committed: list[misfit.Residual], cfg: dict) -> list[dict]:
    """Each row's band: its draws widened by the misfit of the rows that do not touch it
    (misfit.pool), and whether the measurement fell inside."""
    own = [residual(r, machine) for r in rows]
    for r in rows:
        pool, how = misfit.pool(r["series"], r["scaling"], r["k"], machine, own, committed)
        tau, nu = misfit.estimate(pool)
        bd = predict.band(r["_log_draws"], tau, nu, cfg, r["k"], keys=("efficiency",))
        r.update(predicted_lo=bd.get("efficiency_lo"), predicted_hi=bd.get("efficiency_hi"),
                 band_none=bd.get("band_none"), misfit=tau, misfit_rows=nu, misfit_from=how)
        r["inside"] = (r["predicted_lo"] <= r["measured"] <= r["predicted_hi"]) if r["predicted_lo"] is not None \
            else None
    return rows


def leaks(r: dict) -> list[str]:
    """What a row read at the k it predicts, beyond the at_k rule's bare all-reduce (by
    its log of reads, not by what it declared)."""
    allowed = {"sweep", "internode sweep"} if r["rule"] == "at_k" else set()
    return sorted({u.text() for u in r["used"] if u.k == r["k"] and u.kind not in allowed})


def _stats(rows, key):
    errs = [abs(r[key]) for r in rows if r.get(key) is not None]
    return {"n": len(errs), "mean_abs": statistics.fmean(errs) if errs else None, "max_abs": max(errs, default=None)}


def verdict(rows: list[dict]) -> dict:
    """Each naive predictor against the model on the rows where it predicts (mean |error|,
    points), and the winner: the naive one whose mean is lower than the model's on its
    rows by the most (0.05 points, the shown precision, or less is a tie: the model),
    else the model."""
    out, best = {}, ("model", 0.0)
    for key, name in NAIVE.items():
        on = [r for r in rows if r.get(key) is not None]
        if not on:
            continue
        mine, theirs = _stats(on, "error_points")["mean_abs"], _stats(on, f"{key}_error_points")["mean_abs"]
        out[key] = {"name": name, "n": len(on), "mean_abs": theirs, "model_mean_abs": mine}
        if mine - theirs > max(0.05, best[1]):
            best = (key, mine - theirs)
    out["winner"] = best[0]
    out["winner_name"] = NAIVE.get(best[0], MODEL)
    return out


def summary(rows: list[dict]) -> dict:
    """Over rows: n, mean and max |error| (points) of the model and of each naive
    predictor, the verdict, the band's coverage (measured inside / rows with a band), the
    rows that may score each chosen rule, and the measurement's own reach: the widest
    measured interval's half-width (points) and how many predictions fall inside it."""
    banded = [r for r in rows if r.get("inside") is not None]
    judged = [r for r in rows if r.get("predicted_in_measured") is not None]
    chosen = {name: {"rows": sum(name in r.get("chosen_rules", []) for r in rows),
                     "eligible": [f"{r['series']} {r['scaling']} k={r['k']} {r['rule']}" for r in rows
                                  if name in r.get("chosen_rules", []) and r["scores_chosen_rules"]],
                     "eligible_stats": _stats([r for r in rows if name in r.get("chosen_rules", [])
                                               and r["scores_chosen_rules"]], "error_points")}
              for name in fit.CHOSEN}
    return {"model": _stats(rows, "error_points"), **{key: _stats(rows, f"{key}_error_points") for key in NAIVE},
            "verdict": verdict(rows), "banded": len(banded), "inside": sum(bool(r["inside"]) for r in banded),
            "coverage": sum(bool(r["inside"]) for r in banded) / len(banded) if banded else None,
            "chosen_rules": chosen,
            "measured_halfwidth_max_points": max((50 * (r["measured_hi"] - r["measured_lo"]) for r in judged),
                                                 default=None),
            "with_measured_interval": len(judged),
            "predicted_in_measured": sum(r["predicted_in_measured"] for r in judged)}
