"""The forecast of every machine in a report (dpscale.analysis.forecast_data), computed
once per report: the chapter, its figures, the forecast JSON and `dpscale forecast`
read the same records.

A machine with no all-reduce measured (one GPU) borrows the fabric, probe and
all-reduce census of another machine in the report with the same GPU model, and
says so (`fabric_from`); with none, it has compute only, and no prediction past k=1.
"""
from __future__ import annotations

from dpscale.plan import config as dsconfig
from dpscale.report.machines import Machine, ReportData
from dpscale.results import utc_now, write_json_atomic

COMM = ("allreduce", "ddp_comm_probe", "jax_hlo")
PRIMARY = ("seed", "host", "cached", "device", "tuned")   # the book's protocol first


def settings(resolved: dict | None = None, **over) -> dict:
    """The schema's `forecast` defaults, the resolved configuration's values over them."""
    from dpscale.analysis import forecast_data as fd   # numpy, scipy: not when the workflow is parsed
    props = dsconfig.schema()["properties"]["forecast"]["properties"]
    given = {**((resolved or {}).get("forecast") or {}), **{k: v for k, v in over.items() if v is not None}}
    return fd.config({**{k: v["default"] for k, v in props.items()}, **given})


def has_fabric(m: Machine) -> bool:
    return any(e == "allreduce" and r.get("status") == "ok" for (e, _v, _k), r in m.results.items())


def donor(m: Machine, machines: list[Machine]) -> Machine | None:
    if has_fabric(m) or m.kind == "book":
        return None
    gpu = m.fingerprint.get("gpu_model")
    return next((x for x in machines if x is not m and x.kind != "book" and has_fabric(x) and gpu
                 and x.fingerprint.get("gpu_model") == gpu), None)


def of_machine(m: Machine, machines: list[Machine], cfg: dict) -> dict:
    from dpscale.analysis import forecast_data as fd
    d = donor(m, machines)
    results = dict(m.results)
    if d:
        results.update({key: r for key, r in d.results.items() if key[0] in COMM})
    hint = ((m.book or {}).get("model") or {}).get("params")
    return {"machine": m.name, "label": m.label if m.kind != "book" else "book", "kind": m.kind,
            "fabric_from": d.name if d else None, **fd.machine_forecast(results, cfg, hint)}


def compute(data: ReportData) -> list[dict]:
    """Every machine's forecast, once per ReportData."""
    if getattr(data, "_forecast", None) is None:
        cfg = settings(data.build.get("resolved"))
        data._forecast = [of_machine(m, data.machines, cfg) for m in data.machines]
    return data._forecast


def primary(f: dict, framework: str = "ddp") -> dict | None:
    """The series drawn for a machine: the book's protocol where measured."""
    ser = {s["variant"]: s for s in f["series"] if s["framework"] == framework}
    return next((ser[v] for v in PRIMARY if v in ser), next(iter(ser.values()), None))


def grid_rows(forecasts: list[dict], primary_only: bool = False) -> list[dict]:
    """One row per (machine, series, k); primary_only: each machine's drawn DDP and JAX series."""
    out = []
    for f in forecasts:
        chosen = [s for s in (primary(f, "ddp"), primary(f, "jax")) if s] if primary_only else f["series"]
        for s in chosen:
            for r in s["rows"]:
                out.append({"machine": f["machine"], "framework": s["framework"], "variant": s["variant"],
                            "fabric_from": f["fabric_from"] or "", **r})
    return out


def validation_rows(forecasts: list[dict]) -> list[dict]:
    return [{"machine": f["machine"], **{k: v for k, v in r.items() if k not in ("how", "band_fixed")},
             "band_fixed": ", ".join(r["band_fixed"]) or "nothing", "how": "; ".join(r["how"])}
            for f in forecasts for r in f["validation"]]


def model_rows(forecasts: list[dict]) -> list[dict]:
    keep = ("framework", "variant", "alpha_us", "beta_busbw_GBps", "exposed_fraction", "sigma_ms", "compute_a_ms",
            "compute_b_ms_per_sample", "weak_knee_k", "strong_knee_k")
    return [{"machine": f["machine"], **{k: s.get(k) for k in keep}, "fabric_from": f["fabric_from"] or "",
             "how": "; ".join(s["how"])} for f in forecasts for s in f["series"]]


