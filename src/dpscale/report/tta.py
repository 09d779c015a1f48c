"""Time to accuracy, the numbers: per machine and LR rule, every seed's crossing of the
target, each point's samples to target with its interval, statistical efficiency,
samples/s at time to accuracy's protocol, time to accuracy and its speed-up over k=1
with 95% intervals over the seeds, the E(B) model, its out-of-sample check, the noise
scale beside B_crit, and the time-to-accuracy forecast to the throughput forecast's
nodes. dpscale.analysis.stateff (a module a topic) does the statistics; here results become its inputs.

The chapters (chapters.tta, chapters.answer), the tidy table, the closing summary and
`dpscale forecast` (report.forecast.tta_text) read the same records: of_machine(m, fc),
fc being the machine's throughput forecast (report.forecast.of_machine) or None.

One definition of time to accuracy, two forms, everywhere:
    time to accuracy(k) = samples to target(k) x (1 / samples/s(k) + e(k))
with e(k) the seconds per training sample that the protocol's evaluations cost a k-GPU
job (eval_per_sample: their cadence, the test set sharded over the k ranks, as the
newest measurement at k timed them; the instrument's evaluations, which only locate the
crossing, are off the clock), "evaluation on the clock", and e = 0, "training only". samples to target is the seeds' mean of each seed's crossing
interpolated between the evaluations that bracket it (crossings.crossing; MLPerf's score
of the first evaluation at or above the target beside it). The speed-up is time at
k=1 over time at k, its interval Fieller's over the seeds (over_seeds.ratio_over_seeds on
per-seed times), samples/s taken at its value (its own interval is shown beside).
"""
from __future__ import annotations

import functools
import math

from dpscale import provenance, registry
from dpscale.analysis import stats
from dpscale.analysis.stateff import batch_model, common, crossings, forecast as tta_forecast, model_choice, over_seeds
from dpscale.report import tta_noise, tta_pool

CLOCK = "evaluation on the clock"
TRAIN = "training only"
SEEDS = common.SEEDS
EXPERIMENT = registry.ANSWER.experiment          # time to accuracy's experiment
RATE = registry.ANSWER.rate_experiment           # the throughput experiment rate_from names


def rate_variants(rule: str) -> tuple[str, ...]:
    """The weak-scaling variants whose step is this LR rule's (registry: Variant.rate_from),
    the answer's for a rule the registry does not declare (an older result)."""
    exp = registry.get(EXPERIMENT)
    return exp.variant(rule).rate_from if rule in exp.variant_names() else registry.ANSWER.rate_from


def _m(r: dict | None) -> dict:
    return (r or {}).get("metrics") or {}


def ok(r: dict | None) -> bool:
    return bool(r) and r.get("status") == "ok"


def run_kind(r: dict) -> str:
    return "emulated" if _m(r).get("emulated") else "real DDP"


def rule_series(m, rule: str) -> dict[int, tuple[dict, str, list[dict]]]:
    """{k: (the pooled result, how it ran, every measurement's record)} of one LR rule
    (dpscale.report.tta_pool: independent measurements of one protocol pooled); below
    the rule's min_k its k's are another rule's (linear at k=1 is the book's rule, run
    once: dpscale.registry)."""
    exp = registry.get(EXPERIMENT)
    v = exp.variant(rule) if rule in exp.variant_names() else None
    out = {}
    for k in m.series(EXPERIMENT, rule):
        r, recs = tta_pool.pool(tta_pool.measurements(m, EXPERIMENT, rule, k))
        if r:
            out[k] = (r, run_kind(r), recs)
    if v is not None and v.same_below:
        for k in m.series(EXPERIMENT, v.same_below):
            if k < v.min_k and k not in out:
                r, recs = tta_pool.pool(tta_pool.measurements(m, EXPERIMENT, v.same_below, k))
                if r:   # the same rule at this k
                    out[k] = (r, f"{run_kind(r)}: the {v.same_below} rule's run", recs)
    return out


# ---------------------------------------------------------------- one point (rule, k)

def train_images(metrics: dict) -> int | None:
    """Images an epoch: recorded, else read off the curve (samples / epochs)."""
    if metrics.get("train_images"):
        return int(metrics["train_images"])
    for run in metrics.get("runs") or []:
        p = next((p for p in run.get("curve") or [] if p.get("epochs")), None)
        if p:
            return round(p["samples"] / p["epochs"])
    return None


