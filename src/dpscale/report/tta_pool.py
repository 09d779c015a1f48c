"""Independent measurements of one time-to-accuracy point, pooled.

A kept machine holds its latest measurement of each (experiment, variant, k) in runs/,
and earlier ones beside it, one folder each under earlier/ with runs/'s own layout:

    reference/<machine>/runs/ddp_tta/book/k2.json                 the latest
    reference/<machine>/earlier/<label>/ddp_tta/book/k2.json      an earlier one (label:
                                                                  its commit, or a date)

earlier_paths() is the one place that layout is written down; file_earlier() moves a
machine's measurements there before a re-measurement replaces them.

A point pools its measurements (newest first) when they ran the same protocol (the
experiment's protocol keys but the seeds and when the test set is evaluated, the
variant's meaning, the scale and the data's source) A repeated seed starts from the same weights and sees the same data order, so its
launches are not independent of each other (reference/h200's three measurements before
fresh seeds all used seeds 1-5): such a seed counts once, the mean of its launches,
never one of them picked. A measurement left out says why. The pooled point's seeds are every pooled launch; its
clock (seconds, evaluation cost, samples/s of its own launches) stays the newest
measurement's, since the code that times it changes between measurements.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from dpscale import layout, provenance, registry, results as contract
from dpscale.analysis import tta as tta_rules

EARLIER = layout.EARLIER_DIR


def earlier_paths(runs_dir, experiment: str, variant: str, k: int) -> list[Path]:
    """The earlier measurements of (experiment, variant, k) kept beside runs_dir:
    <runs_dir>/../earlier/<label>/<experiment>/<variant>/k<k>.json, by label."""
    root = Path(runs_dir).parent / EARLIER
    return sorted(root.glob(f"*/{contract.job_label(experiment, variant, k)}.json"))


def file_earlier(machine_dir, label: str, experiment: str = registry.ANSWER.experiment) -> list[Path]:
    """Move a kept machine's measurements of `experiment` from runs/ to earlier/<label>/
    (e.g. before `dpscale keep --force` puts a re-measurement in their place; keep must
    then carry earlier/ over). Returns the paths they now have."""
    src = Path(machine_dir) / "runs" / experiment
    out = []
    for f in sorted(src.glob("*/k*.json")):
        dest = Path(machine_dir) / EARLIER / label / experiment / f.parent.name / f.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(f), dest)
        out.append(dest)
    return out


def runs_dir(m) -> Path | None:
    """The folder a machine's results were read from (Machine.source, as the report shows
    it: relative to the working folder or the repository), or None (the book)."""
    if m.kind == "book" or not m.source:
        return None
    p = Path(m.source)
    for c in ([p] if p.is_absolute() else [Path.cwd() / p, provenance.ROOT / p]):
        if c.is_dir():
            return c
    return None


def measurements(m, experiment: str, variant: str, k: int) -> list[dict]:
    """Every ok measurement of the point on this machine, newest first (by when it
    finished): runs/'s, then earlier/'s (each with '_path' and '_label')."""
    out = []
    latest = m.get(experiment, variant, k)
    if latest and latest.get("status") == "ok":
        out.append({**latest, "_label": "latest (runs/)"})
    base = runs_dir(m)
    for path in (earlier_paths(base, experiment, variant, k) if base else []):
        try:
            r = contract.load_result(path)
        except (ValueError, OSError) as e:
            m.errors.append(f"{path}: {e}")
            continue
        if r.get("status") == "ok":
            out.append({**r, "_path": str(path), "_label": path.parts[-4]})
    return sorted(out, key=lambda r: r.get("finished_utc") or "", reverse=True)


def protocol(r: dict) -> tuple:
    """What must match for two measurements to pool: the protocol's keys but the seeds and
    the evaluation's (registry.TTA_EVALUATION: when the test set is evaluated moves nothing
    training does), the variant's meaning, the scale and the data's source."""
    e = registry.get(r["experiment"])
    skip = {"tta_seeds", *registry.TTA_EVALUATION}
    keys = [x for x in e.protocol_for(r["variant"]) if x not in skip] if r["variant"] in e.variant_names() \
        else sorted(set((r.get("config") or {}).get("protocol") or {}) - skip)
    proto = (r.get("config") or {}).get("protocol") or {}
    return (tuple((x, repr(proto.get(x))) for x in keys), repr((r.get("config") or {}).get("variant")),
            (r.get("config") or {}).get("scale"), (r.get("data") or {}).get("source"))


def _seeds(r: dict) -> list:
    return [run["seed"] for run in (r.get("metrics") or {}).get("runs") or []]


def pool(found: list[dict]) -> tuple[dict | None, list[dict]]:
    """(the pooled result, one record per measurement) from measurements(), newest first.
    Each record: {"label", "path", "commit", "finished_utc", "seeds", "run_id", "pooled",
    "why", "averaged"}; the pooled result is the newest's with its runs those of every
    pooled measurement (a seed that several measurements ran appears once per run; its
    seed row is their mean, crossings.per_seed, never one of them picked), its seeds and
    MLPerf scores per seed, "clock_runs" the newest's alone, and "pooled_from"."""
    if not found:
        return None, []
    newest, used, kept, recs = found[0], set(), [], []
    for r in found:
        seeds = _seeds(r)
        why = "" if protocol(r) == protocol(newest) else "another protocol than the latest's"
        rep = sorted(used & set(seeds)) if not why else []
        if not why:
            used |= set(seeds)
            kept.append(r)
        recs.append({"label": r.get("_label"), "path": r.get("_path"), "commit": (r.get("code") or {}).get("commit"),
                     "finished_utc": r.get("finished_utc"), "seeds": seeds,
                     "run_id": (r.get("metrics") or {}).get("run_id"), "pooled": not why, "why": why,
                     "averaged": (f"seeds {', '.join(map(str, rep))} repeat a newer pooled measurement's: each such "
                                  "seed is the mean of its launches (a repeated seed is not independent)") if rep else "",
                     "result": r})
    if len(kept) == 1:
        return {**newest, "clock_runs": newest["metrics"]["runs"], "pooled_from": [recs[0]["label"]]}, recs
    runs = [run for r in kept for run in r["metrics"]["runs"]]
    seeds = list(dict.fromkeys(run["seed"] for run in runs))
    metrics = {**newest["metrics"], "runs": runs, "seeds": seeds,
               **tta_rules.score_fields(per_seed_scores(runs)), "noise_scale": _start_window(runs)}
    return {**newest, "metrics": metrics, "clock_runs": newest["metrics"]["runs"],
            "pooled_from": [x["label"] for x in recs if x["pooled"]]}, recs


def per_seed_scores(runs: list[dict]) -> list[dict]:
    """One record per seed for MLPerf's scoring (tta.score_fields): a seed several pooled
    measurements ran is their mean, converged only where every one of its launches was."""
    by: dict = {}
    for run in runs:
        by.setdefault(run["seed"], []).append(run)
    out = []
    for seed, group in by.items():
        conv = all(g["converged"] for g in group)
        rec = {"seed": seed, "converged": conv, "launches": len(group)}
        for m in (*tta_rules.MEASURES, *tta_rules.INTERPOLATED):
            vals = [g.get(f"{m}_to_target") for g in group]
            rec[f"{m}_to_target"] = sum(vals) / len(vals) if conv and None not in vals else None
        out.append(rec)
    return out


def _start_window(runs: list[dict]) -> dict | None:
    """The worker's step-0-to-target B_simple (torch_tta.noise_fields) over every pooled launch."""
    from dpscale.analysis.stateff import noise
    have = [r for r in runs if r.get("noise_g2_grad_sq_steps")]
    if not have:
        return None
    return noise.b_simple_pooled([(r["noise_g2_grad_sq_steps"][:r["noise_steps"]],
                                   r["noise_trace_grad_sq_steps"][:r["noise_steps"]]) for r in have])
