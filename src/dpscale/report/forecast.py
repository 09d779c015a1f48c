"""The forecast of every machine in a report (dpscale.analysis.forecast), computed once
per report: the chapter, its figures, forecast.json and `dpscale forecast` read the same
records. Here, and only here, results become the forecast's inputs: the registry says
which experiment is a family's weak or strong scaling and which measures the fabric, the
overlap and the all-reduce census (registry.Experiment.scaling, .feeds).

Fabric, in order: a machine's own all-reduce sweeps (and its own measured link between
nodes); else another machine's in the report with the same GPU model (`fabric_from`);
then fabric files (forecast.fabric_files, `dpscale forecast --fabric`: nccl-tests output
or a kept all-reduce result) for the tiers still missing. Without an across-node tier
nothing is predicted past one node.
"""
from __future__ import annotations

from pathlib import Path

from dpscale import provenance, registry
from dpscale.plan import config as dsconfig
from dpscale.report.machines import Machine, ReportData
from dpscale.results import utc_now, write_json_atomic

FAMILY_TEXT = {"torch": "DDP", "jax": "JAX"}


def settings(resolved: dict | None = None, **over) -> dict:
    """The schema's `forecast` defaults, the resolved configuration's values over them."""
    props = dsconfig.schema()["properties"]["forecast"]["properties"]
    given = {**((resolved or {}).get("forecast") or {}), **{k: v for k, v in over.items() if v is not None}}
    return {**{k: v["default"] for k, v in props.items()}, **given}


def ok(r) -> bool:
    return bool(r) and r.get("status") == "ok"


def _m(r) -> dict:
    return (r or {}).get("metrics") or {}


def rate(r: dict):
    """A throughput result as the forecast's Rate: launches and timed epochs kept apart."""
    from dpscale.analysis.forecast.inputs import Rate
    m = _m(r)
    launches = tuple(tuple(x) for x in (m.get("samples_per_s_launch_repeats") or []) if x)
    return Rate(float(m["samples_per_s"]), launches if len(launches) >= 2 else (),
                tuple(m.get("samples_per_s_repeats") or ()))


def nodes_of(r: dict) -> int:
    """Nodes a measurement spanned (its spec's multi-node launch), 1 on one node."""
    return int(((r or {}).get("launch") or {}).get("nodes") or 1)


def sweep(r: dict, k: int):
    """An all-reduce result as the forecast's Sweep (in place: DDP all-reduces in place)."""
    from dpscale.analysis import costmodel
    from dpscale.analysis.forecast.inputs import Sweep
    table = costmodel.allreduce_rows(_m(r))
    rows = table.get("in_place") or table.get("out_of_place") or []
    return Sweep(tuple(float(x["bytes"]) for x in rows),
                 tuple(x.get("time_us_median", x.get("time_us")) / 1e6 for x in rows), k, nodes_of(r),
                 tuple(median_rse(x) for x in rows), r.get("_path", ""))


def median_rse(row: dict) -> float | None:
    """The relative standard error of a payload's median time over its calls: sqrt(pi/2)
    x cv / sqrt(calls) (the median of n normal draws); None where the row has no spread."""
    cv, n = row.get("time_us_cv"), row.get("iters")
    return 1.2533 * cv / n ** 0.5 if cv is not None and n else None