def estimate(values: list) -> dict:
    """A point's samples to target over its seeds (None: did not reach the target), as
    ratio_over_seeds counts them: every seed reached it, the mean with Student's t
    interval; one did not, MLPerf's trimmed mean with Yuen's interval (n >= 5; fewer
    seeds, the trimmed mean alone); two or more, no value (MLPerf gives no score)."""
    got = [float(v) for v in values if v is not None and math.isfinite(v)]
    cens = len(values) - len(got)
    out = {"value": None, "lo": None, "hi": None, "n": len(values), "censored": cens, "covers": SEEDS, "how": ""}
    if cens == 0 and got:
        iv = stats.interval(got)
        out.update(value=iv["mean"], lo=iv["ci_lo"], hi=iv["ci_hi"], how="mean over seeds, Student's t")
    elif cens == 1:
        t = over_seeds.trimmed(values)
        if t is None:
            return {**out, "value": over_seeds.olympic(values), "how": "trimmed mean (MLPerf's), too few seeds for "
                                                                   "an interval"}
        from scipy import stats as sps
        half = float(sps.t.ppf(0.5 + stats.LEVEL / 2, t["h"] - 1)) * math.sqrt(t["var"])
        out.update(value=t["value"], lo=t["value"] - half, hi=t["value"] + half,
                   how="trimmed mean (MLPerf's: one seed did not converge), Yuen's interval")
    return out


def point(k: int, r: dict, run: str, recs: list[dict] | None = None) -> dict:
    """One (rule, k): its seeds' crossings (every pooled measurement's), samples to target
    (interpolated) with its interval, MLPerf's score of the first evaluations beside, the
    clock as the newest measurement measured it (clock_runs, clock_seeds), and each
    measurement's record (tta_pool.pool)."""
    g = _m(r)
    n_img, target = train_images(g), g.get("target_accuracy")
    seeds = crossings.per_seed(crossings.seed_rows(g.get("runs") or [], target, n_img, eval_correction=True)) \
        if target else []
    clock_runs = r.get("clock_runs") or g.get("runs") or []
    clock_seeds = crossings.seed_rows(clock_runs, target, n_img, eval_correction=True) if target else []
    est = estimate([s["samples"] for s in seeds])
    ep = (lambda x: x / n_img if x is not None and n_img else None)
    return {"k": k, "run": run, "emulated": bool(g.get("emulated")), "global_batch": g.get("global_batch"),
            "per_rank_batch": g.get("per_rank_batch"), "image_size": (r.get("data") or {}).get("image_size")
            or g.get("image_size"), "train_images": n_img, "target": target, "max_epochs": g.get("max_epochs"),
            "eval_every_samples": g.get("eval_every_samples"), "eval_near_margin": g.get("eval_near_margin"),
            "test_images": g.get("test_images"),
            "seeds": seeds, "samples": est["value"],
            "samples_lo": est["lo"], "samples_hi": est["hi"], "samples_how": est["how"], "epochs": ep(est["value"]),
            "epochs_lo": ep(est["lo"]), "epochs_hi": ep(est["hi"]), "scored": est["value"] is not None,
            "mlperf_samples": g.get("samples_to_target"), "mlperf_epochs": g.get("epochs_to_target"),
            "mlperf_epochs_min": g.get("epochs_to_target_min"), "mlperf_epochs_max": g.get("epochs_to_target_max"),
            "clock_s": g.get("seconds_to_target"), "clock_s_min": g.get("seconds_to_target_min"),
            "clock_s_max": g.get("seconds_to_target_max"), "eval_s_mean": g.get("eval_s_mean"),
            "not_converged": list(g.get("not_converged_seeds") or []),
            "not_launched": list(g.get("not_launched_seeds") or []), "no_result_reason": g.get("no_result_reason"),
            "seed_list": list(g.get("seeds") or []), "runs": g.get("runs") or [], "noise": noise_of(g),
            "clock_runs": clock_runs, "clock_seeds": clock_seeds, "measurements": measurement_rows(recs or [], target,
                                                                                               n_img)}


def measurement_rows(recs: list[dict], target, n_img) -> list[dict]:
    """Each measurement of a point: when, which seeds (run id), its own epochs to target
    (mean over its seeds with Student's t interval, or MLPerf's trimmed mean), whether it
    was pooled and why not."""
    out = []
    for x in recs:
        g = _m(x["result"])
        rows = crossings.seed_rows(g.get("runs") or [], target, n_img, eval_correction=True) if target else []
        est = estimate([s["samples"] for s in rows])
        ep = (lambda v: v / n_img if v is not None and n_img else None)
        out.append({k: x.get(k, "") for k in ("label", "path", "commit", "finished_utc", "seeds", "run_id", "pooled",
                                                "why", "averaged")}
                   | {"epochs": ep(est["value"]), "epochs_lo": ep(est["lo"]), "epochs_hi": ep(est["hi"]),
                      "samples": [s["samples"] for s in rows], "seed_rows": rows})
    return out


def noise_of(g: dict) -> dict | None:
    """The gradient noise scale the worker recorded at this k: `noise_scale` in the
    metrics (a noise.b_simple_window record: b_simple, ci_lo, ci_hi, mean_trace,
    mean_g2, cov, df, steps, covers), else the first seed's `noise_scale` in its run
    record; None when neither is there (results before the probe: not measured)."""
    got = g.get("noise_scale")
    if isinstance(got, dict) and got.get("b_simple") is not None:
        return {**got, "source": "the point's noise_scale"}
    for run in g.get("runs") or []:
        w = run.get("noise_scale")
        if isinstance(w, dict) and w.get("b_simple") is not None:
            return {**w, "source": f"seed {run.get('seed')}'s window"}
    return None


