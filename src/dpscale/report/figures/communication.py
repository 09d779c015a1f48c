"""Figures of the communication chapter: the probe against its predictions, the
all-reduce's bus bandwidth against payload, throughput against bucket size."""
from __future__ import annotations

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from dpscale.analysis import costmodel
from dpscale.report.chapters.communication import bucket_records
from dpscale.report.machines import Machine, ReportData
from dpscale.report.numbers import allreduce_table, fmt_num, probe_rows
from dpscale.report.figures import kit

PROBE_BARS = (("comm_ms", "measured: synced - no_sync, median of pairs", None),
              ("pred_flat_ms", "predicted, flat: 2N/beta, beta measured at k=2", "//"),
              ("pred_ring_ms", "predicted, ring: 2(k-1)/k N / busbw(k=2)", "\\\\"),
              ("pred_book_ms", "predicted with the book's beta = 4.5 GB/s (the book's box)", ".."))


def _probe_panel(ax, data: ReportData, m: Machine) -> None:
    color, rows = kit.color_of(data, m), probe_rows(m)
    for gi, row in enumerate(rows):
        if row["status"] != "ok":
            ax.text(0, gi, f" k={row['k']}: {row['status']}", va="center", fontsize=9, color="#b71c1c")
            continue
        for bi, (key, _text, hatch) in enumerate(PROBE_BARS):
            v, y = row.get(key), gi + (bi - 1.5) * 0.2
            if v is None or (key == "pred_book_ms" and m.kind != "book"):   # the book's beta: its own box only
                continue
            measured = key == "comm_ms" and row["comm_lo"] is not None
            err = [[v - row["comm_lo"]], [row["comm_hi"] - v]] if measured else None
            ax.barh(y, v, 0.19, color=color if hatch is None else "white", ec=color, hatch=hatch, xerr=err, capsize=2)
            kit.bar_label(ax, v, row["comm_hi"] if measured else None, y, fmt_num(v))
    ax.set_yticks(range(len(rows)), [f"k={r['k']}" for r in rows])
    ax.invert_yaxis()
    ax.axvline(0, color="black", lw=0.8)
    ax.margins(x=0.25)
    ax.set_xlabel("communication per step, ms")
    ax.set_title(m.name, loc="left")


def comm_probe(data: ReportData):
    ms = [m for m in data.machines if probe_rows(m)]
    fig = kit.stacked(ms, [len(probe_rows(m)) for m in ms], lambda ax, m: _probe_panel(ax, data, m),
                      "No ddp_comm_probe results (the probe needs k >= 2).", row_in=1.2, pad_in=0.6)
    kit.legend(fig, [(Patch(fc="#777" if h is None else "white", ec="#555", hatch=h), t) for _k, t, h in PROBE_BARS])
    return fig


def _median_points(p: dict, k: int) -> tuple:
    """(time, busbw, their bounds) of the median call. The bars are the median's interval,
    so the point they sit on is the median; nccl-tests' mean (the tables' time_us) can lie
    outside it when a few calls are slow, and a bar would then point the wrong way."""
    t = p.get("time_us_median") or p["time_us"]
    lo, hi = p.get("time_us_ci95") or (None, None)
    bw = costmodel.busbw(p["bytes"], 1e-6 * t, k) / 1e9
    if lo is None or not lo <= t <= hi:
        return t, bw, (None, None), (None, None)
    return t, bw, (lo, hi), (bw * t / hi, bw * t / lo)


