"""The report's first screen: will k GPUs train sooner? One figure (speed-up over k=1
against k, out to the throughput forecast's nodes: samples/s measured and forecast, and
time to accuracy measured, emulated and predicted, with intervals and bands, each
machine beside the book) and a few lines that name the k that reaches the target
soonest and the k that spends the fewest GPU-hours. The same numbers end the run
(dpscale.report.summary). The provenance's one-line summary sits above (the header);
its tables and notes are a chapter of their own further down."""
from __future__ import annotations

from dpscale.report import forecast as fcr, tta
from dpscale.report.document import Chapter, FigureSpec, Page
from dpscale.report.machines import Machine, ReportData
from dpscale.report.numbers import scaling
from dpscale.report.chapters.common import figure, prose, records_table
from dpscale.report.chapters.tta import numbers, of, point_text

FIGURES = (FigureSpec("answer", "Speed-up over one device against k, out to the forecast's nodes: samples/s "
                                "(weak scaling) and time to accuracy, measured, emulated and predicted"),)


def weak_variant(m: Machine) -> str | None:
    """The weak-scaling series the answer uses: the device-resident one, else the first."""
    variants = m.variants("ddp_weak")
    return next((v for v in [x for x in ("cached",) if x in variants] + variants
                 if any(r.get("status") == "ok" for r in m.series("ddp_weak", v).values())), None)


def throughput(data: ReportData, m: Machine) -> dict[int, dict]:
    """samples/s(k) / samples/s(1) per k: measured (95% interval, stats.ratio_ci), else
    k x the forecast's weak efficiency (its band)."""
    v = weak_variant(m)
    out = {}
    f = next((f for f in fcr.compute(data) if f["machine"] == m.name), None)
    s = next((s for s in (f or {}).get("series", []) if s["family"] == "torch" and s["variant"] == v), None)
    level = ((f or {}).get("config") or {}).get("band_level", 0.9)
    for r in (s or {}).get("rows", []):
        if r.get("weak_efficiency") is not None and r["point"] != "measured":
            k = r["k"]
            lo, hi = r.get("weak_efficiency_lo"), r.get("weak_efficiency_hi")
            out[k] = {"value": k * r["weak_efficiency"], "lo": k * lo if lo else None, "hi": k * hi if hi else None,
                      "source": "forecast", "covers": f"its {level:.0%} band", "nodes": r["nodes"]}
    for r in (scaling(m, "ddp_weak", v) if v else []):
        if r["speedup"] is not None:
            out[r["k"]] = {"value": r["speedup"], "lo": r["speedup_lo"], "hi": r["speedup_hi"], "source": "measured",
                           "covers": r["ratio_covers"], "nodes": 1}
    return dict(sorted(out.items()))


def speedups(data: ReportData, m: Machine) -> list[dict]:
    """Per k: the samples/s speed-up, and at the primary LR rule the time-to-accuracy
    point (measured or emulated) and the forecast's row (both forms)."""
    thr = throughput(data, m)
    rec = of(data, m)
    rule = tta.primary(rec) if rec else None
    pts = {p["k"]: p for p in (rule or {}).get("points", [])}
    ks = sorted(set(thr) | set(pts) | {r["k"] for r in ((rule or {}).get("forecast") or {}).get("clock", {})
                                        .get("rows", [])})
    return [{"k": k, "throughput": thr.get(k), "point": pts.get(k), "predicted": tta.forecast_row(rule, k),
             "predicted_train": tta.forecast_row(rule, k, "train")} for k in ks]


def x_text(d: dict | None) -> str:
    if not d or d.get("value") is None:
        return "–"
    band = f" [{d['lo']:.2f}, {d['hi']:.2f}]" if d.get("lo") is not None and d.get("hi") is not None else ""
    return f"{d['value']:.2f}x{band}"


def k_text(r: dict) -> str:
    """One k of a machine's line: samples/s, then time to accuracy against k=1."""
    p, t = r["point"], r["throughput"]
    head = f"k={r['k']}" + (f" ({p['run']})" if p else "")
    src = f"{t['source']}, {t['covers']}" if t and t["source"] == "forecast" else (t or {}).get("source")
    parts = [f"samples/s {x_text(t)} ({src})" if t else "samples/s not measured here"]
    if p:
        parts.append(point_text(p))
    return f"{head}: " + ", ".join(parts)