def eval_per_sample(p: dict) -> float | None:
    """e(k): seconds per training sample that the protocol's evaluations cost the job at
    this point's k, from the newest measurement's launches (the code that times it runs
    now): the seconds charged to their clocks (each protocol evaluation's sharded pass and
    reduction; the instrument's evaluations charge nothing) over the samples they trained.
    None for a measurement whose evaluations carry no role (before evaluations were sharded
    and the instrument's taken off the clock: one unsharded pass on one device, at the
    instrument's grid, is not what a k-GPU job pays)."""
    runs = [run for run in p["clock_runs"] if all("role" in pt for pt in run.get("curve") or [{}])]
    if not runs or len(runs) != len(p["clock_runs"]):
        return None
    n = sum(run.get("samples_trained") or run["curve"][-1]["samples"] for run in runs)
    return sum(pt["eval_s"] for run in runs for pt in run["curve"]) / n if n else None


def eval_at(e: dict[int, float | None], k: int) -> float | None:
    """e(k) where k was measured, else that of the largest measured k below it (a sharded
    pass measured no faster than that: the forecast claims no gain it did not see); None
    where none below was."""
    if e.get(k) is not None:
        return e[k]
    below = [j for j in e if j < k and e[j] is not None]
    return e[max(below)] if below else None


# ---------------------------------------------------------------- samples/s at time to accuracy's protocol

def same_protocol(p: dict, per_rank_batch, image_size) -> bool:
    """Whether a throughput number was taken at time to accuracy's per-rank batch and
    image size (either unrecorded: taken as the same)."""
    return all(a is None or b is None or int(a) == int(b)
               for a, b in ((p["per_rank_batch"], per_rank_batch), (p["image_size"], image_size)))


def weak_variant(m) -> str | None:
    """The weak-scaling series of the step the answer trains with, on a machine read
    without a time-to-accuracy protocol to match (the book, a machine that ran none): the
    first of registry.ANSWER.rate_from measured at k=1 and a larger k (a growth to show),
    else the first measured at k=1, else the first series with any result."""
    have = {v: {k for k, r in m.series(RATE, v).items() if ok(r)} for v in m.variants(RATE)}
    order = list(registry.ANSWER.rate_from) + [v for v in have if v not in registry.ANSWER.rate_from]
    return (next((v for v in order if 1 in have.get(v, ()) and len(have[v]) > 1), None)
            or next((v for v in order if 1 in have.get(v, ())), None) or next((v for v in order if have.get(v)), None))


def rate_variant(m, fc: dict | None, p: dict, variants: tuple[str, ...]) -> str | None:
    """The one weak-scaling series whose samples/s time to accuracy divides by at every k
    (never one series at k=1 and another at k): the first of `variants` measured at k=1
    at time to accuracy's per-rank batch and image size (what rate_from picks), else the
    first the throughput forecast has; None where neither."""
    for v in variants:
        r = m.get(RATE, v, 1)
        if ok(r) and same_protocol(p, _m(r).get("per_rank_batch"), (r.get("data") or {}).get("image_size")):
            return v
    return next((v for v in variants if forecast_series(m, fc, p, (v,))), None)


def measured_rate(m, p: dict, k: int, variant: str) -> dict | None:
    """samples/s of this machine's weak scaling at k in `variant`, the mean over launches
    (or timed epochs) with its 95% interval; None where it did not run at that protocol."""
    from dpscale.report.numbers import point as tpoint, spread
    r = m.get(RATE, variant, k)
    if ok(r) and same_protocol(p, _m(r).get("per_rank_batch"), (r.get("data") or {}).get("image_size")):
        value, lo, hi = tpoint(r)
        return {"value": value, "lo": lo, "hi": hi, "level": stats.LEVEL, "source": f"measured ({RATE} {variant})",
                "covers": (spread(r) or {}).get("covers", ""), "variant": variant}
    return None


def own_rate(p: dict) -> dict | None:
    """samples/s of the time-to-accuracy launches themselves, at a real k: each seed's
    samples trained over its clock less its evaluations (start-up included), the mean
    over seeds with its interval."""
    if p["emulated"]:
        return None
    rates = []
    for run in p["clock_runs"]:
        end = (run.get("curve") or [{}])[-1]
        train_s = (end.get("seconds") or 0.0) - (run.get("eval_s") or 0.0)
        n = run.get("samples_trained") or end.get("samples")
        if n and train_s > 0:
            rates.append(n / train_s)
    if not rates:
        return None
    iv = stats.interval(rates)
    return {"value": iv["mean"], "lo": iv["ci_lo"], "hi": iv["ci_hi"], "level": stats.LEVEL,
            "source": "measured (the time-to-accuracy launches)", "covers": SEEDS, "variant": None}


