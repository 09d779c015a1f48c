"""The tidy results table: one row per (machine, experiment, variant, k, metric), the
form pandas, R and a spreadsheet read without help.

    results.csv columns: machine, experiment, variant, k, metric, unit, value, ci_lo,
    ci_hi, n, covers, status, data_source, commit

value, ci_lo and ci_hi are numbers (empty where there is none); the unit comes from
the metric's name (names carry units: `unit_of`). The rows are the scalar numeric
metrics of each result (lists, mappings, text and true/false are left out: the JSON
keeps them). `<metric>_ci95` is the 95% interval of the mean of `<metric>`'s sample,
so it sits on the `<metric>_mean` row where the result has one (the `<metric>` row is
the book's single figure, the first timed epoch), else on `<metric>`. `covers` says
what that interval spans: the timed epochs of one launch, or independent launches
when the result holds `<metric>_launches` (paired trials for the probe's
`<metric>_pairs`). n is the size of the sample a row summarises (the launches, the
repeats, the pairs, `<metric>_n` or the result's `repeats`).
A planned result with no number (failed, hung, skipped, not run) keeps one row with
an empty metric, so a failure is never dropped from the table.

The report adds the numbers it derives from several results (`derived`): per machine,
LR rule and k of ddp_tta, samples_to_target_interpolated, statistical_efficiency (and
_mlperf), tta_speedup and tta_speedup_training_only (time to accuracy at k=1 over at k,
evaluation on the clock or not), goodput_efficiency, time_to_accuracy_s (and
_training_only_s), samples_per_s_for_tta and tta_clock_speedup, each with its 95%
interval over independent seeded launches (`covers`); and the forecast's
predicted_* rows (variant '<rule> (forecast)', status 'predicted', its joint band).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from dpscale.analysis import stats
from dpscale.results import write_atomic
from dpscale.report.machines import Machine

COLUMNS = ["machine", "experiment", "variant", "k", "metric", "unit", "value", "ci_lo", "ci_hi", "n", "covers",
           "status", "data_source", "commit"]
WITHIN, ACROSS = stats.WITHIN, stats.ACROSS   # what an interval covers, named once
PAIRED = "paired trials within one launch"
# the statistics of a sample: `<base>_<suffix>` summarises the sample of `<base>`
SUMMARY = ("mean", "median", "min", "max", "cv", "p10", "p90", "std")

# (pattern searched in the metric's name, unit), first match wins: the order matters
# ("busbw_GBps_64MiB" is in GB/s, its payload is 64 MiB; "samples_per_s_cv" is a ratio).
UNITS = (
    (r"(_cv|_coverage)$", "1"),
    (r"(^n_|_n$)", "count"),
    (r"(?<!per)_rank$", "rank"),
    (r"samples_per_s", "samples/s"),
    (r"GBps", "GB/s"),
    (r"TFLOPs", "TFLOP/s"),
    (r"(^|_)ms(_|$)", "ms"),
    (r"(^|_)MiB(_|$)", "MiB"),
    (r"(^|_)MB(_|$)", "MB"),
    (r"(^|_)GB$", "GB"),
    (r"^(interpolated_)?seconds_to_target|^eval_s_|_s_mean$|_s_total$", "s"),   # time to accuracy (MLPerf's clock)
    (r"^(predicted_|interpolated_)?samples_to_target|_every_samples$|^b_(simple|crit)|^crossing_resolution_samples",
     "samples"),
    (r"(^(interpolated_)?epochs_to_target|^max_epochs$|^warmup_epochs$|^crossing_resolution_epochs)", "epochs"),
    (r"^noise_(g2|trace)_grad_sq$", "1"),   # squared gradient norms of a dimensionless loss
    (r"(^evaluations_total$|^noise_steps$)", "count"),
    (r"^eval_near_margin$", "1"),           # accuracy
    (r"^image_size$", "px"),
    (r"(^lr_(base|peak)$|^target_accuracy$)", "1"),
    (r"(^processes$|^ranks_per_process$|_images$)", "count"),
    (r"_s$", "s"),
    (r"(^|_)bytes$", "B"),
    (r"_(elements|floats)$", "elements"),
    (r"^flops_per_sample$", "FLOP/sample"),
    (r"(^mfu$|fraction|_share_|_share$|_over_|ratio|^rel_diff$|threshold$|_lag_|efficiency|speedup|^max_abs_)", "1"),
    (r"^loss", "1"),
    (r"(^repeats$|^launches$|(^|_)batch$|^steps_per_epoch$|_chars$)", "count"),
    (r"^representative_launch$", "index"),
    (r"(^pairs$|^wrong_total$)", "count"),   # the probe's pairs, the sweep's wrong elements (current results)
)


def unit_of(metric: str) -> str | None:
    """The unit a metric's name carries ('1' for a ratio, 'count' for a count), or None
    for a name that carries none (the table leaves the unit empty)."""
    return next((unit for pattern, unit in UNITS if re.search(pattern, metric)), None)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _pair(x) -> tuple[float | None, float | None]:
    if isinstance(x, (list, tuple)) and len(x) == 2 and all(v is None or _number(v) for v in x):
        return x[0], x[1]
    return None, None


def _sample(metrics: dict, base: str) -> tuple[int | None, str]:
    """(n, covers) of the sample behind `base`'s statistics."""
    launches = metrics.get(f"{base}_launches")
    if isinstance(launches, list) and launches:
        return len(launches), ACROSS
    repeats = metrics.get(f"{base}_repeats")
    if isinstance(repeats, list) and repeats:
        return len(repeats), WITHIN
    pairs = metrics.get(f"{base}_pairs")
    if isinstance(pairs, list) and pairs:
        return len(pairs), PAIRED
    if _number(metrics.get(f"{base}_n")):
        return int(metrics[f"{base}_n"]), WITHIN
    if f"{base}_ci95" in metrics and _number(metrics.get("repeats")):
        return int(metrics["repeats"]), WITHIN
    return None, ""


