"""DDP against JAX (throughput and efficiency), and the all-reduce census by size."""
from __future__ import annotations

from matplotlib.lines import Line2D

from dpscale.report.machines import ReportData
from dpscale.report.numbers import hlo_summary, ok
from dpscale.report.figures import kit
from dpscale.report.figures.scaling import draw_series


def ddp_vs_jax(data: ReportData):
    fig, axes = kit.new(2, 1, height=4.2)
    ax, ae = axes[0]
    ks, drawn = set(), []
    for exp, ls in (("ddp_weak", "-"), ("jax_weak", "--")):
        kk, vs = draw_series(ax, data, exp, linestyle=ls)
        _k2, _v2 = draw_series(ae, data, exp, value="efficiency", ideal=False, linestyle=ls)
        ks |= kk
        drawn += vs
    if not drawn:
        kit.empty(ax, "No DDP or JAX weak-scaling results.")
        ae.set_axis_off()
        return fig
    for a in (ax, ae):
        kit.k_axis(a, ks)
        a.set_xlabel("k")
    kit.log_y(ax, "samples/s, weak scaling (log)")
    ax.set_title("throughput (dotted: ideal)")
    ae.set_ylabel("weak-scaling efficiency, %")
    ae.axhline(100, color="gray", ls=":", lw=1)
    ae.set_ylim(0, 115)
    ae.set_title("efficiency: the comparison that holds")
    kit.key(fig, data, [m for m in data.machines if m.variants("ddp_weak") or m.variants("jax_weak")],
            styles=[("-", "PyTorch DDP, one process per device"), ("--", "JAX jit + NamedSharding, one process")],
            markers=[(kit.style_of(v)[1], v) for v in dict.fromkeys(drawn)])
    return fig


def jax_hlo(data: ReportData):
    fig, ax = kit.panel(3.8)
    used = []
    for m in data.machines:
        for r in (r for r in m.all("jax_hlo") if ok(r)):
            h, color = hlo_summary(r), kit.color_of(data, m)
            sizes = sorted(h["sizes"], reverse=True)
            if sizes:
                ax.plot(range(1, len(sizes) + 1), sizes, marker=kit.K_MARKER.get(r["k"], "v"), ms=4, color=color)
            elif h["largest_floats"]:
                ax.plot([1], [h["largest_floats"]], marker="*", ms=15, color=color, ls="none")
            used.append(m)
    if not used:
        kit.empty(ax, "No all-reduce census (jax_hlo) recorded.")
        return fig
    ax.set_yscale("log")
    ax.set_xlabel("all-reduce ops of the compiled step, largest first")
    ax.set_ylabel("elements summed (log)")
    grads = next((r["metrics"].get("grad_floats") for m in data.measured for r in m.all("jax_hlo") if ok(r)
                  and r["metrics"].get("grad_floats")), None)
    if grads:
        ax.axhline(grads, color="gray", ls=":", lw=1)
        ax.annotate(f"{grads / 1e6:.1f}M = every gradient", (1, grads), xytext=(4, 4), textcoords="offset points",
                    fontsize=9, color="gray")
    kit.legend(fig, kit.machine_entries(data, list(dict.fromkeys(used)))
               + [(Line2D([], [], color="#555", marker="*", ms=12, ls="none"), "the book's largest (its only size)")])
    return fig
