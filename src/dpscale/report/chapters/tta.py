"""Time to accuracy: every seed's crossing of the target (interpolated, MLPerf's first
evaluation beside), samples to target against the global batch with the fitted E(B)
model, time to accuracy and its speed-up over k=1 in two labelled forms (evaluation on
the clock; training only) with 95% intervals over the seeds, goodput efficiency =
hardware x statistical efficiency, the model checked out of sample, B_crit beside the
measured noise scale, and the forecast to the throughput forecast's nodes. The numbers
are dpscale.report.tta's, computed once per report. Emulated k's say so everywhere."""
from __future__ import annotations

from dpscale.report import forecast as fcr, tta
from dpscale.report.document import Cell, Chapter, FigureSpec, Page
from dpscale.report.machines import Machine, ReportData
from dpscale.report.numbers import fmt_num, metric, ok
from dpscale.report.chapters.common import figure, jobs_table, missing_notes, prose, records_table

FIGURES = (FigureSpec("tta_epochs", "Epochs to the target accuracy against the global batch: every seed, the "
                                    "mean with its interval, MLPerf's score, and the fitted E(B) with its band"),
           FigureSpec("tta_goodput", "Time to accuracy against k (measured, emulated, predicted), and goodput "
                                     "efficiency split into hardware and statistical efficiency"))
TABLES = ("tta", "tta_measurements", "tta_seeds", "goodput", "tta_model", "tta_noise", "tta_noise_intervals",
          "tta_holdout", "tta_forecast")
TTA_COLUMNS = ["machine", "lr_rule", "k", "run", "global_batch", "target_accuracy", "seeds", "epochs_to_target",
               "epochs_interval", "samples_to_target", "samples_interval", "mlperf_epochs", "mlperf_epochs_min",
               "mlperf_epochs_max", "mlperf_samples_to_target", "seconds_to_target", "seconds_min", "seconds_max",
               "eval_every_samples", "not_converged", "not_launched", "no_result_reason", "estimator"]
SEED_COLUMNS = ["machine", "lr_rule", "k", "run", "seed", "converged", "crossing", "epochs", "mlperf_epochs",
                "resolution_epochs", "seconds", "mlperf_seconds", "best_accuracy"]
GOODPUT_COLUMNS = ["machine", "lr_rule", "k", "run", "samples_per_s", "samples_per_s_interval",
                   "samples_per_s_source", "time_to_accuracy_s", "time_to_accuracy_interval",
                   "time_training_only_s", "time_training_only_interval", "speedup", "speedup_interval",
                   "speedup_training_only", "speedup_training_only_interval", "statistical_efficiency",
                   "statistical_efficiency_interval", "statistical_efficiency_mlperf", "hardware_efficiency",
                   "goodput_efficiency", "goodput_efficiency_interval", "book_weak_efficiency", "clock_speedup",
                   "clock_speedup_interval", "no_score"]


# ---------------------------------------------------------------- the numbers, once per report

def numbers(data: ReportData) -> list[tuple[Machine, dict]]:
    """(machine, dpscale.report.tta.of_machine) of every measured machine with a
    time-to-accuracy result, once per ReportData."""
    def every():
        fcs = {f["machine"]: f for f in fcr.compute(data)}
        recs = [(m, tta.of_machine(m, fcs.get(m.name))) for m in data.measured]
        return [(m, r) for m, r in recs if r["rules"]]
    return data.memo("tta", every)


def of(data: ReportData, m: Machine) -> dict | None:
    return next((r for x, r in numbers(data) if x is m), None)


def weak_samples_per_s(m: Machine | None) -> dict[int, float]:
    """samples/s(k) of a machine's weak scaling, of the step the answer trains with
    (dpscale.report.tta.weak_variant)."""
    v = tta.weak_variant(m) if m is not None else None
    return {k: metric(r, "samples_per_s") for k, r in m.series(tta.RATE, v).items() if ok(r)} if v else {}


# ---------------------------------------------------------------- cells

def pc(x, digits: int = 1) -> Cell:
    return Cell("–" if x is None else f"{100 * x:.{digits}f}%", raw=x)


def times(x) -> Cell:
    return Cell("–" if x is None else f"{x:.2f}x", raw=x)


def iv(lo, hi, fmt=fmt_num) -> Cell:
    """An interval's cell: [lo, hi] on the page, two numbers in the CSV."""
    if lo is None or hi is None:
        return Cell("–", raw=(None, None))
    return Cell(f"[{fmt(lo)}, {fmt(hi)}]", raw=(lo, hi))


def iv_pc(lo, hi) -> Cell:
    return iv(lo, hi, lambda x: f"{100 * x:.1f}%")


def iv_x(lo, hi) -> Cell:
    return iv(lo, hi, lambda x: f"{x:.2f}x")


def ep(x) -> Cell:
    return Cell("–" if x is None else f"{x:.2f}", raw=x)


def gh(x) -> Cell:
    return Cell("–" if x is None else f"{x:.3g}", raw=x)


def listed(xs) -> str:
    return ", ".join(map(str, xs)) or "–"


# ---------------------------------------------------------------- rows

def each_point(data: ReportData):
    """(machine, rule record, point) of every machine, LR rule and k."""
    for m, rec in numbers(data):
        for rule in rec["rules"].values():
            for p in rule["points"]:
                yield m, rule, p