def parts(results: dict, family: str, params_hint: float | None) -> dict:
    """The step model's measured parts: sweeps within one node and across nodes, the
    probe's paired differences, and the payloads of one step's all-reduces."""
    fab, ovl, cen = (registry.feeding(p) for p in ("fabric", "overlap", "census"))
    fab_variant = fab.series_order(fab.variant_names())[0]
    sweeps = {k: sweep(r, k) for (e, v, k), r in sorted(results.items())
              if e == fab.name and v == fab_variant and ok(r) and k >= 2}
    one = {k: s for k, s in sweeps.items() if s.nodes == 1}
    across = [s for s in sweeps.values() if s.nodes > 1]
    probes = {k: tuple(x / 1e3 for x in (_m(r).get("comm_ms_pairs") or [_m(r).get("comm_ms")]) if x is not None)
              for (e, _v, k), r in sorted(results.items()) if e == ovl.name and ok(r) and ovl.family == family}
    stragglers = {k: tuple(_m(r).get("straggler_share_pairs") or ()) for (e, _v, k), r in sorted(results.items())
                  if e == ovl.name and ok(r) and ovl.family == family}
    census = [_m(r) for (e, _v, _k), r in sorted(results.items()) if e == cen.name and ok(r)]
    buckets, how = payloads([_m(r) for (e, _v, _k), r in sorted(results.items()) if e == ovl.name and ok(r)],
                            census, family, params_hint)
    return {"sweeps": one, "internode": max(across, key=lambda s: s.k) if across else None,
            "probes": {k: p for k, p in probes.items() if p}, "buckets": buckets, "buckets_how": how,
            "stragglers": {k: x for k, x in stragglers.items() if x}}


def payloads(probes: list[dict], census: list[dict], family: str, params_hint) -> tuple[tuple, str]:
    """One step's all-reduce payloads: XLA's (the census) for JAX, DDP's recorded buckets,
    else DDP's default bucketing of the gradient bytes (the probe's, the book's model, or
    the pipeline's ResNet-18: models.NUM_PARAMS fp32 gradients)."""
    from dpscale.analysis.forecast import model as fc
    from dpscale.model.models import NUM_PARAMS
    if family == "jax" and census and census[0].get("allreduce_elements"):
        return tuple(4.0 * x for x in census[0]["allreduce_elements"]), "XLA's all-reduces (the HLO census)"
    if family == "torch" and probes and probes[0].get("bucket_bytes"):
        return tuple(float(b) for b in probes[0]["bucket_bytes"]), "DDP's buckets (recorded by the probe)"
    grad = next((p["grad_bytes"] for p in probes if p.get("grad_bytes")), None) or 4.0 * (params_hint or NUM_PARAMS)
    return tuple(fc.ddp_buckets(grad)), f"{grad / 1e6:.1f} MB of fp32 gradients in DDP's default buckets"


def series_of(results: dict, family: str, variant: str, shared: dict):
    """The forecast's Series of one family and variant (None without k=1 throughput)."""
    from dpscale.analysis.forecast import model as fc
    from dpscale.analysis.forecast.inputs import Series
    pts = {sc: {k: r for (e, v, k), r in sorted(results.items()) if e == registry.scaling_of(family, sc)
                and v == variant and ok(r)} for sc in ("weak", "strong")}
    if 1 not in pts["weak"] and 1 not in pts["strong"]:
        return None
    weak1, strong1 = pts["weak"].get(1), pts["strong"].get(1)
    run = (weak1 or strong1).get("runtime") or {}
    pinned = family == "torch" and (weak1 or strong1).get("backend") == "gloo" and run.get("cpu_affinity")
    rows = _m(weak1 or strong1).get("per_rank") or []
    sigma = fc.sigma_from_steps((rows[0] if rows else {}).get("steps"))
    return Series(f"{FAMILY_TEXT[family]} [{variant}]",
                  float(_m(weak1).get("per_rank_batch")) if weak1 else None,
                  float(_m(strong1).get("global_batch")) if strong1 else None,
                  {k: rate(r) for k, r in pts["weak"].items()}, {k: rate(r) for k, r in pts["strong"].items()},
                  {k: nodes_of(r) for sc in pts.values() for k, r in sc.items() if nodes_of(r) > 1},
                  sigma or 0.0, "straggler sigma from k=1's step p10/p90" if sigma else
                  "no per-rank step times at k=1: straggler term 0",
                  no_overlap=(f"each gloo rank is pinned to its own {len(run['cpu_affinity'])} core(s), which its "
                              "all-reduce's threads share with its backward" if pinned else ""), **shared)


def series_list(results: dict) -> list[tuple[str, str]]:
    """(family, variant) of every series with k=1 throughput, the book's protocol first."""
    out = []
    for family in registry.FAMILIES:
        exp = registry.scaling_of(family, "weak")
        have = {v for (e, v, k), r in results.items() if e == exp and k == 1 and ok(r)}
        out += [(family, v) for v in registry.get(exp).series_order(have)]
    return out


