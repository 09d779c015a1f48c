"""The report's figures (matplotlib, Agg): one function per figure, each taking
the loaded ReportData and returning a Figure; draw_all() writes PNG and SVG.

Conventions: a headline that says what scaled and what did not; under it, which
machines and scales the series come from; a legend in the right margin (colour =
machine, line style / marker = variant); a footnote listing every run that was
skipped, hung or failed, with the reason, so no point goes silently missing. A
figure without any data is still drawn, saying why.
"""
from __future__ import annotations

import io
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter, NullLocator  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from . import costmodel  # noqa: E402
from .report import (FIGURES, VARIANT_ORDER, VARIANT_TEXT, Machine, ReportData, allreduce_at,  # noqa: E402
                     bucket_rows, fmt_num, fsdp_rows, hlo_summary, memcpy_training_text, metric, ok,
                     probe_rows, scaling, weak_efficiencies, zero_rows)
from .results import EXPERIMENTS, write_atomic  # noqa: E402

plt.rcParams.update({
    "figure.dpi": 100, "savefig.dpi": 110, "font.size": 10, "axes.titlesize": 10.5,
    "axes.labelsize": 10, "legend.fontsize": 8, "axes.grid": True, "grid.alpha": 0.3,
    "axes.spines.top": False, "axes.spines.right": False, "svg.hashsalt": "dpscale",
})

WIDTH = 12.0
LEGEND_IN = 3.1          # right margin that holds the legend
MACHINE_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#17becf"]
BOOK_COLOR = "#222222"
VARIANT_STYLE = {"seed": ("-", "o"), "cached": ("--", "s"), "tuned": ("-.", "^"),
                 "host": ("-", "D"), "device": ("--", "P"), "default": ("-", "o"), "memcpy": ("--", "s")}
STATUS_COLOR = {"ok": "#c8e6c9", "skipped": "#e0e0e0", "hung": "#ffcc80", "failed": "#ef9a9a"}
K_MARKER = {2: "o", 4: "s", 8: "^", 16: "D"}


# ---------------------------------------------------------------- helpers

def color_of(data: ReportData, m: Machine) -> str:
    if m.kind == "book":
        return BOOK_COLOR
    i = [x.key for x in data.measured].index(m.key)
    return MACHINE_COLORS[i % len(MACHINE_COLORS)]


def style_of(variant: str) -> tuple[str, str]:
    return VARIANT_STYLE.get(variant, (":", "v"))


def machines_line(data: ReportData, machines=None) -> str:
    ms = machines if machines is not None else data.machines
    return "   |   ".join(f"{m.name} ({', '.join(m.backends) or '–'})" for m in ms)


def k_label(data: ReportData, short: bool = False) -> str:
    units = {m.unit for m in data.measured if m.results}
    if units <= {"GPU(s)"}:
        return "k = number of GPUs"
    if short:
        return "k = devices (GPUs, or CPU stand-ins)"
    return "k = number of devices (GPUs; CPU processes or host devices on CPU stand-ins)"


class Notes:
    """Footnotes: runs that did not produce a point, grouped by machine and reason."""

    def __init__(self):
        self.items: dict = {}

    def add(self, m: Machine, r: dict | None, what: str):
        if r is None:
            return
        key = (m.short, r["status"], r.get("reason") or "")
        self.items.setdefault(key, []).append(what)

    def text(self, extra=()) -> list[str]:
        lines = list(extra)
        for (name, status, reason), whats in self.items.items():
            whats = list(dict.fromkeys(whats))
            lines.append(f"{name}: {', '.join(whats)} {status.upper()}" + (f" — {reason}" if reason else ""))
        return lines


def absent(data: ReportData, *experiments: str) -> list[str]:
    """Footnotes for measured machines with no result at all for these experiments."""
    out = []
    for m in data.measured:
        missing = [e for e in experiments if not m.all(e)]
        if missing and m.results:
            out.append(f"{m.short}: no {' / '.join(missing)} result (not in this run's configuration, "
                       f"or its job failed: see logs/{missing[0]}/)")
    return out


class Legend:
    """Grouped legend entries: a bold header, then its entries."""

    def __init__(self):
        self.handles, self.labels, self.headers = [], [], []

    def header(self, text: str):
        self.headers.append(len(self.labels))
        self.handles.append(Patch(visible=False))
        self.labels.append(text)

    def add(self, handle, label: str, width: int = 33):
        self.handles.append(handle)
        self.labels.append("\n".join(textwrap.wrap(label, width)) or label)

    def machines(self, data: ReportData, machines, lw=3):
        self.header("machine (colour)")
        for m in machines:
            self.add(Line2D([], [], color=color_of(data, m), lw=lw), m.name)

    def variants(self, variants, title="variant (line, marker)"):
        if not variants:
            return
        self.header(title)
        for v in variants:
            ls, mk = style_of(v)
            self.add(Line2D([], [], color="#555555", ls=ls, marker=mk), f"{v}: {VARIANT_TEXT.get(v, v)}")

    def __bool__(self):
        return bool(self.handles)


def new_figure(ncols: int = 1, nrows: int = 1, height: float = 5.2, width: float = WIDTH, **kw):
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False, **kw)
    return fig, axes


def finish(fig, headline: str, subtitle: str, notes=None, legend: Legend | None = None, left_in: float = 0.85,
           right_in: float = 0.3, wspace: float = 0.28, hspace: float = 0.35, bottom_in: float = 0.7,
           top_extra: float = 0.0):
    """Lay out: headline and subtitle on top, legend in the right margin, footnotes at
    the bottom (the figure grows to hold them, so the plot area is never squashed)."""
    fig.dpscale_headline = headline
    W, H = fig.get_size_inches()
    if legend:
        right_in = max(right_in, LEGEND_IN)
    head = textwrap.wrap(headline, int(W * 8.6)) or [""]
    sub = textwrap.wrap(subtitle, int(W * 14)) or [""]
    note_lines = []
    for n in notes or []:
        note_lines += textwrap.wrap(n, int(W * 15), subsequent_indent="    ")
    if len(note_lines) > 16:
        note_lines = note_lines[:15] + [f"… and {len(note_lines) - 15} more lines (see the report's tables)"]
    top_in = 0.2 + 0.25 * len(head) + 0.16 * len(sub) + 0.3 + top_extra
    note_in = 0.155 * len(note_lines) + (0.12 if note_lines else 0)
    H2 = max(H, top_in + bottom_in + 1.6) + note_in    # never less than 1.6 in of plot
    fig.set_size_inches(W, H2)
    fig.subplots_adjust(left=left_in / W, right=1 - right_in / W, top=1 - top_in / H2,
                        bottom=(bottom_in + note_in) / H2, wspace=wspace, hspace=hspace)
    y = 1 - 0.12 / H2
    fig.text(0.012, y, "\n".join(head), ha="left", va="top", fontsize=13, fontweight="bold")
    y -= (0.25 * len(head) + 0.06) / H2
    fig.text(0.012, y, "\n".join(sub), ha="left", va="top", fontsize=8.5, color="#444444")
    if note_lines:
        fig.text(0.012, 0.08 / H2, "\n".join(note_lines), ha="left", va="bottom", fontsize=7.5, color="#555555",
                 linespacing=1.25)
    if legend:
        leg = fig.legend(legend.handles, legend.labels, loc="upper left", frameon=False, fontsize=8,
                         bbox_to_anchor=(1 - (right_in - 0.25) / W, 1 - top_in / H2), handlelength=2.6)
        for i in legend.headers:
            leg.get_texts()[i].set_fontweight("bold")
    return fig


