"""The forecast, past the machine (the book's exercise 6 and beyond): weak and strong
efficiency and time per step for k = 1..8 in a node and 2..16 nodes, with a band and a
knee, each point measured or predicted; and the model checked against every measured k
it did not use, beside three naive predictors, with the band's coverage; where a naive
predictor did better out of sample on a machine, that machine's lines lead with it."""
from __future__ import annotations

from dpscale.report import forecast as fcr, forecast_text as fct
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
        "allreduce_tree_ms", "straggler_ms", "weak_naive_bare", "weak_naive_ring", "weak_naive_constant",
        "weak_misfit", "tiers", "inputs"]
VALIDATION = ["machine", "series", "scaling", "k", "nodes", "method", "predicted", "predicted_lo", "predicted_hi",
              "measured", "measured_lo", "measured_hi", "error_points", "inside", "predicted_in_measured",
              "misfit", "misfit_from", "noise", "predicted_overhead_ms", "measured_overhead_ms", "naive_constant",
              "naive_constant_error_points", "naive_ring", "naive_ring_error_points", "naive_bare",
              "naive_bare_error_points", "compute_ms", "exposed_comm_ms", "straggler_ms", "overlap", "exposed_fraction",
              "beta_busbw_GBps", "chosen_rules", "scores_chosen_rules", "measured_utc", "inputs", "how"]
SUMMARY = ["machine", "best_out_of_sample", "rows", "mean_abs_error_points", "max_abs_error_points", "inside", "banded",
           "coverage", "naive_constant_mean_abs", "naive_ring_mean_abs", "naive_ring_rows",
           "model_mean_abs_on_naive_ring_rows", "naive_bare_mean_abs", "measured_halfwidth_max_points",
           "predicted_in_measured", "with_measured_interval"]
PERCENT = {"weak_efficiency", "weak_efficiency_lo", "weak_efficiency_hi", "weak_measured", "strong_efficiency",
           "strong_efficiency_lo", "strong_efficiency_hi", "strong_measured", "predicted", "predicted_lo",
           "predicted_hi", "measured", "measured_lo", "measured_hi", "naive_constant", "naive_ring", "naive_bare",
           "weak_naive_bare", "weak_naive_ring", "weak_naive_constant", "exposed_fraction", "coverage", "misfit",
           "weak_misfit"}


def percent(rows: list[dict]) -> list[dict]:
    """Fractions shown as percentages on the page; the CSV keeps the fraction."""
    return [{k: (Cell(f"{100 * v:.1f}%", raw=v) if k in PERCENT and isinstance(v, float) else v)
             for k, v in r.items()} for r in rows]


def lead_text(f: dict) -> str:
    """Which predictor did best out of sample on this machine, first where a naive one did."""
    v = f["summary"]["verdict"]
    if v["winner"] == "model":
        return ""
    w = v[v["winner"]]
    return (f"out of sample {w['name']} did best here (mean |error| {w['mean_abs']:.2f} points on its {w['n']} rows, "
            f"the model {w['model_mean_abs']:.2f} on them): read it first; ")


def summary_text(f: dict) -> str:
    s = f["summary"]
    cov = f", {s['inside']} of {s['banded']} inside the band" if s["banded"] else ""
    if s.get("with_measured_interval"):
        cov += (f", {s['predicted_in_measured']} of {s['with_measured_interval']} predictions inside the measured "
                f"interval (widest +-{s['measured_halfwidth_max_points']:.1f} points)")
    naive = "; ".join(f"{x['name']} {x['mean_abs']:.2f} (model {x['model_mean_abs']:.2f} on its {x['n']} rows)"
                      for key, x in s["verdict"].items() if key.startswith("naive_"))
    return (f"{f['label']}: {lead_text(f)}{s['model']['n']} rows predicted out of sample, mean |error| "
            f"{s['model']['mean_abs']:.1f} points, max {s['model']['max_abs']:.1f}{cov} (naive: {naive})")


def headline(data: ReportData) -> str:
    parts = []
    for f in fcr.compute(data):
        s = fcr.primary(f)
        if not s:
            continue
        at = {r["k"]: r for r in s["rows"]}
        k8, n4 = at.get(8, {}), at.get(32, {})
        lead = lead_text(f) if f["validation"] else ""
        parts.append(f"{f['label']} {lead}{s['series']} weak k=8 {pct(k8.get('weak_efficiency'))}, 4 nodes of 8 "
                     f"{pct(n4.get('weak_efficiency'))}; knee (weak/strong, < {pct(s['knee_threshold'])}) "
                     f"{fct.knee_text(s, 'weak')}/{fct.knee_text(s, 'strong')}")
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
    fs = fcr.compute(data)
    for f in fs:
        s = fcr.primary(f)
        if s and s.get("tiers"):
            out.append(f"{f['label']}, {s['series']}: fabric " + "; ".join(f"{t}: {v}" for t, v in s["tiers"].items())
                       + f"; nodes of {s['per_node']} ({s['layout_how']})")
        if f["validation"]:
            out.append(summary_text(f))
    pooled = fcr.pooled_coverage(fs)
    if pooled["banded"]:
        out.append(f"Band coverage over every machine's rows: {pooled['inside']} of {pooled['banded']} "
                   f"({pct(pooled['coverage'])}) at the band's {pct(fs[0]['config']['band_level'])}")
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
    return Page("forecast", CHAPTER.title, prose("forecast"),
                figures=[figure(FIGURES[0], headline(data), notes(data)), figure(FIGURES[1], step_headline(data))],
                tables=[records_table("forecast_summary", "The validation, per machine: every row below, summed up",
                                      percent(fcr.summary_rows(fs)), SUMMARY),
                        records_table("forecast_validation", "Every measured k >= 2 predicted from what it did not "
                                      "use, with the inputs of each row", percent(fcr.validation_rows(fs)), VALIDATION),
                        records_table("forecast", "Forecast per k: in one node, then nodes of as many devices as "
                                      "the tier between nodes was measured with",
                                      percent(fcr.grid_rows(fs, primary_only=True)), GRID,
                                      note="Each machine's book-protocol series (seed or host, else the first "
                                           "measured); forecast.json and `dpscale forecast` hold every series.")])


CHAPTER = Chapter("forecast", "Forecast: past the machine (exercise 6)", FIGURES, TABLES, page, book_rows)
