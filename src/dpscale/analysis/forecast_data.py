"""The forecast model (analysis.forecast) fed from one machine's results, with a band
and its validation against every k that was measured.

`results` is {(experiment, variant, k): result dict} (report.machines.Machine.results).
A band is the percentile interval over a bootstrap: each draw resamples k=1's timed
repeats (samples_per_s_repeats, samples_per_s_launches), the all-reduce sweep's
payload points and the probe's paired differences (comm_ms_pairs), refits the model
and predicts again. A number measured once is held fixed (the band says nothing
about it: `fixed` lists what was)."""
from __future__ import annotations

import statistics

import numpy as np

from dpscale.analysis import costmodel
from dpscale.analysis import forecast as fc

KEYS = ("internode_GBps", "internode_alpha_us", "gpus_per_node", "max_nodes", "knee_efficiency", "band_level",
        "bootstrap_draws", "seed")   # schemas/config.schema.yaml `forecast`: the defaults live there
FRAMEWORKS = {"ddp": ("ddp_weak", "ddp_strong"), "jax": ("jax_weak", None)}


def config(cfg: dict) -> dict:
    """The forecast settings, every key present (the schema's defaults filled in by the caller)."""
    missing = [k for k in KEYS if (cfg or {}).get(k) is None]
    if missing:
        raise ValueError(f"forecast config: {', '.join(missing)} missing; take the defaults of "
                         "schemas/config.schema.yaml `forecast` (dpscale.report.forecast.settings)")
    return dict(cfg)


def ok(r) -> bool:
    return bool(r) and r.get("status") == "ok"


def _m(r) -> dict:
    return (r or {}).get("metrics") or {}


def series(results: dict, experiment: str, variant: str) -> dict[int, dict]:
    return {k: r for (e, v, k), r in sorted(results.items()) if e == experiment and v == variant and ok(r)}


def samples(r: dict, rng=None) -> float:
    """samples/s of a throughput result: the mean over its repeats (and launches), one
    bootstrap resample of them when rng is given."""
    m = _m(r)
    xs = list(m.get("samples_per_s_repeats") or []) + list(m.get("samples_per_s_launches") or [])
    if not xs:
        return float(m["samples_per_s"])
    if rng is not None and len(xs) > 1:
        xs = rng.choice(xs, size=len(xs), replace=True)
    return float(np.mean(xs))


def per_rank_batch(r: dict, k: int) -> float:
    m = _m(r)
    return float(m.get("per_rank_batch") or m["global_batch"] / k)


def step_s(r: dict, k: int, rng=None) -> float:
    """Seconds per step of one rank: its batch over its share of the throughput."""
    return per_rank_batch(r, k) / (samples(r, rng) / k)


def measured_efficiency(ser: dict[int, dict], k: int) -> float | None:
    if 1 not in ser or k not in ser:
        return None
    return samples(ser[k]) / (k * samples(ser[1]))


# ---------------------------------------------------------------- inputs

def sweep_at(results: dict, k: int, rng=None) -> dict | None:
    r = results.get(("allreduce", "default", k))
    if not ok(r) or not costmodel.allreduce_rows(_m(r)):
        return None
    table = costmodel.allreduce_rows(_m(r))
    rows = table.get("in_place") or table.get("out_of_place") or []   # DDP all-reduces in place
    pts = [(x["bytes"], x.get("time_us_median", x.get("time_us")) / 1e6) for x in rows]
    if rng is not None and len(pts) > 2:
        pts = [pts[i] for i in rng.integers(0, len(pts), len(pts))]
    return {"bytes": [p[0] for p in pts], "time_s": [p[1] for p in pts], "source": r.get("_path", "")}


def fabric_ks(results: dict) -> list[int]:
    return sorted(k for (e, v, k), r in results.items() if e == "allreduce" and v == "default" and ok(r) and k >= 2)


def fit_at(results: dict, k: int, rng=None) -> fc.Fabric | None:
    sw = sweep_at(results, k, rng)
    return fc.fit_fabric(sw["bytes"], sw["time_s"], k, f"all-reduce sweep at k={k}") if sw else None


def probe_comm_s(results: dict, k: int, rng=None) -> float | None:
    r = results.get(("ddp_comm_probe", "default", k))
    if not ok(r):
        return None
    pairs = _m(r).get("comm_ms_pairs")
    if pairs:
        xs = rng.choice(pairs, size=len(pairs), replace=True) if rng is not None else pairs
        return float(statistics.median(xs)) / 1e3
    return _m(r)["comm_ms"] / 1e3 if _m(r).get("comm_ms") is not None else None


