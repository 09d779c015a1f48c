"""What a chapter hands the templates: tables of cells, figures with their
headline and notes, banners and preformatted blocks. Plain data, no markup:
templates/ turns it into HTML and Markdown, render.py into CSV. A cell carries its
display text (HTML, Markdown) and the value behind it (CSV): numbers stay numbers."""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Callable

from dpscale.report.numbers import fmt_num

STATUS_CSS = {"ok": "ok", "skipped": "skipped", "hung": "hung", "failed": "failed", "not run": "notrun"}


MISSING = "–"   # what a missing number reads as; its CSV cell is empty


class _AsText:
    def __repr__(self) -> str:
        return "AS_TEXT"


AS_TEXT = _AsText()   # a cell whose value is its text (a name, a status, a reason)


@dataclass(frozen=True)
class Cell:
    text: str                        # as HTML and Markdown show it: "1,048,576", "98.0%", "–"
    css: str = ""
    raw: object = AS_TEXT            # as the CSV holds it: a number, None (missing), (lo, hi)

    def __str__(self) -> str:
        return self.text

    @property
    def value(self):
        """The CSV's value: the raw number, None for a missing one, else the text."""
        if self.raw is AS_TEXT:
            return None if self.text == MISSING else self.text
        return self.raw


def cell(value, css: str = "") -> Cell:
    if isinstance(value, Cell):
        return value
    if isinstance(value, str):
        return Cell(value, css)
    return Cell(fmt_num(value), css, None if value is None else value)


def status_cell(status: str) -> Cell:
    return Cell(status if status == "ok" else status.upper(), STATUS_CSS.get(status, ""))


@dataclass
class Table:
    key: str
    title: str
    columns: list[str]
    rows: list[list[Cell]]
    note: str = ""

    def __post_init__(self):
        self.columns = list(self.columns)
        self.rows = [[cell(c) for c in row] for row in self.rows]


@dataclass
class Figure:
    name: str
    title: str                       # one line: what it shows (the image's alt text)
    headline: str = ""               # what it says, with numbers
    notes: list[str] = field(default_factory=list)   # planned series it lacks, and why
    image: dict = field(default_factory=dict)        # filled by the renderer: png, width_px, min_font_pt


@dataclass
class Page:
    """One chapter as the reader sees it."""
    key: str
    title: str
    intro: str = ""                  # the chapter's prose (rst, from prose/<key>.rst)
    banners: list[tuple[str, str]] = field(default_factory=list)   # (alert | warn | info, text)
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    pre: list[tuple[str, str]] = field(default_factory=list)        # (caption, text)
    lead: int = 0                    # how many figures come before the prose (the answer's own, first)


@dataclass(frozen=True)
class FigureSpec:
    name: str
    title: str


@dataclass(frozen=True)
class Chapter:
    """A chapter's declaration: light enough for the workflow to read at parse time
    (its figures and CSV tables are the report rule's outputs). `page` builds it."""
    key: str
    title: str
    figures: tuple[FigureSpec, ...]
    tables: tuple[str, ...]          # keys of the tables also written as tables/<key>.csv
    page: Callable                   # (ReportData) -> Page
    book_rows: Callable | None = None   # (ReportData) -> rows of the book-comparison table


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