def no_score_text(p: dict) -> str:
    """Why a point has no score, short: the first screen's words. Each seed that missed
    the target says its best accuracy and, in test images, how far short it was: a
    'no score' may rest on one seed a few images short."""
    if len(p["not_converged"]) > 1 and p["max_epochs"]:
        return (f"{p['target']:.0%} not reached within {p['max_epochs']:g} epochs by {len(p['not_converged'])} "
                f"seeds ({misses_text(p)}): no score")
    return "no score: " + (p["no_result_reason"] or "not scored")


def misses_text(p: dict) -> str:
    """'seed 1 at best 88.39%, 161 test images of 10,000 short; seed 3 at best 89.96%, 4 ...'."""
    n = p.get("test_images")
    out = []
    for s in (s for s in p["seeds"] if not s["converged"] and s["best_accuracy"] is not None):
        short = round((p["target"] - s["best_accuracy"]) * n) if n else None
        out.append(f"seed {s['seed']} at best {100 * s['best_accuracy']:.2f}%"
                   + (f", {short} test images of {n:,} short" if short is not None else ""))
    return "; ".join(out)


def tta_rows(data: ReportData) -> list[dict]:
    rows = []
    for m, rule, p in each_point(data):
        rows.append({"machine": m.label, "lr_rule": rule["rule"], "k": p["k"], "run": p["run"],
                     "global_batch": p["global_batch"], "target_accuracy": pc(p["target"], 0),
                     "seeds": listed(p["seed_list"]), "epochs_to_target": ep(p["epochs"]),
                     "epochs_interval": iv(p["epochs_lo"], p["epochs_hi"], lambda x: f"{x:.2f}"),
                     "samples_to_target": p["samples"], "samples_interval": iv(p["samples_lo"], p["samples_hi"]),
                     "mlperf_epochs": ep(p["mlperf_epochs"]), "mlperf_epochs_min": ep(p["mlperf_epochs_min"]),
                     "mlperf_epochs_max": ep(p["mlperf_epochs_max"]), "mlperf_samples_to_target": p["mlperf_samples"],
                     "seconds_to_target": p["clock_s"], "seconds_min": p["clock_s_min"],
                     "seconds_max": p["clock_s_max"], "eval_every_samples": p["eval_every_samples"],
                     "not_converged": listed(p["not_converged"]), "not_launched": listed(p["not_launched"]),
                     "no_result_reason": p["no_result_reason"] or "", "estimator": p["samples_how"]})
    return rows


MEASUREMENT_COLUMNS = ["machine", "lr_rule", "k", "measurement", "commit", "finished_utc", "seeds", "run_id",
                       "epochs_to_target", "epochs_interval", "speedup", "speedup_interval", "verdict",
                       "speedup_training_only", "verdict_training_only", "pooled", "note"]


def seeds_text(seeds: list) -> str:
    """'1-5' for a run of consecutive seeds, else the list."""
    s = sorted(seeds)
    # compared pairwise: a range from the smallest to the largest of five fresh 31-bit seeds
    # (tta_seeds: 5 draws them at random) is billions long; built as a list it took the
    # report 208 s and 24+ GB on the first fresh-seed measurement
    consecutive = len(s) > 2 and all(b - a == 1 for a, b in zip(s, s[1:]))
    return f"{s[0]}-{s[-1]}" if consecutive else listed(seeds)


def measurement_rows(data: ReportData) -> list[dict]:
    """Each measurement of each point (dpscale.report.tta_pool), then the pooled result
    with the spread between the pooled measurements (one-way ANOVA over their seeds)."""
    rows = []
    for m, rule, p in each_point(data):
        if "rule's run" in p["run"] or not p["measurements"]:
            continue
        head = {"machine": m.label, "lr_rule": rule["rule"], "k": p["k"]}
        for x in p["measurements"]:
            rows.append({**head, "measurement": x["label"], "commit": (x["commit"] or "–")[:10],
                         "finished_utc": x["finished_utc"] or "–", "seeds": seeds_text(x["seeds"]),
                         "run_id": f"{x['run_id']:016x}" if x["run_id"] is not None else "– (listed)",
                         "epochs_to_target": ep(x["epochs"]), "epochs_interval": iv(x["epochs_lo"], x["epochs_hi"],
                                                                                    lambda v: f"{v:.2f}"),
                         **verdict_cells(x), "pooled": x["pooled"], "note": x["why"] or x.get("averaged", "")})
        if len(p["measurements"]) > 1:
            rows.append({**head, "measurement": "pooled", "seeds": f"{len(p['seeds'])} seeds",
                         "epochs_to_target": ep(p["epochs"]), "epochs_interval": iv(p["epochs_lo"], p["epochs_hi"],
                                                                                    lambda v: f"{v:.2f}"),
                         **verdict_cells({**p, "verdict": p.get("verdict"), "verdict_train": p.get("verdict_train")}),
                         "pooled": True, "note": spread_text(p["measurements"])
                         + ("; verdict differs from the pool's: " + ", ".join(p["verdicts_disagree"])
                            if p.get("verdicts_disagree") else "")})
    return rows


def verdict_cells(x: dict) -> dict:
    """A measurement's (or the pool's) own speed-up over k=1, both forms, and its verdict."""
    two = (lambda lo, hi: iv(lo, hi, lambda v: f"{v:.2f}"))
    return {"speedup": times(x.get("speedup")), "speedup_interval": two(x.get("speedup_lo"), x.get("speedup_hi")),
            "verdict": x.get("verdict") or "–", "speedup_training_only": times(x.get("speedup_train")),
            "verdict_training_only": x.get("verdict_train") or "–"}


