"""The figures' shared parts (matplotlib, Agg): size, fonts, colours, legends,
missing-run marks, saving.

Legibility is designed in: a figure is 8.5 in wide and shown at 96 px per inch
(816 px, which fits a 900 px window beside the page's margins), its smallest text
is 9 pt, and the PNG is drawn at twice that density. save() records the width and
the smallest font, so the browser test can check the text size actually shown.
The headline and the notes that say what is missing are the page's text, not the
image's: the image keeps axes, legend and marks.
"""
from __future__ import annotations

import io
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from dpscale.results import write_atomic  # noqa: E402
from dpscale.report.machines import Machine, ReportData  # noqa: E402
from dpscale.report.numbers import fmt_num  # noqa: E402

WIDTH_IN = 8.5
CSS_DPI = 96
PNG_DPI = 2 * CSS_DPI
MIN_FONT_PT = 9.0

plt.rcParams.update({
    "font.size": 10, "axes.titlesize": 10.5, "axes.labelsize": 10, "xtick.labelsize": 9.5,
    "ytick.labelsize": 9.5, "legend.fontsize": 9, "axes.grid": True, "grid.alpha": 0.3,
    "axes.spines.top": False, "axes.spines.right": False, "svg.hashsalt": "dpscale",
    "figure.constrained_layout.use": True, "errorbar.capsize": 3,
})

MACHINE_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#17becf")
BOOK_COLOR = "#222222"
VARIANT_STYLE = {"seed": ("-", "o"), "cached": ("--", "s"), "tuned": ("-.", "^"), "host": ("-", "D"),
                 "device": ("--", "P"), "default": ("-", "o"), "memcpy": ("--", "s")}
K_MARKER = {2: "o", 4: "s", 8: "^", 16: "D"}
STATUS_COLOR = {"ok": "#c8e6c9", "skipped": "#e0e0e0", "hung": "#ffcc80", "failed": "#ef9a9a",
                "not run": "#ffffff"}


def color_of(data: ReportData, m: Machine) -> str:
    """One colour per machine, the same in every figure; the book is black."""
    if m.kind == "book":
        return BOOK_COLOR
    return MACHINE_COLORS[[x.key for x in data.measured].index(m.key) % len(MACHINE_COLORS)]


def style_of(variant: str) -> tuple[str, str]:
    return VARIANT_STYLE.get(variant, (":", "v"))


def new(ncols: int = 1, nrows: int = 1, height: float = 4.2, **kw):
    fig, axes = plt.subplots(nrows, ncols, figsize=(WIDTH_IN, height), squeeze=False, **kw)
    return fig, axes


def key(fig, data: ReportData, machines, styles=(), markers=(), extra=(), ncol: int = 3) -> None:
    """The legend under a figure: one colour per machine, then line styles [(ls, label)],
    markers [(marker, label)] in grey, and any other entries."""
    kit_entries = machine_entries(data, machines) + style_entries(list(styles)) + marker_entries(list(markers))
    legend(fig, kit_entries + list(extra), ncol=ncol)


def panel(height: float = 4.2):
    """(fig, ax): a figure of one panel."""
    fig, axes = new(height=height)
    return fig, axes[0, 0]


def stacked(machines: list, rows: list[int], draw, empty_text: str, row_in: float, pad_in: float = 0.4,
            base_in: float = 1.0):
    """One panel per machine, stacked, each as tall as its number of rows; draw(ax, m)."""
    rows = rows or [1]
    fig, axes = new(1, len(rows), height=base_in + row_in * sum(rows) + pad_in * len(rows),
                    gridspec_kw={"height_ratios": rows})
    if not machines:
        empty(axes[0, 0], empty_text)
    for ax, m in zip(axes[:, 0], machines):
        draw(ax, m)
    return fig


def wrap(text: str, width: int = 42) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


def legend(fig, entries: list[tuple], ncol: int = 2) -> None:
    """entries: (handle, label), placed under the axes."""
    if entries:
        handles, labels = zip(*entries)
        fig.legend(handles, [wrap(t) for t in labels], loc="outside lower center", ncol=ncol, frameon=False)


def machine_entries(data: ReportData, machines) -> list[tuple]:
    return [(Line2D([], [], color=color_of(data, m), lw=3), m.name) for m in machines]


def variant_entries(variants, texts: dict[str, str]) -> list[tuple]:
    return [(Line2D([], [], color="#555555", ls=style_of(v)[0], marker=style_of(v)[1]), f"{v}: {texts.get(v, v)}")
            for v in variants]


def style_entries(styles: list[tuple[str, str]], **kw) -> list[tuple]:
    """Legend entries of line styles in grey: [(ls, label)], e.g. one framework or variant each."""
    return [(Line2D([], [], color="#555", ls=ls, **kw), text) for ls, text in styles]