def forecast_series(m, fc: dict | None, p: dict, variants: tuple[str, ...]) -> dict | None:
    """The throughput forecast's DDP series at time to accuracy's protocol (the first of
    `variants` it has), or None."""
    by = {s["variant"]: s for s in (fc or {}).get("series", []) if s["family"] == "torch"}
    for v in variants:
        s, r1 = by.get(v), m.get(RATE, v, 1)
        if s and same_protocol(p, s.get("per_rank_batch"), (r1 or {}).get("data", {}).get("image_size")):
            return s
    return None


def forecast_rate(s: dict | None, level: float, k: int) -> dict | None:
    """samples/s(k) = k x per-rank batch / the forecast's weak step, with its band."""
    row = next((r for r in (s or {}).get("rows", []) if r["k"] == k), None)
    if not row or not row.get("weak_step_ms"):
        return None
    b = k * s["per_rank_batch"] * 1e3
    lo, hi = row.get("weak_step_ms_hi"), row.get("weak_step_ms_lo")
    return {"value": b / row["weak_step_ms"], "lo": b / lo if lo else None, "hi": b / hi if hi else None,
            "level": level, "source": "forecast" + (f", {row['nodes']} nodes" if row.get("nodes", 1) > 1 else ""),
            "covers": f"the throughput forecast's band ({level:.0%}: where a measurement should fall)",
            "nodes": row.get("nodes", 1)}


def rates(m, fc: dict | None, points: list[dict], ks, rule: str) -> dict[int, dict]:
    """samples/s(k) for every k wanted, of the rule's step, one series at every k
    (rate_variant): measured by its weak-scaling runs, else by the time-to-accuracy
    launches at a real k, else the throughput forecast of that series; a k with none is
    left out (not measured)."""
    ref = points[0]
    v = rate_variant(m, fc, ref, rate_variants(rule))
    s = forecast_series(m, fc, ref, (v,)) if v else None
    level = ((fc or {}).get("config") or {}).get("band_level", 0.9)
    by_k = {p["k"]: p for p in points}
    out = {}
    for k in sorted(set(ks)):
        got = ((measured_rate(m, ref, k, v) if v else None) or (own_rate(by_k[k]) if k in by_k else None)
               or forecast_rate(s, level, k))
        if got and got["value"]:
            out[k] = {"variant": v, **got}
    return out


# ---------------------------------------------------------------- samples/s growth of the step that trained

def growth(m, rule: dict | None, fc: dict | None) -> tuple[str | None, dict[int, dict]]:
    """(the weak-scaling series, {k: samples/s(k) / samples/s(1)}) of the step the answer
    trains with: with a time-to-accuracy rule, of the rates its time divides by (the
    series None where they are the launches' own); else of weak_variant(m), measured or
    forecast (fc: the machine's throughput forecast)."""
    if rule and rule["rates"].get(1):
        return rule["rates"][1].get("variant"), _rate_growth(m, rule)
    v = weak_variant(m)
    return v, (_series_growth(m, v, fc) if v else {})



def _series_growth(m, v: str, f: dict | None) -> dict[int, dict]:
    """samples/s(k) / samples/s(1) of one weak-scaling series: measured (its 95% interval,
    stats.ratio_ci on the ratio), else k x the forecast's weak efficiency (its band; f: the
    machine's throughput forecast)."""
    from dpscale.report.numbers import scaling
    out = {}
    s = next((s for s in (f or {}).get("series", []) if s["family"] == "torch" and s["variant"] == v), None)
    level = ((f or {}).get("config") or {}).get("band_level", 0.9)
    for r in (s or {}).get("rows", []):
        if r.get("weak_efficiency") is not None and r["point"] != "measured":
            k, lo, hi = r["k"], r.get("weak_efficiency_lo"), r.get("weak_efficiency_hi")
            out[k] = {"value": k * r["weak_efficiency"], "lo": k * lo if lo else None, "hi": k * hi if hi else None,
                      "source": "forecast", "covers": f"its {level:.0%} band", "nodes": r["nodes"], "variant": v}
    for r in scaling(m, RATE, v):
        if r["speedup"] is not None:
            out[r["k"]] = {"value": r["speedup"], "lo": r["speedup_lo"], "hi": r["speedup_hi"], "source": "measured",
                           "covers": r["ratio_covers"], "nodes": 1, "variant": v}
    return dict(sorted(out.items()))


