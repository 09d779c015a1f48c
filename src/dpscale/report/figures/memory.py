"""FSDP's training state per rank against DDP's over k, and exercise 5's ZeRO stages."""
from __future__ import annotations

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from dpscale.report.chapters.memory import fsdp_rows, zero_rows
from dpscale.report.machines import ReportData
from dpscale.report.figures import kit


def _state_panel(ax, data: ReportData) -> list:
    """State per rank against k: FSDP's (solid) should fall as DDP's / k (dotted)."""
    used = []
    for m in data.measured:
        rows = [r for r in fsdp_rows(m) if r["status"] == "ok"]
        by = {w: sorted((r for r in rows if r["wrapper"] == w), key=lambda r: r["k"]) for w in ("DDP", "FSDP")}
        if not by["FSDP"]:
            continue
        used.append(m)
        color = kit.color_of(data, m)
        for w, ls in (("DDP", ":"), ("FSDP", "-")):
            ax.plot([r["k"] for r in by[w]], [r["state_MiB_per_rank"] for r in by[w]], ls=ls, marker="o", color=color)
        if by["DDP"]:
            ks, ddp = [r["k"] for r in by["FSDP"]], by["DDP"][0]["state_MiB_per_rank"]
            ax.plot(ks, [ddp / k for k in ks], color="gray", lw=4, alpha=0.25)
    return kit.k_panel(ax, used, [r["k"] for m in used for r in fsdp_rows(m)], "training state per rank, MiB (log)",
                       "FSDP against DDP", "No FSDP result.")


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
    fig, axes = kit.new(2, 1, height=4.0, gridspec_kw={"width_ratios": [1.4, 1]})
    used = _state_panel(axes[0, 0], data)
    _zero_panel(axes[0, 1], data)
    entries = kit.machine_entries(data, used)
    entries += [(Line2D([], [], color="#555", ls="-", marker="o"), "FSDP: state sharded 1/k"),
                (Line2D([], [], color="#555", ls=":", marker="o"), "DDP: state replicated"),
                (Line2D([], [], color="gray", lw=4, alpha=0.25), "ideal FSDP: DDP's state / k"),
                (Patch(fc="#1f77b4"), "ZeRO: parameters (4P)"), (Patch(fc="#ff7f0e"), "gradients (4P)"),
                (Patch(fc="#2ca02c"), "Adam moments (8P)")]
    kit.legend(fig, entries, ncol=3)
    return fig
