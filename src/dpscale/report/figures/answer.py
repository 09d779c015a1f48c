"""The first screen's figure: speed-up over one device, samples/s and time to accuracy."""
from __future__ import annotations

from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from dpscale.report.chapters.answer import speedups
from dpscale.report.machines import ReportData
from dpscale.report.figures import kit


def answer(data: ReportData):
    fig, axes = kit.new(height=4.4)
    ax, used, ks = axes[0, 0], [], set()
    for m in data.machines:
        rows = speedups(data, m)
        color = kit.color_of(data, m)
        thr = [r for r in rows if r["throughput"] is not None]
        tta = [r for r in rows if r["tta"] is not None]
        if thr:
            ax.plot([r["k"] for r in thr], [r["throughput"] for r in thr], ls="-", marker="o", color=color)
        for r in tta:
            ax.plot([r["k"]], [r["tta"]], marker="s", ms=7, color=color, mfc="white" if r["emulated"] else color)
        if tta:
            ax.plot([r["k"] for r in tta], [r["tta"] for r in tta], ls="--", color=color)
        if thr or tta:
            used.append(m)
            ks |= {r["k"] for r in thr + tta}
    if not used:
        kit.empty(ax, "No scaling result yet.")
        return fig
    k_all = sorted(ks | {1})
    ax.plot(k_all, k_all, color="gray", lw=4, alpha=0.25)
    kit.k_axis(ax, k_all)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _p: f"{y:g}x"))
    ax.set_ylabel("speed-up over k=1")
    ax.set_xlabel("k (devices; hollow: emulated)")
    entries = kit.machine_entries(data, used) + [
        (Line2D([], [], color="#555", marker="o"), "samples/s (weak scaling)"),
        (Line2D([], [], color="#555", ls="--", marker="s"), "time to accuracy (book's LR rule)"),
        (Line2D([], [], color="#555", ls="--", marker="s", mfc="white"), "time to accuracy, k emulated"),
        (Line2D([], [], color="gray", lw=4, alpha=0.25), "ideal: k")]
    kit.legend(fig, entries, ncol=2)
    return fig