def spread_text(recs: list[dict]) -> str:
    """How far the pooled measurements part: their means, and a one-way ANOVA over their
    seeds (do they differ more than seeds do?)."""
    from scipy import stats as sps
    kept = [x for x in recs if x["pooled"]]
    if len(kept) < 2:
        return "one measurement pooled: " + ("the others repeat its seeds" if len(recs) > 1 else "")
    groups = [[v for v in x["samples"] if v is not None] for x in kept]
    f = sps.f_oneway(*groups)
    return (f"{len(kept)} measurements, means " + ", ".join(f"{x['epochs']:.2f}" for x in kept)
            + f" epochs; one-way ANOVA over their seeds p = {f.pvalue:.2f}")


def repeat_notes(data: ReportData) -> list[str]:
    """Where a machine's measurements of a rule's points repeat seeds, said once: they
    are shown (table tta_measurements) and not pooled."""
    out = []
    for m, rule in each_rule(data):
        hit = [p for p in rule["points"] if "rule's run" not in p["run"]
               and any(x.get("averaged") for x in p["measurements"])]
        if hit:
            counts = sorted({len(p["measurements"]) for p in hit})
            out.append(f"{m.label}, {rule['rule']} LR: at k = {listed(p['k'] for p in hit)}, "
                       f"{'/'.join(map(str, counts))} measurements, some with the seeds of a newer one "
                       "(same initial weights and data order: not independent): each such seed counts once, the "
                       "mean of its launches, never one measurement picked (table tta_measurements)")
    return out


def seed_rows(data: ReportData) -> list[dict]:
    rows = []
    for m, rule, p in each_point(data):
        if "rule's run" in p["run"]:
            continue   # another rule's seeds (linear at k=1 is the book's run): listed once, under that rule
        n = p["train_images"]
        e = (lambda x: ep(x / n if x is not None and n else None))
        for s in p["seeds"]:
            rows.append({"machine": m.label, "lr_rule": rule["rule"], "k": p["k"], "run": p["run"],
                         "seed": s["seed"], "converged": s["converged"], "crossing": s["status"],
                         "epochs": e(s["samples"]), "mlperf_epochs": e(s["mlperf_samples"]),
                         "resolution_epochs": e(s["resolution_samples"]), "seconds": s["seconds"],
                         "mlperf_seconds": s["mlperf_seconds"], "best_accuracy": pc(s["best_accuracy"], 2)})
    return rows


def goodput_rows(data: ReportData) -> list[dict]:
    rows = []
    book = weak_samples_per_s(data.book)
    for m, rule, p in each_point(data):
        k = p["k"]
        g = (lambda key: (p.get(key), p.get(f"{key}_lo"), p.get(f"{key}_hi")))
        rows.append({"machine": m.label, "lr_rule": rule["rule"], "k": k, "run": p["run"],
                     "samples_per_s": p["samples_per_s"], "samples_per_s_interval": iv(*g("samples_per_s")[1:]),
                     "samples_per_s_source": p["samples_per_s_source"], "time_to_accuracy_s": p["time_s"],
                     "time_to_accuracy_interval": iv(*g("time_s")[1:]), "time_training_only_s": p["time_train_s"],
                     "time_training_only_interval": iv(*g("time_train_s")[1:]), "speedup": times(p["speedup"]),
                     "speedup_interval": iv_x(*g("speedup")[1:]), "speedup_training_only": times(p["speedup_train"]),
                     "speedup_training_only_interval": iv_x(*g("speedup_train")[1:]),
                     "statistical_efficiency": pc(p["statistical_efficiency"]),
                     "statistical_efficiency_interval": iv_pc(*g("statistical_efficiency")[1:]),
                     "statistical_efficiency_mlperf": pc(p["statistical_efficiency_mlperf"]),
                     "hardware_efficiency": pc(p["hardware_efficiency"]),
                     "goodput_efficiency": pc(p["goodput_efficiency"]),
                     "goodput_efficiency_interval": iv_pc(*g("goodput_efficiency")[1:]),
                     "book_weak_efficiency": pc(book[k] / (k * book[1]) if k in book and 1 in book else None),
                     "clock_speedup": times(p["clock_speedup"]), "clock_speedup_interval": iv_x(*g("clock_speedup")[1:]),
                     "no_score": "" if p["scored"] else no_score_text(p)})
    return rows


def each_rule(data: ReportData):
    for m, rec in numbers(data):
        for rule in rec["rules"].values():
            yield m, rule