def empty(ax, text: str):
    ax.set_axis_off()
    ax.text(0.5, 0.5, "\n".join(textwrap.wrap(text, 70)), ha="center", va="center", fontsize=11,
            color="#666666", transform=ax.transAxes,
            bbox=dict(boxstyle="round,pad=0.8", fc="#fafafa", ec="#bbbbbb"))


def k_axis(ax, ks, log=True):
    ks = sorted(set(ks)) or [1]
    if log:
        ax.set_xscale("log", base=2)
    ax.set_xticks(ks)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _p: f"{x:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(min(ks) / 1.3, max(ks) * 1.3)


def mark_missing(ax, m: Machine, color, r: dict | None, k: int, notes: Notes, what: str, slot: int = 0):
    """A run without a number: an x on the bottom edge at its k, its status above."""
    if r is None:
        return
    tr = blended_transform_factory(ax.transData, ax.transAxes)
    y = 0.03 + 0.07 * slot
    ax.plot([k], [y], marker="x", ms=9, mew=2, color=color, transform=tr, clip_on=False, zorder=5)
    ax.text(k, y + 0.025, f"{m.short}: {r['status']}", color=color, fontsize=7, ha="center", va="bottom",
            transform=tr)
    notes.add(m, r, what)


def label_points(ax, pts, gap: float = 0.045, dx: float = 6):
    """Label points [(x, y, text, color)] to their right, nudged apart vertically
    (in axes fractions, so it works on log axes too). Call after the limits are set."""
    by_x: dict = {}
    for x, y, text, color in pts:
        by_x.setdefault(x, []).append((y, text, color))
    to_axes = ax.transAxes.inverted()
    tr = blended_transform_factory(ax.transData, ax.transAxes)
    for x, items in by_x.items():
        placed = []
        for y, text, color in sorted(items, key=lambda t: t[0]):
            ya = to_axes.transform(ax.transData.transform((x, y)))[1]
            if placed and ya < placed[-1] + gap:
                ya = placed[-1] + gap
            placed.append(ya)
            ax.annotate(text, xy=(x, ya), xycoords=tr, xytext=(dx, 0), textcoords="offset points",
                        fontsize=7.5, color=color, va="center")


def save(fig, figdir: Path, name: str) -> None:
    for ext in ("png", "svg"):
        buf = io.BytesIO()
        meta = {"Date": None} if ext == "svg" else {"Software": None}
        fig.savefig(buf, format=ext, metadata=meta, facecolor="white")
        write_atomic(figdir / f"{name}.{ext}", buf.getvalue())
    plt.close(fig)


def primary_variant(m: Machine, experiment: str, prefer=("seed", "host", "cached", "device", "tuned")) -> str | None:
    vs = m.variants(experiment)
    for v in prefer:
        if v in vs and any(ok(r) for r in m.series(experiment, v).values()):
            return v
    return vs[0] if vs else None


def pct(x) -> str:
    return f"{100 * x:.0f}%"


def ordered(variants) -> list[str]:
    return sorted(set(variants), key=lambda v: (VARIANT_ORDER.index(v) if v in VARIANT_ORDER else 99, v))


# ---------------------------------------------------------------- status

def fig_status(data: ReportData):
    ms = list(data.measured)
    rows_per = []
    for m in ms:
        combos = sorted({(e, v) for (e, v, _k) in m.results},
                        key=lambda ev: (EXPERIMENTS.index(ev[0]) if ev[0] in EXPERIMENTS else 99,
                                        VARIANT_ORDER.index(ev[1]) if ev[1] in VARIANT_ORDER else 99))
        rows_per.append(combos)
    n = sum(max(1, len(c)) for c in rows_per)
    fig, axes = new_figure(1, max(1, len(ms)), height=0.9 + 0.3 * n + 0.55 * len(ms),
                           gridspec_kw={"height_ratios": [max(1, len(c)) for c in rows_per] or [1]})
    reasons: dict[str, int] = {}
    counts = {"ok": 0, "skipped": 0, "hung": 0, "failed": 0}
    for ax, m, combos in zip(axes[:, 0], ms, rows_per):
        if not combos:
            empty(ax, f"{m.name}: no result JSONs under {m.source}")
            continue
        ks = m.ks()
        for i, (e, v) in enumerate(combos):
            y = len(combos) - 1 - i
            for j, k in enumerate(ks):
                r = m.get(e, v, k)
                if r is None:
                    ax.add_patch(Rectangle((j, y), 1, 1, fc="white", ec="#eeeeee"))
                    ax.text(j + 0.5, y + 0.5, "n/a", ha="center", va="center", color="#bbbbbb", fontsize=7)
                    continue
                st = r["status"]
                counts[st] = counts.get(st, 0) + 1
                label = st
                if st != "ok":
                    idx = reasons.setdefault(r.get("reason") or "", len(reasons) + 1)
                    label = f"{st} [{idx}]"
                    if st == "hung" and metric(r, "hung_after_s"):
                        label = f"hung after {metric(r, 'hung_after_s'):g} s [{idx}]"
                ax.add_patch(Rectangle((j, y), 1, 1, fc=STATUS_COLOR.get(st, "white"), ec="white", lw=2))
                ax.text(j + 0.5, y + 0.5, label, ha="center", va="center", fontsize=8,
                        fontweight="bold" if st in ("hung", "failed") else "normal")
        ax.set_xlim(0, len(ks))
        ax.set_ylim(0, len(combos))
        ax.set_xticks([j + 0.5 for j in range(len(ks))], [f"k={k}" for k in ks])
        ax.xaxis.tick_top()
        ax.set_yticks([len(combos) - 1 - i + 0.5 for i in range(len(combos))],
                      [f"{e} / {v}" for e, v in combos], fontsize=8.5)
        ax.grid(False)
        for s in ax.spines.values():
            s.set_visible(False)
        ax.tick_params(length=0)
        ax.set_title(m.name, loc="left", fontsize=10, pad=20, fontweight="bold")
    if not ms:
        empty(axes[0, 0], "no machines")
    total = sum(counts.values())
    head = (f"{counts['ok']} of {total} artifacts ran"
            + "".join(f", {counts[s]} {s}" for s in ("skipped", "hung", "failed") if counts.get(s)))
    if counts.get("hung"):
        head += "; hung runs were killed by the watchdog and the pipeline went on"
    legend = Legend()
    legend.header("status")
    for s, c in STATUS_COLOR.items():
        legend.add(Patch(fc=c), s)
    legend.add(Patch(fc="white", ec="#cccccc"), "n/a: not part of the experiment (a collective at k=1, "
               "an exercise run at k=2 only)")
    return finish(fig, head, "Every result JSON by experiment / variant (rows) and k (columns); [n] = reason below.",
                  [f"[{i}] {reason}" for reason, i in reasons.items()], legend=legend, left_in=2.3,
                  top_extra=0.3, hspace=0.3)


# ---------------------------------------------------------------- scaling

def scaling_phrase(m: Machine, experiment: str, variant: str) -> str | None:
    rows = scaling(m, experiment, variant)
    good = [r for r in rows if r["k"] > 1 and r["efficiency"] is not None]
    bits = []
    if good:
        r = good[-1]
        bits.append(f"{r['speedup']:.2f}x at k={r['k']} ({pct(r['efficiency'])})")
    missing = {}
    for r in rows:
        if r["status"] != "ok":
            missing.setdefault(r["status"], []).append(str(r["k"]))
    bits += [f"k={','.join(ks)} {st}" for st, ks in missing.items()]
    if not bits:
        return None
    return f"{m.short} [{variant}] " + ", ".join(bits)


