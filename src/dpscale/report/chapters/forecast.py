"""The forecast, past the machine (the book's exercise 6 and beyond): weak and strong
efficiency and time per step for k = 1..8 in a node and 2..16 nodes, with a band and a
knee, each point measured or predicted; and the model checked against every measured k
it did not use, beside two naive predictors, with the band's coverage."""
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
TABLES = ("forecast", "forecast_validation", "forecast_summary")
GRID = ["machine", "series", "k", "nodes", "point", "weak_efficiency", "weak_efficiency_lo", "weak_efficiency_hi",
        "weak_measured", "weak_step_ms", "strong_efficiency", "strong_efficiency_lo", "strong_efficiency_hi",
        "strong_measured", "strong_step_ms", "compute_ms", "exposed_comm_ms", "allreduce_ring_ms",
        "allreduce_tree_ms", "straggler_ms", "fabric_from", "inputs"]
VALIDATION = ["machine", "series", "scaling", "k", "nodes", "method", "predicted", "predicted_lo", "predicted_hi",
              "measured", "measured_lo", "measured_hi", "error_points", "inside", "predicted_in_measured",
              "predicted_overhead_ms", "measured_overhead_ms", "naive_constant",
              "naive_constant_error_points", "naive_ring", "naive_ring_error_points", "compute_ms", "exposed_comm_ms",
              "straggler_ms", "overlap", "exposed_fraction", "beta_busbw_GBps", "inputs", "band_none", "how"]
SUMMARY = ["machine", "rows", "mean_abs_error_points", "max_abs_error_points", "coverage", "banded",
           "naive_constant_mean_abs", "naive_ring_mean_abs", "measured_halfwidth_max_points",
           "predicted_in_measured", "with_measured_interval"]
PERCENT = {"weak_efficiency", "weak_efficiency_lo", "weak_efficiency_hi", "weak_measured", "strong_efficiency",
           "strong_efficiency_lo", "strong_efficiency_hi", "strong_measured", "predicted", "predicted_lo",
           "predicted_hi", "measured", "measured_lo", "measured_hi", "naive_constant", "naive_ring", "exposed_fraction",
           "coverage"}


def percent(rows: list[dict]) -> list[dict]:
    """Fractions shown as percentages on the page; the CSV keeps the fraction."""
    return [{k: (Cell(f"{100 * v:.1f}%", raw=v) if k in PERCENT and isinstance(v, float) else v)
             for k, v in r.items()} for r in rows]


def summary_text(f: dict) -> str:
    s = f["summary"]
    cov = f", {pct(s['coverage'])} inside the band" if s["coverage"] is not None else ""
    if s.get("with_measured_interval"):
        cov += (f", {s['predicted_in_measured']} of {s['with_measured_interval']} predictions inside the measured "
                f"interval (widest +-{s['measured_halfwidth_max_points']:.1f} points)")
    return (f"{f['label']}: {s['model']['n']} rows predicted out of sample, mean |error| "
            f"{s['model']['mean_abs']:.1f} points, max {s['model']['max_abs']:.1f}{cov} (naive: constant "
            f"{s['naive_constant']['mean_abs']:.1f}" + (f", ring-scaled {s['naive_ring']['mean_abs']:.1f}"
                                                        if s["naive_ring"]["mean_abs"] is not None else "") + ")")


def headline(data: ReportData) -> str:
    parts = []
    for f in fcr.compute(data):
        s = fcr.primary(f)
        if not s:
            continue
        at = {r["k"]: r for r in s["rows"]}
        k8, n4 = at.get(8, {}), at.get(32, {})
        parts.append(f"{f['label']} {s['series']} weak k=8 {pct(k8.get('weak_efficiency'))}, 4 nodes of 8 "
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
            parts.append(f"{f['label']} {s['series']} weak {rows[0]['weak_step_ms']:.1f} ms at k=1, "
                         f"{node['weak_step_ms']:.1f} ms at k={node['k']}, {far['weak_step_ms']:.1f} ms on "
                         f"{far['nodes']} nodes (k={far['k']})")
    return "Forecast, time per step: " + ("; ".join(parts) or "no machine has a fabric to forecast with")


def notes(data: ReportData) -> list[str]:
    out = []
    for f in fcr.compute(data):
        if f["fabric_from"]:
            out.append(f"{f['label']}: no all-reduce measured here; fabric, probe and census borrowed from "
                       f"{f['fabric_from']} (same GPU model)")
        if f["validation"]:
            out.append(summary_text(f))
    files = next((f["fabric_files"] for f in fcr.compute(data) if f["fabric_files"]), None)
    if files:
        out.append(f"Tiers a machine did not measure come from fabric files measured elsewhere: {files}")
    return out


def book_cell(f: dict | None) -> Cell:
    rows = [r for r in (f or {}).get("validation", []) if r["rule"] == "below_k"] or (f or {}).get("validation", [])
    if not rows:
        return Cell("no measured k >= 2 with a fabric to predict it from", "missing")
    return Cell("; ".join(f"{r['series']} {r['scaling']} k={r['k']}: {pct(r['predicted'])} predicted, "
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
    per_node = fs[0]["config"]["gpus_per_node"] if fs else 8
    return Page("forecast", CHAPTER.title, prose("forecast"),
                figures=[figure(FIGURES[0], headline(data), notes(data)), figure(FIGURES[1], step_headline(data))],
                tables=[records_table("forecast_summary", "The validation, per machine: every row below, summed up",
                                      percent(fcr.summary_rows(fs)), SUMMARY),
                        records_table("forecast_validation", "Every measured k >= 2 predicted from what it did not "
                                      "use, with the inputs of each row", percent(fcr.validation_rows(fs)), VALIDATION),
                        records_table("forecast", f"Forecast per k: in one node, then nodes of {per_node}",
                                      percent(fcr.grid_rows(fs, primary_only=True)), GRID,
                                      note="Each machine's book-protocol series (seed or host, else the first "
                                           "measured); forecast.json and `dpscale forecast` hold every series.")])


CHAPTER = Chapter("forecast", "Forecast: past the machine (exercise 6)", FIGURES, TABLES, page, book_rows)
