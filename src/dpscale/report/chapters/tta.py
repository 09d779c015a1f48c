"""Time to accuracy: epochs-to-target against the global batch per LR rule, time to
accuracy against k, and goodput efficiency = hardware (weak-scaling) efficiency x
statistical efficiency (samples-to-target(1) / samples-to-target(k)), the book's
weak-scaling efficiency beside. Emulated k's say so in every row and legend."""
from __future__ import annotations

from dpscale import registry
from dpscale.analysis import tta
from dpscale.report import forecast
from dpscale.report.document import Chapter, FigureSpec, Page
from dpscale.report.machines import Machine, ReportData
from dpscale.report.numbers import metric, ok
from dpscale.report.chapters.common import figure, jobs_table, missing_notes, prose, records_table

FIGURES = (FigureSpec("tta_epochs", "Epochs to the target accuracy against the global batch, per LR rule"),
           FigureSpec("tta_goodput", "Time to accuracy against k, and goodput efficiency split into hardware "
                                     "and statistical efficiency"))
TTA_COLUMNS = ["machine", "lr_rule", "k", "run", "global_batch", "target_accuracy", "seeds", "epochs_to_target",
               "epochs_min", "epochs_max", "samples_to_target", "seconds_to_target", "seconds_min", "seconds_max",
               "eval_every_samples", "not_converged", "not_launched", "no_result_reason"]
GOODPUT_COLUMNS = ["machine", "lr_rule", "k", "run", "samples_to_target", "samples_per_s", "samples_per_s_source",
                   "time_to_accuracy_s", "statistical_efficiency", "hardware_efficiency", "goodput_efficiency",
                   "book_weak_efficiency"]


def run_kind(r: dict) -> str:
    return "emulated" if metric(r, "emulated") else "real DDP"


def rule_series(m: Machine, rule: str) -> dict[int, tuple[dict, str]]:
    """{k: (result, how it ran)} of one LR rule; below the rule's min_k its k's are
    another rule's (linear at k=1 is the book's rule, run once: dpscale.registry)."""
    v = registry.get("ddp_tta").variant(rule) if rule in registry.get("ddp_tta").variant_names() else None
    out = {k: (r, run_kind(r)) for k, r in m.series("ddp_tta", rule).items()}
    if v is not None and v.same_below:
        for k, r in m.series("ddp_tta", v.same_below).items():
            if k < v.min_k and k not in out:
                out[k] = (r, f"{run_kind(r)}, the {v.same_below} rule's run (the same rule at k={k})")
    return out


def tta_rows(m: Machine) -> list[dict]:
    rows = []
    for rule in m.variants("ddp_tta"):
        for k, (r, run) in sorted(rule_series(m, rule).items()):
            if not ok(r):
                continue
            g = lambda key: metric(r, key)   # noqa: E731
            rows.append({"machine": m.label, "lr_rule": rule, "k": k, "run": run,
                         "global_batch": g("global_batch"), "target_accuracy": g("target_accuracy"),
                         "seeds": ", ".join(map(str, g("seeds") or [])), "epochs_to_target": g("epochs_to_target"),
                         "epochs_min": g("epochs_to_target_min"), "epochs_max": g("epochs_to_target_max"),
                         "samples_to_target": g("samples_to_target"), "seconds_to_target": g("seconds_to_target"),
                         "seconds_min": g("seconds_to_target_min"), "seconds_max": g("seconds_to_target_max"),
                         "eval_every_samples": g("eval_every_samples"), "max_epochs": g("max_epochs"),
                         "not_converged": ", ".join(map(str, g("not_converged_seeds") or [])) or "–",
                         "not_launched": ", ".join(map(str, g("not_launched_seeds") or [])) or "–",
                         "no_result_reason": g("no_result_reason") or "", "eval_s": g("eval_s_mean"),
                         "runs": g("runs") or []})
    return rows


def weak_samples_per_s(m: Machine | None) -> dict[int, float]:
    """samples/s(k) of a machine's weak scaling: the device-resident series (the loop
    time to accuracy runs), else the first series it has (the book's: seed)."""
    if m is None:
        return {}
    variants = m.variants("ddp_weak")
    for v in ["cached"] + variants:
        got = {k: metric(r, "samples_per_s") for k, r in m.series("ddp_weak", v).items() if ok(r)} if v in variants else {}
        if got:
            return got
    return {}


