"""The report's first screen: will k GPUs train sooner? One figure (speed-up over k=1
against k, out to the throughput forecast's nodes: samples/s measured and forecast, and
time to accuracy measured, emulated and predicted, with intervals and bands, each
machine beside the book) and a few lines: per machine and k, one samples/s growth (of
the step the time-to-accuracy runs trained with: registry.ANSWER) and one measured
time-to-accuracy speed-up, training and evaluation apart; a forecast at a measured k
after it, labelled; then the k predicted to reach the target soonest, the k that spends
the fewest GPU-hours, and where the evaluation protocol is most of the clock.

opening(data, m) computes a machine's answer once (memoised on the machine); the
first screen's words, its table and figure, and the closing summary
(dpscale.report.summary) all format that one record. The provenance's one-line summary
sits above (the header); its tables and notes are a chapter of their own further down."""
from __future__ import annotations

import re

from dpscale.analysis.stateff.model_choice import NAMES
from dpscale.report import forecast as fcr, tta
from dpscale.report.document import Chapter, FigureSpec, Page
from dpscale.report.machines import Machine, ReportData
from dpscale.report.chapters.common import figure, prose, records_table
from dpscale.report.chapters.tta import no_score_text, numbers, of

FIGURES = (FigureSpec("answer", "This machine: speed-up over one device against k, out to the forecast's nodes: "
                                "samples/s (weak scaling) and time to accuracy, measured, emulated and predicted"),
           FigureSpec("answer_others", "The kept machines and the book, the same axes"))
FAR_K = 32          # the forecast's far point named on the first screen: 4 nodes of 8 (else the farthest k)
EVAL_DOMINATES = 0.5   # the evaluation protocol's share of the clock above which the first screen says so


# ---------------------------------------------------------------- the answer, once per machine

def opening(data: ReportData, m: Machine) -> dict:
    """A machine's answer, computed once: {"machine", "rule" (the primary LR rule's
    dpscale.report.tta record, or None), "variant" (the weak-scaling series of the step
    that trained), "rows" (per k: throughput growth, the measured point, the forecast's
    rows in both forms, the evaluation's share of each clock), "predicted" (soonest,
    cheapest, the far point; None without a forecast)}."""
    return m.memo("answer_opening", lambda: _opening(data, m))


def _opening(data: ReportData, m: Machine) -> dict:
    rec = of(data, m)
    rule = tta.primary(rec) if rec else None
    fc = next((f for f in fcr.compute(data) if f["machine"] == m.name), None)
    variant, thr = tta.growth(m, rule, fc)
    pts = {p["k"]: p for p in (rule or {}).get("points", [])}
    fc = ((rule or {}).get("forecast") or {}).get("clock") or {}
    ks = sorted(set(thr) | set(pts) | {r["k"] for r in fc.get("rows", [])})
    rows = []
    for k in ks:
        pred, train = tta.forecast_row(rule, k), tta.forecast_row(rule, k, "train")
        p = pts.get(k)
        rows.append({"k": k, "throughput": thr.get(k), "point": p, "predicted": pred, "predicted_train": train,
                     "eval_share": _share(p and p.get("time_s"), p and p.get("time_train_s")),
                     "predicted_eval_share": _share((pred or {}).get("time_s"), (train or {}).get("time_s"))})
    return {"machine": m, "rule": rule, "variant": variant, "rows": rows, "predicted": _predicted(rule, rows)}


def _share(clock_s, train_s) -> float | None:
    """The evaluation's share of a time to accuracy: (clock - training only) / clock."""
    return (clock_s - train_s) / clock_s if clock_s and train_s is not None else None


def _predicted(rule: dict | None, rows: list[dict]) -> dict | None:
    """The forecast's answer: the soonest k (and how often over the draws), the k with the
    fewest GPU-hours, the far point (4 nodes of 8, else the farthest k), and the k's
    where the evaluation protocol is most of the predicted clock."""
    f = (rule or {}).get("forecast")
    if not f or f["clock"]["fastest_k"] is None:
        return None
    c = f["clock"]
    at = {r["k"]: r for r in rows if (r["predicted"] or {}).get("speedup") is not None}
    if not at:   # no k=1 samples/s: no speed-up to name
        return None
    far = at.get(FAR_K) or at[max(at)]
    nodes = (rule["rates"].get(far["k"]) or {}).get("nodes", 1)
    return {"soonest": at.get(c["fastest_k"]) or next(r for r in rows if r["k"] == c["fastest_k"]),
            "cheapest": next(r for r in rows if r["k"] == c["cheapest_k"]), "far": far, "far_nodes": nodes,
            "extrapolated_above": max(rule["measured_batches"], default=0), "models": c.get("models"), "rule": rule,
            "supported": c.get("supported_batch_max"),
            "eval_dominates": [r for r in at.values() if (r["predicted_eval_share"] or 0) > EVAL_DOMINATES]}


