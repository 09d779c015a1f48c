"""Predictions of one series: efficiency, step time and overhead at a k, with the band
(dpscale.analysis.forecast.fit says what a band covers, misfit.py how the model's own
error widens it), and the grid: k = 1..G in one node, then 2..max_nodes nodes of G, G
the layout the tier between nodes was measured on (fit.layout).

Efficiency: weak e(k) = t(B, 1) / t(B, k); strong e(k) = t(G, 1) / (k t(G/k, k)).
Overhead: what a step at k costs beyond its compute, t(b, k) - t_c(b), in ms.
"""
from __future__ import annotations

import numpy as np

from dpscale.analysis import stats
from dpscale.analysis.forecast import fit, misfit, model as fc
from dpscale.analysis.forecast.inputs import Reading, Series

SCALINGS = ("weak", "strong")


def efficiency_and_step(m: fc.StepModel, s: Series, scaling: str, k: int) -> tuple[float, float] | None:
    """(efficiency, step time in s) at k; None where the scaling has no batch at k."""
    batch, full = s.batch(scaling, k), s.batch(scaling, 1)
    if not batch or not full or batch < 1:
        return None
    t, t1 = fc.step_time(m, batch, k), fc.step_time(m, full, 1)
    return (t1 / t if scaling == "weak" else t1 / (k * t)), t


def point(m: fc.StepModel, s: Series, scaling: str, k: int) -> dict | None:
    """{efficiency, step_ms, overhead_ms, compute_ms, exposed_comm_ms, straggler_ms} at k."""
    at = efficiency_and_step(m, s, scaling, k)
    if at is None:
        return None
    (eff, t), batch = at, s.batch(scaling, k)
    comm, strag = fc.exposed_comm_time(m, k, batch), fc.straggler_time(m, k, batch)
    return {"efficiency": eff, "step_ms": 1e3 * t, "overhead_ms": 1e3 * (comm + strag),
            "compute_ms": 1e3 * fc.compute_time(m, batch), "exposed_comm_ms": 1e3 * comm, "straggler_ms": 1e3 * strag,
            "allreduce_ring_ms": 1e3 * fc.allreduce_time(m, k), "allreduce_tree_ms": 1e3 * fc.allreduce_time(m, k, fc.tree_time)}


def draws(s: Reading, k: int, rule: str, given: fit.Given, cfg: dict, *, nodes: int = 1,
          per_node: int = 8) -> list[fc.StepModel]:
    """The bootstrap's models (fit's band), read through s (so logged with the point's)."""
    rng = np.random.default_rng(cfg["seed"])
    out = [fit.build(s, k, rule, given, rng, nodes=nodes, per_node=per_node) for _ in range(int(cfg["bootstrap_draws"]))]
    return [m for m in out if m is not None]


def log_draws(models: list[fc.StepModel], s: Reading, scaling: str, k: int, cfg: dict) -> tuple[dict, str]:
    """{key: log of each draw's efficiency and step time} at k, with the spread of the
    measured mean on each (fit.spread: the largest measured k' below) where it is known;
    and what that spread is ("": not known, a measurement made once)."""
    rng = np.random.default_rng(cfg["seed"] + k)
    cv = fit.spread(s, scaling, below=k)
    vals = {"efficiency": [], "step_ms": []}
    for m in models:   # a draw needs only these two of point()'s parts (the others were half its cost)
        at = efficiency_and_step(m, s, scaling, k)
        if at is None:
            return {}, ""
        noise = cv * rng.standard_normal() if cv else 0.0   # a rate e^noise higher: efficiency up, step time down
        vals["efficiency"].append(np.log(at[0]) + noise)
        vals["step_ms"].append(np.log(1e3 * at[1]) - noise)
    return {key: np.asarray(v) for key, v in vals.items()}, (f"the measured mean's spread {100 * cv:.2f}%" if cv else "")


def band(logd: dict, tau: float, nu: int, cfg: dict, k: int, keys=("efficiency", "step_ms")) -> dict:
    """{key_lo, key_hi}: the band_level percentile interval of the draws, each widened by
    the misfit (misfit.widen; the same misfit draw moves efficiency up and step time down)."""
    if not logd:
        return {"band_none": "no prediction at k"}
    rng = np.random.default_rng(cfg["seed"] + 7919 * k)
    eff = logd["efficiency"]
    shift = misfit.widen(np.zeros_like(eff), tau, nu, rng)
    tail = 100 * (1 - cfg["band_level"]) / 2
    out = {}
    for key in keys:
        vs = np.exp(logd[key] + (shift if key == "efficiency" else -shift))
        lo, hi = np.percentile(vs, [tail, 100 - tail])
        out.update({f"{key}_lo": float(lo), f"{key}_hi": float(hi)})
    return out


def grid_ks(per_node: int, max_nodes: int) -> list[tuple[int, int]]:
    """(k, nodes): 1..G in one node, then 2..max_nodes nodes of G."""
    return [(k, 1) for k in range(1, per_node + 1)] + [(n * per_node, n) for n in range(2, int(max_nodes) + 1)]