def plot_throughput(ax, data: ReportData, experiment: str, notes: Notes, linestyle=None, what="",
                    labels=None):
    """samples/s against k for every machine x variant, ideal lines dotted from k=1."""
    ks_all, variants, slot = set(), set(), {}
    for m in data.machines:
        color = color_of(data, m)
        primary = primary_variant(m, experiment)
        for v in m.variants(experiment):
            rows = scaling(m, experiment, v)
            ls, mk = style_of(v)
            good = [r for r in rows if r["samples_per_s"]]
            ks_all |= {r["k"] for r in rows}
            if good:
                variants.add(v)
                ax.plot([r["k"] for r in good], [r["samples_per_s"] for r in good], ls=linestyle or ls, marker=mk,
                        color=color, lw=1.9 if m.kind != "book" else 1.5, alpha=0.95)
                base = next((r for r in good if r["k"] == 1), None)
                if base:
                    kk = sorted({r["k"] for r in rows})
                    ax.plot(kk, [base["samples_per_s"] * k for k in kk], ls=":", color=color, lw=1, alpha=0.55)
                if labels is not None and v == primary:
                    labels += [(r["k"], r["samples_per_s"], f"{r['speedup']:.2f}x", color) for r in good
                               if r["speedup"] is not None and r["k"] > 1]
            for r in rows:
                if r["status"] != "ok":
                    s = slot.setdefault((m.key, r["k"]), 0)
                    if s == 0:
                        mark_missing(ax, m, color, m.get(experiment, v, r["k"]), r["k"], notes, f"{what}{v} k={r['k']}",
                                     slot=[x.key for x in data.machines].index(m.key))
                    else:
                        notes.add(m, m.get(experiment, v, r["k"]), f"{what}{v} k={r['k']}")
                    slot[(m.key, r["k"])] += 1
    return ks_all, ordered(variants)


def fig_scaling(data: ReportData, experiment: str):
    strong = experiment == "ddp_strong"
    fig, axes = new_figure(1, 1, height=5.8)
    ax = axes[0, 0]
    notes = Notes()
    labels = []
    ks, variants = plot_throughput(ax, data, experiment, notes, labels=labels)
    legend = Legend()
    if not variants:
        empty(ax, f"No {experiment} measurement produced a number on any machine.")
    else:
        k_axis(ax, ks)
        ax.set_yscale("log")
        ax.set_xlabel(k_label(data))
        ax.set_ylabel("samples/s, summed over ranks (log scale)")
        label_points(ax, labels)
        legend.machines(data, [m for m in data.machines if m.variants(experiment)])
        legend.variants(variants)
        legend.header("reference")
        legend.add(Line2D([], [], ls=":", color="gray"), "ideal: k x the series' k=1")
        legend.add(Line2D([], [], ls="none", marker="x", color="gray", mew=2), "no number: skipped / hung / failed")
    batches = []
    for m in data.machines:
        v = primary_variant(m, experiment)
        r1 = next((r for r in m.series(experiment, v).values() if ok(r)), None) if v else None
        if r1:
            batches.append(f"{m.short}: per-rank batch {metric(r1, 'per_rank_batch')} at k={r1['k']}"
                           + (f", global {metric(r1, 'global_batch')}" if strong else ""))
    phrases = [p for m in data.machines if (v := primary_variant(m, experiment))
               and (p := scaling_phrase(m, experiment, v))]
    title = "DDP strong scaling" if strong else "DDP weak scaling"
    head = f"{title}: " + ("; ".join(phrases) if phrases else "no multi-device measurement")
    what = ("Strong scaling: global batch fixed, per-rank batch = global / k." if strong else
            "Weak scaling: per-rank batch fixed, global batch = k x per-rank.")
    return finish(fig, head, f"{what} Labels: speedup over the series' k=1.   " + machines_line(data),
                  notes.text((["Batches: " + "; ".join(batches)] if batches else []) + absent(data, experiment)),
                  legend=legend)


def fig_efficiency(data: ReportData):
    fig, axes = new_figure(2, 1, height=5.4)
    notes = Notes()
    heads, all_variants = [], set()
    for ax, exp, title in zip(axes[0], ("ddp_weak", "ddp_strong"), ("weak", "strong")):
        ks, labels = set(), []
        for m in data.machines:
            color = color_of(data, m)
            primary = primary_variant(m, exp)
            for v in m.variants(exp):
                rows = scaling(m, exp, v)
                ks |= {r["k"] for r in rows}
                good = [r for r in rows if r["efficiency"] is not None]
                ls, mk = style_of(v)
                if good:
                    all_variants.add(v)
                    ax.plot([r["k"] for r in good], [100 * r["efficiency"] for r in good], ls=ls, marker=mk,
                            color=color)
                    if v == primary:
                        labels += [(r["k"], 100 * r["efficiency"], f"{100 * r['efficiency']:.0f}%", color)
                                   for r in good if r["k"] > 1]
                for r in rows:
                    if r["status"] != "ok":
                        notes.add(m, m.get(exp, v, r["k"]), f"{exp} {v} k={r['k']}")
        if not ks:
            empty(ax, f"no {exp} results")
            continue
        k_axis(ax, ks)
        ax.axhline(100, color="gray", ls=":", lw=1)
        ax.set_ylim(0, 112)
        ax.set_xlabel(k_label(data, short=True))
        ax.set_ylabel(f"{title}-scaling efficiency, % of ideal")
        ax.set_title(f"{title} scaling: samples/s / (k x samples/s at k=1)")
        label_points(ax, labels)
        phr = []
        for m in data.machines:
            v = primary_variant(m, exp)
            e = [r for r in scaling(m, exp, v) if r["efficiency"] is not None and r["k"] > 1] if v else []
            if e:
                phr.append(f"{m.short} {pct(e[-1]['efficiency'])} at k={e[-1]['k']}")
        if phr:
            heads.append(f"{title} " + ", ".join(phr))
    legend = Legend()
    legend.machines(data, [m for m in data.machines if m.variants("ddp_weak") or m.variants("ddp_strong")])
    legend.variants(ordered(all_variants))
    head = "Scaling efficiency — " + ("; ".join(heads) if heads else "no multi-device measurement")
    return finish(fig, head, "Labels: the book's protocol (seed) per machine.   " + machines_line(data),
                  notes.text(), legend=legend)


# ---------------------------------------------------------------- loader