# ---------------------------------------------------------------- words

def x_text(d: dict | None, key: str = "value") -> str:
    """'1.88x [1.86, 1.89]' (no interval: the value alone), or '–'."""
    if not d or d.get(key) is None:
        return "–"
    lo, hi = (d.get("lo"), d.get("hi")) if key == "value" else (d.get(f"{key}_lo"), d.get(f"{key}_hi"))
    return f"{d[key]:.2f}x" + (f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else "")


def pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def growth_text(t: dict | None) -> str:
    """The samples/s growth of the step that trained: 'samples/s 1.88x [1.86, 1.89] (forecast)'."""
    if not t:
        return "samples/s not measured here"
    level = next(iter(re.findall(r"\d+%", t.get("covers") or "")), "") if t["source"] == "forecast" else ""
    return f"samples/s {x_text(t)} ({t['source']}" + (f", its {level} band)" if level else ")")


def tta_text(p: dict, share: float | None) -> str:
    """The measured time-to-accuracy speed-up, training and evaluation apart."""
    if not p["scored"]:
        return f"time to accuracy: {no_score_text(p)}"
    if p.get("speedup_train") is None:
        return "time to accuracy: samples/s not measured at this k"
    if p.get("speedup") is None:
        return (f"time to accuracy {x_text(p, 'speedup_train')} {tta.TRAIN}; with {tta.CLOCK}: not measured "
                f"(this k's evaluations were not timed as a k-GPU job runs them)")
    return (f"time to accuracy {x_text(p, 'speedup_train')} {tta.TRAIN}, {x_text(p, 'speedup')} with "
            f"{tta.CLOCK} ({p['time_train_s']:.1f} s training + {p['time_s'] - p['time_train_s']:.1f} s "
            f"evaluation, {pct(share)} of it)")


def forecast_text(r: dict) -> str:
    """The forecast at a k, labelled: after the measurement where k was measured."""
    pred, train = r["predicted"], r["predicted_train"] or {}
    return (f"forecast {x_text(train, 'speedup')} {tta.TRAIN}, {x_text(pred, 'speedup')} with {tta.CLOCK} "
            f"(evaluation {pct(r['predicted_eval_share'])} of it)" + (", beyond the evidence" if pred.get("beyond_evidence")
                                                                     else ""))


def k_text(r: dict) -> str:
    """One k of a machine: samples/s growth, the measured time to accuracy, then the forecast."""
    p = r["point"]
    head = f"k={r['k']}" + (f" ({p['run']})" if p else "")
    parts = [growth_text(r["throughput"])] + ([tta_text(p, r["eval_share"])] if p else [])
    if p and p["scored"]:
        parts.append(f"statistical efficiency {x_pct(p, 'statistical_efficiency')}")
    if p and r["predicted"] and r["predicted"].get("speedup") is not None:
        parts.append(forecast_text(r))
    return f"{head}: " + "; ".join(parts)


def x_pct(p: dict, key: str) -> str:
    v, lo, hi = p.get(key), p.get(f"{key}_lo"), p.get(f"{key}_hi")
    if v is None:
        return "–"
    return f"{100 * v:.1f}%" + (f" [{100 * lo:.1f}, {100 * hi:.1f}]" if lo is not None and hi is not None else "")


def models_text(models: dict | None) -> str:
    """'E(B): the line 62%, the power law 38%' (the weights the forecast draws with)."""
    if not models:
        return "E(B) fit"
    return "E(B): " + ", ".join(f"{name} {w:.0%}" for name, w in models.items())


def dominance_text(pr: dict) -> str:
    """Where the evaluation protocol is most of the predicted clock: from which k on, and
    its share at one node of 8 and at the far point."""
    dom = sorted(pr["eval_dominates"], key=lambda r: r["k"])
    if not dom:
        return ""
    at = {r["k"]: r for r in dom}
    named = [at[k] for k in sorted({dom[0]["k"], 8, pr["far"]["k"]}) if k in at]
    return (f"the evaluation protocol ({tta.protocol_words(pr['rule'])}) is most of the "
            f"predicted clock from k={dom[0]['k']} on (" + ", ".join(f"k={r['k']} {pct(r['predicted_eval_share'])}"
                                                         for r in named) + ")")