def forecast_provider(data: ReportData, m: Machine) -> tta.Provider:
    """samples/s(k) where k did not run, from the scaling forecast (dpscale.report.forecast):
    its DDP series (the cached one where measured), k x per-rank batch / predicted weak step.
    At the forecast's per-rank batch (the throughput protocol's), which at paper scale is
    time to accuracy's too (256)."""
    f = next((f for f in forecast.compute(data) if f["machine"] == m.name), None)
    ser = {s["variant"]: s for s in (f or {}).get("series", []) if s["family"] == "torch"}
    s = ser.get("cached") or next(iter(ser.values()), None)
    steps = {r["k"]: r.get("weak_step_ms") for r in (s or {}).get("rows", [])}

    def provide(k: int):
        ms = steps.get(k)
        return (k * s["per_rank_batch"] / (ms / 1e3), "forecast") if ms and s.get("per_rank_batch") else \
            (None, "not measured")
    return provide


def no_score_text(r: dict) -> str:
    """Why a time-to-accuracy point has no score, short: the first screen's words."""
    bad = [x for x in r["not_converged"].split(", ") if x not in ("", "–")]
    if len(bad) > 1 and r["max_epochs"]:
        return f"{r['target_accuracy']:.0%} not reached within {r['max_epochs']:g} epochs by {len(bad)} seeds: no score"
    return "no score: " + (r["no_result_reason"] or "not scored")


def goodput_rows(data: ReportData, m: Machine) -> list[dict]:
    provider = tta.chained(tta.measured_provider(weak_samples_per_s(m)), forecast_provider(data, m))
    book = weak_samples_per_s(data.book)
    rows = []
    for rule in m.variants("ddp_tta"):
        mine = [r for r in tta_rows(m) if r["lr_rule"] == rule]
        pts = [{"k": r["k"], "samples_to_target": r["samples_to_target"], "eval_s": r["eval_s"],
                "emulated": r["run"] == "emulated"} for r in mine]
        unscored = {r["k"]: no_score_text(r) for r in mine if r["epochs_to_target"] is None}
        for row in tta.goodput(pts, provider):
            k = row["k"]
            rows.append({"machine": m.label, "lr_rule": rule, "run": "emulated" if row["emulated"] else "real DDP",
                         **row, "book_weak_efficiency": book[k] / (k * book[1]) if k in book and 1 in book else None,
                         "no_score": unscored.get(k)})
    return rows


def headline(data: ReportData) -> str:
    parts = []
    for m in data.measured:
        for r in goodput_rows(data, m):
            if r["lr_rule"] == "book" and r["k"] > 1 and r["statistical_efficiency"] is not None:
                hw = f"{r['hardware_efficiency']:.0%}" if r["hardware_efficiency"] else "not measured"
                parts.append(f"{m.label} k={r['k']} ({r['run']}): statistical efficiency "
                             f"{r['statistical_efficiency']:.0%}, hardware {hw}")
    return "; ".join(parts) or "No time-to-accuracy result with a score at k=1 and a larger k."


def epochs_headline(data: ReportData) -> str:
    parts = []
    for m in data.measured:
        for rule in m.variants("ddp_tta"):
            pts = [f"{r['epochs_to_target']:.2f} at {r['global_batch']}" + (" (emulated)" if r["run"] == "emulated" else "")
                   for r in tta_rows(m) if r["lr_rule"] == rule and r["epochs_to_target"] is not None]
            if pts:
                parts.append(f"{m.label}, {rule} LR: epochs to target " + ", ".join(pts))
    return "; ".join(parts) or "No scored time-to-accuracy result."


def page(data: ReportData) -> Page:
    tta_all = [r for m in data.measured for r in tta_rows(m)]
    good = [r for m in data.measured for r in goodput_rows(data, m)]
    notes = missing_notes(data, "ddp_tta")
    return Page("tta", CHAPTER.title, prose("tta"),
                figures=[figure(FIGURES[0], epochs_headline(data), notes), figure(FIGURES[1], headline(data), notes)],
                tables=[records_table("tta", "Time to accuracy per LR rule and k (MLPerf's score: the mean of the "
                                      "seeds without the fastest and the slowest; min and max over those kept)",
                                      tta_all, TTA_COLUMNS),
                        records_table("goodput", "Goodput: time to accuracy = samples to target / samples/s(k) "
                                      "+ evaluation time", good, GOODPUT_COLUMNS,
                                      note="samples/s(k) from this machine's ddp_weak (cached) at the same k where it ran, else "
                                           "from the scaling forecast (source 'forecast'), else 'not measured'."),
                        jobs_table(data, "tta")])


CHAPTER = Chapter("tta", "Time to accuracy: will k GPUs train sooner?", FIGURES, ("tta", "goodput"), page)