def _rate_growth(m, rule: dict) -> dict[int, dict]:
    """samples/s(k) / samples/s(1) of the rates time to accuracy divides by (rule["rates"]),
    so that the training-only speed-up is statistical efficiency x this growth, exactly.
    Both ends measured in one weak-scaling series: that series' ratio with its interval
    (Fieller over launches); else the rate at k over the rate at k=1, the band of the
    rate at k over k=1's value (k=1's interval, measured, is far narrower)."""
    from dpscale.report.numbers import scaling
    rates, out = rule["rates"], {}
    r1 = rates.get(1)
    if not r1:
        return {}
    v = r1.get("variant")
    sc = {r["k"]: r for r in scaling(m, RATE, v)} if v else {}
    series = f"measured ({RATE} {v})"
    for k, r in sorted(rates.items()):
        if k == 1 or (r["source"] == r1["source"] == series and sc.get(k, {}).get("speedup") is not None):
            row = sc[k] if k > 1 else {"speedup": 1.0, "speedup_lo": None, "speedup_hi": None, "ratio_covers": ""}
            out[k] = {"value": row["speedup"], "lo": row["speedup_lo"], "hi": row["speedup_hi"],
                      "source": "measured", "covers": row["ratio_covers"], "nodes": 1, "variant": v}
            continue
        c = 1 / r1["value"]
        out[k] = {"value": r["value"] * c, "lo": r["lo"] * c if r.get("lo") else None,
                  "hi": r["hi"] * c if r.get("hi") else None,
                  "source": "measured" if r["source"].startswith("measured") else "forecast",
                  "covers": (r.get("covers") or "") + "; over k=1's samples/s at its value",
                  "nodes": r.get("nodes", 1), "variant": r.get("variant")}
    return out


# ---------------------------------------------------------------- time to accuracy at each point

def _ratio(base: list, other: list) -> dict:
    """over_seeds.ratio_over_seeds's value and interval, flat. Where it has no estimate but
    both sides have MLPerf's score (one seed short of the target and fewer than 5
    seeds: no trimmed-mean interval), the ratio of those scores, without an interval."""
    r = over_seeds.ratio_over_seeds(base, other)
    if r["value"] is None and r["mlperf_value"] is not None:
        return {"value": r["mlperf_value"], "lo": None, "hi": None,
                "method": "ratio of the MLPerf scores of the interpolated crossings, no interval: " + r["method"]}
    return {"value": r["value"], "lo": r["ci_lo"], "hi": r["ci_hi"], "method": r["method"]}


def verdict(lo: float | None, hi: float | None) -> str:
    """A speed-up's reading at its interval's level: 'sooner' (the whole interval above 1),
    'later' (below 1), 'not distinguishable' (it holds 1), 'no interval'."""
    if lo is None or hi is None:
        return "no interval"
    return "sooner" if lo > 1 else "later" if hi < 1 else "not distinguishable"


def measurement_verdicts(pts: list[dict], e: dict, thr: dict) -> None:
    """Each pooled measurement's own speed-up at each k (its seeds at k against its own
    seeds at k=1, both forms) and its verdict, beside the pool's: into each point's
    measurement rows (speedup, speedup_lo, speedup_hi, verdict; _train the same), and the
    point's `verdicts_disagree` (the labels whose verdict is not the pool's)."""
    base = next((p for p in pts if p["k"] == 1), None)
    own1 = {x["label"]: x for x in (base or {}).get("measurements", [])}
    r1 = (thr.get(1) or {}).get("value")
    for p in pts:
        rk = (thr.get(p["k"]) or {}).get("value")
        for x in p["measurements"]:
            b = own1.get(x["label"])
            for form, add in (("", e.get(p["k"])), ("_train", 0.0)):
                add1 = e.get(1) if form == "" else 0.0
                if p["k"] == 1 or b is None or not rk or not r1 or add is None or add1 is None:
                    x.update({f"speedup{form}": None, f"speedup{form}_lo": None, f"speedup{form}_hi": None,
                              f"verdict{form}": "not measured"})
                    continue
                r = _ratio(_times({"seeds": b["seed_rows"]}, 1 / r1 + add1), _times({"seeds": x["seed_rows"]}, 1 / rk + add))
                x.update({f"speedup{form}": r["value"], f"speedup{form}_lo": r["lo"], f"speedup{form}_hi": r["hi"],
                          f"verdict{form}": verdict(r["lo"], r["hi"])})
        p["verdict"] = verdict(p.get("speedup_lo"), p.get("speedup_hi")) if p.get("speedup") is not None else \
            "not measured"
        p["verdict_train"] = verdict(p.get("speedup_train_lo"), p.get("speedup_train_hi")) \
            if p.get("speedup_train") is not None else "not measured"
        p["verdicts_disagree"] = [x["label"] for x in p["measurements"] if x["pooled"] and x.get("verdict")
                                  not in (None, "not measured", p["verdict"])]


def _per_seed(p: dict, key: str = "samples", seeds: str = "seeds") -> list:
    return [s[key] if s["converged"] else None for s in p[seeds]]


def _times(p: dict, per_sample: float) -> list:
    """Each seed's time to accuracy: samples to target x seconds per sample."""
    return [None if v is None else v * per_sample for v in _per_seed(p)]


ONE = {"value": 1.0, "lo": None, "hi": None, "method": "the baseline itself"}
NONE = {"value": None, "lo": None, "hi": None, "method": ""}


