"""FSDP's state per rank against DDP's, stacked by part, and exercise 5's ZeRO stages."""
from __future__ import annotations

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..chapters.memory import STATE, fsdp_rows, zero_rows
from ..machines import Machine, ReportData
from ..numbers import fmt_num
from . import kit

PARTS = dict(zip(STATE, (("parameters", "#1f77b4"), ("gradients", "#ff7f0e"), ("optimizer state", "#2ca02c"))))


def _stack(ax, x: float, row: dict, alpha: float) -> float:
    bottom = 0.0
    for key, (_name, color) in PARTS.items():
        v = row.get(key) or 0
        ax.bar(x, v, 0.38, bottom=bottom, color=color, alpha=alpha, edgecolor="white")
        bottom += v
    return bottom


def _fsdp_panel(ax, m: Machine) -> None:
    rows = fsdp_rows(m)
    ks = sorted({r["k"] for r in rows})
    for gi, k in enumerate(ks):
        by = {r.get("wrapper"): r for r in rows if r["k"] == k}
        if any(r["status"] != "ok" for r in by.values()):
            ax.text(gi, 0, next(iter(by.values()))["status"], ha="center", va="bottom", fontsize=9, color="#b71c1c")
            continue
        for j, name in enumerate(("DDP", "FSDP")):
            total = _stack(ax, gi + (j - 0.5) * 0.4, by[name], 0.5 if name == "DDP" else 0.95)
            ax.text(gi + (j - 0.5) * 0.4, total, f"{name}\n{fmt_num(total)}", ha="center", va="bottom", fontsize=9)
        ideal = (by["DDP"]["state_MiB_per_rank"] or 0) / k
        ax.plot([gi + 0.01, gi + 0.39], [ideal, ideal], color="black", lw=1.5, ls="--")
    ax.set_xticks(range(len(ks)), [f"k={k}" for k in ks])
    ax.margins(y=0.3)
    ax.set_ylabel("state per rank, MiB")
    ax.set_title(m.label, loc="left")


def _zero_panel(ax, data: ReportData) -> None:
    zr = zero_rows(data)
    bottom = [0.0] * len(zr)
    for key, text, color in (("params_GB", "4P", "#1f77b4"), ("grads_GB", "4P", "#ff7f0e"),
                             ("optimizer_GB", "8P", "#2ca02c")):
        vals = [r[key] for r in zr]
        ax.bar(range(len(zr)), vals, 0.7, bottom=bottom, color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    gpu = zr[0].get("gpu_GB", 80)
    ax.axhline(gpu, color="#b71c1c", ls="--", lw=1.2)
    for i, r in enumerate(zr):
        ax.text(i, r["total_GB"], f"{r['total_GB']:.0f}", ha="center", va="bottom", fontsize=9,
                color="#1b5e20" if r["fits"] else "#b71c1c")
    ax.set_xticks(range(len(zr)), [str(r["stage"]) for r in zr])
    ax.set_xlabel("ZeRO stage")
    ax.set_ylabel("GB per GPU, no activations")
    ax.set_title(f"ex. 5: {zr[0].get('n_params', 7e9) / 1e9:g}B, {zr[0].get('k', 8)} x {gpu:g} GB", loc="left")
    ax.set_ylim(0, max(r["total_GB"] for r in zr) * 1.2)


def fsdp_memory(data: ReportData):
    ms = [m for m in data.measured if fsdp_rows(m)]
    fig, axes = kit.new(len(ms) + 1, 1, height=4.0)
    for ax, m in zip(axes[0], ms):
        _fsdp_panel(ax, m)
    _zero_panel(axes[0, -1], data)
    entries = [(Patch(fc=color), name) for name, color in PARTS.values()]
    entries += [(Patch(fc="#999", alpha=0.5), "pale: DDP (replicated), strong: FSDP"),
                (Line2D([], [], color="black", ls="--"), "ideal FSDP: DDP's state / k")]
    kit.legend(fig, entries, ncol=3)
    return fig