def predicted_text(data: ReportData, m: Machine) -> str | None:
    """The forecast's answer: the k that reaches the target soonest and the k that spends
    the fewest GPU-hours (evaluation on the clock), and where 4 nodes of 8 stand."""
    rec = of(data, m)
    rule = tta.primary(rec) if rec else None
    f = (rule or {}).get("forecast")
    if not f or f["clock"]["fastest_k"] is None:
        return None
    c = f["clock"]
    fast, cheap = (tta.forecast_row(rule, c[key]) for key in ("fastest_k", "cheapest_k"))
    at = {r["k"]: r for r in c["rows"] if r["speedup"] is not None}
    far = at.get(32) or at[max(at)]   # 4 nodes of 8, else the farthest k
    nodes = (rule["rates"].get(far["k"]) or {}).get("nodes", 1)
    beyond = max(rule["measured_batches"], default=0)
    where = f"{nodes} nodes of {far['k'] // nodes}" if nodes > 1 else f"k={far['k']}"
    return (f"predicted (E(B) fit / samples/s, {tta.CLOCK}): soonest at k={fast['k']}, "
            f"{x_text(_band(fast, 'speedup'))} ({fast['time_s']:.1f} s; soonest in {fast['p_fastest']:.0%} of the "
            f"draws); fewest GPU-hours at k={cheap['k']}; {where}: {x_text(_band(far, 'speedup'))}"
            + (f" (batches above {beyond:,} extrapolated)" if beyond else ""))


def _band(r: dict, key: str) -> dict:
    return {"value": r[key], "lo": r[f"{key}_lo"], "hi": r[f"{key}_hi"]}


def caveat(m: Machine) -> str:
    out = "; smoke scale: checks the pipeline, not the book's experiment" if m.scale == "smoke" else ""
    sources = m.data_sources()
    return out + ("; SYNTHETIC data" if sources == ["synthetic"] else
                  "; some results on SYNTHETIC data (see the provenance)" if "synthetic" in sources else "")


def short(data: ReportData, m: Machine) -> str | None:
    """The answer for a machine with a time to accuracy, in one sentence, then the forecast's."""
    rec = of(data, m)
    rule = tta.primary(rec) if rec else None
    rows = [r for r in speedups(data, m) if r["k"] > 1 and r["point"]]
    if not rule or not rows:
        return None
    ok_ = [r for r in rows if r["point"].get("speedup") is not None]
    emu = (lambda r: " (emulated)" if r["point"]["emulated"] else "")
    parts = [f"{m.label}: to {rule['target']:.0%} test accuracy ({rule['rule']} LR), "
             + (" and ".join(f"k={r['k']}{emu(r)} is {x_text(_band(r['point'], 'speedup'))}" for r in ok_)
                + f" as fast as k=1 (time to accuracy, {tta.CLOCK}; {tta.TRAIN} "
                + " and ".join(f"{r['point']['speedup_train']:.2f}x" for r in ok_) + ") while samples/s grow "
                + " and ".join(x_text(r["throughput"]).split(" [")[0] for r in ok_) if ok_ else
                "time to accuracy: samples/s not measured at its k")]
    parts += [f"k={r['k']}{emu(r)}: {r['point']['target']:.0%} not reached" + (
        f" within {r['point']['max_epochs']:g} epochs" if r["point"]["max_epochs"] else "")
              for r in rows if not r["point"]["scored"]]
    pred = predicted_text(data, m)
    return "; ".join(parts + ([pred] if pred else [])) + caveat(m)


def line(data: ReportData, m: Machine) -> str | None:
    """A machine without a time to accuracy: its samples/s against k=1, in one line."""
    rows = [r for r in speedups(data, m) if r["k"] > 1 and (r["throughput"] or {}).get("source") == "measured"]
    if not rows:
        return None
    return f"{'the book' if m.kind == 'book' else m.label}: " + "; ".join(k_text(r) for r in rows) + caveat(m)


def lines(data: ReportData) -> list[str]:
    """The first screen's words: each machine with a time to accuracy (its answer and its
    forecast's), then the others' samples/s."""
    mine = [m for m, _r in numbers(data)]
    out = [t for m in mine if (t := short(data, m))]
    out += [t for m in data.machines if all(m is not x for x in mine) and (t := line(data, m))]
    return out or ["No scaling result yet."]


COLUMNS = ["machine", "k", "run", "samples_per_s_from", "throughput_x", "throughput_ci", "tta_x", "tta_ci",
           "tta_train_x", "tta_train_ci", "stat_eff", "stat_eff_ci", "note"]


