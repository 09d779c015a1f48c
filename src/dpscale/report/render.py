"""Pages -> report.html (self-contained: figures inlined, opens from disk),
report.md (figures as files) and tables/<key>.csv. The markup lives in
templates/ (Jinja2, autoescaped for HTML); the prose in prose/ is reStructuredText,
turned into HTML by docutils, as Snakemake's own report does with the same files."""
from __future__ import annotations

import base64
import csv
import io
import math
import re
from pathlib import Path

import jinja2
from docutils.core import publish_parts

from dpscale.results import write_atomic
from dpscale.report.document import Figure, Page, Table

TEMPLATES = Path(__file__).resolve().parent / "templates"
ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), keep_trailing_newline=True,
                         autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",)),
                         undefined=jinja2.StrictUndefined)
ENV.filters["md"] = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
TITLE = "dpscale report: multi-GPU data parallelism (d2l 13.6), regenerated"


def rst_html(text: str) -> str:
    if not text.strip():
        return ""
    return publish_parts(text, writer="html5",
                         settings_overrides={"report_level": 5, "doctitle_xform": False})["body"]


def rst_md(text: str) -> str:
    """The prose's reStructuredText as Markdown: only inline literals differ."""
    return re.sub(r"``(.+?)``", r"`\1`", text).strip()


def _figure_view(f: Figure, caption: str) -> dict:
    img = dict(f.image)
    img["png_b64"] = base64.b64encode(Path(img["png"]).read_bytes()).decode()
    return {"name": f.name, "title": f.title, "headline": f.headline, "notes": f.notes, "image": img,
            "caption": rst_html(caption), "caption_md": rst_md(caption)}


def _page_view(p: Page, captions: dict[str, str], with_images: bool) -> dict:
    figs = [_figure_view(f, captions[f.name]) if with_images else
            {"name": f.name, "title": f.title, "headline": f.headline, "notes": f.notes,
             "caption_md": rst_md(captions[f.name])} for f in p.figures]
    return {"key": p.key, "title": p.title, "banners": p.banners, "intro_html": rst_html(p.intro),
            "intro_md": rst_md(p.intro), "lead": figs[:p.lead], "figures": figs[p.lead:], "tables": p.tables,
            "pre": p.pre}


def document(pages: list[Page], build: list[tuple[str, str]], captions: dict[str, str], fmt: str) -> str:
    views = [_page_view(p, captions, fmt == "html") for p in pages]
    glance = [(f.name, f.headline) for p in pages for f in p.figures if f.headline]
    template = ENV.get_template(f"report.{fmt}.j2")
    return template.render(title=TITLE, build=build, pages=views, glance=glance)


def _csv_value(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    if isinstance(x, float):   # repr: every digit; float(): numpy's scalars print as np.float64(...)
        return repr(float(x))
    return str(x)


def csv_text(t: Table) -> str:
    """The table's values, not its display: numbers as numbers, empty for missing, and a
    column of intervals as two, <column>_lo and <column>_hi."""
    pairs = [any(isinstance(row[i].raw, tuple) for row in t.rows) for i in range(len(t.columns))]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow([h for col, pair in zip(t.columns, pairs) for h in ((f"{col}_lo", f"{col}_hi") if pair else (col,))])
    for row in t.rows:
        out = []
        for c, pair in zip(row, pairs):
            v = c.value
            out += [_csv_value(x) for x in (v if isinstance(v, tuple) else (None, None))] if pair else [_csv_value(v)]
        w.writerow(out)
    return buf.getvalue()


def write_all(out: Path, pages: list[Page], build: list[tuple[str, str]], captions: dict[str, str],
              csv_keys: list[str]) -> None:
    tables = {t.key: t for p in pages for t in p.tables}
    for key in csv_keys:
        write_atomic(out / "tables" / f"{key}.csv", csv_text(tables[key]))
    write_atomic(out / "report.md", document(pages, build, captions, "md"))
    write_atomic(out / "report.html", document(pages, build, captions, "html"))
