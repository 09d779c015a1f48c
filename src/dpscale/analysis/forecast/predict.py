"""Predictions of one series: efficiency, step time and overhead at a k, with the band
(dpscale.analysis.forecast.fit says what a band covers), and the grid: k = 1..G in one
node, then 2..max_nodes nodes of G.

Efficiency: weak e(k) = t(B, 1) / t(B, k); strong e(k) = t(G, 1) / (k t(G/k, k)).
Overhead: what a step at k costs beyond its compute, t(b, k) - t_c(b), in ms.
"""
from __future__ import annotations

import numpy as np

from dpscale.analysis import stats
from dpscale.analysis.forecast import fit, model as fc
from dpscale.analysis.forecast.inputs import Series

SCALINGS = ("weak", "strong")


def point(m: fc.StepModel, s: Series, scaling: str, k: int) -> dict | None:
    """{efficiency, step_ms, overhead_ms, compute_ms, exposed_comm_ms, straggler_ms} at k."""
    batch, full = s.batch(scaling, k), s.batch(scaling, 1)
    if not batch or not full or batch < 1:
        return None
    t, t1 = fc.step_time(m, batch, k), fc.step_time(m, full, 1)
    eff = t1 / t if scaling == "weak" else t1 / (k * t)
    comm, strag = fc.exposed_comm_time(m, k, batch), fc.straggler_time(m, k, batch)
    return {"efficiency": eff, "step_ms": 1e3 * t, "overhead_ms": 1e3 * (comm + strag),
            "compute_ms": 1e3 * fc.compute_time(m, batch), "exposed_comm_ms": 1e3 * comm, "straggler_ms": 1e3 * strag,
            "allreduce_ring_ms": 1e3 * fc.allreduce_time(m, k), "allreduce_tree_ms": 1e3 * fc.allreduce_time(m, k, fc.tree_time)}


def draws(s: Series, k: int, rule: str, given: fit.Given, cfg: dict, *, nodes: int = 1,
          per_node: int = 8) -> list[fc.StepModel] | str:
    """The bootstrap's models (fit's band), or why there are none."""
    if fit.measured_once(s):
        return "k=1's throughput was measured once: no spread of a measurement to band with"
    rng = np.random.default_rng(cfg["seed"])
    out = [fit.build(s, k, rule, given, rng, nodes=nodes, per_node=per_node) for _ in range(int(cfg["bootstrap_draws"]))]
    return [b[0] for b in out if b] or "no model at k"


def band(models: list[fc.StepModel] | str, s: Series, scaling: str, k: int, cfg: dict,
         keys=("efficiency", "step_ms")) -> dict:
    """{key_lo, key_hi} at k over the draws' models, each with one measurement's spread
    on its rate (the replicate cv of the largest measured k below, fit.spread);
    {"band_none": why} without draws."""
    if isinstance(models, str):
        return {"band_none": models}
    rng = np.random.default_rng(cfg["seed"] + k)
    cv = fit.spread(s, scaling, below=k) or 0.0
    vals = {key: [] for key in keys}
    for m in models:
        p = point(m, s, scaling, k)
        if p is None:
            return {"band_none": "no prediction at k"}
        noise = float(np.exp(cv * rng.standard_normal()))
        for key in keys:   # a rate noise-times higher: efficiency up, step time down
            vals[key].append(p[key] * noise if key == "efficiency" else p[key] / noise)
    tail = 100 * (1 - cfg["band_level"]) / 2
    out = {}
    for key, vs in vals.items():
        lo, hi = np.percentile(vs, [tail, 100 - tail])
        out.update({f"{key}_lo": float(lo), f"{key}_hi": float(hi)})
    return out


def grid_ks(cfg: dict) -> list[tuple[int, int]]:
    """(k, nodes): 1..G in one node, then 2..max_nodes nodes of G."""
    g = int(cfg["gpus_per_node"])
    return [(k, 1) for k in range(1, g + 1)] + [(n * g, n) for n in range(2, int(cfg["max_nodes"]) + 1)]


def grid(s: Series, given: fit.Given, cfg: dict) -> list[dict]:
    """One row per (k, nodes) of the grid, from one model (fit's rule "any") and one set
    of bootstrap draws: predicted efficiency and step time per scaling, with bands, the
    parts of the weak step, and where a point was measured, its measured efficiency."""
    g = int(cfg["gpus_per_node"])
    built = fit.build(s, 0, "any", given, nodes=2, per_node=g)
    if built is None:
        return []
    m, used = built
    models = draws(s, 0, "any", given, cfg, nodes=2, per_node=g)
    rows = []
    for k, nodes in grid_ks(cfg):
        row = {"k": k, "nodes": nodes, "inputs": sorted({u.text() for u in used})}
        if k > 1 and (m.fabric is None or (nodes > 1 and m.internode is None)):
            row["why_none"] = "no in-node fabric measured" if m.fabric is None else "no tier between nodes known"
        else:
            for scaling in SCALINGS:
                p = point(m, s, scaling, k)
                if p is None:
                    continue
                row.update({f"{scaling}_efficiency": p["efficiency"], f"{scaling}_step_ms": p["step_ms"]})
                row.update({key: v for key, v in p.items() if key not in ("efficiency", "step_ms")}
                           if scaling == "weak" else {})
                if k > 1:
                    row.update({f"{scaling}_{key}": v for key, v in band(models, s, scaling, k, cfg).items()})
        for scaling in SCALINGS:
            row[f"{scaling}_measured"] = measured_efficiency(s, scaling, k) if nodes == s.nodes_at(k) else None
        row["point"] = "measured" if row.get("weak_measured") is not None else "predicted"
        rows.append(row)
    return rows


def measured_efficiency(s: Series, scaling: str, k: int) -> float | None:
    """samples/s(k) / (k samples/s(1)), each the total samples over total time of its replicates."""
    rates = s.rates(scaling)
    if 1 not in rates or k not in rates:
        return None
    return rates[k].estimate() / (k * rates[1].estimate())


def measured_interval(s: Series, scaling: str, k: int, level: float) -> dict:
    """The measured efficiency's `level` interval, computed on the ratio: with u = 1/rate
    per replicate (seconds per sample), e(k) = mean(u at 1) / (k mean(u at k)), the
    ratio of two independent means (the points ran as separate launches): Fieller with
    Welch's degrees of freedom (stats.ratio_ci). {lo, hi, covers}; lo and hi are None
    where a side has fewer than two replicates (`covers` then says so)."""
    rates = s.rates(scaling)
    if 1 not in rates or k not in rates:
        return {"lo": None, "hi": None, "covers": "not measured"}
    (c1, x1), (ck, xk) = rates[1].units(), rates[k].units()
    r = stats.ratio_ci([1 / x for x in x1], [1 / x for x in xk], level=level, scale=1 / k,
                       covers=c1 if c1 == ck else f"{ck} at k over {c1} at k=1")
    return {"lo": r["ci_lo"], "hi": r["ci_hi"], "covers": r["covers"] if r["ci_lo"] is not None else r["method"]}


def knee(rows: list[dict], key: str, threshold: float) -> int | None:
    pts = [(r["k"], r[key]) for r in rows if r.get(key) is not None]
    return fc.knee([k for k, _ in pts], [e for _, e in pts], threshold) if pts else None