def timing(p: dict, base: dict | None, e: float | None, e1: float | None, rate: dict | None,
           rate1: dict | None) -> dict:
    """A point's samples/s, time to accuracy (both forms) with intervals, and against
    k=1: statistical efficiency (interpolated; MLPerf's ratio of first-evaluation scores
    beside), speed-up (both forms), hardware and goodput efficiency, and, where both
    ends ran on real devices, the speed-up of the seeds' own clocks. e, e1: e(k) at this
    point and at k=1 (None: the clock form is not given)."""
    out = {"samples_per_s": None, "samples_per_s_lo": None, "samples_per_s_hi": None, "samples_per_s_level": None,
           "samples_per_s_source": "not measured", "samples_per_s_covers": "", "eval_s_per_sample": e}
    for key in ("time_s", "time_train_s"):
        out.update({key: None, f"{key}_lo": None, f"{key}_hi": None})
    if rate:
        out.update(samples_per_s=rate["value"], samples_per_s_lo=rate["lo"], samples_per_s_hi=rate["hi"],
                   samples_per_s_level=rate["level"], samples_per_s_source=rate["source"],
                   samples_per_s_covers=rate.get("covers", ""))
        for key, c in (("time_s", None if e is None else 1 / rate["value"] + e), ("time_train_s", 1 / rate["value"])):
            out.update({key: _mul(p["samples"], c), f"{key}_lo": _mul(p["samples_lo"], c),
                        f"{key}_hi": _mul(p["samples_hi"], c)})
    ratios = _against_base(p, base, e, e1, rate, rate1)
    for name, r in ratios.items():
        out.update({name: r["value"], f"{name}_lo": r["lo"], f"{name}_hi": r["hi"], f"{name}_method": r["method"]})
    mb, mk = (base or {}).get("mlperf_samples"), p["mlperf_samples"]   # MLPerf's scores (first evaluations)
    out["statistical_efficiency_mlperf"] = mb / mk if mb and mk else None
    sp = ratios["speedup_train"]
    k = p["k"]
    out.update(goodput_efficiency=_mul(sp["value"], 1 / k), goodput_efficiency_lo=_mul(sp["lo"], 1 / k),
               goodput_efficiency_hi=_mul(sp["hi"], 1 / k),
               hardware_efficiency=rate["value"] / (k * rate1["value"]) if rate and rate1 else None)
    return out


def _mul(x, c):
    return None if x is None or c is None else x * c


def _against_base(p: dict, base: dict | None, e: float | None, e1: float | None, rate: dict | None,
                  rate1: dict | None) -> dict:
    names = ("statistical_efficiency", "speedup", "speedup_train", "clock_speedup")
    if base is None or not base["seeds"] or not p["seeds"]:
        return {n: NONE for n in names}
    if p["k"] == 1:
        return {n: ONE if n != "clock_speedup" else NONE for n in names}
    out = {"statistical_efficiency": _ratio(_per_seed(base), _per_seed(p)), "speedup": NONE, "speedup_train": NONE,
           "clock_speedup": NONE}
    if rate and rate1:
        if e is not None and e1 is not None:
            out["speedup"] = _ratio(_times(base, 1 / rate1["value"] + e1), _times(p, 1 / rate["value"] + e))
        out["speedup_train"] = _ratio(_times(base, 1 / rate1["value"]), _times(p, 1 / rate["value"]))
    if not p["emulated"] and not base["emulated"]:
        out["clock_speedup"] = _ratio(_per_seed(base, "seconds", "clock_seeds"), _per_seed(p, "seconds", "clock_seeds"))
    return out


# ---------------------------------------------------------------- the E(B) model, checked, and the forecast

def batch_points(points: list[dict]) -> dict:
    """{global batch: per-seed samples to target (None: not reached)} of every point."""
    return {p["global_batch"]: _per_seed(p) for p in points if p["global_batch"] and p["seeds"]}


# MLPerf's published convergence tables, as the project keeps them (docs/public-convergence.md)
PUBLIC_CONVERGENCE = provenance.ROOT / "reference" / "public" / "convergence"


@functools.cache
def public_pool() -> tuple:
    """The public tables' "predict the next" residuals of the model the forecast draws (the
    mixture: model_choice.next_residuals), one table per benchmark family: what this
    machine's E(B) misfit borrows where its own batches give too few (model_choice.misfit;
    the same fixed pool for every machine)."""
    from dpscale.analysis import convergence, convergence_check
    from dpscale.analysis.stateff import model_choice
    files = sorted(PUBLIC_CONVERGENCE.glob("*/*.csv"))
    if not files:
        return ()
    return tuple(provenance.stored(
        "public_pool", ("dpscale.analysis.convergence_check", "dpscale.analysis.stateff.model_choice"), files,
        lambda: convergence_check.public_pool([convergence.read(p) for p in files],
                                              residuals=model_choice.next_residuals)))


@functools.cache
def public_coverage() -> dict | None:
    """The borrowed misfit's band on the public tables, pooled one table per family: its
    coverage and median half-width, and the same with its largest contributor left out
    (convergence_check.without_largest); None without the tables."""
    from dpscale.analysis import convergence, convergence_check
    files = sorted(PUBLIC_CONVERGENCE.glob("*/*.csv"))
    if not files:
        return None

    def compute():
        p = convergence_check.check([convergence.read(f) for f in files])["pooled"]
        return {"coverage_wide": p["coverage_wide"], "median_half_width_pct": p["median_half_width_pct"]["band_wide"],
                "without_largest": p.get("without_largest")}
    return provenance.stored("public_coverage", ("dpscale.analysis.convergence_check",), files, compute)