def model_rows(data: ReportData) -> list[dict]:
    """Per machine and LR rule, each model of samples to target: the line (E_min, S_min,
    B_crit) and the power law (alpha), each with its weight in the forecast and its
    summed leave-one-batch-out log density."""
    rows = []
    for m, rule in each_rule(data):
        f, n = rule["fit"], rule["train_images"] or 1
        if f is None:
            rows.append({"machine": m.label, "lr_rule": rule["rule"], "note": f"no fit: {rule['fit_note']}"})
            continue
        ms = rule["models"]
        w = (lambda name: pc(ms["weights"].get(name)))
        elpd = (lambda name: (ms["elpd"] or {}).get(name))
        e, s, b = f["E_min"], f["S_min"], f["B_crit"]
        head = {"machine": m.label, "lr_rule": rule["rule"], "batches": listed(f["batches"]), "seeds_fitted": f["n"],
                "censored": listed(f"B={k}: {v}" for k, v in f["censored"].items()), "df": f["df"],
                "weighting_method": ms["method"]}
        rows.append({**head, "model": "line: E_min (1 + B / B_crit)", "weight": w("line"), "lobo_log_density":
                     elpd("line"), "e_min_epochs": ep(e["value"] / n),
                     "e_min_interval": iv(e["ci_lo"] / n, e["ci_hi"] / n, lambda x: f"{x:.2f}"),
                     "s_min_steps": s["value"], "s_min_interval": iv(s["ci_lo"], s["ci_hi"]),
                     "b_crit_samples": b["value"], "b_crit_interval": iv(b["ci_lo"], b["ci_hi"]),
                     "per_seed_cv": pc(f["sigma"]) if f["weighting"] == "cv" else f["sigma"], "note": b["note"]})
        pw = ms["fits"].get("power")
        if pw:
            a = pw["alpha"]
            rows.append({**head, "model": "power law: c B^alpha", "weight": w("power"),
                         "lobo_log_density": elpd("power"), "alpha": a["value"],
                         "alpha_interval": iv(a["ci_lo"], a["ci_hi"], lambda x: f"{x:.2f}"),
                         "per_seed_cv": pc(pw["sigma"]), "note": ""})
    return rows


MODEL_COLUMNS = ["machine", "lr_rule", "model", "weight", "lobo_log_density", "batches", "seeds_fitted", "censored",
                 "e_min_epochs", "e_min_interval", "s_min_steps", "s_min_interval", "b_crit_samples",
                 "b_crit_interval", "alpha", "alpha_interval", "per_seed_cv", "df", "weighting_method", "note"]
NOISE_COLUMNS = ["machine", "lr_rule", "k", "global_batch", "window", "b_noise", "b_noise_interval", "covers",
                 "seeds", "steps", "source", "b_crit", "b_crit_interval", "b_crit_over_b_noise", "ratio_interval",
                 "same_order"]
NOISE_INTERVAL_COLUMNS = ["machine", "lr_rule", "k", "global_batch", "from_epochs", "to_epochs", "seeds", "steps",
                          "b_simple", "b_simple_interval", "covers"]
HOLDOUT_COLUMNS = ["machine", "lr_rule", "k", "run", "global_batch", "check", "predicted_from", "measured_epochs",
                   "seeds_measured", "line_epochs", "line_error", "line_band", "line_inside", "power_epochs",
                   "power_error", "power_band", "power_inside", "weight_line", "combined_epochs", "combined_error",
                   "combined_band", "combined_inside", "misfit_rel_sd", "misfit_from", "seeds_censored",
                   "p_seed_over_budget", "p_censored_as_seen", "b_crit_of_fit", "note"]


def noise_rows(data: ReportData) -> list[dict]:
    return [{"machine": m.label, "lr_rule": rule["rule"], "k": r["k"], "global_batch": r["global_batch"],
             "window": r["window_text"], "b_noise": r["b_noise"] if r["b_noise"] is not None else
             ("not measured" if r["source"] == "not measured" else "–"),
             "b_noise_interval": iv(r["b_noise_lo"], r["b_noise_hi"]), "covers": r["covers"], "seeds": r["seeds"],
             "steps": r["steps"], "source": r["source"], "b_crit": r["b_crit"],
             "b_crit_interval": iv(r["b_crit_lo"], r["b_crit_hi"]), "b_crit_over_b_noise": r["ratio"],
             "ratio_interval": iv(r["ratio_lo"], r["ratio_hi"], lambda x: f"{x:.2f}"), "same_order": r["same_order"]}
            for m, rule in each_rule(data) for r in rule["noise"]]


def noise_interval_rows(data: ReportData) -> list[dict]:
    out = []
    for m, rule in each_rule(data):
        n = rule["train_images"] or None
        for r in rule["noise_intervals"]:
            out.append({"machine": m.label, "lr_rule": rule["rule"], "k": r["k"], "global_batch": r["global_batch"],
                        "from_epochs": ep(r["from_samples"] / n if n else None),
                        "to_epochs": ep(r["to_samples"] / n if n else None), "seeds": r["seeds"],
                        "steps": r["steps"], "b_simple": r["b_simple"], "b_simple_interval": iv(r["ci_lo"], r["ci_hi"]),
                        "covers": r["covers"]})
    return out


def holdout_rows(data: ReportData) -> list[dict]:
    rows = []
    two = (lambda lo, hi: iv(lo, hi, lambda x: f"{x:.2f}"))
    for m, rule in each_rule(data):
        for h in rule["holdout"]:
            g = h.get
            rows.append({"machine": m.label, "lr_rule": rule["rule"], "k": h["k"], "run": g("run", ""),
                         "global_batch": g("global_batch"), "check": g("check", ""),
                         "predicted_from": "k = " + listed(h["from_ks"]), "measured_epochs": ep(g("measured_epochs")),
                         "seeds_measured": g("measured_n"), "line_epochs": ep(g("line_epochs")),
                         "line_error": pc(g("line_relative_error")), "line_band": two(g("line_band_lo"),
                                                                                      g("line_band_hi")),
                         "line_inside": g("line_inside_band"), "power_epochs": ep(g("power_epochs")),
                         "power_error": pc(g("power_relative_error")),
                         "power_band": two(g("power_band_lo"), g("power_band_hi")), "power_inside":
                         g("power_inside_band"), "weight_line": pc((g("weights") or {}).get("line"), 0),
                         "combined_epochs": ep(g("predicted_epochs")), "combined_error": pc(g("relative_error")),
                         "combined_band": two(g("band_lo"), g("band_hi")), "combined_inside": g("inside_band"),
                         "misfit_rel_sd": pc(g("misfit_rel_sd")), "misfit_from": g("misfit_from") or "",
                         "seeds_censored": g("censored_n"), "p_seed_over_budget": g("p_seed_over_budget"),
                         "p_censored_as_seen": g("p_censored_as_seen"), "b_crit_of_fit": g("b_crit"),
                         "note": holdout_note(h, rule)})
    return rows