def marker_entries(markers: list[tuple[str, str]], color: str = "#555") -> list[tuple]:
    """Legend entries of markers alone: [(marker, label)], e.g. one k or one variant each."""
    return [(Line2D([], [], color=color, ls="none", marker=mk), text) for mk, text in markers]


def k_panel(ax, used: list, ks, ylabel: str, title: str, empty_text: str) -> list:
    """Finish a panel drawn against k on a log axis: its frame, or the empty text when
    nothing was drawn. Returns `used` (the machines drawn)."""
    if not used:
        empty(ax, empty_text)
        return used
    k_axis(ax, ks)
    log_y(ax, ylabel)
    ax.set_xlabel("k")
    ax.set_title(title, loc="left")
    return used


def empty(ax, text: str) -> None:
    ax.set_axis_off()
    ax.text(0.5, 0.5, wrap(text, 60), ha="center", va="center", fontsize=11, color="#666666",
            transform=ax.transAxes, bbox=dict(boxstyle="round,pad=0.8", fc="#fafafa", ec="#bbbbbb"))


def k_axis(ax, ks, log: bool = True) -> None:
    ks = sorted(set(ks)) or [1]
    if log:
        ax.set_xscale("log", base=2)
    ax.set_xticks(ks)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _p: f"{x:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(min(ks) / 1.35, max(ks) * 1.35)


def log_y(ax, label: str) -> None:
    """A log y axis labelled 1, 2, 5 x 10^n in plain numbers (2,000, not 2 x 10^3)."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _p: fmt_num(y)))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel(label)


def log2_axis(ax, label: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xlabel(label)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _p: f"{x:g}"))


def mark_missing(ax, x: float, text: str, color: str, slot: int = 0) -> None:
    """A planned point without a number: an x on the bottom edge, its status above it."""
    tr = blended_transform_factory(ax.transData, ax.transAxes)
    y = 0.04 + 0.09 * slot
    ax.plot([x], [y], marker="x", ms=9, mew=2, color=color, transform=tr, clip_on=False, zorder=5)
    ax.text(x, y + 0.03, text, color=color, fontsize=9, ha="center", va="bottom", transform=tr)


def bar_label(ax, value: float, hi: float | None, y: float, text: str) -> None:
    """A horizontal bar's number, past the end of its error bar (if any), not on it."""
    ax.text(max(value, hi or 0, 0), y, f" {text}", va="center", fontsize=9)


def errorbars(ax, xs, ys, los, his, **style):
    """ys as points (and a line); an error bar on each point that has an interval (a
    baseline at k=1 or a single-epoch point has none)."""
    with_bar = [(x, y, lo, hi) for x, y, lo, hi in zip(xs, ys, los, his) if lo is not None and hi is not None]
    if len(with_bar) == len(xs) and xs:
        err = [[y - lo for y, lo in zip(ys, los)], [hi - y for y, hi in zip(ys, his)]]
        return ax.errorbar(xs, ys, yerr=err, **style)
    lines = ax.plot(xs, ys, **{k: v for k, v in style.items() if k != "capsize"})
    if with_bar:
        bx, by, blo, bhi = zip(*with_bar)
        ax.errorbar(bx, by, yerr=[[y - lo for y, lo in zip(by, blo)], [hi - y for y, hi in zip(by, bhi)]],
                    fmt="none", ecolor=style.get("color"), capsize=style.get("capsize", 3))
    return lines


def min_font(fig) -> float:
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return min(sizes, default=MIN_FONT_PT)


def save(fig, figdir: Path, name: str) -> dict:
    """PNG (twice the display density) and SVG, written atomically; what the page needs to show it."""
    # One layout pass before the files' own (constrained layout settles over passes; the
    # files are byte for byte what a full canvas.draw() gave), and the tick labels
    # min_font reads: without rasterising an image no one keeps (a third of save's time).
    fig.draw_without_rendering()
    meta = {"width_in": float(fig.get_size_inches()[0]), "min_font_pt": float(min_font(fig))}
    for ext, kw in (("png", {"dpi": PNG_DPI, "metadata": {"Software": None}}), ("svg", {"metadata": {"Date": None}})):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, facecolor="white", **kw)
        write_atomic(Path(figdir) / f"{name}.{ext}", buf.getvalue())
        # The SVG keeps the PNG's layout: savefig runs a layout pass of its own before it
        # renders, and a third pass would move the SVG's axes by a rounding from the PNG's
        # (and cost a seventh of a report's time). The axes keep the positions that pass set.
        fig.set_layout_engine("none")
    plt.close(fig)
    return {**meta, "width_px": round(meta["width_in"] * CSS_DPI), "png": str(Path(figdir) / f"{name}.png")}