def grad_buckets(results: dict, framework: str, params_hint: float | None) -> tuple[tuple, str]:
    """The all-reduce payloads of one step: DDP's recorded buckets, else XLA's all-reduces
    (jax_hlo), else DDP's default bucketing of the gradient bytes."""
    probes = [_m(r) for (e, _v, _k), r in sorted(results.items()) if e == "ddp_comm_probe" and ok(r)]
    hlo = [_m(r) for (e, _v, _k), r in sorted(results.items()) if e == "jax_hlo" and ok(r)]
    if framework == "jax" and hlo and hlo[0].get("allreduce_elements"):
        return tuple(4.0 * x for x in hlo[0]["allreduce_elements"]), "XLA's all-reduces (jax_hlo)"
    if framework == "ddp" and probes and probes[0].get("bucket_bytes"):
        return tuple(float(b) for b in probes[0]["bucket_bytes"]), "DDP's buckets (ddp_comm_probe)"
    grad = next((p["grad_bytes"] for p in probes if p.get("grad_bytes")), None) or (
        4.0 * params_hint if params_hint else None)
    if not grad:
        return (), "no gradient size recorded"
    return tuple(fc.ddp_buckets(grad)), f"{grad / 1e6:.1f} MB of fp32 gradients in DDP's default buckets"


def compute_points(results: dict, framework: str, variant: str, rng=None) -> dict[float, float]:
    """{per-rank batch: k=1 step seconds} from the weak and strong sweeps at k=1."""
    out = {}
    for exp in FRAMEWORKS[framework]:
        r = (series(results, exp, variant) if exp else {}).get(1)
        if r:
            out[per_rank_batch(r, 1)] = step_s(r, 1, rng)
    return out


def sigma_k1(results: dict, framework: str, variant: str) -> tuple[float, str]:
    """(sigma s, how): k=1's step-time spread; 0 where no per-rank step times were recorded."""
    r = series(results, FRAMEWORKS[framework][0], variant).get(1)
    rows = _m(r).get("per_rank") or []
    sig = fc.sigma_from_steps((rows[0] if rows else {}).get("steps"))
    return (sig, "straggler sigma from k=1's step p10/p90") if sig else (
        0.0, "no per-rank step times at k=1: straggler term 0")


def band_sources(results: dict, framework: str, variant: str) -> dict:
    """What the band resamples, and what was measured once and so held fixed."""
    reps = [len(_m(r).get("samples_per_s_repeats") or []) + len(_m(r).get("samples_per_s_launches") or [])
            for e in FRAMEWORKS[framework] if e for r in [series(results, e, variant).get(1)] if r]
    pts = {k: len((sweep_at(results, k) or {}).get("bytes", [])) for k in fabric_ks(results)}
    pairs = {k: len(_m(r).get("comm_ms_pairs") or []) for (e, _v, k), r in results.items()
             if e == "ddp_comm_probe" and ok(r)}
    fixed = (["k=1 throughput"] if not any(n > 1 for n in reps) else []) + \
            (["all-reduce sweep"] if not any(n > 2 for n in pts.values()) else []) + \
            (["probe difference"] if framework == "ddp" and not any(pairs.values()) else [])
    return {"k1_repeats": reps, "sweep_points": pts, "probe_pairs": pairs, "fixed": fixed}


# ---------------------------------------------------------------- the model of a machine

def internode(cfg: dict) -> fc.Fabric:
    return fc.Fabric(cfg["internode_alpha_us"] / 1e6, fc.bytes_per_s(cfg["internode_GBps"]), 0,
                     f"config forecast.internode_GBps = {cfg['internode_GBps']:g}")


def _pick(ks, below):
    ks = [k for k in ks if k >= 2 and (below is None or k < below)]
    return max(ks) if ks else None


def build(results: dict, framework: str, variant: str, cfg: dict, *, below: int | None = None,
          fabric_k: int | None = None, rng=None, params_hint: float | None = None) -> fc.StepModel | None:
    """The step model of one series. below: use only what was measured at k < below
    (None: everything); fabric_k: the all-reduce sweep of exactly that k."""
    pts = compute_points(results, framework, variant, rng)
    if not pts:
        return None
    a, b, how_c = fc.fit_compute(pts)
    fk = fabric_k or _pick(fabric_ks(results), below)
    fab = fit_at(results, fk, rng) if fk else None
    buckets, how_b = grad_buckets(results, framework, params_hint)
    sigma, how_s = sigma_k1(results, framework, variant)
    m = fc.StepModel(a, b, fab, buckets, 1.0, sigma, internode(cfg), int(cfg["gpus_per_node"]),
                     notes=(how_c, how_b, fab.source if fab else "no fabric measured", how_s))
    if fab is None or not buckets:
        return m
    f, how_f = exposure(results, framework, variant, m, below, fabric_k, rng)
    return m.with_(exposed=f, notes=m.notes + (how_f,))