def no_soonest_text(o: dict) -> str:
    """Why the forecast names no soonest k, where it was made but could not compare k=1
    with another k ('' otherwise): a missing input said, never answered."""
    why = ((((o["rule"] or {}).get("forecast") or {}).get("clock") or {}).get("no_choice_reason"))
    return f"predicted: no soonest k named ({why})" if why else ""


def predicted_text(o: dict) -> str | None:
    """The forecast's answer in one sentence (evaluation on the clock unless said)."""
    pr = o["predicted"]
    if not pr:
        return None
    fast, cheap, far = pr["soonest"], pr["cheapest"], pr["far"]
    where = f"{pr['far_nodes']} nodes of {far['k'] // pr['far_nodes']} (k={far['k']})" if pr["far_nodes"] > 1 \
        else f"k={far['k']}"
    dom = dominance_text(pr)
    by = fast["predicted"].get("p_fastest_by_model") or {}
    alone = (" (" + ", ".join(f"{NAMES.get(n, n)} alone {v:.0%}" for n, v in by.items()) + ")") if len(by) > 1 else ""
    return (f"predicted ({models_text(pr['models'])}, over samples/s): soonest at k={fast['k']} in "
            f"{fast['predicted']['p_fastest']:.0%} of the draws{alone}, {forecast_text(fast)}; fewest GPU-hours at "
            f"k={cheap['k']}; {where}: {forecast_text(far)}"
            + (f" (batches above {pr['extrapolated_above']:,} extrapolated; soonest named among batches up to "
               f"{pr['supported']:,.0f}, twice the largest measured: past it the forecast is beyond the evidence)"
               if pr["extrapolated_above"] and pr.get("supported") else "")
            + (f". {dom[0].upper()}{dom[1:]}: there the clock form measures the protocol, the training-only form "
               "the scaling" if dom else ""))


def verdict_text(o: dict) -> str | None:
    """This machine's verdict per k, read off the numbers it states: 'sooner', 'not
    distinguishable' or 'later' at 95% on the pool of every measurement (evaluation on the
    clock as the job pays it; training only where that form is not measured), each
    measurement whose own verdict differs named; None without a measured k >= 2."""
    rule = o["rule"]
    ks = [r["point"] for r in o["rows"] if r["k"] > 1 and r["point"] and r["point"]["scored"]]
    if not rule or not ks:
        return None
    # A k without a time (no samples/s there, or none at k=1) says why and does not
    # take the clock form from the k's that have one.
    timed = [p for p in ks if p.get("speedup_train") is not None]
    clock = bool(timed) and all(p.get("speedup") is not None for p in timed)
    key, form = ("speedup", tta.CLOCK) if clock else ("speedup_train", tta.TRAIN)
    parts = []
    for p in ks:
        if p.get("speedup_train") is None:
            parts.append(f"k={p['k']} ({p['run']}): {no_time_text(o, p)}")
            continue
        v = p["verdict"] if clock else p["verdict_train"]
        n = sum(s.get("launches", 1) for s in p["seeds"])
        pooled = [x for x in p["measurements"] if x["pooled"]]
        also = f", {x_text(p, 'speedup_train')} {tta.TRAIN}" if clock else ""
        part = (f"k={p['k']} ({p['run']}) {v}: {x_text(p, key)} {'with ' if clock else ''}{form}{also} ({len(p['seeds'])} seeds, {n} "
                f"launches, {len(pooled)} measurement(s))")
        off = [x for x in pooled if x.get("verdict" if clock else "verdict_train") not in ("not measured", v)]
        if off:
            part += "; but " + ", ".join(f"{x['label']} alone: {x['verdict' if clock else 'verdict_train']} "
                                         f"{x_text(x, key)} {form}" for x in off)
        parts.append(part)
    return (f"{who(o['machine'])}: will k GPUs reach {rule['target']:.0%} sooner than one? Time to accuracy "
            f"against k=1, 95% over seeds: " + "; ".join(parts) + caveat(o["machine"]))


def no_time_text(o: dict, p: dict) -> str:
    """A scored point without a time to accuracy against k=1, as the verdict and the headline say it."""
    return f"no time to accuracy, {no_time_reason(o, p)}"


def no_time_reason(o: dict, p: dict) -> str:
    """Why a scored point has no time to accuracy against k=1: the input it lacks."""
    base = next((r["point"] for r in o["rows"] if r["k"] == 1), None)
    if not base or not base.get("seeds"):
        return "no k=1 time to accuracy on this machine to compare with"
    if base.get("samples_per_s") is None:
        return "no samples/s at k=1 on this machine"
    if p.get("samples_per_s") is None:
        return f"no samples/s at k={p['k']} on this machine (its samples to the target are measured)"
    return "no ratio over the seeds"


