"""Measured weak-scaling efficiency below k=8 and the two predictions at k=8."""
from __future__ import annotations

from matplotlib.lines import Line2D

from dpscale.report.machines import ReportData
from dpscale.report.numbers import k8_rows, scaling
from dpscale.report.figures import kit

TARGET = 8


def k8_prediction(data: ReportData):
    fig, axes = kit.new(height=4.2)
    ax = axes[0, 0]
    used = []
    rows = {(r["machine"], r["variant"]): r for r in k8_rows(data.machines, TARGET)}
    for m in data.machines:
        for v in ("seed",):
            pred = rows.get((m.name, v))
            if not pred:
                continue
            used.append(m)
            color = kit.color_of(data, m)
            eff = {r["k"]: 100 * r["efficiency"] for r in scaling(m, "ddp_weak", v) if r["efficiency"] is not None}
            below = sorted(k for k in eff if k < TARGET)
            ax.plot(below, [eff[k] for k in below], marker="o", color=color, lw=2)
            k0 = pred["from_k"]
            for key, ls in (("predicted_flat", "--"), ("predicted_ring", ":")):
                ax.plot([k0, TARGET], [eff[k0], 100 * pred[key]], ls=ls, color=color, lw=1.6)
            if pred["measured"] is not None:
                ax.plot([TARGET], [100 * pred["measured"]], marker="*", ms=16, color=color, mec="black", ls="none")
    if not used:
        kit.empty(ax, "Exercise 6 needs weak-scaling runs at k=1 and at some k >= 2.")
        return fig
    kit.k_axis(ax, [1, 2, 4, TARGET])
    ax.axhline(100, color="gray", ls=":", lw=1)
    ax.set_ylim(0, 110)
    ax.set_xlabel("k")
    ax.set_ylabel("weak-scaling efficiency, %")
    kit.legend(fig, kit.machine_entries(data, used)
               + [(Line2D([], [], color="#555", marker="o", lw=2), "measured, k < 8"),
                  (Line2D([], [], color="#555", ls="--"), "predicted, flat t_comm (Eq. 13.5.2)"),
                  (Line2D([], [], color="#555", ls=":"), "predicted, ring 2(k-1)/k (Eq. 13.5.1)"),
                  (Line2D([], [], color="#555", marker="*", ms=12, ls="none"), "measured k=8, not used to predict")])
    return fig
