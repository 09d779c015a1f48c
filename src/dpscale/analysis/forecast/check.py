"""The forecast checked against what it did not use: every measured k >= 2 of a series
predicted by each rule that can (fit.RULES: the fabric at k; only what ran below k),
with the inputs each row used, the overhead in ms beside the efficiency, two naive
predictors beside the model, the band's coverage, and the measured efficiency's own
interval (an error inside it is the measurement's, not the model's).

Out of sample: a row never uses a throughput or probe measured at the k it predicts;
the `at_k` rule's one input at k is the bare all-reduce there (a collective, not the
training it predicts), and `leaks` says so of any row that breaks this.

Naive predictors, so a reader sees whether the model earns its terms:
  constant   the efficiency measured at the largest k' < k (100% where k' = 1)
  ring       the overhead measured at the largest k' >= 2 below k, times the ring's
             growth 2(k-1)/k / (2(k'-1)/k')
"""
from __future__ import annotations

import statistics

from dpscale.analysis.forecast import fit, model as fc, predict
from dpscale.analysis.forecast.inputs import Series

RULE_TEXT = {"at_k": "k=1 compute + fabric at k", "below_k": "k=1 compute + fabric and overlap below k only"}


def measured(s: Series, scaling: str, k: int, m) -> dict | None:
    """Measured efficiency and overhead at k: overhead = the step at k - t_c(b), the
    compute line from k=1 (the model's own, so both sides share it)."""
    eff, batch = predict.measured_efficiency(s, scaling, k), s.batch(scaling, k)
    if eff is None or not batch:
        return None
    step = batch / (s.rates(scaling)[k].estimate() / k)
    return {"efficiency": eff, "overhead_ms": 1e3 * (step - fc.compute_time(m, batch)), "step_ms": 1e3 * step}


def ring_growth(k: int) -> float:
    return 2 * (k - 1) / k


def naive(s: Series, scaling: str, k: int, m) -> dict:
    """The two naive predictions of the efficiency at k, from smaller measured k only."""
    below = [x for x in s.rates(scaling) if 1 < x < k and s.nodes_at(x) == s.nodes_at(k)]
    if not below:
        return {"naive_constant": 1.0, "naive_ring": None}
    kp = max(below)
    prev = measured(s, scaling, kp, m)
    t_c = fc.compute_time(m, s.batch(scaling, k))
    over = prev["overhead_ms"] / 1e3 * ring_growth(k) / ring_growth(kp)
    t1 = fc.compute_time(m, s.batch(scaling, 1))
    eff = t1 / (t_c + over) if scaling == "weak" else t1 / (k * (t_c + over))
    return {"naive_constant": prev["efficiency"], "naive_ring": eff}


def row(s: Series, scaling: str, k: int, rule: str, given: fit.Given, cfg: dict) -> dict | None:
    nodes, g = s.nodes_at(k), (k // s.nodes_at(k) if s.nodes_at(k) > 1 else int(cfg["gpus_per_node"]))
    built = fit.build(s, k, rule, given, nodes=nodes, per_node=g)
    if built is None or built[0].fabric is None or (nodes > 1 and built[0].internode is None):
        return None
    m, used = built
    pred, meas = predict.point(m, s, scaling, k), measured(s, scaling, k, m)
    if pred is None or meas is None:
        return None
    out = {"series": s.name, "scaling": scaling, "k": k, "nodes": nodes, "rule": rule, "method": RULE_TEXT[rule],
           "inputs": sorted({u.text() for u in used}), "used": used,
           "predicted": pred["efficiency"], "measured": meas["efficiency"],
           "error_points": 100 * (pred["efficiency"] - meas["efficiency"]),
           "predicted_overhead_ms": pred["overhead_ms"], "measured_overhead_ms": meas["overhead_ms"],
           **{key: pred[key] for key in ("compute_ms", "exposed_comm_ms", "straggler_ms")},
           "overlap": m.overlap, "exposed_fraction": m.exposed if m.overlap == "fraction" else None,
           "beta_busbw_GBps": m.fabric.beta_Bps / 1e9 if m.fabric.beta_Bps != float("inf") else None,
           "how": list(m.notes)}
    bd = predict.band(predict.draws(s, k, rule, given, cfg, nodes=nodes, per_node=g), s, scaling, k, cfg,
                      keys=("efficiency",))
    out.update(predicted_lo=bd.get("efficiency_lo"), predicted_hi=bd.get("efficiency_hi"), band_none=bd.get("band_none"))
    out["inside"] = (out["predicted_lo"] <= out["measured"] <= out["predicted_hi"]) if out["predicted_lo"] is not None \
        else None
    mi = predict.measured_interval(s, scaling, k, cfg["band_level"])
    out.update(measured_lo=mi["lo"], measured_hi=mi["hi"], measured_covers=mi["covers"])
    # The measurement's own uncertainty: an error inside it is not the model's to explain.
    out["predicted_in_measured"] = (mi["lo"] <= out["predicted"] <= mi["hi"]) if mi["lo"] is not None else None
    nv = naive(s, scaling, k, m)
    out.update(nv, **{f"{key}_error_points": (100 * (v - out["measured"]) if v is not None else None)
                      for key, v in nv.items()})
    return out


def validation(s: Series, given: fit.Given, cfg: dict) -> list[dict]:
    """Every measured k >= 2 (with k=1 measured) of both scalings, by every rule that builds."""
    rows = []
    for scaling in predict.SCALINGS:
        for k in sorted(x for x in s.rates(scaling) if x >= 2 and 1 in s.rates(scaling)):
            rows += [r for rule in ("at_k", "below_k") if (r := row(s, scaling, k, rule, given, cfg))]
    return rows


def leaks(r: dict) -> list[str]:
    """Inputs of a row measured at the k it predicts, beyond the at_k rule's bare all-reduce."""
    allowed = {"sweep", "internode sweep"} if r["rule"] == "at_k" else set()
    return [u.text() for u in r["used"] if u.k == r["k"] and u.kind not in allowed]


def summary(rows: list[dict]) -> dict:
    """Over rows: n, mean and max |error| (points) of the model and of each naive
    predictor, the band's coverage (measured inside / rows with a band), and the
    measurement's own reach: the widest measured interval's half-width (points) and how
    many predictions fall inside their measured interval."""
    def stats(key):
        errs = [abs(r[key]) for r in rows if r.get(key) is not None]
        return {"n": len(errs), "mean_abs": statistics.fmean(errs) if errs else None, "max_abs": max(errs, default=None)}
    banded = [r for r in rows if r.get("inside") is not None]
    judged = [r for r in rows if r.get("predicted_in_measured") is not None]
    return {"model": stats("error_points"), "naive_constant": stats("naive_constant_error_points"),
            "naive_ring": stats("naive_ring_error_points"), "banded": len(banded),
            "coverage": sum(r["inside"] for r in banded) / len(banded) if banded else None,
            "measured_halfwidth_max_points": max((50 * (r["measured_hi"] - r["measured_lo"]) for r in judged),
                                                 default=None),
            "with_measured_interval": len(judged),
            "predicted_in_measured": sum(r["predicted_in_measured"] for r in judged)}
