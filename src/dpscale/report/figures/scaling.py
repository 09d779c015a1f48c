"""Figures of the scaling chapter: samples/s and efficiency against k, every
machine and variant, with the 95% interval over the timed epochs as error bars."""
from __future__ import annotations

from matplotlib.lines import Line2D

from dpscale import registry
from dpscale.report.machines import ReportData
from dpscale.report.numbers import scaling
from dpscale.report.figures import kit


def _marks(ax, data: ReportData, experiment: str) -> None:
    """One x per machine and k that has a planned series without a number."""
    for slot, m in enumerate(data.machines):
        by_k: dict[int, set] = {}
        for v in m.variants(experiment):
            for r in scaling(m, experiment, v):
                if r["status"] != "ok":
                    by_k.setdefault(r["k"], set()).add(r["status"])
        for k, statuses in by_k.items():
            kit.mark_missing(ax, k, f"{m.label}: {'/'.join(sorted(statuses))}", kit.color_of(data, m), slot)


def draw_series(ax, data: ReportData, experiment: str, value: str = "mean", ideal: bool = True,
                linestyle: str | None = None) -> tuple[set, list]:
    """Every machine x variant of `experiment`; returns the ks seen and the variants drawn."""
    ks, drawn = set(), []
    lo, hi = ("ci_lo", "ci_hi") if value == "mean" else (f"{value}_lo", f"{value}_hi")
    scale = 100 if value == "efficiency" else 1
    for m in data.machines:
        for v in m.variants(experiment):
            rows = scaling(m, experiment, v)
            ks |= {r["k"] for r in rows}
            good = [r for r in rows if r[value] is not None]
            if not good:
                continue
            drawn.append(v)
            ls, mk = kit.style_of(v)
            kit.errorbars(ax, [r["k"] for r in good], [scale * r[value] for r in good],
                          [None if r[lo] is None else scale * r[lo] for r in good],
                          [None if r[hi] is None else scale * r[hi] for r in good],
                          ls=linestyle or ls, marker=mk, color=kit.color_of(data, m), capsize=3)
            base = next((r for r in good if r["k"] == 1), None)
            if ideal and base:
                kk = sorted({r["k"] for r in rows})
                ax.plot(kk, [base[value] * k for k in kk], ls=":", color=kit.color_of(data, m), lw=1, alpha=0.6)
    return ks, list(dict.fromkeys(drawn))


def _throughput(data: ReportData, experiment: str):
    fig, ax = kit.panel(4.6)
    ks, variants = draw_series(ax, data, experiment)
    if not variants:
        kit.empty(ax, f"No {experiment} measurement produced a number on any machine.")
        return fig
    kit.k_axis(ax, ks)
    kit.log_y(ax, "samples/s, all ranks (log)")
    ax.set_xlabel("k = devices (GPUs, or CPU stand-ins)")
    _marks(ax, data, experiment)
    texts = {v.name: v.text for v in registry.get(experiment).variants}
    kit.legend(fig, kit.machine_entries(data, [m for m in data.machines if m.variants(experiment)])
               + kit.variant_entries(variants, texts)
               + [(Line2D([], [], ls=":", color="gray"), "ideal: k x the series' k=1"),
                  (Line2D([], [], ls="none", marker="x", color="gray", mew=2), "planned, no number")])
    return fig


def scaling_weak(data: ReportData):
    return _throughput(data, "ddp_weak")


def scaling_strong(data: ReportData):
    return _throughput(data, "ddp_strong")


def efficiency(data: ReportData):
    fig, axes = kit.new(2, 1, height=4.2)
    variants = []
    for ax, exp, title in zip(axes[0], ("ddp_weak", "ddp_strong"), ("weak", "strong")):
        ks, drawn = draw_series(ax, data, exp, value="efficiency", ideal=False)
        variants += drawn
        if not drawn:
            kit.empty(ax, f"no {exp} efficiency (needs k=1 and k >= 2)")
            continue
        kit.k_axis(ax, ks)
        ax.axhline(100, color="gray", ls=":", lw=1)
        ax.set_ylim(0, 115)
        ax.set_xlabel("k")
        ax.set_ylabel(f"{title}-scaling efficiency, %")
        ax.set_title(f"{title} scaling")
    texts = {v.name: v.text for v in registry.get("ddp_weak").variants}
    kit.legend(fig, kit.machine_entries(data, [m for m in data.machines if m.variants("ddp_weak")])
               + kit.variant_entries(list(dict.fromkeys(variants)), texts))
    return fig