def holdout_note(h: dict, rule: dict) -> str:
    if h.get("note"):
        return h["note"]
    if h.get("censored_n") and rule["max_epochs"]:
        low = "; the measured mean is a lower bound" if h.get("measured_is_lower_bound") else ""
        return (f"{h['censored_n']} seed(s) did not reach the target within {rule['max_epochs']:g} epochs{low}: "
                f"the model gives a seed {h['p_seed_over_budget']:.0%} to need more, and {h['p_censored_as_seen']:.0%}"
                " to see as many censored as were")
    return ""


FORECAST_COLUMNS = ["machine", "lr_rule", "k", "nodes", "global_batch", "epochs", "epochs_band", "epochs_line",
                    "epochs_power", "samples_input", "over_budget", "samples_per_s", "samples_per_s_band",
                    "samples_per_s_input", "time_to_accuracy_s", "time_to_accuracy_band", "eval_share", "speedup",
                    "speedup_band", "p_fastest", "p_fastest_line", "p_fastest_power", "time_training_only_s",
                    "speedup_training_only", "speedup_training_only_band", "gpu_hours", "gpu_hours_band",
                    "p_cheapest"]


def forecast_rows(data: ReportData) -> list[dict]:
    """The time-to-accuracy forecast at every k of the throughput forecast: both forms."""
    rows = []
    for m, rule in each_rule(data):
        f, n, cap = rule["forecast"], rule["train_images"] or 1, rule["budget_samples"]
        for r in (f["clock"]["rows"] if f else []):
            t = tta.forecast_row(rule, r["k"], "train") or {}
            nodes = (rule["rates"].get(r["k"]) or {}).get("nodes", 1)
            by, pf = r.get("samples_by_model") or {}, r.get("p_fastest_by_model") or {}
            share = (r["time_s"] - t["time_s"]) / r["time_s"] if r["time_s"] and t.get("time_s") else None
            rows.append({"machine": m.label, "lr_rule": rule["rule"], "k": r["k"], "nodes": nodes,
                         "global_batch": r["global_batch"], "epochs": ep(r["samples"] / n),
                         "epochs_band": iv(r["samples_lo"] / n, r["samples_hi"] / n, lambda x: f"{x:.2f}"),
                         "epochs_line": ep(by["line"] / n if "line" in by else None),
                         "epochs_power": ep(by["power"] / n if "power" in by else None), "eval_share": pc(share, 0),
                         "p_fastest_line": pc(pf.get("line")), "p_fastest_power": pc(pf.get("power")),
                         "samples_input": r["samples_input"], "over_budget": bool(cap and r["samples"] > cap),
                         "samples_per_s": r["samples_per_s"],
                         "samples_per_s_band": iv(r["samples_per_s_lo"], r["samples_per_s_hi"]),
                         "samples_per_s_input": r["samples_per_s_input"], "time_to_accuracy_s": r["time_s"],
                         "time_to_accuracy_band": iv(r["time_s_lo"], r["time_s_hi"]), "speedup": times(r["speedup"]),
                         "speedup_band": iv_x(r["speedup_lo"], r["speedup_hi"]), "p_fastest": pc(r["p_fastest"]),
                         "time_training_only_s": t.get("time_s"), "speedup_training_only": times(t.get("speedup")),
                         "speedup_training_only_band": iv_x(t.get("speedup_lo"), t.get("speedup_hi")),
                         "gpu_hours": gh(r["gpu_hours"]), "gpu_hours_band": iv(r["gpu_hours_lo"], r["gpu_hours_hi"],
                                                                                    lambda x: f"{x:.3g}"),
                         "p_cheapest": pc(r["p_cheapest"])})
    return rows


# ---------------------------------------------------------------- words

def ratio_text(p: dict, key: str, pct: bool = False) -> str:
    """'1.31x [1.01, 1.66]' or '71.5% [54.9, 90.7]' (no interval: the value alone)."""
    v, lo, hi = p.get(key), p.get(f"{key}_lo"), p.get(f"{key}_hi")
    if v is None:
        return "–"
    f = (lambda x: f"{100 * x:.1f}") if pct else (lambda x: f"{x:.2f}")
    unit = "%" if pct else "x"
    return f"{f(v)}{unit}" + (f" [{f(lo)}, {f(hi)}]" if lo is not None and hi is not None else "")


def speedup_text(p: dict) -> str:
    """Both forms of the time-to-accuracy speed-up, labelled: the first screen's words."""
    if p.get("speedup") is None:
        return "time to accuracy: samples/s not measured at this k"
    return (f"time to accuracy {ratio_text(p, 'speedup')} faster ({tta.CLOCK}; {ratio_text(p, 'speedup_train')} "
            f"{tta.TRAIN})")


def point_text(p: dict, source: bool = False) -> str:
    """One k against k=1: speed-up (both forms) and statistical efficiency, with
    intervals; source: say where samples/s comes from when it was not measured."""
    if not p["scored"]:
        return f"time to accuracy: {no_score_text(p)}"
    src = p["samples_per_s_source"]
    return (f"{speedup_text(p)}, statistical efficiency {ratio_text(p, 'statistical_efficiency', True)} "
            f"(MLPerf's first evaluations: {ratio_text(p, 'statistical_efficiency_mlperf', True)})"
            + (f"; samples/s {src}" if source and p.get("speedup") is not None and not src.startswith("measured")
               else ""))