def fig_loader(data: ReportData):
    ms = [m for m in data.measured if m.variants("ddp_weak") or m.variants("ddp_strong")]
    fig, axes = new_figure(max(1, len(ms)), 1, height=5.3)
    notes = Notes()
    heads, used = [], set()
    colors = {"seed": "#9e9e9e", "cached": "#1f77b4", "tuned": "#ff7f0e"}
    if not ms:
        empty(axes[0, 0], "No DDP throughput results: nothing to compare.")
    for ax, m in zip(axes[0], ms):
        groups = [(e, k) for e in ("ddp_weak", "ddp_strong") for k in m.ks(e)]
        variants = [v for v in ("seed", "cached", "tuned") if v in set(m.variants("ddp_weak")) | set(m.variants("ddp_strong"))]
        used |= set(variants)
        width = 0.8 / max(1, len(variants))
        top = max([metric(r, "samples_per_s") or 0 for r in m.results.values()
                   if r["experiment"] in ("ddp_weak", "ddp_strong") and ok(r)] or [1])
        for i, v in enumerate(variants):
            for gi, (e, k) in enumerate(groups):
                r = m.get(e, v, k)
                x = gi + (i - (len(variants) - 1) / 2) * width
                if ok(r):
                    s = metric(r, "samples_per_s")
                    ax.bar(x, s, width * 0.95, color=colors[v])
                    ax.text(x, s + top * 0.01, fmt_num(s), ha="center", va="bottom", fontsize=6.5, rotation=90)
                elif r is not None:
                    ax.bar(x, top * 0.04, width * 0.95, color="white", ec=colors[v], hatch="xx")
                    ax.text(x, top * 0.05, r["status"], ha="center", va="bottom", fontsize=7, rotation=90,
                            color="#b71c1c")
                    notes.add(m, r, f"{e} {v} k={k}")
        ratios = []
        for gi, (e, k) in enumerate(groups):
            s, c = m.get(e, "seed", k), m.get(e, "cached", k)
            if ok(s) and ok(c):
                ratio = metric(c, "samples_per_s") / metric(s, "samples_per_s")
                ax.text(gi, top * 1.2, f"{ratio:.2f}x", ha="center", va="bottom", fontsize=8.5, fontweight="bold")
                if e == "ddp_weak":
                    ratios.append(f"{ratio:.2f}x at k={k}")
        if ratios:
            heads.append(f"{m.short} " + ", ".join(ratios))
        ax.text(-0.5, top * 1.32, "cached / seed:", fontsize=8, ha="left", va="bottom", style="italic")
        ax.set_xticks(range(len(groups)), [f"k={k}" for e, k in groups], fontsize=8.5)
        tr = blended_transform_factory(ax.transData, ax.transAxes)
        for e in ("ddp_weak", "ddp_strong"):
            idx = [gi for gi, (ee, _k) in enumerate(groups) if ee == e]
            if idx:
                ax.text(sum(idx) / len(idx), -0.12, e.split("_")[1], ha="center", va="top", transform=tr,
                        fontsize=9.5, fontweight="bold")
        ax.set_xlim(-0.6, len(groups) - 0.4)
        ax.set_ylim(0, top * 1.45)
        ax.set_ylabel("samples/s, summed over ranks")
        ax.set_title(m.name, fontsize=9.5)
    legend = Legend()
    legend.header("input path (bar colour)")
    for v in ("seed", "cached", "tuned"):
        if v in used:
            legend.add(Patch(fc=colors[v]), f"{v}: {VARIANT_TEXT[v]}")
    legend.add(Patch(fc="white", ec="#888", hatch="xx"), "no number: skipped / hung / failed")
    head = ("Resize cache on the device vs the book's DataLoader (weak scaling): " + "; ".join(heads)) if heads \
        else "Resize cache vs the book's DataLoader: no pair of runs to compare"
    return finish(fig, head, "Same DDP job, two input paths; the number above each pair is cached / seed.   "
                  + machines_line(data, ms), notes.text(absent(data, "ddp_weak", "ddp_strong")), legend=legend)


# ---------------------------------------------------------------- tuned series

TUNED_GROUPS = (("ddp_weak", "DDP (PyTorch)", (("seed", "the book's protocol: DataLoader, fp32/TF32"),
                                               ("cached", "resize cache on the device, fp32/TF32"),
                                               ("tuned", "bf16, channels_last, compile, fused SGD, CUDA graph"))),
                ("jax_weak", "JAX", (("host", "the book's protocol: host-staged, fp32/TF32"),
                                     ("device", "data on the device, fp32/TF32"),
                                     ("tuned", "bf16 compute, data on the device, jax.jit over flat state"))))
TUNED_COLORS = ("#9e9e9e", "#1f77b4", "#ff7f0e")