def _base(metrics: dict, name: str) -> str | None:
    """`<base>` when `name` is `<base>_<statistic>` of a sample the result records."""
    head, _, tail = name.rpartition("_")
    return head if head and tail in SUMMARY and _sample(metrics, head)[0] else None


# Identifiers, not measurements: a time-to-accuracy job's run_id is a 63-bit integer that a
# float64 column would round to another id (the result JSON keeps it exactly).
IDENTIFIERS = frozenset({"run_id"})


def metric_rows(metrics: dict) -> list[dict]:
    """One row per scalar numeric metric (identifiers left out): metric, unit, value,
    ci_lo, ci_hi, n, covers."""
    rows = []
    for name, value in metrics.items():
        if not _number(value) or name in IDENTIFIERS:
            continue
        base = _base(metrics, name)
        n, covers = _sample(metrics, base) if base else (None, "")
        lo, hi = None, None
        owner = base if base and name == f"{base}_mean" else (name if f"{name}_mean" not in metrics else None)
        if owner is not None:
            lo, hi = _pair(metrics.get(f"{owner}_ci95"))
            if lo is not None and not base:
                n, covers = _sample(metrics, owner)
        rows.append({"metric": name, "unit": unit_of(name), "value": float(value), "ci_lo": lo, "ci_hi": hi,
                     "n": n, "covers": covers if lo is not None else ""})
    return rows


def result_rows(machine: str, r: dict) -> list[dict]:
    code = r.get("code") or {}
    head = {"machine": machine, "experiment": r["experiment"], "variant": r["variant"], "k": int(r["k"])}
    tail = {"status": r["status"], "data_source": (r.get("data") or {}).get("source"), "commit": code.get("commit")}
    rows = metric_rows(r.get("metrics") or {})
    if not rows:   # no number: the row that says so
        rows = [{"metric": None, "unit": None, "value": None, "ci_lo": None, "ci_hi": None, "n": None, "covers": ""}]
    return [{**head, **row, **tail} for row in rows]


def table(machines: list[Machine], derived: list[dict] | None = None) -> pd.DataFrame:
    """The tidy table of the measured machines (the book's published numbers are not
    results), then `derived`: numbers the report computes from several results (time
    to accuracy's statistical efficiency, speed-ups and goodput with their intervals:
    dpscale.report.chapters.tta.tidy_rows), each a row of these columns (unit from its
    name when not given)."""
    rows = [row for m in machines if m.kind != "book"
            for _key, r in sorted(m.results.items()) for row in result_rows(m.label, r)]
    rows += [{"unit": unit_of(r["metric"]), **r} for r in derived or []]
    df = pd.DataFrame(rows, columns=COLUMNS)
    for col in ("value", "ci_lo", "ci_hi"):
        df[col] = pd.to_numeric(df[col], errors="raise").astype("float64")
    df["k"] = df["k"].astype("int64")
    df["n"] = df["n"].astype("Int64")
    return df


def write(machines: list[Machine], path: str | Path, derived: list[dict] | None = None) -> pd.DataFrame:
    """results.csv, atomically: empty cells for what a row lacks."""
    df = table(machines, derived)
    write_atomic(path, df.to_csv(index=False))
    return df