def epochs_headline(data: ReportData) -> str:
    parts = []
    for m, rule in each_rule(data):
        pts = [f"{p['epochs']:.2f} [{p['epochs_lo']:.2f}, {p['epochs_hi']:.2f}] at {p['global_batch']:,}"
               if p["epochs_lo"] is not None else (f"{p['epochs']:.2f} at {p['global_batch']:,}" if p["scored"]
                                                   else f"not reached at {p['global_batch']:,}")
               for p in rule["points"] if p["global_batch"]]
        f = rule["fit"]
        fit = (f"; E(B) fit: E_min {f['E_min']['value'] / rule['train_images']:.2f} epochs, B_crit "
               f"{fmt_num(f['B_crit']['value'])} samples {iv(f['B_crit']['ci_lo'], f['B_crit']['ci_hi'])}"
               if f and rule["train_images"] else "")
        parts.append(f"{m.label}, {rule['rule']} LR: epochs to {rule['target']:.0%} (interpolated crossings, mean "
                     f"[95% over seeds]) " + ", ".join(pts) + fit + noise_text(rule))
    return "; ".join(parts) or "No time-to-accuracy result."


def noise_text(rule: dict) -> str:
    """B_crit's counterpart in words: the progress-weighted noise scale (every k pooled),
    its range near the target, and the step-0-to-target B_simple said for what it is."""
    by = {(r["k"], r["window"]): r for r in rule["noise"] if r["b_noise"] is not None}
    pw = by.get(("k >= 2", "progress"))
    if not pw:
        return ""
    near = [r["b_noise"] for (k, w), r in by.items() if w == "near"]
    start = [r["b_noise"] for (k, w), r in by.items() if w == "start"]
    return (f"; the gradient noise scale, progress-weighted over the run (what E(B) ties to B_crit), "
            f"{fmt_num(pw['b_noise'])} {iv(pw['b_noise_lo'], pw['b_noise_hi'])} over every seed of every k >= 2"
            + (f", {fmt_num(min(near))}-{fmt_num(max(near))} near the target" if near else "")
            + (f", {fmt_num(min(start))}-{fmt_num(max(start))} from step 0 to the target (the first steps dominate "
               "that one)" if start else ""))


def headline(data: ReportData) -> str:
    parts = []
    for m, rec in numbers(data):
        rule = tta.primary(rec)
        for p in (q for q in rule["points"] if q["k"] > 1):
            parts.append(f"{m.label} k={p['k']} ({p['run']}, {rule['rule']} LR): {point_text(p, source=True)}")
    return "; ".join(parts) or "No time-to-accuracy result with a score at k=1 and a larger k."


def check_text(data: ReportData) -> str:
    """The out-of-sample check in one line per machine and rule: each row's mixture (the
    forecast's) against the measurement, then each model's mean error and how many of
    the rows the mixture's band holds."""
    parts = []
    for m, rule in each_rule(data):
        rows = [h for h in rule["holdout"] if h.get("measured_epochs") is not None]
        cens = [h for h in rule["holdout"] if h.get("measured_epochs") is None and h.get("censored_n")]
        if not rows and not cens:
            continue
        txt = ", ".join(f"k={h['k']} from k = {listed(h['from_ks'])}: {h['predicted_epochs']:.2f} epochs predicted, "
                        f"{h['measured_epochs']:.2f} measured ({100 * h['relative_error']:+.1f}%, "
                        f"{'inside' if h['inside_band'] else 'OUTSIDE'} its band)" for h in rows)
        txt += "".join(f"{', ' if txt else ''}k={h['k']}: {h['predicted_epochs']:.2f} epochs predicted, "
                       f"{h['censored_n']} seed(s) not at the target in the budget (P = {h['p_censored_as_seen']:.2f})"
                       for h in cens)
        mean = (lambda key: sum(abs(h[key]) for h in rows) / len(rows) if rows else None)
        summary = (f" (mean |error| over the {len(rows)} rows: the line {100 * mean('line_relative_error'):.1f}%, "
                   f"the power law {100 * mean('power_relative_error'):.1f}%, their mixture "
                   f"{100 * mean('relative_error'):.1f}%; the mixture's band holds {sum(bool(h['inside_band']) for h in rows)}"
                   f" of {len(rows)})") if rows and all(h.get("power_relative_error") is not None for h in rows) else ""
        parts.append(f"{m.label}, {rule['rule']} LR, out of sample: {txt}{summary}")
    return "; ".join(parts)


def public_note() -> list[str]:
    """The borrowed misfit on the public tables, with and without its largest contributor."""
    c = tta.public_coverage()
    if not c:
        return []
    w, x = c["coverage_wide"], c.get("without_largest")
    out = (f"E(B)'s band with the misfit it borrows, on MLPerf's public tables (one per family): {w['k']} of "
           f"{w['n']} inside, median half-width {c['median_half_width_pct']:.1f}% of the prediction")
    if x:
        out += (f"; without its largest contributor ({x['family']}, {100 * x['share']:.0f}% of the pool's squared "
                f"errors) {x['coverage_wide']['k']} of {x['coverage_wide']['n']}, half-width "
                f"{x['median_half_width_pct']:.1f}% (docs/public-convergence.md)")
    return [out]


