"""Exercise 6: the weak-scaling efficiency at k=8, predicted from the smaller k."""
from __future__ import annotations

from dpscale.report.document import Cell, Chapter, FigureSpec, Page
from dpscale.report.machines import Machine, ReportData
from dpscale.report.numbers import k8_rows, pct
from dpscale.report.chapters.book_table import row
from dpscale.report.chapters.common import figure, prose, records_table

FIGURES = (FigureSpec("k8_prediction", "Exercise 6: weak-scaling efficiency at k=8 from the cost model"),)
COLUMNS = ["machine", "variant", "from_k", "efficiency_at_from_k", "k", "predicted_flat", "predicted_ring", "measured"]


def headline(data: ReportData) -> str:
    parts = []
    for r in k8_rows(data.machines):
        if r["variant"] in ("seed", "host") or r["machine"].startswith("book"):
            parts.append(f"{r['machine'].split(':')[0]} [{r['variant']}] {pct(r['predicted_flat'])} flat / "
                         f"{pct(r['predicted_ring'])} ring (from k={r['from_k']})"
                         + (f", measured {pct(r['measured'])}" if r["measured"] is not None else ""))
    return "Exercise 6, weak-scaling efficiency at k=8: " + ("; ".join(parts) or "no data")


def k8_cell(m: Machine) -> Cell:
    rs = k8_rows([m])
    if not rs:
        return Cell("needs k=1 and k>=2 weak runs", "missing")
    return Cell("; ".join(f"[{x['variant']}] flat {pct(x['predicted_flat'])}, ring {pct(x['predicted_ring'])} "
                          f"(from k={x['from_k']})" + (f", measured {pct(x['measured'])}" if x["measured"] else "")
                          for x in rs))


def book_rows(data: ReportData) -> list:
    book = k8_cell(data.book) if data.book else Cell("–")
    return [row(data, "Exercise 6: weak-scaling efficiency at k=8", "13.6.7 exercise 6 (a prediction the book asks "
                "for)", Cell(book.text, "book") if data.book else book, k8_cell)]


def page(data: ReportData) -> Page:
    return Page("exercise6", CHAPTER.title, prose("exercise6"), figures=[figure(FIGURES[0], headline(data))],
                tables=[records_table("k8_prediction", "Predicted weak-scaling efficiency at k=8",
                                      k8_rows(data.machines), COLUMNS)])


CHAPTER = Chapter("exercise6", "Exercise 6: predicting k=8", FIGURES, ("k8_prediction",), page, book_rows)
