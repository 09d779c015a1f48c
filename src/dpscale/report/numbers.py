"""The numbers the chapters show, computed once from a machine's results: pure
functions (no plotting, no HTML), shared by tables, headlines and figures.

A throughput point is the mean over independent launches (`samples_per_s_launches`)
or, without them, over the timed epochs (repeats) of one launch, with its 95%
interval and what that interval covers; else the single number it has. Speedups
and efficiencies are ratios, with intervals computed on the ratio (stats.ratio_ci).
The book's form ("2 GPU(s): 3706 samples/s, 1.76x, 88%") prints the first timed
epoch, as the book's protocol does (`samples_per_s`).
"""
from __future__ import annotations

import math
import statistics

from dpscale.analysis import costmodel, stats
from dpscale.report.machines import Machine

THROUGHPUT = ("ddp_weak", "ddp_strong", "jax_weak")
PROBE_COVERS = "paired trials within one launch"


def ok(r: dict | None) -> bool:
    return bool(r) and r.get("status") == "ok"


def metric(r: dict | None, *names: str, default=None):
    """The first metric present under any of `names` (results of older code name some differently)."""
    m = (r or {}).get("metrics") or {}
    for n in names:
        if m.get(n) is not None:
            return m[n]
    return default


def fmt_num(x, digits: int = 3) -> str:
    """Short human form: 3,706, 41.2, 0.734, 1.5e-04; '–' for nothing."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if not isinstance(x, (int, float)):
        return str(x)
    a = abs(x)
    if a == 0:
        return "0"
    if a >= 100 or (float(x).is_integer() and a < 1e15):
        return f"{x:,.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 0.01:
        return f"{x:.{digits - 1}f}" if a < 1 else f"{x:.2f}"
    return f"{x:.1e}"


def pct(x) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def fmt_interval(lo, hi, scale: float = 1.0, unit: str = "") -> str:
    if lo is None or hi is None:
        return "–"
    return f"[{fmt_num(lo * scale)}, {fmt_num(hi * scale)}]{unit}"


# ---------------------------------------------------------------- throughput

def samples(r: dict | None, name: str = "samples_per_s") -> tuple[list[float], str]:
    """The samples a number's interval is computed over, and what they cover: one
    value per independent launch (`<name>_launches`, a launch's own repeats averaged)
    where the result has two or more, else the timed repeats within its one launch,
    else its single number (which covers nothing: no interval)."""
    if not ok(r):
        return [], ""
    launches = metric(r, f"{name}_launches") or []
    if len(launches) >= 2:
        return [statistics.fmean(x) if isinstance(x, (list, tuple)) else float(x) for x in launches], stats.ACROSS
    reps = metric(r, f"{name}_repeats") or []
    if reps:
        return [float(x) for x in reps], stats.WITHIN if len(reps) >= 2 else ""
    one = metric(r, name)
    return ([float(one)] if one is not None else []), ""


def spread(r: dict | None, name: str = "samples_per_s") -> dict | None:
    """stats.interval over the result's samples (None without at least two), with `covers`."""
    xs, covers = samples(r, name)
    return stats.interval(xs, covers=covers) if len(xs) >= 2 else None


def point(r: dict | None) -> tuple[float | None, float | None, float | None]:
    """(value, interval low, interval high) of one throughput result."""
    if not ok(r):
        return None, None, None
    sp = spread(r)
    if sp:
        return sp["mean"], sp["ci_lo"], sp["ci_hi"]
    return metric(r, "samples_per_s"), None, None


def ratio(num: dict | None, den: dict | None, name: str = "samples_per_s", scale: float = 1.0,
          paired: bool = False) -> dict:
    """stats.ratio_ci of two results' samples, independent (different launches) unless
    `paired` (sample i of each from the same launch); `covers` names both sides when they differ."""
    (a, ca), (b, cb) = samples(num, name), samples(den, name)
    both = ca if ca == cb else f"{ca or 'one number'} over {cb or 'one number'}"
    return stats.ratio_ci(a, b, paired=paired, scale=scale, covers=both)
def gpu_flags(r: dict | None) -> list[str]:
    """What the GPU's state flagged during the timing ("shared", "throttled: <reason>";
    dpscale.measure.gpustate); [] on a CPU, without NVML, or when nothing was flagged."""
    return list(((r or {}).get("gpu_state") or {}).get("flags") or []) if ok(r) else []


def host_flags(r: dict | None) -> list[str]:
    """What the host flagged: more ranks than CPU cores (dpscale.run.watchdog.oversubscribed)."""
    o = (r or {}).get("oversubscribed") if ok(r) else None
    return [f"{o['ranks']} ranks on {o['cores']} CPU cores"] if o else []


def slow_ranks(r: dict | None, threshold: float = 0.05) -> list[int]:
    rows = metric(r, "per_rank", default=[]) or []
    secs = [x.get("seconds_repeats") or ([x["seconds"]] if x.get("seconds") else []) for x in rows]
    return stats.stragglers(secs, threshold) if len(secs) > 1 and all(secs) else []


def scaling(m: Machine, experiment: str, variant: str) -> list[dict]:
    """Per k: the book's figure, the mean with its interval, speedup and efficiency
    against the same series' k=1, each interval computed on the ratio (stats.ratio_ci).
    Computed once per machine and series (~300 reads a report): read, do not change."""
    return m.memo(("scaling", experiment, variant), lambda: _scaling(m, experiment, variant))


def _scaling(m: Machine, experiment: str, variant: str) -> list[dict]:
    ser = m.series(experiment, variant)
    book1 = metric(ser.get(1), "samples_per_s") if ok(ser.get(1)) else None
    rows = []
    for k, r in ser.items():
        v, lo, hi = point(r)
        sp = spread(r) or {}
        row = {"machine": m.name, "experiment": experiment, "variant": variant, "k": k,
               "status": r["status"], "reason": r.get("reason") or "",
               "samples_per_s": metric(r, "samples_per_s") if ok(r) else None,
               "mean": v, "ci_lo": lo, "ci_hi": hi, "repeats": sp.get("n"), "cv": sp.get("cv"),
               "covers": sp.get("covers") or "", "min": sp.get("min"), "max": sp.get("max"),
               "per_rank_batch": metric(r, "per_rank_batch"), "global_batch": metric(r, "global_batch"),
               "step_ms_median": metric(r, "step_ms_median"), "peak_mem_MiB": metric(r, "peak_mem_MiB"),
               "mfu": metric(r, "mfu"), "slow_ranks": slow_ranks(r), "backend": r.get("backend"),
               "gpu_flags": gpu_flags(r), "host_flags": host_flags(r)}
        row.update(_relative(r, row, k, ser.get(1), book1))
        rows.append(row)
    return rows


def _relative(r: dict, row: dict, k: int, base: dict | None, book1: float | None) -> dict:
    out = {key: None for key in ("speedup", "speedup_lo", "speedup_hi", "efficiency", "efficiency_lo",
                                 "efficiency_hi", "book_speedup")}
    out.update(ratio_covers="", ratio_method="")
    if row["mean"] is None or point(base)[0] is None:
        return out
    if k == 1:   # the baseline against itself: 1 by definition, no interval
        out.update(speedup=1.0, efficiency=1.0, ratio_method="the baseline itself")
    else:
        s = ratio(r, base)
        out.update(speedup=s["value"], speedup_lo=s["ci_lo"], speedup_hi=s["ci_hi"], efficiency=s["value"] / k,
                   efficiency_lo=s["ci_lo"] / k if s["ci_lo"] is not None else None,
                   efficiency_hi=s["ci_hi"] / k if s["ci_hi"] is not None else None,
                   ratio_covers=s["covers"], ratio_method=s["method"])
    if book1 and row["samples_per_s"]:
        out["book_speedup"] = row["samples_per_s"] / book1
    return out


def book_form_scaling(m: Machine, row: dict, strong: bool) -> str:
    """'2 GPU(s): 3706 samples/s, 1.76x, 88% weak-scaling efficiency' (the book's print)."""
    k = row["k"]
    if row["status"] != "ok":
        return f"{k} {m.unit}: {row['status']}"
    s = row["samples_per_s"]
    head = f"{k} {m.unit}: {s:.0f} samples/s" if s >= 100 else f"{k} {m.unit}: {s:.1f} samples/s"
    if row["book_speedup"] is None:
        return head + " (no k=1 baseline)"
    kind = "strong" if strong else "weak"
    return f"{head}, {row['book_speedup']:.2f}x, {100 * row['book_speedup'] / k:.0f}% {kind}-scaling efficiency"


def common_k(series: dict[str, dict[int, float]]) -> int | None:
    """The k at which to compare machines like with like: the largest k > 1 that
    every machine with a multi-device number has, else the k > 1 most of them have."""
    sets = [{k for k, v in ks.items() if k > 1 and v is not None} for ks in series.values()]
    sets = [s for s in sets if s]
    if not sets:
        return None
    shared = set.intersection(*sets)
    if shared:
        return max(shared)
    counts = {k: sum(k in s for s in sets) for s in sets for k in s}
    return max(counts, key=lambda k: (counts[k], -k))


# ---------------------------------------------------------------- communication

def probe_row(m: Machine, k: int, r: dict) -> dict:
    diffs = metric(r, "comm_ms_pairs")
    mi = stats.median_interval(diffs) if ok(r) and diffs else {}
    row = {"machine": m.name, "k": k, "status": r["status"], "reason": r.get("reason") or "",
           "synced_ms": metric(r, "synced_ms"), "no_sync_ms": metric(r, "no_sync_ms"),
           "comm_ms": mi.get("median", metric(r, "comm_ms")), "comm_lo": mi.get("ci_lo"),
           "comm_hi": mi.get("ci_hi"), "pairs": mi.get("n"),
           "covers": PROBE_COVERS if mi.get("ci_lo") is not None else "",
           "pred_flat_ms": metric(r, "pred_flat_ms"), "pred_ring_ms": metric(r, "pred_ring_ms"),
           "pred_book_ms": metric(r, "pred_book_ms"),
           "grad_MB": (metric(r, "grad_bytes") or 0) / 1e6 or None,
           "n_buckets": len(metric(r, "bucket_bytes") or []) or None}
    row["vs_zero"] = stats.excludes(row["comm_lo"], row["comm_hi"], 0.0)
    for key in ("pred_flat_ms", "pred_ring_ms", "pred_book_ms"):
        row[f"vs_{key}"] = stats.excludes(row["comm_lo"], row["comm_hi"], row[key]) if row[key] else None
    return row


def probe_rows(m: Machine) -> list[dict]:
    return [probe_row(m, k, r) for k, r in m.series("ddp_comm_probe", "default").items()]


def distinguishable(row: dict) -> str:
    """What the probe's interval says, in words."""
    if row["comm_lo"] is None:
        return "no interval (one trial per arm)"
    parts = ["distinguishable from 0" if row["vs_zero"] else "not distinguishable from 0"]
    for key, name in (("pred_flat_ms", "flat"), ("pred_ring_ms", "ring"), ("pred_book_ms", "book beta")):
        if row[f"vs_{key}"] is not None:
            parts.append(f"{'differs from' if row[f'vs_{key}'] else 'consistent with'} {name} "
                         f"{fmt_num(row[key])} ms")
    return "; ".join(parts)


def allreduce_table(r: dict | None) -> dict[str, list[dict]]:
    """{placement: rows} with bytes, time_us, algbw, busbw and #wrong per row."""
    return costmodel.allreduce_rows((r or {}).get("metrics") or {})


def allreduce_at(r: dict | None, mib: float = 64, placement: str = "in_place") -> dict | None:
    """The row at `mib` MiB, else at the largest payload measured."""
    rows = allreduce_table(r).get(placement) or []
    if not rows:
        return None
    size = mib * 2**20
    exact = [p for p in rows if p["bytes"] == size]
    return exact[0] if exact else max(rows, key=lambda p: p["bytes"])


def avg_busbw(r: dict | None) -> float | None:
    """nccl-tests' 'Avg bus bandwidth': the mean busbw over every row of both placements."""
    vals = [row["busbw_GBps"] for rows in allreduce_table(r).values() for row in rows]
    return metric(r, "avg_busbw_GBps", default=sum(vals) / len(vals) if vals else None)


# ---------------------------------------------------------------- the rest

def hlo_summary(r: dict) -> dict:
    sizes = [s for s in metric(r, "allreduce_elements", default=[]) or [] if isinstance(s, (int, float))]
    n = metric(r, "n_allreduce", default=len(sizes) or None)
    two = metric(r, "largest_two_elements") or sorted(sizes, reverse=True)[:2] or None
    largest = metric(r, "largest_floats") or (max(sizes) if sizes else None)
    return {"n_allreduce": n, "largest_floats": largest, "largest_two": two, "sizes": sizes,
            "total_floats": metric(r, "total_elements", default=sum(sizes) if sizes else None),
            "total_bytes": metric(r, "total_bytes")}


def equality_summary(r: dict) -> dict:
    broken = metric(r, "broken", default={})
    broken = broken if isinstance(broken, dict) else {}
    return {"max_abs_diff": metric(r, "max_abs_diff"), "max_abs_update": metric(r, "max_abs_update"),
            "rel_diff": metric(r, "rel_diff"), "threshold": metric(r, "threshold"),
            "passed": metric(r, "passed"), "broken_rel_diff": broken.get("rel_diff"),
            "broken_flagged": metric(r, "broken_flagged")}