def given_fabric(paths, base: Path | None = None):
    """fit.Given from fabric files (forecast.fabric_files, `--fabric`): a one-host sweep
    gives the in-node ring, a multi-host one the tier across nodes (with the one-host
    file's ring subtracted where both are given). A relative path is the workflow's."""
    from dpscale.analysis.forecast import fabric_file, fit
    sweeps = [fabric_file.read_sweep(Path(p) if Path(p).is_absolute() else (base or provenance.ROOT) / p)
              for p in paths or ()]
    one = [s for s in sweeps if s.hosts <= 1]
    intra = fabric_file.fabric_tiers(one[0]).intra if one else None
    multi = [s for s in sweeps if s.hosts > 1]
    tiers = fabric_file.fabric_tiers(multi[0], intra) if multi else None
    intra = intra or (tiers.intra if tiers and tiers.per_node > 1 else None)   # "neglected", and says so
    names = "; ".join(f"{Path(s.source).name} ({s.ranks} ranks on {s.hosts} host(s)"
                      + (f", {s.gpu}" if s.gpu else "") + ")" for s in (one[:1] + multi[:1]))
    return fit.Given(intra, tiers.inter if tiers else None, tiers.per_node if tiers else None, names)


def has_fabric(m: Machine) -> bool:
    fab = registry.feeding("fabric").name
    return any(e == fab and ok(r) for (e, _v, _k), r in m.results.items())


def donor(m: Machine, machines: list[Machine]) -> Machine | None:
    if has_fabric(m) or m.kind == "book":
        return None
    gpu = m.fingerprint.get("gpu_model")
    return next((x for x in machines if x is not m and x.kind != "book" and has_fabric(x) and gpu
                 and x.fingerprint.get("gpu_model") == gpu), None)


def with_spread(s, m: Machine, machines: list[Machine], family: str, variant: str):
    """A series whose k=1 throughput was measured once takes one measurement's spread
    from the same series of a machine with the same GPU that repeated it, and says so."""
    from dataclasses import replace

    from dpscale.analysis.forecast import fit
    if fit.spread(s) is not None:
        return s
    gpu = m.fingerprint.get("gpu_model")
    for x in machines:
        if x is m or x.kind == "book" or not gpu or x.fingerprint.get("gpu_model") != gpu:
            continue
        r = x.get(registry.scaling_of(family, "weak"), variant, 1)
        cv = rate(r).cv() if ok(r) else None
        if cv is not None:
            return replace(s, noise_cv=cv, noise_how=f"one measurement's spread borrowed from {x.name}")
    return s


def of_machine(m: Machine, machines: list[Machine], cfg: dict, given) -> dict:
    """One machine's forecast: per series its model, grid and validation, and the
    validation's summary over every row."""
    from dpscale.analysis.forecast import check, predict
    d = donor(m, machines)
    results = dict(m.results)
    if d:
        results.update({key: r for key, r in d.results.items() if registry.get(key[0]).feeds})
    hint = ((m.book or {}).get("model") or {}).get("params")
    series, validation = [], []
    for family, variant in series_list(results):
        s = series_of(results, family, variant, parts(results, family, hint))
        if s is None:
            continue
        s = with_spread(s, m, machines, family, variant)
        grid = predict.grid(s, given, cfg)
        series.append({"series": s.name, "family": family, "variant": variant, "rows": grid,
                       "per_rank_batch": s.per_rank_batch, "global_batch": s.global_batch,
                       "buckets_how": s.buckets_how, "knee_threshold": cfg["knee_efficiency"],
                       **{f"{sc}_knee_k": predict.knee(grid, f"{sc}_efficiency", cfg["knee_efficiency"])
                          for sc in predict.SCALINGS}})
        validation += [{"machine": m.name, **r} for r in check.validation(s, given, cfg)]
    return {"machine": m.name, "label": m.label if m.kind != "book" else "book", "kind": m.kind, "config": cfg,
            "fabric_from": d.name if d else None, "fabric_files": given.source, "series": series,
            "validation": validation, "summary": check.summary(validation)}