def page(data: ReportData) -> Page:
    notes = missing_notes(data, tta.EXPERIMENT)
    check = check_text(data)
    return Page("tta", CHAPTER.title, prose("tta"),
                figures=[figure(FIGURES[0], epochs_headline(data) + (f". {check}" if check else ""),
                                notes + repeat_notes(data) + public_note()),
                         figure(FIGURES[1], headline(data), notes)], tables=tables(data))


def tables(data: ReportData) -> list:
    t = records_table
    return [
        t("tta", "Time to accuracy per LR rule and k: samples and epochs to target from each seed's crossing "
          "interpolated between evaluations (mean over seeds, 95% interval over independent seeded launches); "
          "MLPerf's score of the first evaluations at or above the target beside (mean of the seeds without the "
          "fastest and the slowest; min and max of those kept), and the clock as measured", tta_rows(data),
          TTA_COLUMNS),
        t("tta_measurements", "Each measurement of each point (runs/ and the machine's earlier/ folder), and the "
          "pooled result: measurements of one protocol pool, a seed several of them ran counted once as the mean "
          "of its launches (a repeated seed starts from the same weights and data order: not independent); epochs "
          "to target, mean over the measurement's seeds with its 95% interval; each measurement's own speed-up "
          "over k=1 (its seeds at k against its own at k=1) and verdict beside the pool's",
          measurement_rows(data), MEASUREMENT_COLUMNS),
        t("tta_seeds", "Every seed: where its accuracy curve crossed the target, interpolated and at MLPerf's first "
          "evaluation; the resolution is the bracket's width", seed_rows(data), SEED_COLUMNS),
        t("goodput", "Time to accuracy = samples to target x (1 / samples/s(k) + evaluation seconds per sample), "
          "and its speed-up over k=1, in two forms: evaluation on the clock, and training only", goodput_rows(data),
          GOODPUT_COLUMNS, note=GOODPUT_NOTE),
        t("tta_model", "Samples to target against the global batch, two models fitted over the seeds: the line E(B) = "
          "E_min (1 + B / B_crit) (weighted for a constant coefficient of variation) and the power law c B^alpha "
          "(least squares on the logs); 95% intervals over seeds; each model's weight in the forecast from its "
          "leave-one-batch-out predictive scores", model_rows(data), MODEL_COLUMNS),
        t("tta_noise", "The gradient noise scale over three windows of each seed's run, pooled over the seeds, beside "
          "the fitted B_crit: from step 0 to the target (the worker's B_simple: the first steps dominate it), near "
          "the target, and the progress-weighted average over the run, which the E(B) model ties to B_crit "
          "(McCandlish et al. 2018's per-step model); B_crit over it with a Monte Carlo interval", noise_rows(data),
          NOISE_COLUMNS, note=NOISE_NOTE),
        t("tta_noise_intervals", "The gradient noise scale per evaluation interval (tr(Sigma) over |G|^2 summed over "
          "the seeds' steps in it, up to each seed's target), Fieller's 95% interval over the seeds",
          noise_interval_rows(data), NOISE_INTERVAL_COLUMNS),
        t("tta_holdout", "The models checked out of sample, every row: each k predicted from the smaller k only "
          "(forward) and from every other k (leave one out: the folds that weigh the models), by the line, the power "
          "law and their mixture (weights from the fitted k's own folds), against the mean of the seeds measured "
          "there; bands: 95% for the mean of that many seeds, the mixture's with the between-batch misfit "
          "(its relative sd, from the fit's own errors or the public tables' pool)", holdout_rows(data), HOLDOUT_COLUMNS),
        t("tta_forecast", "Time-to-accuracy forecast: predicted samples to target at k x the per-rank batch over "
          "samples/s(k) (measured, or the throughput forecast), with a joint band", forecast_rows(data),
          FORECAST_COLUMNS, note=FORECAST_NOTE),
        jobs_table(data, "tta")]


GOODPUT_NOTE = ("samples/s(k) at time to accuracy's per-rank batch and image size: this machine's ddp_weak at k "
                "(95% interval), else the time-to-accuracy launches themselves at a real k (over seeds), else the "
                "throughput forecast (its band); 'not measured' when none. Speed-up intervals: Fieller over the "
                "seeds, samples/s at its value. clock_speedup: the seeds' own clocks, where k=1 and k both ran on "
                "real devices. Goodput efficiency = speed-up (training only) / k = hardware x statistical "
                "efficiency.")
NOISE_NOTE = ("Each window's noise scale is the sum of tr(Sigma) over the sum of |G|^2 over its steps, pooled over "
              "the seeds; its interval is Fieller's over the seeds (each seed's window one sample), except the "
              "worker's step-0-to-target B_simple, whose interval covers blocks of steps only. The progress-weighted "
              "average weighs each step by the progress it makes under the per-step model, 1 / (1 + B_noise / B): "
              "the sum of tr(Sigma) / |G_B|^2 over the sum of |G|^2 / |G_B|^2, per evaluation interval, |G_B|^2 the "
              "expected squared norm of the batch gradient; it is the noise scale that E_min / S_min estimates. "
              "'k >= 2' pools it over every seed of every k.")