def exposure(results, framework, variant, m: fc.StepModel, below, fabric_k, rng) -> tuple[float, str]:
    """f: the probe at fabric_k, else the probe at the largest k below, else calibrated
    from the measured efficiency at the largest k below, else 1 (nothing hidden)."""
    if framework == "ddp":
        probe_ks = [k for (e, _v, k), r in results.items() if e == "ddp_comm_probe" and ok(r)]
        kp = fabric_k if fabric_k in probe_ks else _pick(probe_ks, below)
        if kp:
            return fc.exposed_fraction(probe_comm_s(results, kp, rng), m, kp), f"no_sync() probe at k={kp}"
    ser = series(results, FRAMEWORKS[framework][0], variant)
    kc = _pick(list(ser), below)
    if kc and 1 in ser:
        r = ser[kc]
        t = step_s(r, kc, rng) - fc.compute_time(m, per_rank_batch(r, kc)) - m.sigma_s * fc.expected_max_normal(kc)
        return fc.exposed_fraction(t, m, kc), f"calibrated from the measured efficiency at k={kc}"
    return 1.0, "assumed 1 (nothing hidden): no probe and no smaller k"


def batches(results: dict, framework: str, variant: str) -> tuple[float | None, float | None]:
    """(weak per-rank batch, strong global batch) of a series."""
    weak, strong = (series(results, e, variant).get(1) if e else None for e in FRAMEWORKS[framework])
    return (per_rank_batch(weak, 1) if weak else None,
            float(_m(strong).get("global_batch") or per_rank_batch(strong, 1)) if strong else None)


def predict(m: fc.StepModel, weak_b, strong_g, k: int) -> dict:
    out = {"compute_ms": 1e3 * fc.compute_time(m, weak_b) if weak_b else None,
           "exposed_comm_ms": 1e3 * fc.exposed_comm_time(m, k),
           "allreduce_ring_ms": 1e3 * fc.allreduce_time(m, k),
           "allreduce_tree_ms": 1e3 * fc.allreduce_time(m, k, fc.tree_time),
           "straggler_ms": 1e3 * m.sigma_s * fc.expected_max_normal(k)}
    out.update(scaling(m, weak_b, strong_g, k))
    return out


def scaling(m: fc.StepModel, weak_b, strong_g, k: int) -> dict:
    """The efficiencies and step times at k: what a band spans (predict's last keys)."""
    out = {}
    if weak_b:
        out.update(weak_efficiency=fc.weak_efficiency(m, weak_b, k), weak_step_ms=1e3 * fc.step_time(m, weak_b, k))
    if strong_g and strong_g / k >= 1:
        out.update(strong_efficiency=fc.strong_efficiency(m, strong_g, k),
                   strong_step_ms=1e3 * fc.step_time(m, strong_g / k, k))
    return out


def describe(m: fc.StepModel) -> dict:
    return {"alpha_us": 1e6 * m.fabric.alpha_s if m.fabric else None,
            "beta_busbw_GBps": m.fabric.beta_Bps / fc.GB if m.fabric else None,
            "exposed_fraction": m.exposed, "sigma_ms": 1e3 * m.sigma_s,
            "compute_a_ms": 1e3 * m.compute_a_s, "compute_b_ms_per_sample": 1e3 * m.compute_b_s,
            "how": list(m.notes)}


def band(results, framework, variant, cfg, ks, build_kw: dict) -> dict[int, dict]:
    """{k: {key_lo, key_hi}}: percentile band of each prediction over bootstrap draws."""
    rng = np.random.default_rng(cfg["seed"])
    wb, sg = batches(results, framework, variant)
    draws: dict = {}
    for _ in range(int(cfg["bootstrap_draws"])):
        m = build(results, framework, variant, cfg, rng=rng, **build_kw)
        for k in ks:   # scaling(), not predict(): the band needs none of the components
            for key, v in scaling(m, wb, sg, k).items():
                draws.setdefault((k, key), []).append(v)
    tail = 100 * (1 - cfg["band_level"]) / 2
    out: dict = {}
    for (k, key), vs in draws.items():
        lo, hi = np.percentile(vs, [tail, 100 - tail])
        out.setdefault(k, {}).update({f"{key}_lo": float(lo), f"{key}_hi": float(hi)})
    return out


# ---------------------------------------------------------------- validation and forecast