def compute(data: ReportData) -> list[dict]:
    """Every machine's forecast, once per ReportData."""
    if getattr(data, "_forecast", None) is None:
        cfg = settings(data.build.get("resolved"))
        given = given_fabric(cfg.get("fabric_files"))
        data._forecast = [of_machine(m, data.machines, cfg, given) for m in data.machines]
    return data._forecast


def primary(f: dict, family: str = "torch") -> dict | None:
    """The series drawn for a machine: the book's protocol where measured (series_list's order)."""
    return next((s for s in f["series"] if s["family"] == family), None)


def grid_rows(forecasts: list[dict], primary_only: bool = False) -> list[dict]:
    """One row per (machine, series, k); primary_only: each machine's drawn DDP and JAX series."""
    out = []
    for f in forecasts:
        chosen = [s for s in (primary(f, fam) for fam in registry.FAMILIES) if s] if primary_only else f["series"]
        for s in chosen:
            out += [{"machine": f["machine"], "series": s["series"], "fabric_from": f["fabric_from"] or "",
                     **{k: v for k, v in r.items() if k != "inputs"}, "inputs": "; ".join(r.get("inputs", []))}
                    for r in s["rows"]]
    return out


def validation_rows(forecasts: list[dict]) -> list[dict]:
    """Every validation row of every machine, flat: lists joined, the inputs' objects dropped."""
    return [{k: ("; ".join(v) if isinstance(v, list) else v) for k, v in r.items() if k != "used"}
            for f in forecasts for r in f["validation"]]


def summary_rows(forecasts: list[dict]) -> list[dict]:
    """Per machine: the validation's rows, mean and max |error| of the model and of the
    naive predictors, and the band's coverage."""
    out = []
    for f in forecasts:
        s = f["summary"]
        if not s["model"]["n"]:
            continue
        out.append({"machine": f["machine"], "rows": s["model"]["n"], "mean_abs_error_points": s["model"]["mean_abs"],
                    "max_abs_error_points": s["model"]["max_abs"], "coverage": s["coverage"], "banded": s["banded"],
                    "naive_constant_mean_abs": s["naive_constant"]["mean_abs"],
                    "naive_ring_mean_abs": s["naive_ring"]["mean_abs"],
                    "measured_halfwidth_max_points": s.get("measured_halfwidth_max_points"),
                    "predicted_in_measured": s.get("predicted_in_measured"),
                    "with_measured_interval": s.get("with_measured_interval")})
    return out


def record(forecasts: list[dict]) -> dict:
    """The forecast JSON: settings, every machine's series (grid, band, knee), validation and summary."""
    return {"written_utc": utc_now(), "settings": forecasts[0]["config"] if forecasts else None,
            "machines": [{**{k: v for k, v in f.items() if k not in ("validation", "config")},
                          "validation": validation_rows([f])} for f in forecasts]}


def write(path, forecasts: list[dict]) -> None:
    write_json_atomic(path, record(forecasts))


# ---------------------------------------------------------------- `dpscale forecast`

def _pc(x) -> str:
    return "    –" if x is None else f"{100 * x:5.1f}"


def _band(r: dict, key: str) -> str:
    lo, hi = r.get(f"{key}_lo"), r.get(f"{key}_hi")
    return f"{_pc(r.get(key))}% [{_pc(lo)}, {_pc(hi)}]" if lo is not None else f"{_pc(r.get(key))}%{'':16}"


def _ms(x) -> str:
    return "      –" if x is None else f"{x:7.2f}"


def knee_text(s: dict, scaling: str) -> str:
    """'k=4', 'past k=128' (never below the threshold), '– (no k=1 point)' where the
    series has no throughput at k=1 to predict from (e.g. strong scaling at ks=[1])."""
    if not any(r.get(f"{scaling}_efficiency") is not None and r["k"] > 1 for r in s["rows"]):
        return "– (no k=1 point)"
    return f"k={s[f'{scaling}_knee_k']}" if s[f"{scaling}_knee_k"] else f"past k={s['rows'][-1]['k']}"