def headline(o: dict) -> str:
    """A machine's answer in one sentence: the measured speed-ups in both forms, the soonest k predicted."""
    m, rule = o["machine"], o["rule"]
    ks = [r for r in o["rows"] if r["k"] > 1 and r["point"]]
    done = "; ".join(f"k={r['k']} ({r['point']['run']}): " + _measured(o, r["point"]) for r in ks)
    pr = o["predicted"]
    return (f"{who(m)}, to {rule['target']:.0%} test accuracy ({rule['rule']} LR; {step_words(o)}; "
            f"{tta.protocol_words(rule)}): time to accuracy against k=1, measured: {done}" + (f"; predicted soonest: k={pr['soonest']['k']} (in "
                                                f"{pr['soonest']['predicted']['p_fastest']:.0%} of the draws)"
                                                if pr else "") + caveat(m))


def _measured(o: dict, p: dict) -> str:
    """A k's measured time-to-accuracy speed-up in both forms, or why it has none."""
    if not p["scored"]:
        return no_score_text(p)
    if p.get("speedup_train") is None:
        return no_time_text(o, p)
    clock = x_text(p, 'speedup') if p.get("speedup") is not None else "not measured"
    return f"{x_text(p, 'speedup_train')} {tta.TRAIN}, {clock} with {tta.CLOCK}"


def caveat(m: Machine) -> str:
    out = "; smoke scale: checks the pipeline, not the book's experiment" if m.scale == "smoke" else ""
    sources = m.data_sources()
    return out + ("; SYNTHETIC data" if sources == ["synthetic"] else
                  "; some results on SYNTHETIC data (see the provenance)" if "synthetic" in sources else "")


def who(m: Machine) -> str:
    return "the book" if m.kind == "book" else m.label


def step_words(o: dict) -> str:
    """Which step's samples/s: '(samples/s of the step that trained: ddp_weak tuned)'."""
    if o["rule"] and o["variant"]:
        return f"samples/s of the step that trained: {tta.RATE} {o['variant']}"
    if o["rule"]:
        return "samples/s of the time-to-accuracy launches themselves (no weak-scaling series at their protocol)"
    return f"samples/s of the step time to accuracy trains with here: {tta.RATE} {o['variant']}"


def lines(data: ReportData) -> list[str]:
    """The first screen's words: this run's (mine()), then the other machines' (others())."""
    return (mine(data) + others(data)) or ["No scaling result yet."]


def _tta_lines(data: ReportData, m: Machine) -> list[str]:
    """A machine with a time to accuracy: its verdict per k, its answer, a line per k and
    its forecast's ([] without a measured k >= 2)."""
    o = opening(data, m)
    ks = [r for r in o["rows"] if r["k"] > 1 and r["point"]]
    if not o["rule"] or not ks:
        return []
    return ([t for t in [verdict_text(o)] if t] + [headline(o)] + [f"{who(m)} {k_text(r)}" for r in ks]
            + [f"{who(m)} {t}" for t in [predicted_text(o) or no_soonest_text(o)] if t])


def _rate_line(data: ReportData, m: Machine) -> list[str]:
    """A machine without a time to accuracy: its measured samples/s growth in one line."""
    rows = [r for r in opening(data, m)["rows"] if r["k"] > 1 and (r["throughput"] or {}).get("source") == "measured"]
    return [f"{who(m)} ({step_words(opening(data, m))}): " + "; ".join(k_text(r) for r in rows) + caveat(m)] \
        if rows else []


def mine(data: ReportData) -> list[str]:
    """This run's words (the first screen's first figure)."""
    m = data.current
    return [] if m is None else (_tta_lines(data, m) or _rate_line(data, m))


def others(data: ReportData) -> list[str]:
    """Every other machine's, those with a time to accuracy first."""
    rest = [m for m in data.machines if m is not data.current]
    tta_ids = {id(m) for m, _r in numbers(data)}
    out = [x for m in rest if id(m) in tta_ids for x in _tta_lines(data, m)]
    return out + [x for m in rest if id(m) not in tta_ids or not _tta_lines(data, m) for x in _rate_line(data, m)]


# ---------------------------------------------------------------- the table

COLUMNS = ["machine", "k", "run", "samples_per_s_from", "throughput_x", "throughput_ci", "tta_train_x",
           "tta_train_ci", "tta_x", "tta_ci", "eval_share", "stat_eff", "stat_eff_ci", "note"]


