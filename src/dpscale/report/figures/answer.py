"""The first screen's figures: speed-up over one device against k, out to the throughput
forecast's nodes, this machine alone (answer), then the kept machines and the book
(answer_others). samples/s: measured (circles, 95% bars) and forecast (thin line, its
band); time to accuracy with evaluation on the clock: measured on real devices (filled
squares), emulated (hollow squares), both with 95% bars over seeds, and predicted (dashed,
its band), the k that reaches the target soonest starred; training only dotted."""
from __future__ import annotations

from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter, NullLocator

from dpscale.report.chapters.answer import opening
from dpscale.report.chapters.tta import numbers
from dpscale.report.machines import ReportData
from dpscale.report.figures import kit


def _band_line(ax, pts: list[dict], color: str, ls: str, lw: float = 1.6, band: bool = True) -> None:
    ks = [p["k"] for p in pts]
    ax.plot(ks, [p["value"] for p in pts], ls=ls, color=color, lw=lw)
    if band and all(p.get("lo") is not None and p.get("hi") is not None for p in pts):
        ax.fill_between(ks, [p["lo"] for p in pts], [p["hi"] for p in pts], color=color, alpha=0.15, lw=0)


def _throughput(ax, rows: list[dict], color: str, forecast: bool) -> tuple[set, bool]:
    """(the k drawn, whether the forecast's line was drawn)."""
    meas = [r["throughput"] | {"k": r["k"]} for r in rows if (r["throughput"] or {}).get("source") == "measured"]
    fc = [r["throughput"] | {"k": r["k"]} for r in rows if r["throughput"] and (forecast or r["k"] == 1)
          and (r["throughput"]["source"] == "forecast" or r["k"] == 1)]
    drew_fc = forecast and len(fc) > 1
    if drew_fc:
        _band_line(ax, fc, color, "-", lw=0.9)
    if meas:
        kit.errorbars(ax, [p["k"] for p in meas], [p["value"] for p in meas], [p["lo"] for p in meas],
                      [p["hi"] for p in meas], ls="-", marker="o", ms=6, color=color, capsize=3)
    return {p["k"] for p in meas} | ({p["k"] for p in fc} if drew_fc else set()), drew_fc


def _tta(ax, rows: list[dict], color: str, kinds: set) -> tuple[set, bool]:
    """Draws this machine's time to accuracy; adds to `kinds` what it drew (the legend's
    keys). Returns (the k it marked, whether it drew a measured or predicted speed-up): a
    forecast row without a value, or a point without samples/s, marks nothing and must
    not stretch the axis (a 2-core box's emulated k=4 did, to k=128)."""
    pts = [r["point"] for r in rows if r["point"] and r["point"].get("speedup_train") is not None]
    for p in pts:
        for key, marker, dx in (("speedup", "s", 1.0), ("speedup_train", "^", 1.06)):
            if p.get(key) is None:   # the clock form where this k's evaluations were not timed as a job's
                continue
            kinds.add("train" if key == "speedup_train" else "measured")
            if p["emulated"]:
                kinds.add("emulated")
            lo, hi = p.get(f"{key}_lo"), p.get(f"{key}_hi")
            if lo is not None and hi is not None:
                ax.errorbar([p["k"] * dx], [p[key]], yerr=[[p[key] - lo], [hi - p[key]]], color=color,
                            capsize=4, lw=1.2, zorder=4)
            ax.plot([p["k"] * dx], [p[key]], marker=marker, ms=8, color=color,
                    mfc="white" if p["emulated"] else color, mew=1.6, ls="", zorder=5)
    pred = [{"k": r["k"], "value": r["predicted"]["speedup"], "lo": r["predicted"]["speedup_lo"],
             "hi": r["predicted"]["speedup_hi"]} for r in rows if (r["predicted"] or {}).get("speedup") is not None]
    train = [{"k": r["k"], "value": r["predicted_train"]["speedup"]} for r in rows
             if (r["predicted_train"] or {}).get("speedup") is not None]
    if len(pred) > 1:
        _band_line(ax, pred, color, "--")
        kinds.add("predicted")
    if len(train) > 1:
        _band_line(ax, train, color, ":", lw=1.3, band=False)
        kinds.add("predicted_train")
    unscored = [r for r in rows if r["point"] and not r["point"]["scored"]]
    for slot, r in enumerate(unscored):
        kit.mark_missing(ax, r["k"], f"k={r['k']}: no score", color, slot)
    return {x["k"] for x in pts + pred + train + unscored}, bool(pts or pred)


def _soonest(ax, rec: dict, color: str) -> bool:
    """A star on the predicted speed-up where the target is reached soonest."""
    rule = rec["rules"].get(rec["primary"]) or {}
    f = rule.get("forecast")
    k = f["clock"]["fastest_k"] if f else None
    row = next((r for r in f["clock"]["rows"] if r["k"] == k), None) if k else None
    if row and row.get("speedup") is not None:
        ax.plot([k], [row["speedup"]], marker="*", ms=17, color=color, mec="black", ls="", zorder=6)
        ax.annotate(f"soonest: k={k}", (k, row["speedup"]), xytext=(10, -16), textcoords="offset points",
                    fontsize=kit.MIN_FONT_PT, color=color)
        return True
    return False