def series_text(s: dict) -> list[str]:
    out = [f"  {s['series']}: knee (< {100 * s['knee_threshold']:.0f}%) weak {knee_text(s, 'weak')}, "
           f"strong {knee_text(s, 'strong')}; payloads: {s['buckets_how']}",
           f"    {'k':>4} {'nodes':>5} {'point':<9} {'weak efficiency [band]':<24} {'measured':>8} {'ms/step':>7}  "
           f"{'strong efficiency [band]':<24} {'measured':>8} {'ms/step':>7}"]
    for r in s["rows"]:
        out.append(f"    {r['k']:>4} {r['nodes']:>5} {r['point']:<9} {_band(r, 'weak_efficiency'):<24} "
                   f"{_pc(r.get('weak_measured')):>7}% {_ms(r.get('weak_step_ms'))}  "
                   f"{_band(r, 'strong_efficiency'):<24} {_pc(r.get('strong_measured')):>7}% "
                   f"{_ms(r.get('strong_step_ms'))}" + (f"  ({r['why_none']})" if r.get("why_none") else ""))
    return out


def validation_text(f: dict) -> list[str]:
    if not f["validation"]:
        return ["  validation: no measured k >= 2 with a fabric to predict it from"]
    s = f["summary"]
    cov = f"{100 * s['coverage']:.0f}% of {s['banded']}" if s["coverage"] is not None else "no band"
    reach = (f"; the measurement's own {100 * f['config']['band_level']:.0f}% interval: at most "
             f"+-{s['measured_halfwidth_max_points']:.1f} points, {s['predicted_in_measured']} of "
             f"{s['with_measured_interval']} predictions inside it" if s.get("with_measured_interval") else "")
    out = [f"  validation, every row: mean |error| {s['model']['mean_abs']:.1f} points, max {s['model']['max_abs']:.1f}; "
           f"band coverage {cov}; naive: constant {_pts(s['naive_constant']['mean_abs'])}, "
           f"ring-scaled overhead {_pts(s['naive_ring']['mean_abs'])}{reach}"]
    for r in f["validation"]:
        band = f" [{_pc(r['predicted_lo'])}, {_pc(r['predicted_hi'])}]" if r["predicted_lo"] is not None else ""
        mband = f" [{_pc(r['measured_lo'])}, {_pc(r['measured_hi'])}]" if r.get("measured_lo") is not None else ""
        out.append(f"    {r['series']} {r['scaling']:<6} k={r['k']:<3} {r['method']:<44} predicted "
                   f"{_pc(r['predicted'])}%{band}, measured {_pc(r['measured'])}%{mband}, error {r['error_points']:+.1f}; "
                   f"overhead {r['predicted_overhead_ms']:.2f} vs {r['measured_overhead_ms']:.2f} ms; naive "
                   f"{_pc(r['naive_constant'])}% / {_pc(r['naive_ring'])}%")
        out.append(f"      from: {', '.join(r['inputs'])}")
    return out


def _pts(x) -> str:
    return "–" if x is None else f"{x:.1f} points"


def text(forecasts: list[dict]) -> str:
    """The forecast and its validation, as `dpscale forecast` prints them."""
    cfg = forecasts[0]["config"] if forecasts else {}
    lines = [f"Forecast (band: where a measurement should fall, {100 * cfg.get('band_level', 0):.0f}%, "
             f"{cfg.get('bootstrap_draws')} bootstrap draws; nodes of {cfg.get('gpus_per_node')})"]
    for f in forecasts:
        head = f"\n== {f['machine']}" + (f"  (fabric borrowed from {f['fabric_from']})" if f["fabric_from"] else "")
        lines.append(head + (f"\n  fabric files: {f['fabric_files']}" if f["fabric_files"] else ""))
        for s in f["series"]:
            lines += series_text(s)
        lines += validation_text(f)
    return "\n".join(lines)


