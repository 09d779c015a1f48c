"""The table of the book's numbers beside ours: one row per number the book printed,
one column per machine, each cell in the book's printed form. Each chapter
contributes its rows (Chapter.book_rows); the helpers they share are here."""
from __future__ import annotations

from dpscale.report import book as bookmod
from dpscale.report.document import Cell, Table
from dpscale.report.machines import Machine, ReportData
from dpscale.report.numbers import book_form_scaling, ok, scaling


def status_text(r: dict | None) -> Cell:
    if r is None:
        return Cell("not planned", "missing")
    return Cell(f"{r['status'].upper()}: {r.get('reason') or ''}", r["status"].replace(" ", ""))


def scaling_cell(m: Machine, exp: str, variant: str, k: int, strong: bool) -> Cell:
    r = m.get(exp, variant, k)
    if not ok(r):
        return status_text(r)
    row = next(x for x in scaling(m, exp, variant) if x["k"] == k)
    return Cell(book_form_scaling(m, row, strong), "book" if m.kind == "book" else "")


def scaling_rows(data: ReportData, exp: str, variant: str, strong: bool, what: str) -> list[list[Cell]]:
    """One row per k that the book or any machine measured."""
    book = data.book
    ks = sorted(set(book.series(exp, variant) if book else {}) | {k for m in data.measured
                                                                   for k in m.series(exp, variant)})
    return [[Cell(f"{what}, k={k} [{variant}]"), Cell(bookmod.cite(book, exp)),
             scaling_cell(book, exp, variant, k, strong) if book and book.get(exp, variant, k) else Cell("–")]
            + [scaling_cell(m, exp, variant, k, strong) for m in data.measured] for k in ks]


def printed_cell(data: ReportData, key: str) -> Cell:
    """The line the book's cell printed for `key`."""
    lines = bookmod.printed(data.book, key)
    return Cell(lines[0].rstrip(":"), "book") if lines else Cell("–")


def row(data: ReportData, what: str, where: str, book_cell: Cell, fn) -> list[Cell]:
    """A row of one quantity: the book's cell, then fn(machine) for each machine."""
    return [Cell(what), Cell(where), book_cell] + [fn(m) for m in data.measured]


def book_comparison(data: ReportData, rows: list[list[Cell]]) -> Table:
    book = data.book
    cols = ["quantity", "where in the book (section 13.6)",
            f"{book.name} (published)" if book else "book"] + [m.name for m in data.measured]
    return Table("book_comparison", "The book's numbers beside this pipeline's", cols, rows,
                 note="Book cells quote the line the book printed (reference/book_4090.yaml cites the section "
                      "for each); the exercise-6 book cell is derived from the book's numbers by this "
                      "pipeline's cost model. Other cells print the same quantity in the same form.")
