"""Forecast past the machine (exercise 6 and beyond): weak and strong efficiency and
time per step for k = 1..8 in a node and 2..16 nodes, with a band and a knee, each
point measured or predicted; and the model checked against every measured k."""
from __future__ import annotations

from dpscale.report import forecast as fcr
from dpscale.report.document import Cell, Chapter, FigureSpec, Page
from dpscale.report.machines import Machine, ReportData
from dpscale.report.numbers import pct
from dpscale.report.chapters.book_table import row
from dpscale.report.chapters.common import figure, prose, records_table

FIGURES = (FigureSpec("forecast_efficiency", "Forecast: weak- and strong-scaling efficiency to 16 nodes, with band "
                                             "and knee"),
           FigureSpec("forecast_step_time", "Forecast: time per step to 16 nodes, with band"))
TABLES = ("forecast", "forecast_validation", "forecast_model")
GRID = ["machine", "framework", "variant", "k", "nodes", "point", "weak_efficiency", "weak_efficiency_lo",
        "weak_efficiency_hi", "weak_measured", "weak_step_ms", "strong_efficiency", "strong_efficiency_lo",
        "strong_efficiency_hi", "strong_measured", "strong_step_ms", "compute_ms", "exposed_comm_ms",
        "allreduce_ring_ms", "allreduce_tree_ms", "straggler_ms", "fabric_from"]
VALIDATION = ["machine", "framework", "variant", "scaling", "k", "method", "predicted", "predicted_lo", "predicted_hi",
              "measured", "error_points", "compute_ms", "exposed_comm_ms", "straggler_ms", "exposed_fraction",
              "beta_busbw_GBps", "alpha_us", "band_fixed", "how"]
MODEL = ["machine", "framework", "variant", "alpha_us", "beta_busbw_GBps", "exposed_fraction", "sigma_ms",
         "compute_a_ms", "compute_b_ms_per_sample", "weak_knee_k", "strong_knee_k", "fabric_from", "how"]
PERCENT = ("weak_efficiency", "weak_efficiency_lo", "weak_efficiency_hi", "weak_measured", "strong_efficiency",
           "strong_efficiency_lo", "strong_efficiency_hi", "strong_measured", "predicted", "predicted_lo",
           "predicted_hi", "exposed_fraction")


def percent(rows: list[dict]) -> list[dict]:
    """Fractions shown as percentages on the page; the CSV keeps the fraction."""
    return [{k: (Cell(f"{100 * v:.1f}%", raw=v) if k in PERCENT and isinstance(v, float) else v)
             for k, v in r.items()} for r in rows]


def validation_text(f: dict) -> str:
    return "; ".join(f"{r['framework']} {r['scaling']} k={r['k']} ({r['method']}): predicted {pct(r['predicted'])}, "
                     f"measured {pct(r['measured'])}, {r['error_points']:+.1f} points" for r in f["validation"])


def headline(data: ReportData) -> str:
    parts = []
    for f in fcr.compute(data):
        s = fcr.primary(f)
        if not s:
            continue
        at = {r["k"]: r for r in s["rows"]}
        k8, n4 = at.get(8, {}), at.get(32, {})
        parts.append(f"{f['label']} [{s['variant']}] weak k=8 {pct(k8.get('weak_efficiency'))}, 4 nodes of 8 "
                     f"{pct(n4.get('weak_efficiency'))}; knee (weak/strong, < {pct(s['knee_threshold'])}) "
                     f"{fcr.knee_text(s, 'weak')}/{fcr.knee_text(s, 'strong')}")
    return "Forecast: " + ("; ".join(parts) or "no machine has k=1 throughput")


def step_headline(data: ReportData) -> str:
    parts = []
    for f in fcr.compute(data):
        s = fcr.primary(f)
        rows = [r for r in (s or {}).get("rows", []) if r.get("weak_step_ms") is not None]
        if len(rows) > 1:
            node, far = max((r for r in rows if r["nodes"] == 1), key=lambda r: r["k"]), rows[-1]
            parts.append(f"{f['label']} [{s['variant']}] weak {rows[0]['weak_step_ms']:.1f} ms at k=1, "
                         f"{node['weak_step_ms']:.1f} ms at k={node['k']}, {far['weak_step_ms']:.1f} ms on "
                         f"{far['nodes']} nodes (k={far['k']})")
    return "Forecast, time per step: " + ("; ".join(parts) or "no machine has a fabric to forecast with")


def notes(data: ReportData) -> list[str]:
    out = []
    for f in fcr.compute(data):
        if f["fabric_from"]:
            out.append(f"{f['label']}: no all-reduce measured here; fabric, probe and census borrowed from "
                       f"{f['fabric_from']} (same GPU model)")
        elif f["series"] and all(s["beta_busbw_GBps"] is None for s in f["series"]):
            out.append(f"{f['label']}: no all-reduce measured and no machine with its GPU to borrow from: "
                       "compute only, no prediction past k=1")
        if f["validation"]:
            out.append(f"{f['label']} validation: {validation_text(f)}")
    out.append("Time to accuracy: needs the statistical efficiency per k from the time-to-accuracy chapter "
               "(not in this report); dpscale.analysis.forecast_data.time_to_accuracy takes it.")
    return out


def book_cell(f: dict | None) -> Cell:
    rows = [r for r in (f or {}).get("validation", []) if r["method"] == "smaller k only"] or \
           (f or {}).get("validation", [])
    if not rows:
        return Cell("no measured k >= 2 with an all-reduce sweep to check against", "missing")
    return Cell("; ".join(f"{r['framework']} {r['scaling']} [{r['variant']}] k={r['k']}: "
                          f"{pct(r['predicted'])} predicted, "
                          f"{pct(r['measured'])} measured ({r['error_points']:+.1f})" for r in rows))


def book_rows(data: ReportData) -> list:
    by = {f["machine"]: f for f in fcr.compute(data)}

    def of(m: Machine) -> Cell:
        return book_cell(by.get(m.name))
    book = Cell(book_cell(by.get(data.book.name)).text, "book") if data.book else Cell("–")
    return [row(data, "Forecast: a measured k predicted from smaller k (exercise 6)",
                "13.6.7 exercise 6 (a prediction the book asks for)", book, of)]


def page(data: ReportData) -> Page:
    fs = fcr.compute(data)
    return Page("exercise6", CHAPTER.title, prose("exercise6"),
                figures=[figure(FIGURES[0], headline(data), notes(data)), figure(FIGURES[1], step_headline(data))],
                tables=[records_table("forecast_validation", "Predicted against measured, every measured k >= 2",
                                      percent(fcr.validation_rows(fs)), VALIDATION),
                        records_table("forecast_model", "The fitted model of each series",
                                      percent(fcr.model_rows(fs)), MODEL),
                        records_table("forecast", "Forecast per k: in one node, then nodes of "
                                      f"{fcr.settings(data.build.get('resolved'))['gpus_per_node']}",
                                      percent(fcr.grid_rows(fs, primary_only=True)), GRID,
                                      note="Each machine's book-protocol series (seed or host, else the first "
                                           "measured); forecast.json and `dpscale forecast` hold every variant.")])


CHAPTER = Chapter("exercise6", "Forecast: past the machine (exercise 6)", FIGURES, TABLES, page, book_rows)