def grid(series: Series, given: fit.Given, cfg: dict, misfit_of=None) -> dict:
    """One row per (k, nodes) of the grid, from one model (fit's rule "any") and one set
    of bootstrap draws: predicted efficiency and step time per scaling, with bands (the
    misfit from misfit_of(scaling) -> (tau, nu, how), else none), the parts of the weak
    step, and where a point was measured, its measured efficiency. {rows, inputs, tiers,
    per_node, layout_how}."""
    log: list = []
    s = series.reading(log)
    per_node, layout_how = fit.layout(s, given, int(cfg["gpus_per_node"]))
    m = fit.build(s, 0, "any", given, nodes=2, per_node=per_node)
    if m is None:
        return {"rows": [], "inputs": [], "tiers": {}, "per_node": per_node, "layout_how": layout_how}
    models = draws(s, 0, "any", given, cfg, nodes=2, per_node=per_node)
    rows = [grid_row(m, models, s, series, k, nodes, cfg, misfit_of) for k, nodes in grid_ks(per_node, cfg["max_nodes"])]
    inputs = sorted({u.text() for u in log})
    for r in rows:
        r["inputs"] = inputs
    return {"rows": rows, "inputs": inputs, "tiers": fit.tier_sources(m), "per_node": per_node,
            "layout_how": layout_how, "notes": list(m.notes), "refused": m.refused}


def grid_row(m, models, s: Reading, series: Series, k: int, nodes: int, cfg: dict, misfit_of) -> dict:
    row = {"k": k, "nodes": nodes}
    if k > 1 and m.refused:   # tiers that cannot be one cluster's (fit.inconsistent): refused, not fitted
        row["why_none"] = "refused: inconsistent fabric tiers"
    elif k > 1 and (m.fabric is None or (nodes > 1 and m.internode is None)):
        row["why_none"] = ("no in-node fabric measured or given" if m.fabric is None else
                           "no tier between nodes measured or given")
    else:
        for scaling in SCALINGS:
            p = point(m, s, scaling, k)
            if p is None:
                continue
            row.update({f"{scaling}_efficiency": p["efficiency"], f"{scaling}_step_ms": p["step_ms"]})
            if k > 1:
                row.update({f"{scaling}_{key}": v for key, v in naive(series, scaling, k, m).items()})
            row.update({key: v for key, v in p.items() if key not in ("efficiency", "step_ms")}
                       if scaling == "weak" else {})
            if k > 1:
                tau, nu, how = misfit_of(scaling) if misfit_of else (0.0, 0, "")
                logd, _ = log_draws(models, s, scaling, k, cfg)
                row.update({f"{scaling}_{key}": v for key, v in band(logd, tau, nu, cfg, k).items()})
                row[f"{scaling}_misfit"] = tau
    for scaling in SCALINGS:
        row[f"{scaling}_measured"] = measured_efficiency(series, scaling, k) if nodes == series.nodes_at(k) else None
    row["point"] = "measured" if row.get("weak_measured") is not None else "predicted"
    return row


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


def measured(s: Series, scaling: str, k: int, m) -> dict | None:
    """Measured efficiency and overhead at k: overhead = the step at k - t_c(b), the
    compute line from k=1 (the model's own, so both sides share it)."""
    eff, batch = measured_efficiency(s, scaling, k), s.batch(scaling, k)
    if eff is None or not batch:
        return None
    step = batch / (s.rates(scaling)[k].estimate() / k)
    return {"efficiency": eff, "overhead_ms": 1e3 * (step - fc.compute_time(m, batch)), "step_ms": 1e3 * step}


def ring_growth(k: int) -> float:
    return 2 * (k - 1) / k


def naive(s: Series, scaling: str, k: int, m) -> dict:
    """The naive predictions of the efficiency at k (check.py names them), from smaller
    measured k only (on the same number of nodes) and, for `bare`, the model's own inputs."""
    bare = m.with_(exposed=1.0, exposed_inter=1.0, overlap="fraction", sigma_s=0.0, straggler_cv=0.0)
    p = point(bare, s, scaling, k)
    out = {"naive_bare": p["efficiency"] if p else None}
    below = [x for x in s.rates(scaling) if 1 < x < k and s.nodes_at(x) == s.nodes_at(k) and 1 in s.rates(scaling)]
    if not below:
        return {**out, "naive_constant": 1.0 if 1 in s.rates(scaling) else None, "naive_ring": None}
    kp = max(below)
    prev = measured(s, scaling, kp, m)
    t_c = fc.compute_time(m, s.batch(scaling, k))
    over = prev["overhead_ms"] / 1e3 * ring_growth(k) / ring_growth(kp)
    t1 = fc.compute_time(m, s.batch(scaling, 1))
    eff = t1 / (t_c + over) if scaling == "weak" else t1 / (k * (t_c + over))
    return {**out, "naive_constant": prev["efficiency"], "naive_ring": eff}
