"""The status grid: every planned job of every machine, coloured by how it ended."""
from __future__ import annotations

from matplotlib.patches import Patch, Rectangle

from dpscale import registry
from dpscale.report.machines import STATUSES, Machine, ReportData
from dpscale.report.figures import kit


def grid_rows(m: Machine) -> list[tuple[str, str]]:
    """(experiment, variant) rows, in the registry's order."""
    present = {e for (e, _v, _k) in m.results}
    order = [e for e in registry.names() if e in present] + sorted(present - set(registry.names()))
    return [(e, v) for e in order for v in m.variants(e)]


def _panel(ax, m: Machine) -> None:
    rows, ks = grid_rows(m), m.ks()
    for i, (e, v) in enumerate(rows):
        y = len(rows) - 1 - i
        for j, k in enumerate(ks):
            r = m.get(e, v, k)
            if r is None:
                ax.add_patch(Rectangle((j, y), 1, 1, fc="#fafafa", ec="#eeeeee"))
                continue
            st = r["status"]
            ax.add_patch(Rectangle((j, y), 1, 1, fc=kit.STATUS_COLOR[st], ec="#bbbbbb" if st == "not run" else "white",
                                   lw=1.5, ls="--" if st == "not run" else "-"))
            ax.text(j + 0.5, y + 0.5, st, ha="center", va="center", fontsize=9,
                    fontweight="bold" if st in ("hung", "failed") else "normal")
    ax.set_xlim(0, len(ks))
    ax.set_ylim(0, len(rows))
    ax.set_xticks([j + 0.5 for j in range(len(ks))], [f"k={k}" for k in ks])
    ax.xaxis.tick_top()
    ax.set_yticks([len(rows) - 1 - i + 0.5 for i in range(len(rows))], [f"{e} / {v}" for e, v in rows], fontsize=9)
    ax.grid(False)
    ax.tick_params(length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    ax.set_title(m.name, loc="left", fontweight="bold")


def status(data: ReportData):
    ms = [m for m in data.measured if m.results]
    fig = kit.stacked(ms, [max(1, len(grid_rows(m))) for m in ms], _panel, "no machines with results",
                      row_in=0.26, pad_in=0.5, base_in=0.9)
    kit.legend(fig, [(Patch(fc=kit.STATUS_COLOR[s], ec="#bbbbbb"), s) for s in STATUSES]
               + [(Patch(fc="#fafafa", ec="#eeeeee"), "not planned at this k")], ncol=3)
    return fig