def series_list(results: dict) -> list[tuple[str, str]]:
    out = []
    for fw, (weak, _strong) in FRAMEWORKS.items():
        for v in sorted({v for (e, v, k), r in results.items() if e == weak and k == 1 and ok(r)}):
            out.append((fw, v))
    return out


def _validate_one(results, fw, variant, scaling, k, method, kw, cfg, params_hint) -> dict | None:
    m = build(results, fw, variant, cfg, params_hint=params_hint, **kw)
    if m is None or m.fabric is None:
        return None
    exp = FRAMEWORKS[fw][0 if scaling == "weak" else 1]
    wb, sg = batches(results, fw, variant)
    pred = predict(m, wb, sg, k)
    key = f"{scaling}_efficiency"
    measured = measured_efficiency(series(results, exp, variant), k)
    if pred.get(key) is None or measured is None:
        return None
    bd = band(results, fw, variant, cfg, [k], {**kw, "params_hint": params_hint}).get(k, {})
    return {"framework": fw, "variant": variant, "scaling": scaling, "k": k, "method": method,
            "predicted": pred[key], "predicted_lo": bd.get(f"{key}_lo"), "predicted_hi": bd.get(f"{key}_hi"),
            "measured": measured, "error_points": 100 * (pred[key] - measured),
            "band_fixed": band_sources(results, fw, variant)["fixed"],
            **{x: pred[x] for x in ("compute_ms", "exposed_comm_ms", "straggler_ms")}, **describe(m)}


def validation(results: dict, cfg: dict, params_hint: float | None = None) -> list[dict]:
    """Each measured k >= 2 predicted (1) from k=1's compute and the fabric measured at
    that k, (2) with three or more measured k, from the smaller k only."""
    rows = []
    for fw, variant in series_list(results):
        for scaling, exp in zip(("weak", "strong"), FRAMEWORKS[fw]):
            ser = series(results, exp, variant) if exp else {}
            for k in (k for k in ser if k >= 2 and 1 in ser):
                plans = []
                if k in fabric_ks(results):
                    plans.append(("k=1 compute + fabric at k", {"fabric_k": k, "below": k}))
                if len(ser) >= 3:
                    plans.append(("smaller k only", {"below": k}))
                for method, kw in plans:
                    row = _validate_one(results, fw, variant, scaling, k, method, kw, cfg, params_hint)
                    if row:
                        rows.append(row)
    return rows


def grid_ks(cfg: dict) -> list[tuple[int, int]]:
    """(k, nodes): 1..G in one node, then 2..max_nodes nodes of G."""
    g = int(cfg["gpus_per_node"])
    return [(k, 1) for k in range(1, g + 1)] + [(n * g, n) for n in range(2, int(cfg["max_nodes"]) + 1)]


def forecast_series(results, fw, variant, cfg, params_hint=None) -> dict | None:
    m = build(results, fw, variant, cfg, params_hint=params_hint)
    if m is None:
        return None
    wb, sg = batches(results, fw, variant)
    grid = grid_ks(cfg)
    bd = band(results, fw, variant, cfg, [k for k, _n in grid], {"params_hint": params_hint}) if m.fabric else {}
    rows = []
    for k, nodes in grid:
        row = {"k": k, "nodes": nodes, **(predict(m, wb, sg, k) if m.fabric or k == 1 else {}), **bd.get(k, {})}
        for scaling, exp in zip(("weak", "strong"), FRAMEWORKS[fw]):
            meas = measured_efficiency(series(results, exp, variant), k) if exp and nodes == 1 else None
            row[f"{scaling}_measured"] = meas
        row["point"] = "measured" if row.get("weak_measured") is not None else "predicted"
        rows.append(row)
    return {"framework": fw, "variant": variant, "per_rank_batch": wb, "global_batch": sg, **describe(m),
            "band_sources": band_sources(results, fw, variant),
            "knee_threshold": cfg["knee_efficiency"], "band_level": cfg["band_level"], "rows": rows,
            **{f"{s}_knee_k": knee_of(rows, f"{s}_efficiency", cfg) for s in ("weak", "strong")}}


def knee_of(rows: list[dict], key: str, cfg: dict) -> int | None:
    pts = [(r["k"], r[key]) for r in rows if r.get(key) is not None]
    return fc.knee([k for k, _ in pts], [e for _, e in pts], cfg["knee_efficiency"]) if pts else None


def machine_forecast(results: dict, cfg: dict, params_hint: float | None = None) -> dict:
    cfg = config(cfg)
    out = [s for fw, v in series_list(results) if (s := forecast_series(results, fw, v, cfg, params_hint))]
    return {"config": cfg, "series": out, "validation": validation(results, cfg, params_hint)}


