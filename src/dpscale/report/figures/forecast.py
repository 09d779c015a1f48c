"""The forecast: efficiency and time per step against k, in one node then across nodes,
with the band; a measured point filled, a predicted one hollow; the knee marked."""
from __future__ import annotations

from matplotlib.lines import Line2D

from dpscale.report import forecast as fcr
from dpscale.report.machines import ReportData
from dpscale.report.figures import kit

PANELS = (("weak", "weak scaling (per-rank batch fixed)"), ("strong", "strong scaling (global batch fixed)"))


def _series(data: ReportData):
    """(machine, forecast, its primary DDP series) for each machine that has one with a fabric."""
    by = {f["machine"]: f for f in fcr.compute(data)}
    for m in data.machines:
        f = by.get(m.name)
        s = fcr.primary(f) if f else None
        if s and any(r.get("weak_efficiency") is not None for r in s["rows"] if r["k"] > 1):
            yield m, f, s


def _draw(ax, rows: list[dict], key: str, color: str, scale: float = 1.0):
    pts = [r for r in rows if r.get(key) is not None]
    if not pts:
        return False
    ks = [r["k"] for r in pts]
    ax.plot(ks, [scale * r[key] for r in pts], color=color, lw=1.6)
    if all(r.get(f"{key}_lo") is not None for r in pts):
        ax.fill_between(ks, [scale * r[f"{key}_lo"] for r in pts], [scale * r[f"{key}_hi"] for r in pts],
                        color=color, alpha=0.18, lw=0)
    ax.plot(ks, [scale * r[key] for r in pts], ls="none", marker="o", ms=5, mfc="white", mec=color)
    return True


def _measured(ax, rows, scaling: str, color: str):
    meas = [r for r in rows if r.get(f"{scaling}_measured") is not None]
    ax.plot([r["k"] for r in meas], [100 * r[f"{scaling}_measured"] for r in meas], ls="none", marker="o", ms=8,
            color=color, mec="black", zorder=5)


def _frame(ax, data_ks, per_node: int, title: str):
    kit.k_axis(ax, [k for k in data_ks if k & (k - 1) == 0])   # powers of two: readable on a log axis
    ax.axvline(per_node * 1.41, color="gray", ls=":", lw=1)
    ax.set_title(title)
    ax.set_xlabel(f"k (1..{per_node} in one node, then nodes of {per_node})")


def forecast_efficiency(data: ReportData):
    fig, axes = kit.new(2, 1, height=4.6)
    used, knee_at = [], None
    for m, f, s in _series(data):
        color = kit.color_of(data, m)
        drew = False
        for ax, (scaling, _t) in zip(axes[0], PANELS):
            if _draw(ax, s["rows"], f"{scaling}_efficiency", color, 100):
                drew = True
                _measured(ax, s["rows"], scaling, color)
                knee = s[f"{scaling}_knee_k"]
                if knee:
                    y = next(100 * r[f"{scaling}_efficiency"] for r in s["rows"] if r["k"] == knee)
                    ax.plot([knee], [y], marker="v", ms=11, color=color, mec="black", ls="none", zorder=6)
                    knee_at = s["knee_threshold"]
        if drew:
            used.append(m)
    if not used:
        return _empty(fig, axes)
    cfg = _frames(data, axes)
    for ax in axes[0]:
        ax.axhline(100 * cfg["knee_efficiency"], color="#999", ls="--", lw=1)
        ax.set_ylim(0, 105)
    axes[0, 0].set_ylabel("efficiency, %")
    kit.legend(fig, kit.machine_entries(data, used) + _legend(cfg, knee_at))
    return fig


def _empty(fig, axes):
    kit.empty(axes[0, 0], "The forecast needs k=1 throughput and an all-reduce at some k >= 2 "
                          "(measured on this machine, or a fabric file).")
    axes[0, 1].set_axis_off()
    return fig


def _frames(data: ReportData, axes) -> dict:
    """Both panels framed on the first machine's k grid and node size; the forecast's config."""
    cfg = fcr.compute(data)[0]["config"]
    first = next(s for _m, _f, s in _series(data))
    for ax, (_s, title) in zip(axes[0], PANELS):
        _frame(ax, [r["k"] for r in first["rows"]], first.get("per_node") or cfg["gpus_per_node"], title)
    return cfg


def _legend(cfg: dict, knee_at) -> list[tuple]:
    grey = "#555"
    out = [(Line2D([], [], color=grey, lw=6, alpha=0.25), f"band: where {100 * cfg['band_level']:.0f}% of measurements "
                                                          "should fall, the model's own error included"),
           (Line2D([], [], color=grey, marker="o", ms=8, mec="black", ls="none"), "measured"),
           (Line2D([], [], color=grey, marker="o", mfc="white", ls="-"), "predicted")]
    if knee_at is not None:
        out.append((Line2D([], [], color=grey, marker="v", ms=10, mec="black", ls="none"),
                    f"knee: last k before efficiency < {100 * knee_at:.0f}% (dashed)"))
    return out


def forecast_step_time(data: ReportData):
    fig, axes = kit.new(2, 1, height=4.4)
    used = []
    for m, f, s in _series(data):
        color = kit.color_of(data, m)
        if any([_draw(ax, s["rows"], f"{scaling}_step_ms", color) for ax, (scaling, _t) in zip(axes[0], PANELS)]):
            used.append(m)
    if not used:
        return _empty(fig, axes)
    cfg = _frames(data, axes)
    for ax in axes[0]:
        kit.log_y(ax, "time per step, ms")
    kit.legend(fig, kit.machine_entries(data, used) + _legend(cfg, None)[::2])
    return fig
