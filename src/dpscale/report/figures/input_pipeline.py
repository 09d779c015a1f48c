"""The loader figure: per machine, samples/s of each input path at each k, as
horizontal bars with their 95% intervals."""
from __future__ import annotations

from matplotlib.patches import Patch

from dpscale import registry
from dpscale.report.chapters.input_pipeline import VARIANTS
from dpscale.report.machines import Machine, ReportData
from dpscale.report.numbers import fmt_num, point
from dpscale.report.figures import kit

COLORS = {"seed": "#9e9e9e", "cached": "#1f77b4", "tuned": "#ff7f0e"}


def _panel(ax, m: Machine) -> None:
    groups = [(e, k) for e in ("ddp_weak", "ddp_strong") for k in m.ks(e)]
    variants = [v for v in VARIANTS if any(m.get(e, v, k) for e, k in groups)]
    h = 0.8 / max(1, len(variants))
    top = max([point(r)[0] or 0 for r in m.results.values() if r["experiment"] in ("ddp_weak", "ddp_strong")] + [1])
    for gi, (e, k) in enumerate(groups):
        for i, v in enumerate(variants):
            y = gi + (i - (len(variants) - 1) / 2) * h
            r = m.get(e, v, k)
            val, lo, hi = point(r)
            if val is not None:
                err = [[val - lo], [hi - val]] if lo is not None else None
                ax.barh(y, val, h * 0.9, color=COLORS[v], xerr=err, capsize=2)
                kit.bar_label(ax, val, hi if lo is not None else None, y, fmt_num(val))
            elif r is not None:
                ax.barh(y, top * 0.03, h * 0.9, color="white", ec=COLORS[v], hatch="xx")
                ax.text(top * 0.04, y, r["status"], va="center", fontsize=9, color="#b71c1c")
    ax.set_yticks(range(len(groups)), [f"{e.split('_')[1]} k={k}" for e, k in groups])
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.25)
    ax.set_xlabel("samples/s, all ranks")
    ax.set_title(m.name, loc="left")


def loader(data: ReportData):
    ms = [m for m in data.measured if m.variants("ddp_weak") or m.variants("ddp_strong")]
    rows = [max(1, len(m.ks("ddp_weak")) + len(m.ks("ddp_strong"))) for m in ms]
    fig = kit.stacked(ms, rows, _panel, "No DDP throughput results: nothing to compare.", row_in=0.55)
    texts = {v.name: v.text for v in registry.get("ddp_weak").variants}
    kit.legend(fig, [(Patch(fc=COLORS[v]), f"{v}: {texts[v]}") for v in VARIANTS]
               + [(Patch(fc="white", ec="#888", hatch="xx"), "planned, no number")], ncol=2)
    return fig
