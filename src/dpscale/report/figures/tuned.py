"""The tuned figure: per machine, per-device samples/s of the book's protocol and the
tuned series, MFU beside each bar, and where MFU = 1 would be."""
from __future__ import annotations

import statistics

from matplotlib.patches import Patch

from dpscale import registry
from dpscale.report.chapters.tuned import GROUPS, per_device, smallest_k, tuned_variants
from dpscale.report.machines import Machine, ReportData
from dpscale.report.numbers import fmt_num, metric, ok
from dpscale.report.figures import kit

SHADES = ("#9e9e9e", "#1f77b4", "#ff7f0e", "#d62728")


def mfu_one(m: Machine, k: int) -> float | None:
    """samples/s per device at MFU = 1: the measured bf16 matmul peak over the counted FLOPs."""
    vals = [1e12 * metric(r, "bf16_matmul_peak_TFLOPs") / metric(r, "flops_per_sample")
            for e, _f, vs in GROUPS for v in vs if ok(r := m.get(e, v, k))
            and metric(r, "bf16_matmul_peak_TFLOPs") and metric(r, "flops_per_sample")]
    return statistics.median(vals) if vals else None


def roofline_bound(m: Machine, k: int) -> float | None:
    """samples/s per device at the ideal-fusion roofline, as the tuned jobs computed it."""
    vals = [metric(r, "roofline_samples_per_s") for e, _f, vs in GROUPS for v in tuned_variants(e, vs)
            if ok(r := m.get(e, v, k)) and metric(r, "roofline_samples_per_s")]
    return statistics.median(vals) if vals else None


def _panel(ax, m: Machine) -> None:
    k, y, labels, ticks = smallest_k(m), 0, [], []
    top = 1.0
    for e, framework, variants in GROUPS:
        for v, shade in zip(variants, SHADES):
            r = m.get(e, v, k)
            val, lo, hi = per_device(r)
            labels.append(f"{framework} {v}")
            ticks.append(y)
            if val is not None:
                ax.barh(y, val, 0.75, color=shade, xerr=[[val - lo], [hi - val]] if lo else None, capsize=2)
                mfu = metric(r, "mfu")
                kit.bar_label(ax, val, hi if lo else None, y, fmt_num(val) + (f"  MFU {mfu:.2f}" if mfu else ""))
                top = max(top, val)
            elif r is not None:
                ax.text(0, y, f" {r['status']}", va="center", fontsize=9, color="#b71c1c")
            else:   # a row of the comparison this machine's plan left out (the smoke plan has no tuned series)
                ax.text(0, y, " not planned here", va="center", fontsize=9, color="#777777")
            y += 1
        y += 0.5
    for value, text, ls in ((mfu_one(m, k), "MFU = 1", ":"), (roofline_bound(m, k), "roofline", "--")):
        if value:
            ax.axvline(value, color="#444", ls=ls, lw=1.2)
            ax.text(value, -0.9, f"{text}: {fmt_num(value)} ", ha="right", fontsize=9, color="#444")
            top = max(top, value)
    ax.set_yticks(ticks, labels)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.35)
    ax.set_xlabel(f"samples/s per device at k={k}")
    ax.set_title(m.name, loc="left")


def tuned(data: ReportData):
    ms = [m for m in data.measured if smallest_k(m) is not None]
    fig = kit.stacked(ms, [1] * len(ms), _panel, "No DDP or JAX throughput results: nothing to compare.",
                      row_in=3.0, pad_in=0.0, base_in=0.8)
    entries = [(Patch(fc=shade), f"{f} {v}: {registry.variant_text(e, v)}")
               for e, f, vs in GROUPS for v, shade in zip(vs, SHADES)]
    kit.legend(fig, entries, ncol=2)
    return fig
