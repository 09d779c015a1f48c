"""Time to accuracy: epochs to target against the global batch, time to accuracy
against k, goodput efficiency split into hardware and statistical efficiency.
Emulated points are hollow and the legend says so."""
from __future__ import annotations

from matplotlib.lines import Line2D

from dpscale.report.chapters.tta import goodput_rows, tta_rows
from dpscale.report.machines import ReportData
from dpscale.report.figures import kit

RULE_STYLE = {"book": ("-", "o"), "linear": ("--", "s")}


def _points(ax, xs, ys, los, his, emulated, color, ls, marker):
    ax.plot(xs, ys, ls=ls, color=color)
    for x, y, lo, hi, emu in zip(xs, ys, los, his, emulated):
        if lo is not None:
            ax.errorbar([x], [y], yerr=[[y - lo], [hi - y]], color=color, capsize=3, lw=1)
        ax.plot([x], [y], marker=marker, ms=7, color=color, mfc="white" if emu else color, ls="")


def tta_epochs(data: ReportData):
    fig, axes = kit.new(height=4.2)
    ax, used, rules = axes[0, 0], [], set()
    for m in data.measured:
        rows = [r for r in tta_rows(m) if r["epochs_to_target"] is not None]
        for rule in sorted({r["lr_rule"] for r in rows}):
            pts = sorted((r for r in rows if r["lr_rule"] == rule), key=lambda r: r["k"])
            ls, mk = RULE_STYLE.get(rule, (":", "v"))
            _points(ax, [r["global_batch"] for r in pts], [r["epochs_to_target"] for r in pts],
                    [r["epochs_min"] for r in pts], [r["epochs_max"] for r in pts],
                    [r["run"] == "emulated" for r in pts], kit.color_of(data, m), ls, mk)
            rules.add(rule)
        unscored = _unscored(ax, m, data)
        used += [m] if rows or unscored else []
    if not used:
        kit.empty(ax, "No time-to-accuracy result with a score (two or more seeds that did not converge, "
                      "or none planned).")
        return fig
    kit.log2_axis(ax, "global batch (k x per-rank batch)")
    ax.set_ylabel("epochs to target")
    ax.set_ylim(0, max(ax.get_ylim()[1], 1.15 * max((r["max_epochs"] or 0 for m in used for r in tta_rows(m)),
                                                     default=0)))
    entries = kit.machine_entries(data, used) + _style_entries(rules)
    kit.legend(fig, entries, ncol=3)
    return fig


def _unscored(ax, m, data: ReportData) -> bool:
    """A point without a score (two or more seeds missed the target within the budget)
    is drawn at its budget with an upward arrow: epochs to target > max_epochs."""
    rows = [r for r in tta_rows(m) if r["epochs_to_target"] is None and r["max_epochs"]]
    for r in rows:
        ax.annotate("", xy=(r["global_batch"], r["max_epochs"] * 1.08), xytext=(r["global_batch"], r["max_epochs"]),
                    arrowprops={"arrowstyle": "->", "color": kit.color_of(data, m)})
        ax.plot([r["global_batch"]], [r["max_epochs"]], marker="_", ms=14, mew=2, color=kit.color_of(data, m))
        ax.annotate(f"{r['lr_rule']} LR: not reached in {r['max_epochs']:g} epochs", (r["global_batch"], r["max_epochs"]),
                    xytext=(-6, -12 if r["lr_rule"] == "book" else -24), textcoords="offset points", ha="right",
                    fontsize=kit.MIN_FONT_PT, color=kit.color_of(data, m))
    return bool(rows)


def _style_entries(rules) -> list[tuple]:
    out = [(Line2D([], [], color="#555", ls=RULE_STYLE.get(r, (":", "v"))[0], marker=RULE_STYLE.get(r, (":", "v"))[1]),
            f"LR rule: {r}") for r in sorted(rules)]
    return out + [(Line2D([], [], color="#555", marker="o", mfc="white", ls=""), "hollow: emulated k (DDP's "
                   "semantics on fewer devices)")]


def _tta_panel(ax, data: ReportData) -> list:
    used = []
    for m in data.measured:
        rows = [r for r in tta_rows(m) if r["lr_rule"] == "book" and r["seconds_to_target"] is not None
                and r["run"] != "emulated"]
        pred = [r for r in goodput_rows(data, m) if r["lr_rule"] == "book" and r["time_to_accuracy_s"]]
        color = kit.color_of(data, m)
        if rows:
            _points(ax, [r["k"] for r in rows], [r["seconds_to_target"] for r in rows],
                    [r["seconds_min"] for r in rows], [r["seconds_max"] for r in rows], [False] * len(rows),
                    color, "-", "o")
        if pred:
            ax.plot([r["k"] for r in pred], [r["time_to_accuracy_s"] for r in pred], ls=":", marker="^",
                    color=color, mfc="white")
        used += [m] if rows or pred else []
    if not used:
        kit.empty(ax, "No time to accuracy at the book's LR rule.")
        return used
    kit.k_axis(ax, [r["k"] for m in used for r in tta_rows(m)])
    kit.log_y(ax, "seconds to target (log)")
    ax.set_xlabel("k")
    ax.set_title("time to accuracy, book's LR rule", loc="left")
    return used


def _efficiency_panel(ax, data: ReportData) -> None:
    drawn = False
    for m in data.measured:
        rows = [r for r in goodput_rows(data, m) if r["lr_rule"] == "book"]
        color = kit.color_of(data, m)
        for key, ls in (("statistical_efficiency", "--"), ("hardware_efficiency", ":"), ("goodput_efficiency", "-")):
            pts = [r for r in rows if r[key] is not None]
            if pts:
                ax.plot([r["k"] for r in pts], [r[key] for r in pts], ls=ls, marker="o", color=color)
                drawn = True
        book = [r for r in rows if r["book_weak_efficiency"] is not None]
        if book:
            ax.plot([r["k"] for r in book], [r["book_weak_efficiency"] for r in book], ls=":", marker="D",
                    color=kit.BOOK_COLOR)
    if not drawn:
        kit.empty(ax, "No efficiency: needs a scored time to accuracy at k=1 and a larger k.")
        return
    kit.k_axis(ax, [r["k"] for m in data.measured for r in goodput_rows(data, m)])
    ax.set_ylim(0, 1.1)
    ax.set_xlabel("k")
    ax.set_ylabel("efficiency")
    ax.set_title("goodput = hardware x statistical", loc="left")


def tta_goodput(data: ReportData):
    fig, axes = kit.new(2, 1, height=4.4)
    used = _tta_panel(axes[0, 0], data)
    _efficiency_panel(axes[0, 1], data)
    entries = kit.machine_entries(data, used) + [
        (Line2D([], [], color="#555", marker="o"), "measured, real DDP (MLPerf mean, min-max)"),
        (Line2D([], [], color="#555", ls=":", marker="^", mfc="white"),
         "samples to target / samples/s(k) + evaluation (emulated k: samples only)"),
        (Line2D([], [], color="#555", ls="--"), "statistical efficiency"),
        (Line2D([], [], color="#555", ls=":"), "hardware (weak-scaling) efficiency"),
        (Line2D([], [], color="#555", ls="-"), "goodput efficiency"),
        (Line2D([], [], color=kit.BOOK_COLOR, ls=":", marker="D"), "book: weak-scaling efficiency")]
    kit.legend(fig, entries, ncol=2)
    return fig
