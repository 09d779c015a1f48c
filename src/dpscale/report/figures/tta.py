"""Time to accuracy: epochs to target against the global batch (every seed's interpolated
crossing, the mean with its 95% interval, MLPerf's score, the fitted E(B) with its
band); time to accuracy against k (measured, emulated, predicted) and goodput efficiency
split into hardware and statistical efficiency. Emulated points are hollow."""
from __future__ import annotations

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from dpscale.analysis.stateff import batch_model, model_choice
from dpscale.report.chapters.tta import each_rule, numbers, weak_samples_per_s
from dpscale.report.machines import ReportData
from dpscale.report.figures import kit

RULE_STYLE = {"book": ("-", "o"), "linear": ("--", "s")}
GREY = "#555"


def _style(rule: str) -> tuple[str, str]:
    return RULE_STYLE.get(rule, (":", "v"))


def _means(ax, pts: list[dict], color: str, marker: str, key: str = "epochs") -> None:
    """Each point's mean with its interval; hollow where k was emulated."""
    for p in pts:
        if p.get(f"{key}_lo") is not None and p.get(f"{key}_hi") is not None:
            ax.errorbar([p["x"]], [p[key]], yerr=[[p[key] - p[f"{key}_lo"]], [p[f"{key}_hi"] - p[key]]],
                        color=color, capsize=4, lw=1.2, zorder=4)
        ax.plot([p["x"]], [p[key]], marker=marker, ms=8, color=color, mfc="white" if p["emulated"] else color,
                mew=1.5, ls="", zorder=5)


def _fit_curve(ax, rule: dict, color: str, ls: str) -> bool:
    f, n = rule["fit"], rule["train_images"]
    if not f or not n:
        return False
    top = max(p["global_batch"] for p in rule["points"] if p["global_batch"])
    bs = [min(rule["measured_batches"]) / 1.25 * (top * 1.6 * 1.25 / min(rule["measured_batches"])) ** (i / 40)
          for i in range(41)]
    pr = [batch_model.predict(f, b) for b in bs]
    ax.plot(bs, [p["mean"] / n for p in pr], ls=ls, color=color, lw=1.2, alpha=0.8)
    ax.fill_between(bs, [p["conf_lo"] / n for p in pr], [p["conf_hi"] / n for p in pr], color=color, alpha=0.12, lw=0)
    power = ((rule.get("models") or {}).get("fits") or {}).get("power")
    if power:
        ax.plot(bs, [model_choice.predict(power, b)["mean"] / n for b in bs], ls=(0, (1, 1.5)), color=color, lw=1.0)
    return True


def _unscored(ax, rule: dict, color: str) -> bool:
    """A point without a score is drawn at its budget with an upward arrow."""
    rows = [p for p in rule["points"] if not p["scored"] and p["max_epochs"] and p["global_batch"]]
    for p in rows:
        x, y = p["global_batch"], p["max_epochs"]
        ax.annotate("", xy=(x, y * 1.1), xytext=(x, y), arrowprops={"arrowstyle": "->", "color": color})
        ax.plot([x], [y], marker="_", ms=14, mew=2, color=color)
        ax.annotate(f"{rule['rule']} LR: not reached in {y:g} epochs", (x, y), xytext=(0, -14 if rule["rule"] ==
                    "book" else -26), textcoords="offset points", ha="center", fontsize=kit.MIN_FONT_PT, color=color)
    return bool(rows)


def tta_epochs(data: ReportData):
    fig, axes = kit.new(height=4.8)
    ax, used, rules, top = axes[0, 0], [], set(), 0.0
    for m, rule in each_rule(data):
        color, (ls, mk) = kit.color_of(data, m), _style(rule["rule"])
        n = rule["train_images"] or 1
        pts = [{**p, "x": p["global_batch"]} for p in rule["points"] if p["scored"] and p["global_batch"]
               and "rule's run" not in p["run"]]   # another rule's run (linear at k=1 is the book's): drawn once
        for p in pts:
            seeds = [s["samples"] / n for s in p["seeds"] if s["samples"] is not None]
            ax.plot([p["x"]] * len(seeds), seeds, ls="", marker=".", ms=5, color=color, alpha=0.55)
            if p["mlperf_epochs"] is not None:
                ax.plot([p["x"] * 1.06], [p["mlperf_epochs"]], ls="", marker="D", ms=5, mfc="white", mec=color)
        _means(ax, pts, color, mk)
        drew = _fit_curve(ax, rule, color, ls) | _unscored(ax, rule, color) | bool(pts)
        if drew:
            used += [m] if all(m is not u for u in used) else []
            rules.add(rule["rule"])
            top = max([top] + [p["max_epochs"] or 0 for p in rule["points"]])
    if not used:
        kit.empty(ax, "No time-to-accuracy result with a score (two or more seeds that did not converge, or none "
                      "planned).")
        return fig
    kit.log2_axis(ax, "global batch B (k x per-rank batch)")
    ax.set_ylabel("epochs to target")
    ax.set_ylim(0, max(ax.get_ylim()[1], 1.2 * top))
    kit.legend(fig, kit.machine_entries(data, used) + _epoch_entries(rules), ncol=2)
    return fig