def fit(points: list[dict]) -> tuple[dict | None, dict | None, str]:
    """The models of samples to target over the scored points (at most one seed short of
    the target, as MLPerf scores them): the line (batch_model.fit_batch_model) and the set
    of both models with their weights (model_choice.choose), or None and why not."""
    scored = [p for p in points if p["scored"] and p["global_batch"]]
    sources = {p["global_batch"]: "emulated" if p["emulated"] else "measured" for p in scored}
    try:
        line = batch_model.fit_batch_model(batch_points(scored), sources=sources)
    except ValueError as e:
        return None, None, str(e).removeprefix("fit_batch_model: ")
    return line, model_choice.choose(batch_points(scored), sources=sources, pool=public_pool()), ""


def budget(points: list[dict]) -> float | None:
    """The samples one seed may train (max_epochs x images an epoch; else the most a
    censored seed trained)."""
    p = points[0]
    if p["max_epochs"] and p["train_images"]:
        return float(p["max_epochs"] * p["train_images"])
    return max((s["censored_samples"] or 0 for q in points for s in q["seeds"]), default=None) or None


def holdout_rows(points: list[dict]) -> list[dict]:
    """The models checked out of sample, every row: each point predicted from the smaller
    k alone ("forward": two or more scored batches below it), and each point predicted
    from every other scored k ("leave one out": the folds whose scores weigh the models),
    a pair of batches counted once. Per row the line, the power law and their mixture
    (model_choice.holdout: weights from the fitted batches' own folds only), and the
    line's censoring check (batch_model.holdout: budget)."""
    allp, rows, seen = batch_points(points), [], set()
    scored = [q for q in points if q["scored"] and q["global_batch"]]
    for kind in ("forward", "leave one out"):
        for p in (p for p in points if p["global_batch"]):
            fit_from = [q for q in scored if q is not p and (kind != "forward" or q["k"] < p["k"])]
            key = (p["k"], tuple(q["k"] for q in fit_from))
            if len(fit_from) < 2 or key in seen or (kind != "forward" and not p["scored"]):
                continue
            seen.add(key)
            fb = [q["global_batch"] for q in fit_from]
            try:
                h = batch_model.holdout(allp, p["global_batch"], fit_batches=fb, budget=budget(points))
                mc = model_choice.holdout(allp, p["global_batch"], fb, pool=public_pool())
            except ValueError as e:
                rows.append({"k": p["k"], "check": kind, "from_ks": list(key[1]), "note": str(e)})
                continue
            rows.append({"k": p["k"], "check": kind, "run": p["run"], "global_batch": p["global_batch"],
                         "from_ks": list(key[1]), **_holdout_fields(h, mc, p["train_images"])})
    return rows


def _holdout_fields(h: dict, mc: dict, n_img: int | None) -> dict:
    """A holdout row: the mixture's prediction and band first (what the forecast draws
    from), then each model's; the line's censoring check."""
    ep = (lambda x: None if x is None or not n_img else x / n_img)
    c = mc["combined"]
    out = {"predicted_epochs": ep(c["mean"]), "band_lo": ep(c["pred_lo"]), "band_hi": ep(c["pred_hi"]),
           "band": h["band"], "measured_epochs": ep(h["measured_mean"]), "measured_n": h["measured_n"],
           "censored_n": h["censored_n"], "relative_error": c["relative_error"], "inside_band": c["inside_band"],
           "error_epochs": ep(c["mean"] - h["measured_mean"]) if h["measured_mean"] is not None else None,
           "weights": mc["weights"], "weights_method": mc["method"],
           "measured_is_lower_bound": h["measured_is_lower_bound"],
           "p_seed_over_budget": h["p_seed_over_budget"], "p_censored_as_seen": h["p_censored_as_seen"],
           "b_crit": h["fit"]["B_crit"]["value"], "note": "",
           "misfit_rel_sd": (mc.get("misfit") or {}).get("rel_sd"),
           "misfit_from": (mc.get("misfit") or {}).get("source")}
    for name, r in mc["models"].items():
        out.update({f"{name}_epochs": ep(r["mean"]), f"{name}_band_lo": ep(r["pred_lo"]),
                    f"{name}_band_hi": ep(r["pred_hi"]), f"{name}_relative_error": r["relative_error"],
                    f"{name}_inside_band": r["inside_band"]})
    return out


