"""What every chapter uses: its prose, the notes that say which planned series a
figure lacks and why, the table of its jobs, and tables from records."""
from __future__ import annotations

from pathlib import Path

from dpscale import registry
from dpscale.report.document import Cell, Figure, FigureSpec, Table, cell, status_cell
from dpscale.report.machines import Machine, ReportData
from dpscale.report.numbers import fmt_interval, fmt_num

PROSE = Path(__file__).resolve().parents[1] / "prose"
PERCENT = ("efficiency", "mfu", "predicted_flat", "predicted_ring", "measured", "efficiency_at_from_k", "cv",
           "roofline_fraction", "roofline_fraction_compiler", "fraction_of_bound",
           "statistical_efficiency", "hardware_efficiency", "goodput_efficiency", "book_weak_efficiency",
           "target_accuracy")


def prose(name: str) -> str:
    """The chapter's or figure's text, written once, in prose/ (rst)."""
    return (PROSE / f"{name}.rst").read_text()


def figure(spec: FigureSpec, headline: str, notes: list[str] | None = None) -> Figure:
    return Figure(spec.name, spec.title, headline, list(dict.fromkeys(notes or [])))


def missing_notes(data: ReportData, experiment: str, variants=None, machines=None) -> list[str]:
    """One line per machine, status and reason: the planned jobs without a number."""
    groups: dict = {}
    for m in machines if machines is not None else data.machines:
        for (e, v, k), r in sorted(m.results.items()):
            if e != experiment or r["status"] == "ok" or (variants and v not in variants):
                continue
            groups.setdefault((m.label, r["status"], r.get("reason") or ""), []).append(f"{v} k={k}")
    return [f"{who}: {experiment} {', '.join(what)} {status.upper()}" + (f": {reason}" if reason else "")
            for (who, status, reason), what in groups.items()]


def jobs_table(data: ReportData, chapter: str) -> Table:
    """Every planned job of the experiments this chapter shows, however it ended."""
    exps = [e.name for e in registry.EXPERIMENTS.values() if e.chapter == chapter]
    rows = []
    for m in data.measured:
        for (e, v, k), r in sorted(m.results.items()):
            if e in exps:
                rows.append([m.label, e, v, str(k), status_cell(r["status"]), r.get("reason") or "",
                             r.get("log") or r.get("_path", "")])
    return Table(f"jobs_{chapter}", "The planned jobs of this chapter",
                    ["machine", "experiment", "variant", "k", "status", "reason", "file"], rows)


def format_value(column: str, v) -> Cell:
    """The cell of a record's value: formatted for the page, the number kept for the CSV."""
    if column == "status" and isinstance(v, str):
        return status_cell(v)
    if column in PERCENT and isinstance(v, float):
        return Cell(f"{100 * v:.1f}%", raw=v)
    if column.startswith("speedup") and isinstance(v, float):
        return Cell(f"{v:.2f}x", raw=v)
    if isinstance(v, (list, tuple)) and len(v) == 2 and column.endswith(("interval", "ci95")):
        return Cell(fmt_interval(*v), raw=tuple(v))
    return cell(v)


def records_table(key: str, title: str, records: list[dict], columns: list[str], note: str = "") -> Table:
    rows = [[format_value(c, r.get(c)) for c in columns] for r in records]
    return Table(key, title, list(columns), rows, note)


def by_machine(data: ReportData, fn) -> list[str]:
    """fn(machine) -> text or None, for each machine: the parts of a headline."""
    return [t for m in data.machines if (t := fn(m))]


def label(m: Machine) -> str:
    return m.label if m.kind != "book" else "book"


__all__ = ["prose", "figure", "missing_notes", "jobs_table", "records_table", "by_machine", "fmt_num"]


def not_ok_row(m: Machine, k: int, r: dict) -> dict:
    """The row of a job that left no number: its status and why."""
    return {"machine": m.name, "k": k, "status": r["status"], "reason": r.get("reason") or ""}