def record(forecasts: list[dict]) -> dict:
    """The forecast JSON: settings, every machine's series (grid, band, knee) and validation."""
    return {"written_utc": utc_now(), "settings": forecasts[0]["config"] if forecasts else None,
            "machines": [{k: v for k, v in f.items() if k != "config"} for f in forecasts]}


def write(path, forecasts: list[dict]) -> None:
    write_json_atomic(path, record(forecasts))


# ---------------------------------------------------------------- `dpscale forecast`

def _pc(x) -> str:
    return "    –" if x is None else f"{100 * x:5.1f}"


def _band(r: dict, key: str) -> str:
    lo, hi = r.get(f"{key}_lo"), r.get(f"{key}_hi")
    return f"{_pc(r.get(key))}% [{_pc(lo)}, {_pc(hi)}]" if lo is not None else f"{_pc(r.get(key))}%{'':16}"


def _meas(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def knee_text(s: dict, scaling: str) -> str:
    """'k=4', 'past k=128' (never below the threshold), '–' (no prediction past k=1)."""
    if not any(r.get(f"{scaling}_efficiency") is not None and r["k"] > 1 for r in s["rows"]):
        return "–"
    return f"k={s[f'{scaling}_knee_k']}" if s[f"{scaling}_knee_k"] else f"past k={s['rows'][-1]['k']}"


def _ms(x) -> str:
    return "      –" if x is None else f"{x:7.2f}"


def series_text(s: dict) -> list[str]:
    beta = f"{s['beta_busbw_GBps']:.1f} GB/s busbw, alpha {s['alpha_us']:.1f} us" if s["beta_busbw_GBps"] else "none"
    out = [f"  {s['framework']} [{s['variant']}]: fabric {beta}; exposed fraction {s['exposed_fraction']:.2f}; "
           f"straggler sigma {s['sigma_ms']:.2f} ms; knee (< {100 * s['knee_threshold']:.0f}%) weak "
           f"{knee_text(s, 'weak')}, strong {knee_text(s, 'strong')}",
           f"    ({'; '.join(s['how'])})",
           f"    {'k':>4} {'nodes':>5} {'point':<9} {'weak efficiency [band]':<24} {'measured':>8} {'ms/step':>7}  "
           f"{'strong efficiency [band]':<24} {'measured':>8} {'ms/step':>7}"]
    for r in s["rows"]:
        out.append(f"    {r['k']:>4} {r['nodes']:>5} {r['point']:<9} {_band(r, 'weak_efficiency'):<24} "
                   f"{_meas(r.get('weak_measured')):>8} {_ms(r.get('weak_step_ms'))}  "
                   f"{_band(r, 'strong_efficiency'):<24} {_meas(r.get('strong_measured')):>8} "
                   f"{_ms(r.get('strong_step_ms'))}")
    return out


def validation_text(f: dict) -> list[str]:
    out = ["  validation (predicted against measured):"] if f["validation"] else [
        "  validation: no measured k >= 2 with an all-reduce sweep"]
    for r in f["validation"]:
        band = f" [{_pc(r['predicted_lo'])}, {_pc(r['predicted_hi'])}]" if r["predicted_lo"] is not None else ""
        fixed = f" (band holds fixed: {', '.join(r['band_fixed'])})" if r["band_fixed"] else ""
        out.append(f"    {r['framework']} {r['scaling']:<6} [{r['variant']}] k={r['k']:<3} {r['method']:<26} "
                   f"predicted {_pc(r['predicted'])}%{band}, measured {_pc(r['measured'])}%, "
                   f"error {r['error_points']:+.1f} points{fixed}")
    return out


def text(forecasts: list[dict]) -> str:
    """The forecast and its validation, as `dpscale forecast` prints them."""
    cfg = forecasts[0]["config"] if forecasts else {}
    lines = [f"Forecast (band: {100 * cfg.get('band_level', 0):.0f}% bootstrap interval, "
             f"{cfg.get('bootstrap_draws')} draws; nodes of {cfg.get('gpus_per_node')} at "
             f"{cfg.get('internode_GBps')} GB/s and {cfg.get('internode_alpha_us')} us between nodes)"]
    for f in forecasts:
        lines.append(f"\n== {f['machine']}" + (f"  (fabric borrowed from {f['fabric_from']})" if f["fabric_from"]
                                               else ""))
        for s in f["series"]:
            lines += series_text(s)
        lines += validation_text(f)
    return "\n".join(lines)