def evaluation_counts(p: dict) -> dict:
    """The newest measurement's evaluations at this point, by role: the protocol's (on the
    clock: how many, their seconds charged) and the instrument's (off it)."""
    pts = [pt for run in p["clock_runs"] for pt in run.get("curve") or []]
    prot = [pt for pt in pts if pt.get("role") == "protocol"]
    inst = [pt for pt in pts if pt.get("role") == "instrument"]
    return {"protocol": len(prot), "protocol_s": sum(pt["eval_s"] for pt in prot),
            "instrument": len(inst), "instrument_s": sum(pt.get("eval_wall_s") or 0.0 for pt in inst),
            "unlabelled": len(pts) - len(prot) - len(inst),
            "every_epochs": (p["clock_runs"][0].get("eval_every_epochs") if p["clock_runs"] else None)}


def protocol_words(rule: dict) -> str:
    """How the clock form charges evaluations, from the points' own records: 'evaluation
    once per epoch, the test set sharded over the k ranks, on the clock; 212 evaluations
    that only locate the crossing, off it'."""
    ev = [p.get("evaluations") or {} for p in rule.get("points", [])]
    every = next((x["every_epochs"] for x in ev if x.get("every_epochs")), None)
    if every is None:
        return "evaluations as an older measurement ran them (one device, unsharded): the clock form not given"
    cadence = "once per epoch" if every == 1 else f"every {every:g} epochs"
    off = sum(x.get("instrument", 0) for x in ev)
    return (f"evaluation {cadence}, the test set sharded over the k ranks, on the clock; {off} evaluations "
            f"that only locate the crossing, off it")


def forecast_of(model: dict | None, ks, per_rank_batch, thr: dict, e: dict) -> dict | None:
    """forecast.tta_forecast at every k, both forms, over the models (model_choice.choose's
    set): {"clock": ..., "train": ...}; e: {k: e(k)} (eval_at)."""
    if model is None or not per_rank_batch or not thr:
        return None
    return {"clock": tta_forecast.tta_forecast(model, ks, int(per_rank_batch), thr, eval_s_per_sample=e),
            "train": tta_forecast.tta_forecast(model, ks, int(per_rank_batch), thr)}


# ---------------------------------------------------------------- a machine

def grid_ks(fc: dict | None) -> list[int]:
    """The throughput forecast's k's (1..G in one node, then nodes of G), else none."""
    s = next((s for s in (fc or {}).get("series", []) if s["family"] == "torch"), None)
    return [r["k"] for r in (s or {}).get("rows", [])]


def of_rule(m, rule: str, fc: dict | None) -> dict | None:
    """One LR rule's points, model, check, noise scale and forecast; None without a
    scored-or-not point that ran."""
    pts = [point(k, r, run, recs) for k, (r, run, recs) in sorted(rule_series(m, rule).items()) if ok(r)]
    if not pts:
        return None
    measured_e = {p["k"]: eval_per_sample(p) for p in pts}
    ks = sorted({p["k"] for p in pts} | set(grid_ks(fc)))
    e = {k: eval_at(measured_e, k) for k in ks}
    thr = rates(m, fc, pts, ks, rule)
    base = next((p for p in pts if p["k"] == 1 and p["scored"]), None)
    for p in pts:
        p.update(timing(p, base, e.get(p["k"]), e.get(1), thr.get(p["k"]), thr.get(1)),
                 noise_windows=tta_noise.windows(p), evaluations=evaluation_counts(p))
    measurement_verdicts(pts, e, thr)
    model, models, why = fit(pts)
    fcast = forecast_of(models, ks, pts[0]["per_rank_batch"], thr, e)
    return {"rule": rule, "points": pts, "eval_s_per_sample": e, "target": pts[0]["target"],
            "train_images": pts[0]["train_images"], "per_rank_batch": pts[0]["per_rank_batch"],
            "budget_samples": budget(pts), "max_epochs": pts[0]["max_epochs"], "fit": model, "models": models,
            "fit_note": why,
            "holdout": holdout_rows(pts), "noise": tta_noise.rows(pts, model),
            "noise_intervals": tta_noise.interval_rows(pts), "forecast": fcast, "rates": thr,
            "measured_batches": sorted(p["global_batch"] for p in pts if p["scored"] and p["global_batch"])}


def of_machine(m, fc: dict | None) -> dict:
    """Every LR rule of a machine: {"machine", "label", "rules": {rule: of_rule}, "primary"}:
    the rule the first screen answers with (registry.ANSWER's where it ran, else the
    book's protocol first)."""
    rules = {}
    for rule in m.variants(EXPERIMENT):
        rec = of_rule(m, rule, fc)
        if rec:
            rules[rule] = rec
    order = registry.get(EXPERIMENT).series_order(rules)   # the book's protocol first
    primary = registry.ANSWER.variant if registry.ANSWER.variant in rules else (order[0] if order else None)
    return {"machine": m.name, "label": m.label, "rules": rules, "primary": primary}


def primary(rec: dict) -> dict | None:
    return rec["rules"].get(rec["primary"]) if rec["primary"] else None


def forecast_row(rule: dict | None, k: int, form: str = "clock") -> dict | None:
    """The time-to-accuracy forecast's row at k (form: clock or train)."""
    f = (rule or {}).get("forecast") or {}
    return next((r for r in (f.get(form) or {}).get("rows", []) if r["k"] == k), None)