def _allreduce_series(ax, axt, data: ReportData, m: Machine, used: set) -> None:
    color = kit.color_of(data, m)
    for v in m.variants("allreduce"):
        for k, r in m.series("allreduce", v).items():
            table = allreduce_table(r)
            pts = sorted(table.get("out_of_place") or table.get("in_place") or [], key=lambda p: p["bytes"])
            if not pts:
                continue
            used.add((v, k))
            mib = [p["bytes"] / 2**20 for p in pts]
            if m.kind == "book":
                ax.plot(mib, [p["busbw_GBps"] for p in pts], ls="none", marker="*", ms=15, color=color,
                        mfc=color if v == "default" else "white")
                continue
            style = dict(ls="-" if v == "default" else "--", marker=kit.K_MARKER.get(k, "v"), color=color, capsize=3)
            med = [_median_points(p, k) for p in pts]
            kit.errorbars(ax, mib, [q[1] for q in med], [q[3][0] for q in med], [q[3][1] for q in med], **style)
            kit.errorbars(axt, mib, [q[0] for q in med], [q[2][0] for q in med], [q[2][1] for q in med], **style)
            bad = [(x, q[1]) for x, q, p in zip(mib, med, pts) if p.get("wrong")]
            ax.plot([b[0] for b in bad], [b[1] for b in bad], ls="none", marker="X", ms=12, color="#b71c1c")


def allreduce(data: ReportData):
    fig, axes = kit.new(2, 1, height=4.4)
    ax, axt = axes[0]
    used: set = set()
    for m in data.machines:
        _allreduce_series(ax, axt, data, m, used)
    if not used:
        kit.empty(ax, "No all-reduce sweep results.")
        axt.set_axis_off()
        return fig
    for a in (ax, axt):
        kit.log2_axis(a, "payload, MiB (log)")
        a.set_yscale("log")
    ax.set_ylabel("bus bandwidth, GB/s (log)")
    ax.set_title("busbw = S/t x 2(k-1)/k")
    axt.set_ylabel("time per all-reduce, us (log)")
    axt.set_title("time against payload")
    kit.key(fig, data, [m for m in data.machines if m.variants("allreduce")],
            styles=[("-", "NCCL default"), ("--", "NCCL_SHM_USE_CUDA_MEMCPY=1")],
            markers=[(kit.K_MARKER.get(k, "v"), f"k={k}") for k in sorted({k for _v, k in used})],
            extra=kit.marker_entries([("X", "a wrong sum at this size")], color="#b71c1c"))
    return fig


def bucket_sweep(data: ReportData):
    fig, ax = kit.panel(4.2)
    used = []
    for m in data.measured:
        for k in m.ks("ddp_bucket_sweep"):
            rows = sorted((r for r in bucket_records(m) if r["k"] == k and r["status"] == "ok"),
                          key=lambda r: r["bucket_cap_MiB"])
            if not rows:
                continue
            used.append(m)
            x, y = [r["bucket_cap_MiB"] for r in rows], [r["samples_per_s"] for r in rows]
            lo = [r["samples_per_s"] * r["step_ms_median"] / r["step_ms_interval"][1] if r["step_ms_interval"][1]
                  else None for r in rows]
            hi = [r["samples_per_s"] * r["step_ms_median"] / r["step_ms_interval"][0] if r["step_ms_interval"][0]
                  else None for r in rows]
            kit.errorbars(ax, x, y, lo, hi, marker=kit.K_MARKER.get(k, "v"), color=kit.color_of(data, m), capsize=3)
            for r in rows:
                ax.annotate(f"{r['n_buckets']}", (r["bucket_cap_MiB"], r["samples_per_s"]), xytext=(6, 4),
                            textcoords="offset points", ha="left", fontsize=9)
    if not used:
        kit.empty(ax, "No bucket-sweep results.")
        return fig
    kit.log2_axis(ax, "bucket_cap_mb, MiB (log); labels: the number of buckets DDP built")
    ax.axvline(25, color="gray", ls=":", lw=1)
    ax.set_ylabel("samples/s, all ranks")
    ax.margins(x=0.1, y=0.2)
    kit.legend(fig, kit.machine_entries(data, list(dict.fromkeys(used)))
               + [(Line2D([], [], color="gray", ls=":"), "DDP's default, 25 MiB")])
    return fig