def _cells(t: dict, p: dict | None, share: float | None) -> dict:
    """A row's numbers: samples/s, time to accuracy (both forms) and statistical efficiency."""
    from dpscale.report.chapters.tta import iv, pc, times
    g = (lambda key: (p or {}).get(key))
    two = (lambda lo, hi: iv(lo, hi, lambda x: f"{x:.2f}"))
    return {"samples_per_s_from": t.get("source", "not measured"), "throughput_x": times(t.get("value")),
            "throughput_ci": two(t.get("lo"), t.get("hi")), "tta_x": times(g("speedup")),
            "tta_ci": two(g("speedup_lo"), g("speedup_hi")), "tta_train_x": times(g("speedup_train")),
            "tta_train_ci": two(g("speedup_train_lo"), g("speedup_train_hi")), "eval_share": pc(share, 0),
            "stat_eff": pc(g("statistical_efficiency")),
            "stat_eff_ci": iv(g("statistical_efficiency_lo"), g("statistical_efficiency_hi"),
                              lambda x: f"{100 * x:.1f}%")}


def table_rows(data: ReportData) -> list[dict]:
    """Per machine, each k that ran (or was emulated) against k=1, then the forecast at the
    soonest k, a full node and 4 nodes; time to accuracy in both forms, with intervals."""
    out = []
    mine = [m for m, _r in numbers(data)]
    for m in mine + [m for m in data.machines if all(m is not x for x in mine)]:
        o = opening(data, m)
        for r in o["rows"]:
            p, t = r["point"], r["throughput"] or {}
            if r["k"] < 2 or not (p or t.get("source") == "measured"):
                continue
            note = no_score_text(p) if p and not p["scored"] else ""
            out.append({"machine": who(m), "k": r["k"], "run": (p or {}).get("run", "real"),
                        **_cells(t, p, r["eval_share"]), "note": note})
        out += predicted_rows(o, who(m))
    return out


def predicted_rows(o: dict, name: str) -> list[dict]:
    """The forecast at the k that reaches the target soonest, at one node of 8 and at 4."""
    pr = o["predicted"]
    if not pr:
        return []
    out = []
    fast = pr["soonest"]["k"]
    by = {r["k"]: r for r in o["rows"]}
    for k, why in ((fast, "predicted soonest"), (8, "one node of 8"), (FAR_K, "4 nodes of 8")):
        r = by.get(k)
        if not r or (r["predicted"] or {}).get("speedup") is None or any(x["k"] == k for x in out):
            continue
        pred, t = r["predicted"], r["predicted_train"] or {}
        band = {"speedup": pred["speedup"], "speedup_lo": pred["speedup_lo"], "speedup_hi": pred["speedup_hi"],
                "speedup_train": t.get("speedup"), "speedup_train_lo": t.get("speedup_lo"),
                "speedup_train_hi": t.get("speedup_hi")}
        out.append({"machine": name, "k": k, "run": "predicted", **_cells(r["throughput"] or {}, band,
                                                                            r["predicted_eval_share"]),
                    "note": f"{why}; " + ("beyond the evidence (a batch past twice the largest measured): no "
                                          "soonest named here" if pred.get("beyond_evidence") else
                                          f"the soonest in {pred['p_fastest']:.0%} of draws") + (
                        f"; fewest GPU-hours: k={pr['cheapest']['k']}" if k == fast else "")
                    + ("; a forecast at a measured k: the measured row comes first" if r["point"] else "")})
    return out


def page(data: ReportData) -> Page:
    ls, rest = mine(data) or ["No time-to-accuracy result on this machine yet."], others(data)
    return Page("answer", CHAPTER.title, prose("answer"), lead=1,
                figures=[figure(FIGURES[0], ls[0], ls[1:]),
                         figure(FIGURES[1], "Beside the kept machines and the book (speed-up over their own k=1)",
                                rest)],
                tables=[records_table("answer", "The answer per machine and k, speed-up over k=1: throughput_x in "
                                      "samples/s of the step that trained; tta_train_x in time to accuracy, training "
                                      "only; tta_x, with the evaluation on the clock (eval_share: the evaluation's "
                                      "share of that clock); stat_eff, statistical efficiency", table_rows(data),
                                      COLUMNS, note=TABLE_NOTE)])


TABLE_NOTE = ("Intervals (_ci): 95% over independent seeded launches for time to accuracy and statistical "
              "efficiency; samples/s its own 95% interval where measured, the throughput forecast's band where "
              "forecast. samples/s is the step's that the time-to-accuracy runs trained with (registry.ANSWER), "
              "so tta_train_x = stat_eff x throughput_x. Predicted rows: the E(B) models over samples/s(k), a "
              "joint band; at a measured k they come after the measured row.")


CHAPTER = Chapter("answer", "Will k GPUs train sooner?", FIGURES, ("answer",), page)