def _cells(t: dict, p: dict | None) -> dict:
    """A row's numbers: samples/s, time to accuracy (both forms) and statistical efficiency."""
    from dpscale.report.chapters.tta import iv, pc, times
    g = (lambda key: (p or {}).get(key))
    two = (lambda lo, hi: iv(lo, hi, lambda x: f"{x:.2f}"))
    return {"samples_per_s_from": t.get("source", "not measured"), "throughput_x": times(t.get("value")),
            "throughput_ci": two(t.get("lo"), t.get("hi")), "tta_x": times(g("speedup")),
            "tta_ci": two(g("speedup_lo"), g("speedup_hi")), "tta_train_x": times(g("speedup_train")),
            "tta_train_ci": two(g("speedup_train_lo"), g("speedup_train_hi")),
            "stat_eff": pc(g("statistical_efficiency")),
            "stat_eff_ci": iv(g("statistical_efficiency_lo"), g("statistical_efficiency_hi"),
                              lambda x: f"{100 * x:.1f}%")}


def table_rows(data: ReportData) -> list[dict]:
    """Per machine, each k that ran (or was emulated) against k=1, then the forecast at the
    soonest k, a full node and 4 nodes; time to accuracy in both forms, with intervals."""
    out = []
    mine = [m for m, _r in numbers(data)]
    for m in mine + [m for m in data.machines if all(m is not x for x in mine)]:
        who = "book" if m.kind == "book" else m.label
        for r in speedups(data, m):
            p, t = r["point"], r["throughput"] or {}
            if r["k"] < 2 or not (p or t.get("source") == "measured"):
                continue
            note = (f"no score: {len(p['not_converged'])} seeds short of {p['target']:.0%}"
                    + (f" in {p['max_epochs']:g} epochs" if p["max_epochs"] else "") if p and not p["scored"] else "")
            out.append({"machine": who, "k": r["k"], "run": (p or {}).get("run", "real"), **_cells(t, p),
                        "note": note})
        out += predicted_rows(data, m, who)
    return out


def predicted_rows(data: ReportData, m: Machine, who: str) -> list[dict]:
    """The forecast at the k that reaches the target soonest, at one node of 8 and at 4."""
    rec = of(data, m)
    rule = tta.primary(rec) if rec else None
    f = (rule or {}).get("forecast")
    if not f or f["clock"]["fastest_k"] is None:
        return []
    thr, out, fast = throughput(data, m), [], f["clock"]["fastest_k"]
    for k, why in ((fast, "predicted soonest"), (8, "one node of 8"), (32, "4 nodes of 8")):
        r, t = tta.forecast_row(rule, k), tta.forecast_row(rule, k, "train") or {}
        if not r or r["speedup"] is None or any(x["k"] == k and x["run"] == "predicted" for x in out):
            continue
        band = {"speedup": r["speedup"], "speedup_lo": r["speedup_lo"], "speedup_hi": r["speedup_hi"],
                "speedup_train": t.get("speedup"), "speedup_train_lo": t.get("speedup_lo"),
                "speedup_train_hi": t.get("speedup_hi")}
        out.append({"machine": who, "k": k, "run": "predicted", **_cells(thr.get(k) or {}, band),
                    "note": f"{why}; the soonest in {r['p_fastest']:.0%} of draws" + (
                        f"; fewest GPU-hours: k={f['clock']['cheapest_k']}" if k == fast else "")})
    return out


def page(data: ReportData) -> Page:
    ls = lines(data)
    return Page("answer", CHAPTER.title, prose("answer"), figures=[figure(FIGURES[0], ls[0], ls[1:])],
                tables=[records_table("answer", "The answer per machine and k, speed-up over k=1: throughput_x in "
                                      "samples/s; tta_x in time to accuracy, evaluation on the clock; tta_train_x, "
                                      "training only; stat_eff, statistical efficiency", table_rows(data), COLUMNS,
                                      note=TABLE_NOTE)])


TABLE_NOTE = ("Intervals (_ci): 95% over independent seeded launches for time to accuracy and statistical "
              "efficiency; samples/s its own 95% interval where measured, the throughput forecast's band where "
              "forecast. Predicted rows: the E(B) fit over samples/s(k), a joint band.")


CHAPTER = Chapter("answer", "Will k GPUs train sooner?", FIGURES, ("answer",), page)