# ---------------------------------------------------------------- `dpscale forecast`: time to accuracy

def _tta_row(r: dict, t: dict | None, n: int) -> str:
    iv = (lambda lo, hi, f: f"[{f(lo)}, {f(hi)}]" if lo is not None and hi is not None else "")
    f1, f2 = (lambda x: f"{x:.1f}"), (lambda x: f"{x:.2f}")
    time = f"{r['time_s']:7.1f} {iv(r['time_s_lo'], r['time_s_hi'], f1):<14}" if r["time_s"] is not None else \
        f"{'–':>7} {'':<14}"
    sp = f"{r['speedup']:5.2f}x {iv(r['speedup_lo'], r['speedup_hi'], f2):<13}" if r["speedup"] is not None else \
        f"{'–':>6} {'':<13}"
    tr = f"{t['speedup']:5.2f}x" if t and t.get("speedup") is not None else f"{'–':>6}"
    sps = f"{r['samples_per_s']:9,.0f}" if r["samples_per_s"] is not None else f"{'–':>9}"
    return (f"    {r['k']:>4} {r['global_batch']:>6} {r['samples'] / n:6.2f} {iv(r['samples_lo'] / n, r['samples_hi'] / n, f2):<14}"
            f" {r['samples_input']:<9} {sps} {r['samples_per_s_input']:<30} {time} {sp} {tr}"
            + (f"  p_fastest {r['p_fastest']:.2f}" if r.get("p_fastest") else ""))


def tta_text(machines: list, forecasts: list[dict]) -> str:
    """The time-to-accuracy forecast beside the throughput one (dpscale.report.tta): per
    machine with a ddp_tta result, predicted epochs to target, samples/s, time to accuracy
    and its speed-up over k=1 (evaluation on the clock, and training only), with bands."""
    from dpscale.report import tta
    by = {f["machine"]: f for f in forecasts}
    lines = ["\nTime to accuracy (samples to target from the E(B) fit over seeds / samples/s; bands joint, 95% "
             "over seeds and the throughput's band as given)"]
    for m in (m for m in machines if m.kind != "book"):
        rec = tta.of_machine(m, by.get(m.name))
        for rule in rec["rules"].values():
            f, n = rule["forecast"], rule["train_images"] or 1
            lines.append(f"\n== {m.name}, {rule['rule']} LR, target {rule['target']:.0%}")
            if not f:
                lines.append(f"  no forecast: {rule['fit_note'] or 'no samples/s at any k'}")
                continue
            fit, ms = rule["fit"], rule["models"]
            lines.append(f"  E(B) fit: E_min {fit['E_min']['value'] / n:.2f} epochs, B_crit {fit['B_crit']['value']:.0f} "
                         f"samples; soonest k={f['clock']['fastest_k']}, fewest GPU-hours k={f['clock']['cheapest_k']} "
                         f"(evaluation on the clock)")
            lines.append("  models: " + ", ".join(f"{name} {w:.0%}" for name, w in f["clock"]["models"].items())
                         + f" ({ms['method']})")
            lines.append(f"    {'k':>4} {'batch':>6} {'epochs [95%]':<21} {'samples':<9} {'samples/s':>9} "
                         f"{'from':<30} {'time s [band]':<22} {'speed-up [band]':<20} {'training only'}")
            lines += [_tta_row(r, tta.forecast_row(rule, r["k"], "train"), n) for r in f["clock"]["rows"]]
            lines += [f"  out of sample ({h['check']}): k={h['k']} from k = {', '.join(map(str, h['from_ks']))}: "
                      f"predicted {h['predicted_epochs']:.2f} epochs (line {h['line_epochs']:.2f}, power law "
                      f"{h['power_epochs']:.2f}), measured " + (f"{h['measured_epochs']:.2f}, inside the band: "
                      f"{h['inside_band']}" if h.get("measured_epochs") is not None else
                      f"none ({h.get('censored_n')} seed(s) not at the target)") for h in rule["holdout"]
                      if h.get("predicted_epochs") is not None]
    return "\n".join(lines)