def _frame(ax, ks: list[int], per_node: int | None) -> None:
    """log2 axes, ticks at powers of two, the node boundary dotted."""
    top = max(ks)
    ticks = [k for k in (2 ** i for i in range(12)) if k <= top]
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _p: f"{x:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(1 / 1.3, top * 1.3)
    ax.set_yscale("log", base=2)
    lo, hi = ax.get_ylim()
    ax.set_yticks([2.0 ** i for i in range(-6, 12) if lo <= 2.0 ** i <= hi])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _p: f"{y:g}x"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel("speed-up over k=1")
    if per_node and top > per_node:
        ax.axvline(per_node * 1.41, color="gray", ls=":", lw=1)
        ax.set_xlabel(f"k (devices: 1..{per_node} in one node, then nodes of {per_node})")
    else:
        ax.set_xlabel("k (devices)")


def _entries(data: ReportData, used, tta_kinds: set, with_fc: bool) -> list[tuple]:
    """The keys of what was drawn: the first time-to-accuracy key names the measure (it
    stands whenever any of it was drawn), the others only where their mark was."""
    grey = "#555"
    out = kit.machine_entries(data, used) + [
        (Line2D([], [], color=grey, marker="o"), "samples/s, measured (95% interval)")]
    if with_fc:
        out += [((Line2D([], [], color=grey, lw=0.9), Patch(color=grey, alpha=0.15)), "samples/s, forecast (its band)")]
    if tta_kinds:
        keys = [("measured", Line2D([], [], color=grey, marker="s", ls=""),
                 "time to accuracy (evaluation on the clock), k real: samples to target measured (95% over seeds)"),
                ("train", Line2D([], [], color=grey, marker="^", ls=""), "the same, training only (measured)"),
                ("emulated", Line2D([], [], color=grey, marker="s", mfc="white", ls=""),
                 "the same, k emulated (DDP's semantics on fewer devices)"),
                ("predicted", (Line2D([], [], color=grey, ls="--"), Patch(color=grey, alpha=0.15)),
                 "the same, predicted: E(B) fit / samples/s (joint band)"),
                ("predicted_train", Line2D([], [], color=grey, ls=":"), "the same, training only (predicted)"),
                ("soonest", Line2D([], [], color=grey, marker="*", ms=12, mec="black", ls=""),
                 "reaches the target soonest")]
        out += [(handle, text) for kind, handle, text in keys if kind in tta_kinds]
    return out + [(Line2D([], [], color="gray", lw=4, alpha=0.25), "ideal: k")]


def answer(data: ReportData):
    """This machine alone: its own answer first, not lost under the kept machines' curves."""
    mine = [m for m in data.machines if m is data.current] or list(data.machines)
    return _draw(data, mine)


def answer_others(data: ReportData):
    """The kept machines and the book, beside one another (this run's figure is above)."""
    others = [m for m in data.machines if m is not data.current]
    if not others:
        fig, axes = kit.new(height=2.5)
        kit.empty(axes[0, 0], "No other machine kept under reference/.")
        return fig
    return _draw(data, others)


def _draw(data: ReportData, machines: list):
    fig, axes = kit.new(height=5.6)
    # the axis and the legend are what was drawn: no k, curve or key of a series not drawn
    ax, used, ks, tta_kinds, with_fc = axes[0, 0], [], set(), set(), False
    recs = {id(m): r for m, r in numbers(data)}
    for m in machines:
        rows, color = opening(data, m)["rows"], kit.color_of(data, m)
        rec = recs.get(id(m))
        drawn, drew_fc = _throughput(ax, rows, color, forecast=rec is not None)
        with_fc |= drew_fc
        marked, drew_tta = _tta(ax, rows, color, tta_kinds) if rec is not None else (set(), False)
        if drew_tta:
            tta_kinds.add("measured")   # the first key names the measure whenever any of it was drawn
            if _soonest(ax, rec, color):
                tta_kinds.add("soonest")
            drawn |= marked
        if drawn:
            used.append(m)
            ks |= drawn
    if not used:
        kit.empty(ax, "No scaling result yet.")
        return fig
    k_all = sorted(ks | {1})
    ax.plot(k_all, k_all, color="gray", lw=4, alpha=0.25)
    from dpscale.report import forecast as fcr
    per_node = (fcr.compute(data)[0]["config"] if fcr.compute(data) else {}).get("gpus_per_node")
    _frame(ax, k_all, per_node)
    kit.legend(fig, _entries(data, used, tta_kinds, with_fc), ncol=2)
    return fig