def fig_tuned(data: ReportData):
    """Per-device samples/s at the smallest k of each machine: the book's protocol,
    the device-resident data, the tuned series; MFU beside each number where measured,
    and the bf16 arithmetic limit (measured matmul peak / counted FLOPs per sample)."""
    ms = [m for m in data.measured if any(m.variants(e) for e, _t, _v in TUNED_GROUPS)]
    fig, axes = new_figure(max(1, len(ms)), 1, height=5.3)
    notes = Notes()
    heads = []
    if not ms:
        empty(axes[0, 0], "No DDP or JAX throughput results: nothing to compare.")
    for ax, m in zip(axes[0], ms):
        k = min(m.ks("ddp_weak") + m.ks("jax_weak"))
        top, limits, parts = 1.0, [], []
        for gi, (e, title, variants) in enumerate(TUNED_GROUPS):
            base = None
            for i, ((v, _text), color) in enumerate(zip(variants, TUNED_COLORS)):
                r = m.get(e, v, k)
                x = gi + (i - 1) * 0.27
                if ok(r):
                    s = metric(r, "samples_per_s_per_device")
                    top = max(top, s)
                    ax.bar(x, s, 0.25, color=color)
                    mfu = metric(r, "mfu")
                    ax.text(x, s * 1.01, f"{fmt_num(s)}" + (f"  MFU {mfu:.2f}" if mfu else ""), ha="center",
                            va="bottom", fontsize=7, rotation=90)
                    if metric(r, "bf16_matmul_peak_TFLOPs") and metric(r, "flops_per_sample"):
                        limits.append(1e12 * metric(r, "bf16_matmul_peak_TFLOPs") / metric(r, "flops_per_sample"))
                    base = s if i == 0 else base
                    if v == "tuned":
                        parts.append(f"{title.split()[0]} {fmt_num(s)}" + (f" ({s / base:.1f}x)" if base else "")
                                     + (f", MFU {mfu:.2f}" if mfu else ""))
                elif r is not None:
                    ax.bar(x, 1, 0.25, color="white", ec=color, hatch="xx")
                    ax.text(x, 0, r["status"], ha="center", va="bottom", fontsize=7, rotation=90, color="#b71c1c")
                    notes.add(m, r, f"{e} {v} k={k}")
        if limits:
            lim = sorted(limits)[len(limits) // 2]
            ax.axhline(lim, color="#444", ls=":", lw=1.2)
            ax.text(1.45, lim * 1.01, f"MFU = 1: {fmt_num(lim)}", ha="right", va="bottom", fontsize=7.5,
                    color="#444")
            top = max(top, lim)
        if parts:
            heads.append(f"{m.short} tuned " + "; ".join(parts))
        ax.set_xticks(range(len(TUNED_GROUPS)), [t for _e, t, _v in TUNED_GROUPS], fontsize=9.5)
        ax.set_xlim(-0.55, len(TUNED_GROUPS) - 0.45)
        ax.set_ylim(0, top * 1.3)
        ax.set_ylabel(f"samples/s per device, k={k}")
        ax.set_title(m.name, fontsize=9.5)
    legend = Legend()
    for _e, title, variants in TUNED_GROUPS:
        legend.header(title)
        for (v, text), color in zip(variants, TUNED_COLORS):
            legend.add(Patch(fc=color), f"{v}: {text}")
    head = ("The tuned series beside the book's protocol: " + "; ".join(heads)) if heads \
        else "The tuned series beside the book's protocol: no tuned run (tuned: auto runs it on GPUs)"
    return finish(fig, head, "Same model, same per-rank batch; MFU = counted FLOPs x samples/s / measured bf16 "
                  "matmul peak; dotted: the samples/s at MFU = 1.   " + machines_line(data, ms),
                  notes.text(absent(data, "ddp_weak", "jax_weak")), legend=legend)


# ---------------------------------------------------------------- communication

PROBE_BARS = [("comm_ms", "measured: synced - no_sync step time", None),
              ("pred_flat_ms", "predicted, flat: 2N/beta, beta measured at k=2 (Eq. 13.5.2)", "//"),
              ("pred_ring_ms", "predicted, ring: 2(k-1)/k N / busbw(k=2) (Eq. 13.5.1)", "\\\\"),
              ("pred_book_ms", "predicted with the book's beta = 4.5 GB/s", "..")]


def fig_comm_probe(data: ReportData):
    ms = [m for m in data.machines if probe_rows(m)]
    fig, axes = new_figure(max(1, len(ms)), 1, height=5.3)
    notes = Notes()
    heads = []
    extra = []
    if not ms:
        empty(axes[0, 0], "No ddp_comm_probe results (the probe needs k >= 2).")
    for ax, m in zip(axes[0], ms):
        color = color_of(data, m)
        rows = probe_rows(m)
        width = 0.2
        ticks = []
        for gi, row in enumerate(rows):
            ticks.append(f"k={row['k']}" + (f"\n{fmt_num(row['synced_ms'])} / {fmt_num(row['no_sync_ms'])}"
                                            if row["synced_ms"] is not None else ""))
            if row["status"] != "ok":
                ax.text(gi, 0.02, row["status"].upper(), ha="center", va="bottom", color="#b71c1c", fontsize=9,
                        transform=blended_transform_factory(ax.transData, ax.transAxes))
                notes.add(m, m.get("ddp_comm_probe", "default", row["k"]), f"probe k={row['k']}")
                continue
            for bi, (key, _label, hatch) in enumerate(PROBE_BARS):
                v = row.get(key)
                x = gi + (bi - 1.5) * width
                if v is None:
                    ax.text(x, 0, "n/a", ha="center", va="bottom", fontsize=7, color="#888", rotation=90)
                    continue
                ax.bar(x, v, width * 0.95, color=color if bi == 0 else "white", ec=color, hatch=hatch, lw=1.2)
                ax.text(x, v, fmt_num(v), ha="center", va="bottom" if v >= 0 else "top", fontsize=7)
            if row["comm_ms"] is not None and row["comm_ms"] < 0:
                extra.append(f"{m.short} k={row['k']}: the unsynced steps were no faster than the synced ones; "
                             "the noise is larger than the communication.")
        good = [r for r in rows if r["status"] == "ok" and r["comm_ms"] is not None]
        if good:
            r = good[0]
            pred = r["pred_flat_ms"] if r["pred_flat_ms"] is not None else r["pred_book_ms"]
            which = "flat" if r["pred_flat_ms"] is not None else "book beta"
            if pred:
                heads.append(f"{m.short} k={r['k']} {fmt_num(r['comm_ms'])} ms measured vs {fmt_num(pred)} "
                             f"predicted ({which})")
            if len(good) > 1:
                g = good[-1]
                heads[-1] += (f", k={g['k']} {fmt_num(g['comm_ms'])} vs {fmt_num(g['pred_flat_ms'])} flat / "
                              f"{fmt_num(g['pred_ring_ms'])} ring")
        ax.set_xticks(range(len(rows)), ticks, fontsize=8)
        ax.set_xlim(-0.6, len(rows) - 0.4)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_ylabel("communication per step, ms")
        ax.set_title(m.name, fontsize=9.5)
        ax.margins(y=0.12)
    legend = Legend()
    legend.machines(data, ms)
    legend.header("bars")
    for key, label, hatch in PROBE_BARS:
        legend.add(Patch(fc="#777" if hatch is None else "white", ec="#555", hatch=hatch), label)
    head = "Communication per step, no_sync() probe vs the cost model: " + ("; ".join(heads) if heads else "no data")
    return finish(fig, head, "Per machine (own scale): measured (solid) and three predictions (hatched); under "
                  "each k: synced / no_sync step time, ms.   " + machines_line(data, ms),
                  notes.text(extra + absent(data, "ddp_comm_probe")),
                  legend=legend)


def fig_allreduce(data: ReportData):
    fig, axes = new_figure(2, 1, height=5.4)
    ax, axt = axes[0]
    notes = Notes()
    any_pts, used_k, used_v, used_m = False, set(), set(), []
    for m in data.machines:
        color = color_of(data, m)
        for v in m.variants("allreduce"):
            for k, r in m.series("allreduce", v).items():
                sweep = metric(r, "sweep", default=[]) or []
                if not sweep:
                    notes.add(m, r, f"{v} k={k}")
                    continue
                if r["status"] != "ok":
                    notes.add(m, r, f"{v} k={k}")
                any_pts = True
                used_v.add(v)
                if m not in used_m:
                    used_m.append(m)
                ls = "-" if v == "default" else "--"
                pts = sorted(sweep, key=lambda p: p["MiB"])
                x = [p["MiB"] for p in pts]
                if m.kind == "book":
                    ax.plot(x, [p["busbw_GBps"] for p in pts], ls="none", marker="*", ms=15, color=color,
                            mfc=color if v == "default" else "white")
                    for p in pts:
                        ax.annotate(f"book {v}: {p['book_GBps']:.1f} GB/s (2S/t)", (p["MiB"], p["busbw_GBps"]),
                                    fontsize=7.5, xytext=(-10, 0), textcoords="offset points", ha="right",
                                    va="center")
                    axt.plot(x, [p["time_ms_median"] for p in pts], marker="*", ms=15, ls="none", color=color,
                             mfc=color if v == "default" else "white")
                    continue
                used_k.add(k)
                mk = K_MARKER.get(k, "v")
                ax.plot(x, [p["busbw_GBps"] for p in pts], ls=ls, marker=mk, color=color)
                bad = [p for p in pts if p.get("correct") is False]
                if bad:
                    ax.plot([p["MiB"] for p in bad], [p["busbw_GBps"] for p in bad], ls="none", marker="X", ms=12,
                            color="#b71c1c")
                t = [p["time_ms_median"] for p in pts]
                # results before 2026-11-29 took p10/p90 from rank 0 but the median from the slowest
                # rank; clip so such spreads still draw (new results are consistent by construction)
                lo = [max(0.0, p["time_ms_median"] - (p.get("time_ms_p10") or p["time_ms_median"])) for p in pts]
                hi = [max(0.0, (p.get("time_ms_p90") or p["time_ms_median"]) - p["time_ms_median"]) for p in pts]
                axt.errorbar(x, t, yerr=[lo, hi], ls=ls, marker=mk, color=color, capsize=3)
    if not any_pts:
        empty(ax, "No all-reduce sweep results.")
        axt.set_axis_off()
    else:
        for a in (ax, axt):
            a.set_xscale("log", base=2)
            a.set_xlabel("payload per rank, MiB (log scale)")
            a.xaxis.set_major_formatter(FuncFormatter(lambda x, _p: f"{x:g}"))
            a.set_yscale("log")
        ax.set_ylabel("bus bandwidth, GB/s (log scale)")
        ax.set_title("busbw = S/t x 2(k-1)/k (nccl-tests): per-link traffic")
        axt.set_ylabel("time per all-reduce, ms (median, p10-p90 bars)")
        axt.set_title("time against payload")
    extra = []
    for m in data.machines:
        extra += [f"{m.short}: {t}" for t in memcpy_training_text(m)]
    heads = []
    for m in data.machines:
        d, c = m.get("allreduce", "default", 2), m.get("allreduce", "memcpy", 2)
        pd = allreduce_at(d) if ok(d) else None
        if pd and ok(c) and (pc := allreduce_at(c, pd["MiB"])):
            heads.append(f"{m.short} {pc['busbw_GBps'] / pd['busbw_GBps']:.1f}x at {fmt_num(pd['MiB'])} MiB")
        elif pd:
            heads.append(f"{m.short} memcpy {c['status'] if c else 'not run'} "
                         f"(default {fmt_num(pd['busbw_GBps'])} GB/s busbw at {fmt_num(pd['MiB'])} MiB)")
    hung = [m.short for m in data.machines if any(r["status"] == "hung" for r in m.all("ddp_memcpy_training"))]
    head = "All-reduce bandwidth, memcpy switch vs NCCL default at k=2: " + ("; ".join(heads) if heads else "no data")
    if hung:
        head += ". The switch hung DDP training on: " + ", ".join(hung)
    legend = Legend()
    legend.machines(data, used_m)
    legend.header("transport (line)")
    for v in ("default", "memcpy"):
        if v in used_v:
            legend.add(Line2D([], [], color="#555", ls="-" if v == "default" else "--"), f"{v}: {VARIANT_TEXT[v]}")
    if used_k:
        legend.header("k (marker)")
        for k in sorted(used_k):
            legend.add(Line2D([], [], color="#555", ls="none", marker=K_MARKER.get(k, "v")), f"k={k}")
    if data.book and data.book.variants("allreduce"):
        legend.header("book (64 MB, k=2)")
        legend.add(Line2D([], [], color=BOOK_COLOR, ls="none", marker="*", ms=12), "default (filled), memcpy (open)")
    return finish(fig, head, "The book quotes 2S/t ('effective bytes/device/s'), which is twice busbw at k=2.   "
                  + machines_line(data, used_m), notes.text(extra + absent(data, "allreduce")), legend=legend)


def fig_bucket_sweep(data: ReportData):
    fig, axes = new_figure(2, 1, height=5.2)
    ax, axt = axes[0]
    notes = Notes()
    heads, used = [], []
    labels = []
    for m in data.measured:
        color = color_of(data, m)
        by_k: dict = {}
        for row in bucket_rows(m):
            by_k.setdefault(row["k"], []).append(row)
        for k, rows in by_k.items():
            if rows[0]["status"] != "ok":
                notes.add(m, m.get("ddp_bucket_sweep", "default", k), f"bucket sweep k={k}")
                continue
            if m not in used:
                used.append(m)
            rows = sorted(rows, key=lambda r: r["bucket_cap_MiB"])
            x = [r["bucket_cap_MiB"] for r in rows]
            mk = K_MARKER.get(k, "v")
            ax.plot(x, [r["samples_per_s"] for r in rows], marker=mk, color=color)
            for r in rows:
                labels.append((r["bucket_cap_MiB"], r["samples_per_s"], f"{r['n_buckets']} buckets", color))
                if r["best"]:
                    ax.plot([r["bucket_cap_MiB"]], [r["samples_per_s"]], marker="*", ms=17, color=color, mec="black",
                            ls="none", zorder=4)
            med = [r["step_ms_median"] for r in rows]
            if all(v is not None for v in med):
                lo = [r["step_ms_median"] - (r["step_ms_p10"] or r["step_ms_median"]) for r in rows]
                hi = [(r["step_ms_p90"] or r["step_ms_median"]) - r["step_ms_median"] for r in rows]
                axt.errorbar(x, med, yerr=[lo, hi], marker=mk, color=color, capsize=3)
            best = max(rows, key=lambda r: r["samples_per_s"])
            worst = min(rows, key=lambda r: r["samples_per_s"])
            heads.append(f"{m.short} k={k}: best {fmt_num(best['bucket_cap_MiB'])} MiB, "
                         f"{best['samples_per_s'] / worst['samples_per_s']:.2f}x the worst "
                         f"({fmt_num(worst['bucket_cap_MiB'])} MiB)")
    if not used:
        empty(ax, "No bucket-sweep results.")
        axt.set_axis_off()
    else:
        for a in (ax, axt):
            a.set_xscale("log")
            a.axvline(25, color="gray", ls=":", lw=1)
            a.text(25, 0.98, "DDP default 25 MiB ", transform=blended_transform_factory(a.transData, a.transAxes),
                   fontsize=7, color="gray", ha="right", va="top")
            a.set_xlabel("bucket_cap_mb, MiB (log scale)")
            a.xaxis.set_major_formatter(FuncFormatter(lambda x, _p: f"{x:g}"))
        ax.set_ylabel("samples/s, all ranks")
        ax.set_title("throughput (star: best)")
        ax.margins(x=0.15, y=0.15)
        label_points(ax, labels)
        axt.set_ylabel("step time, ms (median, p10-p90 bars)")
        axt.set_title("step time")
        axt.margins(x=0.15)
    legend = Legend()
    legend.machines(data, used)
    head = "DDP gradient bucket size (exercise 1): " + ("; ".join(heads) if heads else "no data")
    return finish(fig, head, "Too small: many all-reduce launches; too large: the first all-reduce waits for most "
                  "of backward, so less overlap.   " + machines_line(data, used or data.measured),
                  notes.text(absent(data, "ddp_bucket_sweep")),
                  legend=legend)


# ---------------------------------------------------------------- FSDP

STATE_PARTS = [("params_MiB", "parameters", "#1f77b4"), ("grads_MiB", "gradients", "#ff7f0e"),
               ("optimizer_MiB", "optimizer state", "#2ca02c")]


def fig_fsdp(data: ReportData):
    ms = [m for m in data.measured if fsdp_rows(m)]
    fig, axes = new_figure(len(ms) + 1, 1, height=5.4,
                           gridspec_kw={"width_ratios": [1.2] * len(ms) + [1]})
    notes = Notes()
    heads = []
    for ax, m in zip(axes[0], ms):
        rows = fsdp_rows(m)
        ks = sorted({r["k"] for r in rows})
        top = max([r.get("state_MiB_per_rank") or 0 for r in rows if r["status"] == "ok"] or [0])
        for gi, k in enumerate(ks):
            rk = {r.get("wrapper"): r for r in rows if r["k"] == k}
            if any(r["status"] != "ok" for r in rk.values()):
                r = m.get("fsdp", "default", k)
                ax.text(gi, 0.03, r["status"].upper(), ha="center", va="bottom", rotation=90, color="#b71c1c",
                        transform=blended_transform_factory(ax.transData, ax.transAxes))
                notes.add(m, r, f"fsdp k={k}")
                continue
            for j, name in enumerate(("DDP", "FSDP")):
                r = rk.get(name)
                if not r:
                    continue
                x = gi + (j - 0.5) * 0.4
                bottom = 0
                for key, _lab, col in STATE_PARTS:
                    v = r.get(key) or 0
                    ax.bar(x, v, 0.38, bottom=bottom, color=col, alpha=0.55 if name == "DDP" else 0.95,
                           edgecolor="white", hatch="" if name == "FSDP" else "")
                    bottom += v
                peak = f" (peak {fmt_num(r['peak_mem_MiB_max'])})" if r.get("peak_mem_MiB_max") else ""
                ax.text(x, bottom + top * 0.01 if top else bottom, f"{name} {fmt_num(bottom)}{peak}", ha="center",
                        va="bottom", fontsize=6.5, rotation=90)
            if rk.get("DDP") and rk.get("FSDP"):
                ideal = (rk["DDP"]["state_MiB_per_rank"] or 0) / k
                ax.plot([gi + 0.2 - 0.19, gi + 0.2 + 0.19], [ideal, ideal], color="black", lw=1.5, ls="--")
        ax.set_xticks(range(len(ks)), [f"k={k}" for k in ks])
        ax.set_ylim(0, (top or 1) * 1.6)
        ax.set_ylabel("training state per rank, MiB (largest rank)")
        ax.set_title(m.name, fontsize=9.5)
        good = [r for r in rows if r.get("wrapper") == "FSDP" and r.get("state_ratio_fsdp_over_ddp")]
        if good:
            g = good[-1]
            heads.append(f"{m.short} {g['state_ratio_fsdp_over_ddp']:.2f}x DDP's at k={g['k']} (1/k = {1 / g['k']:.2f})")
    az = axes[0, -1]
    zr = zero_rows(data)
    bottom = [0.0] * len(zr)
    for key, lab, col in (("params_GB", "parameters (4P)", "#1f77b4"), ("grads_GB", "gradients (4P)", "#ff7f0e"),
                          ("optimizer_GB", "Adam moments (8P)", "#2ca02c")):
        vals = [r[key] for r in zr]
        az.bar(range(len(zr)), vals, 0.7, bottom=bottom, color=col)
        bottom = [b + v for b, v in zip(bottom, vals)]
    gpu = zr[0].get("gpu_GB", 80)
    az.axhline(gpu, color="#b71c1c", ls="--", lw=1.2)
    az.text(len(zr) - 0.6, gpu, f"{gpu:g} GB per GPU", color="#b71c1c", ha="right", va="bottom", fontsize=8)
    for i, r in enumerate(zr):
        az.text(i, r["total_GB"], f"{r['total_GB']:.0f} GB\n{'fits' if r['fits'] else 'no fit'}",
                ha="center", va="bottom", fontsize=8, fontweight="bold", color="#1b5e20" if r["fits"] else "#b71c1c")
    az.set_xticks(range(len(zr)), [f"{r['stage']}" + ("\n(DDP)" if r["stage"] == 0 else "") for r in zr])
    az.set_xlabel("ZeRO stage")
    az.set_ylabel("training state per GPU, GB (no activations)")
    n_params, kk = zr[0].get("n_params", 7e9), zr[0].get("k", 8)
    az.set_title(f"exercise 5: {n_params / 1e9:g}B params, {kk} x {gpu:g} GB", fontsize=9.5)
    az.set_ylim(0, max(r["total_GB"] for r in zr) * 1.25)
    legend = Legend()
    legend.header("training state (stacked)")
    for _key, lab, col in STATE_PARTS:
        legend.add(Patch(fc=col), lab + (" (Adam: 8P)" if lab.startswith("optim") else ""))
    legend.add(Patch(fc="#999", alpha=0.55), "pale: DDP (replicated); strong: FSDP")
    legend.add(Line2D([], [], color="black", ls="--"), "ideal FSDP: DDP's state / k")
    z0, z3 = zr[0], zr[-1]
    head = ("FSDP training state per rank: " + ("; ".join(heads) if heads else "no measurement")
            + f". Exercise 5: ZeRO-3 puts a {n_params / 1e9:g}B model in {z3['total_GB']:.0f} GB/GPU, "
            f"DDP would need {z0['total_GB']:.0f} GB")
    return finish(fig, head, "Measured: ResNet-18, SGD with momentum (parameters + gradients + momentum), MiB; "
                  "labels: total (and peak allocated on GPUs).   " + machines_line(data, ms),
                  notes.text(absent(data, "fsdp")),
                  legend=legend, wspace=0.35)


# ---------------------------------------------------------------- JAX

def fig_ddp_vs_jax(data: ReportData):
    fig, axes = new_figure(2, 1, height=5.4)
    ax, ae = axes[0]
    notes = Notes()
    ks, variants = set(), set()
    for exp, what, ls in (("ddp_weak", "DDP ", "-"), ("jax_weak", "JAX ", "--")):
        kk, vs = plot_throughput(ax, data, exp, notes, linestyle=ls, what=what)
        ks |= kk
        variants |= set(vs)
        for m in data.machines:
            for v in m.variants(exp):
                rows = [r for r in scaling(m, exp, v) if r["efficiency"] is not None]
                if rows:
                    ae.plot([r["k"] for r in rows], [100 * r["efficiency"] for r in rows], ls=ls,
                            marker=style_of(v)[1], color=color_of(data, m))
    legend = Legend()
    if not variants:
        empty(ax, "No DDP or JAX weak-scaling results.")
        ae.set_axis_off()
    else:
        for a in (ax, ae):
            k_axis(a, ks)
            a.set_xlabel(k_label(data, short=True))
        ax.set_yscale("log")
        ax.set_ylabel("samples/s, weak scaling (log scale)")
        ax.set_title("throughput (dotted: ideal)")
        ae.set_ylabel("weak-scaling efficiency, %")
        ae.axhline(100, color="gray", ls=":", lw=1)
        ae.set_ylim(0, 112)
        ae.set_title("efficiency: the scaling curve is the comparison")
        legend.machines(data, [m for m in data.machines if m.variants("ddp_weak") or m.variants("jax_weak")])
        legend.header("framework (line)")
        legend.add(Line2D([], [], color="#555", ls="-"), "PyTorch DDP, one process per device")
        legend.add(Line2D([], [], color="#555", ls="--"), "JAX jit + NamedSharding, one process")
        legend.header("variant (marker)")
        for v in ordered(variants):
            legend.add(Line2D([], [], color="#555", ls="none", marker=style_of(v)[1]), f"{v}: {VARIANT_TEXT.get(v, v)}")
    heads = []
    for m in data.machines:
        vd, vj = primary_variant(m, "ddp_weak"), primary_variant(m, "jax_weak")
        if not vd or not vj:
            continue
        ed = {r["k"]: r["efficiency"] for r in scaling(m, "ddp_weak", vd)}
        ej = {r["k"]: r["efficiency"] for r in scaling(m, "jax_weak", vj)}
        both = sorted(k for k in ed if k > 1 and ed[k] is not None and ej.get(k) is not None)
        if both:
            k = both[-1]
            heads.append(f"{m.short} k={k}: JAX {pct(ej[k])} vs DDP {pct(ed[k])}")
    head = "Weak-scaling efficiency, JAX vs DDP: " + ("; ".join(heads) if heads else "no pair measured")
    return finish(fig, head, "Absolute samples/s is not a framework shoot-out (different input paths).   "
                  + machines_line(data), notes.text(absent(data, "ddp_weak", "jax_weak")), legend=legend)


def fig_jax_hlo(data: ReportData):
    fig, axes = new_figure(1, 1, height=5.0)
    ax = axes[0, 0]
    notes = Notes()
    heads, used = [], []
    drawn = False
    vlines = []
    for m in data.machines:
        color = color_of(data, m)
        for r in m.all("jax_hlo"):
            if not ok(r):
                notes.add(m, r, f"jax_hlo k={r['k']}")
                continue
            h = hlo_summary(r)
            sizes = sorted(h["sizes"], reverse=True)
            mk = K_MARKER.get(r["k"], "v")
            if m not in used:
                used.append(m)
            if sizes:
                ax.plot(range(1, len(sizes) + 1), sizes, marker=mk, ms=4, color=color, ls="-", lw=1)
                drawn = True
            elif h["largest_floats"]:
                ax.plot([1], [h["largest_floats"]], marker="*", ms=15, color=color, ls="none")
                drawn = True
            if h["n_allreduce"]:
                vlines.append((h["n_allreduce"], color, f"{m.short} k={r['k']}: {h['n_allreduce']} ops"))
            if h["n_allreduce"] is not None:
                two = h.get("largest_two") or []
                heads.append(f"{m.short} k={r['k']}: {h['n_allreduce']} all-reduces"
                             + (f", largest {h['largest_floats'] / 1e6:.1f}M floats" if h["largest_floats"] else "")
                             + (f", two largest {sum(two) / 1e6:.1f}M" if len(two) > 1 else ""))
    heads += [f"{m.short}: no census" for m in data.measured if not any(ok(r) for r in m.all("jax_hlo"))]
    legend = Legend()
    if not drawn:
        empty(ax, "No all-reduce census (jax_hlo) recorded.")
    else:
        ax.set_yscale("log")
        ax.set_xlabel("all-reduce ops in the compiled step, largest first")
        ax.set_ylabel("elements summed per all-reduce (floats, log)")
        grads = next((metric(r, "grad_floats") for m in data.measured for r in m.all("jax_hlo")
                      if metric(r, "grad_floats")), None)
        if grads is None and data.book:
            grads = ((data.book.book or {}).get("model") or {}).get("params")
        try:
            grads = float(grads) if grads else None
        except (TypeError, ValueError):
            grads = None
        if grads:
            ax.axhline(grads, color="gray", ls=":", lw=1)
            lo, hi = ax.get_ylim()
            ax.set_ylim(lo, max(hi, grads * 2.5))
            ax.text(0.99, grads, f"{grads / 1e6:.1f}M = all gradients (parameter count) ", ha="right", va="bottom",
                    fontsize=7.5, color="gray", transform=blended_transform_factory(ax.transAxes, ax.transData))
        for i, (n, color, text) in enumerate(vlines):
            ax.axvline(n, color=color, ls=":", lw=1)
            ax.text(n, 0.6 - 0.07 * i, text + " ", color=color, fontsize=7.5, ha="right",
                    transform=blended_transform_factory(ax.transData, ax.transAxes))
        legend.machines(data, used)
        legend.header("marks")
        legend.add(Line2D([], [], color="#555", marker="o", ms=4), "every all-reduce, by size")
        legend.add(Line2D([], [], color="#555", marker="*", ms=12, ls="none"), "largest only (book)")
        legend.add(Line2D([], [], color="#555", ls=":"), "number of all-reduce ops")
    head = "All-reduces XLA inserted into the compiled step: " + ("; ".join(heads) if heads else "no census")
    return finish(fig, head, "A few large fused gradient sums and many small ones (batch-norm statistics over the "
                  "global batch).   " + machines_line(data, used or data.measured),
                  notes.text(absent(data, "jax_hlo")), legend=legend)


# ---------------------------------------------------------------- k=8

def fig_k8(data: ReportData, target: int = 8):
    fig, axes = new_figure(1, 1, height=5.4)
    ax = axes[0, 0]
    notes = Notes()
    heads, used, labels = [], [], []
    any_meas8 = False
    for m in data.machines:
        v = primary_variant(m, "ddp_weak")
        if not v:
            continue
        color = color_of(data, m)
        eff_all = weak_efficiencies(m, v)
        eff = {k: e for k, e in eff_all.items() if k < target}
        if not eff or max(eff) < 2:
            for r in m.series("ddp_weak", v).values():
                if not ok(r):
                    notes.add(m, r, f"ddp_weak {v} k={r['k']}")
            continue
        used.append(m)
        ks = sorted(eff)
        ax.plot(ks, [100 * eff[k] for k in ks], marker="o", color=color, lw=2)
        pred = costmodel.weak_efficiency_k(eff, target)
        k0 = pred["from_k"]
        for key, ls in (("flat", "--"), ("ring", ":")):
            ax.plot([k0, target], [100 * eff[k0], 100 * pred[key]], ls=ls, color=color, lw=1.6)
            labels.append((target, 100 * pred[key], f"{m.short} [{v}] {key} {100 * pred[key]:.0f}%", color))
        who = "book's numbers" if m.kind == "book" else m.short
        heads.append(f"{who} {pct(pred['flat'])} flat / {pct(pred['ring'])} ring (from k={k0})")
        if target in eff_all:
            any_meas8 = True
            ax.plot([target], [100 * eff_all[target]], marker="*", ms=17, color=color, mec="black", ls="none", zorder=5)
            labels.append((target, 100 * eff_all[target], f"{m.short} measured {pct(eff_all[target])}", color))
            heads[-1] += f", measured {pct(eff_all[target])}"
        elif (r8 := m.get("ddp_weak", v, target)) is not None:
            notes.add(m, r8, f"ddp_weak {v} k={target}")
    legend = Legend()
    if not used:
        empty(ax, "Exercise 6 needs weak-scaling runs at k=1 and at some k >= 2.")
    else:
        k_axis(ax, [1, 2, 4, target])
        ax.set_xlim(0.8, target * 3.2)
        ax.axhline(100, color="gray", ls=":", lw=1)
        ax.set_ylim(0, 110)
        ax.set_xlabel(k_label(data))
        ax.set_ylabel("weak-scaling efficiency, %")
        label_points(ax, labels, gap=0.04)
        legend.machines(data, used)
        legend.header("line")
        legend.add(Line2D([], [], color="#555", marker="o", lw=2), "measured (k < 8)")
        legend.add(Line2D([], [], color="#555", ls="--"), "predicted, flat t_comm (Eq. 13.5.2)")
        legend.add(Line2D([], [], color="#555", ls=":"), "predicted, ring 2(k-1)/k (Eq. 13.5.1)")
        if any_meas8:
            legend.add(Line2D([], [], color="#555", marker="*", ms=12, ls="none"), f"measured k={target}")
    head = f"Exercise 6, weak-scaling efficiency at k={target}: " + ("; ".join(heads) if heads else "no data")
    return finish(fig, head, "e = t_c / (t_c + t_comm); t_comm/t_c from the largest measured k below "
                  f"{target}, then held flat or grown as 2(k-1)/k; a measured k={target} was not used to predict.   "
                  + machines_line(data, used or data.machines), notes.text(), legend=legend)


# ---------------------------------------------------------------- all

DRAW = {
    "status": fig_status,
    "scaling_weak": lambda d: fig_scaling(d, "ddp_weak"),
    "scaling_strong": lambda d: fig_scaling(d, "ddp_strong"),
    "efficiency": fig_efficiency,
    "loader": fig_loader,
    "tuned": fig_tuned,
    "comm_probe": fig_comm_probe,
    "allreduce": fig_allreduce,
    "bucket_sweep": fig_bucket_sweep,
    "fsdp_memory": fig_fsdp,
    "ddp_vs_jax": fig_ddp_vs_jax,
    "jax_hlo": fig_jax_hlo,
    "k8_prediction": fig_k8,
}
assert set(DRAW) == set(FIGURES), "every figure the report declares has a drawing function"


def draw_all(data: ReportData, figdir: Path) -> dict[str, str]:
    """Draw every figure; return {name: headline}. One that raises is replaced by a
    figure saying so, and the error is raised after the others are written, so the
    rule still fails loudly."""
    figdir = Path(figdir)
    errors, headlines = [], {}
    for name, fn in DRAW.items():
        try:
            fig = fn(data)
        except Exception as e:  # noqa: BLE001
            plt.close("all")
            errors.append((name, e))
            fig, axes = new_figure(1, 1, height=3)
            empty(axes[0, 0], f"figure {name} failed: {type(e).__name__}: {e}")
        headlines[name] = getattr(fig, "dpscale_headline", "")
        save(fig, figdir, name)
    if errors:
        name, e = errors[0]
        raise RuntimeError(f"figure {name!r} failed: {type(e).__name__}: {e}") from e
    return headlines
