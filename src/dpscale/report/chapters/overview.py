"""Overview: every planned job counted and listed as ok, skipped, hung, failed or
not run; the book's numbers beside ours; how much each number moves on a second try."""
from __future__ import annotations

import datetime as _dt

from dpscale.analysis import stats
from dpscale.report.document import Cell, Chapter, FigureSpec, Page, Table, cell, status_cell
from dpscale.report.machines import STATUSES, ReportData
from dpscale.report.numbers import allreduce_table, metric, ok
from dpscale.report.chapters.book_table import book_comparison
from dpscale.report.chapters.common import figure, prose

FIGURES = (FigureSpec("status", "Every planned job by experiment / variant (rows) and k (columns)"),)


def plan_table(data: ReportData) -> Table:
    rows = []
    for m in data.measured:
        c = m.counts()
        rows.append([m.name, str(sum(c.values()))] + [str(c[s]) for s in STATUSES])
    return Table("plan", "The plan: every planned job, counted by how it ended (who planned it: the "
                 "provenance's machines table)", ["machine", "planned"] + list(STATUSES), rows)


def took(r: dict) -> str:
    try:
        t0, t1 = (_dt.datetime.fromisoformat(r[k]) for k in ("started_utc", "finished_utc"))
    except (TypeError, ValueError, KeyError):
        return ""
    return f"{(t1 - t0).total_seconds():.0f}"


def status_table(data: ReportData) -> Table:
    rows = []
    for m in data.measured:
        for (e, v, k), r in sorted(m.results.items()):
            src = (r.get("data") or {}).get("source")
            rows.append([Cell(m.label), Cell(e), Cell(v), Cell(str(k)), status_cell(r["status"]),
                         Cell(r.get("reason") or ""), Cell(r.get("backend") or ""),
                         Cell((r.get("config") or {}).get("scale") or ""),
                         Cell(src or "–", "alert" if src == "synthetic" else ""), Cell(r.get("started_utc") or ""),
                         Cell(took(r)), Cell(r.get("log") or r.get("_path", ""))])
    return Table("status", "Every planned job", ["machine", "experiment", "variant", "k", "status", "reason",
                 "backend", "scale", "data", "started (UTC)", "took (s)", "file"], rows)


def _cv_of_steps(r: dict, key: str = "steps") -> tuple:
    rows = metric(r, "per_rank", default=[]) or []
    s = (rows[0].get(key) if rows else None) or {}
    return s.get("n"), s.get("cv")


def noise(r: dict) -> tuple[str, int | None, float | None] | None:
    """What moves from one try to the next, for one result: (what, n, cv)."""
    if not ok(r):
        return None
    e = r["experiment"]
    if len(reps := metric(r, "samples_per_s_repeats") or []) >= 2:   # one launch's; across: launch_noise
        iv = stats.interval(reps)
        return f"samples/s over {stats.WITHIN}", iv["n"], iv["cv"]
    if e == "ddp_comm_probe" and (pairs := metric(r, "synced_ms_pairs")):
        iv = stats.interval(pairs)
        return "synced step time over the probe's pairs", iv["n"], iv["cv"]
    if e == "allreduce":
        rows = allreduce_table(r).get("out_of_place") or allreduce_table(r).get("in_place") or []
        big = max(rows, key=lambda p: p["bytes"], default=None)
        if big and big.get("time_us_cv") is not None:
            return f"time per iteration at {big['bytes'] / 2**20:g} MiB", big.get("iters"), big["time_us_cv"]
    if e in ("ddp_weak", "ddp_strong", "jax_weak", "ddp_memcpy_training"):
        n, cv = _cv_of_steps(r)
        return ("step time within the timed epoch (rank 0)", n, cv) if cv is not None else None
    return None


def launch_noise(r: dict) -> tuple[str, int, float | None] | None:
    """The spread of samples/s across independent launches (dpscale.run.launches), beside
    the within-launch one; None below two launches."""
    xs = metric(r, "samples_per_s_launches") if ok(r) else None
    if not xs or len(xs) < 2:
        return None
    return f"samples/s across {stats.ACROSS}", len(xs), stats.interval(xs)["cv"]


def noise_table(data: ReportData) -> Table:
    rows = []
    for m in data.measured:
        for (e, v, k), r in sorted(m.results.items()):
            for found in (noise(r), launch_noise(r)):
                if found is not None:
                    what, n, cv = found
                    rows.append([m.label, e, v, str(k), what, cell(n),
                                 Cell(f"{100 * cv:.2f}%", raw=cv) if cv is not None else cell(None)])
    return Table("noise", "Noise: the coefficient of variation (stdev / mean) of each measurement's repeats",
                    ["machine", "experiment", "variant", "k", "over", "n", "cv"], rows,
                    note="A difference between two machines smaller than a few times this is not one to read.")


def status_headline(data: ReportData) -> str:
    parts = []
    for m in data.measured:
        c = m.counts()
        parts.append(f"{m.label}: {sum(c.values())} planned, " + ", ".join(f"{n} {s}" for s, n in c.items() if n))
    return "; ".join(parts) or "no machines"


def page(data: ReportData) -> Page:
    return Page("overview", CHAPTER.title, prose("overview"),
                figures=[figure(FIGURES[0], status_headline(data))],
                tables=[plan_table(data), book_comparison(data, data.book_rows), noise_table(data),
                        status_table(data)])


CHAPTER = Chapter("overview", "Overview", FIGURES, ("plan", "book_comparison", "noise", "status"), page)