def _epoch_entries(rules) -> list[tuple]:
    out = [(Line2D([], [], color=GREY, ls=_style(r)[0], marker=_style(r)[1]), f"LR rule {r}: mean of the seeds' "
            "interpolated crossings (95% over seeds)") for r in sorted(rules)]
    return out + [(Line2D([], [], color=GREY, marker=".", ls=""), "one seed (interpolated crossing)"),
                  (Line2D([], [], color=GREY, marker="D", ms=5, mfc="white", ls=""), "MLPerf's score (first "
                   "evaluations at or above the target)"),
                  ((Line2D([], [], color=GREY, lw=1.2), Patch(color=GREY, alpha=0.12)),
                   "E(B) = E_min (1 + B / B_crit) fitted, 95% band of the mean"),
                  (Line2D([], [], color=GREY, lw=1.0, ls=(0, (1, 1.5))), "E(B) = c B^alpha fitted (the power law)"),
                  (Line2D([], [], color=GREY, marker="o", mfc="white", ls=""), "hollow: emulated k")]


def _primary(data: ReportData):
    """(machine, its primary LR rule's record) of each machine with a time to accuracy."""
    for m, rec in numbers(data):
        rule = rec["rules"].get(rec["primary"])
        if rule:
            yield m, rule


def _tta_panel(ax, data: ReportData) -> list:
    used = []
    for m, rule in _primary(data):
        color = kit.color_of(data, m)
        pts = [{**p, "x": p["k"]} for p in rule["points"] if p["time_s"] is not None]
        _means(ax, pts, color, "s", key="time_s")
        clock = [p for p in rule["points"] if not p["emulated"] and p["clock_s"] is not None]
        ax.plot([p["k"] * 1.08 for p in clock], [p["clock_s"] for p in clock], ls="", marker="D", ms=5, mfc="white",
                mec=color)
        f = rule["forecast"]
        rows = [r for r in (f["clock"]["rows"] if f else []) if r["time_s"] is not None]
        train = [r for r in (f["train"]["rows"] if f else []) if r["time_s"] is not None]
        if len(rows) > 1:
            ax.plot([r["k"] for r in rows], [r["time_s"] for r in rows], ls="--", color=color, lw=1.4)
            ax.fill_between([r["k"] for r in rows], [r["time_s_lo"] for r in rows], [r["time_s_hi"] for r in rows],
                            color=color, alpha=0.15, lw=0)
            ax.plot([r["k"] for r in train], [r["time_s"] for r in train], ls=":", color=color, lw=1.3)
        used += [m] if pts or rows else []
    if not used:
        kit.empty(ax, "No time to accuracy: needs a scored point and samples/s at its k.")
        return used
    ks = [k for m, rule in _primary(data) for k in ([p["k"] for p in rule["points"]] + list(rule["rates"]))]
    kit.k_axis(ax, [k for k in ks if k & (k - 1) == 0])
    kit.log_y(ax, "seconds to target (log)")
    ax.set_xlabel("k")
    ax.set_title("time to accuracy", loc="left")
    return used


def _efficiency_panel(ax, data: ReportData) -> None:
    drawn, book = False, weak_samples_per_s(data.book)
    for m, rule in _primary(data):
        color = kit.color_of(data, m)
        for key, ls, dx in (("statistical_efficiency", "--", 1.0), ("hardware_efficiency", ":", 1.0),
                            ("goodput_efficiency", "-", 1.05)):
            pts = [p for p in rule["points"] if p.get(key) is not None]
            if pts:
                kit.errorbars(ax, [p["k"] * dx for p in pts], [p[key] for p in pts], [p.get(f"{key}_lo") for p in pts],
                              [p.get(f"{key}_hi") for p in pts], ls=ls, marker="o", color=color, capsize=3)
                drawn = True
    if 1 in book and len(book) > 1:
        ks = sorted(book)
        ax.plot(ks, [book[k] / (k * book[1]) for k in ks], ls=":", marker="D", color=kit.BOOK_COLOR)
    if not drawn:
        kit.empty(ax, "No efficiency: needs a scored time to accuracy at k=1 and a larger k.")
        return
    kit.k_axis(ax, [p["k"] for _m, rule in _primary(data) for p in rule["points"]])
    ax.set_ylim(0, 1.15)
    ax.set_xlabel("k")
    ax.set_ylabel("efficiency")
    ax.set_title("goodput = hardware x statistical", loc="left")


def tta_goodput(data: ReportData):
    fig, axes = kit.new(2, 1, height=4.9)
    used = _tta_panel(axes[0, 0], data)
    _efficiency_panel(axes[0, 1], data)
    entries = kit.machine_entries(data, used) + [
        (Line2D([], [], color=GREY, marker="s", ls=""), "samples to target x (1 / samples/s + evaluation per "
         "sample), 95% over seeds (hollow: k emulated)"),
        (Line2D([], [], color=GREY, marker="D", ms=5, mfc="white", ls=""), "the clock as measured, real k (MLPerf)"),
        ((Line2D([], [], color=GREY, ls="--"), Patch(color=GREY, alpha=0.15)), "predicted, evaluation on the "
         "clock (joint band)"),
        (Line2D([], [], color=GREY, ls=":"), "left: predicted, training only; right: hardware efficiency"),
        (Line2D([], [], color=GREY, ls="--", marker="o"), "statistical efficiency (95% over seeds)"),
        (Line2D([], [], color=GREY, ls="-", marker="o"), "goodput efficiency = speed-up (training only) / k"),
        (Line2D([], [], color=kit.BOOK_COLOR, ls=":", marker="D"), "book: weak-scaling efficiency")]
    kit.legend(fig, entries, ncol=2)
    return fig