FORECAST_NOTE = ("Bands by Monte Carlo: per draw a model by its weight (the line or the power law), its "
                 "coefficients (95%, over seeds) and samples/s(k) (the throughput forecast's band), drawn "
                 "independently; epochs is the mixture's, epochs_line and epochs_power each model's; p_fastest and "
                 "p_cheapest: the share of draws in which that k takes the least time or GPU-hours (p_fastest_line "
                 "and _power: among that model's draws); eval_share: the evaluation's share of the predicted time "
                 "with the evaluation on the clock. samples_input says whether seeds ran at that batch; "
                 "over_budget: more samples than a launch was allowed (max_epochs), so no run there would have "
                 "been scored.")


CHAPTER = Chapter("tta", "Time to accuracy: will k GPUs train sooner?", FIGURES, TABLES, page)


# ---------------------------------------------------------------- the tidy table's rows

TIDY = (("samples_to_target_interpolated", "samples"), ("time_to_accuracy_s", "time_s"),
        ("time_to_accuracy_training_only_s", "time_train_s"), ("samples_per_s_for_tta", "samples_per_s"),
        ("statistical_efficiency", "statistical_efficiency"), ("tta_speedup", "speedup"),
        ("tta_speedup_training_only", "speedup_train"), ("goodput_efficiency", "goodput_efficiency"),
        ("tta_clock_speedup", "clock_speedup"))


def tidy_rows(data: ReportData) -> list[dict]:
    """The chapter's numbers for results.csv: per machine, LR rule and k, each with its
    interval and what it covers (dpscale.report.tidy's columns)."""
    rows = []
    for m, rule, p in each_point(data):
        r = m.get(tta.EXPERIMENT, rule["rule"], p["k"]) or {}
        head = {"machine": m.label, "experiment": tta.EXPERIMENT, "variant": rule["rule"], "k": p["k"], "status": "ok",
                "data_source": (r.get("data") or {}).get("source"), "commit": (r.get("code") or {}).get("commit")}
        for name, key in TIDY:
            if p.get(key) is None:
                continue
            lo, hi = p.get(f"{key}_lo"), p.get(f"{key}_hi")
            covers = (p["samples_per_s_covers"] if key == "samples_per_s" else tta.SEEDS) if lo is not None else ""
            rows.append({**head, "metric": name, "value": p[key], "ci_lo": lo, "ci_hi": hi,
                         "n": len(p["seeds"]) if key != "samples_per_s" else None, "covers": covers})
        if p["statistical_efficiency_mlperf"] is not None:
            rows.append({**head, "metric": "statistical_efficiency_mlperf", "value": p["statistical_efficiency_mlperf"],
                         "ci_lo": None, "ci_hi": None, "n": len(p["seeds"]), "covers": ""})
        rows += noise_tidy(rule, p, head)
    return rows + growth_tidy(data) + forecast_tidy(data)


NOISE_TIDY = {"start": "b_simple_start_to_target", "near": "b_simple_near_target",
              "progress": "b_simple_progress_weighted"}


def noise_tidy(rule: dict, p: dict, head: dict) -> list[dict]:
    """The point's noise scale over each window (dpscale.report.tta_noise), with its interval."""
    return [{**head, "metric": NOISE_TIDY[r["window"]], "value": r["b_noise"], "ci_lo": r["b_noise_lo"],
             "ci_hi": r["b_noise_hi"], "n": r["seeds"], "covers": r["covers"]}
            for r in rule["noise"] if r["k"] == p["k"] and r["b_noise"] is not None]


def growth_tidy(data: ReportData) -> list[dict]:
    """The first screen's samples/s growth of the step that trained, per machine and k
    (dpscale.report.tta.growth, as chapters.answer.opening reads it), as throughput_speedup."""
    fcs = {f["machine"]: f for f in fcr.compute(data)}
    rows = []
    for m in data.measured:
        rule = tta.primary(of(data, m)) if of(data, m) else None
        v, thr = tta.growth(m, rule, fcs.get(m.name))
        for k, t in sorted((k, t) for k, t in thr.items() if k > 1):
            own = not t.get("variant") and rule   # the time-to-accuracy launches' own samples/s
            rows.append({"machine": m.label, "experiment": tta.EXPERIMENT if own else tta.RATE,
                         "variant": rule["rule"] if own else t.get("variant") or v,
                         "k": k, "status": "ok" if t["source"] == "measured" else "predicted",
                         "data_source": None, "commit": None, "metric": "throughput_speedup", "value": t["value"],
                         "ci_lo": t["lo"], "ci_hi": t["hi"], "n": None, "covers": t["covers"] if t["lo"] else ""})
    return rows


def forecast_tidy(data: ReportData) -> list[dict]:
    """The forecast's predicted time and speed-up per k, variant '<rule> (forecast)'."""
    rows = []
    for m, rule in each_rule(data):
        f = rule["forecast"]
        for form, suffix in (("clock", ""), ("train", "_training_only")):
            for r in (f[form]["rows"] if f else []):
                head = {"machine": m.label, "experiment": tta.EXPERIMENT, "variant": f"{rule['rule']} (forecast)",
                        "k": r["k"], "status": "predicted", "data_source": None, "commit": None, "n": None,
                        "covers": f["clock"]["covers"]}
                for name, key in ((f"predicted_time_to_accuracy{suffix}_s", "time_s"),
                                  (f"predicted_tta_speedup{suffix}", "speedup")):
                    if r.get(key) is not None:
                        rows.append({**head, "metric": name, "value": r[key], "ci_lo": r[f"{key}_lo"],
                                     "ci_hi": r[f"{key}_hi"]})
                if not suffix:
                    rows.append({**head, "metric": "predicted_samples_to_target", "value": r["samples"],
                                 "ci_lo": r["samples_lo"], "ci_hi": r["samples_hi"]})
    return rows
