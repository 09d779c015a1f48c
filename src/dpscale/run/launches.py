"""Independent launches of one throughput point, merged into one result.

The timed epochs of one process share its NCCL algorithm and channel choice, its
cudnn autotune picks, its memory placement and the clocks of the minute: their
spread is within-launch noise only. MLPerf runs independent launches for this
reason. So the watchdog runs the worker `launches` times in sequence (the
protocol key of the throughput experiments), each writing its own result, and
`merge` makes the one result of the point:

- samples_per_s: the lower median of the launches' figures (for an odd count, the
  median), and every other metric from that same launch (`representative_launch`),
  so that the result stays one launch's coherent set of numbers;
- samples_per_s_launches: each launch's figure; samples_per_s_launch_repeats: each
  launch's within-launch repeats;
- samples_per_s_ci95: the Student-t 95% interval over the launches' figures,
  covering "independent launches" (samples_per_s_ci95_covers); with one launch,
  the within-launch interval, covering "timed epochs within one launch";
- samples_per_s_within_ci95 (and _cv): the representative launch's within-launch
  interval, kept beside it.

A failed or hung launch makes the whole point failed or hung (the caller stops
at the first one and records its reason): no half merges. Pure: no processes.

What the point cost (`stamp`, `cost_fields`), for every experiment: `launch_s`, the
seconds from the spawn of a launch's process to its exit; `start_s`, from that spawn to
the wall-clock time the worker stamped on its first timed step (`first_timed_step_unix`,
the throughput experiments: imports, process group, data, the warm-up with its
compilation), which a warm compilation cache shortens; `start_s_launches` and
`launch_s_launches` for every launch, `start_s` and `launch_s` of the representative one,
`start_stages_s` and `end_stages_s` (and `_launches`), the launch split at its worker's
stages (its first line, the imports, the process group or devices, the rates, model and
data, the warm-up; then the timed epochs, the metrics, the result and the exit),
and `wall_s`, the job's wall time from the first spawn to the end of its last launch;
`compile_cache_launches`, each launch's lookups in the persistent compilation caches
(dpscale.run.caches), where its worker counted any: a warm cache shows as hits.
"""
from __future__ import annotations

import copy
import statistics

from dpscale.analysis import stats
from dpscale.measure import gpustate
from dpscale.plan import specs

KEY, count = specs.LAUNCHES_KEY, specs.launch_count   # declared where the plan sizes a job's time limit by them

METRIC = "samples_per_s"
STAMP = "first_timed_step_unix"   # a worker's wall-clock time of its first timed step (time.time())
MARKS = "stage_marks_unix"        # its stages' ends (dpscale.measure.timing.STAGES)
ACROSS, WITHIN = stats.ACROSS, stats.WITHIN   # what an interval covers, named once


def merge(results: list[dict]) -> dict:
    """One result from the launches' ok results (in launch order)."""
    if not results:
        raise ValueError("merge needs at least one launch's result")
    bad = [i for i, r in enumerate(results, 1) if r.get("status") != "ok"]
    if bad:
        raise ValueError(f"launch(es) {bad} did not end ok: record the first one's reason, do not merge")
    values = [r["metrics"].get(METRIC) for r in results]
    if METRIC not in results[0]["metrics"]:   # not a throughput result: one launch, as it is
        return _single(results)
    rep = values.index(statistics.median_low(values))
    out = copy.deepcopy(results[rep])
    m = out["metrics"]
    within = m.get(f"{METRIC}_ci95") or [None, None]
    m.update({KEY: len(results), "representative_launch": rep + 1,
              f"{METRIC}_launches": values,
              f"{METRIC}_launch_repeats": [r["metrics"].get(f"{METRIC}_repeats") for r in results],
              f"{METRIC}_within_ci95": within, f"{METRIC}_within_ci95_covers": WITHIN,
              f"{METRIC}_within_cv": m.get(f"{METRIC}_cv")})
    if len(results) >= 2:
        iv = stats.interval(values)
        m.update({f"{METRIC}_ci95": [iv["ci_lo"], iv["ci_hi"]], f"{METRIC}_ci95_covers": ACROSS,
                  f"{METRIC}_launches_cv": iv["cv"], f"{METRIC}_launches_mean": iv["mean"]})
    else:
        m[f"{METRIC}_ci95_covers"] = WITHIN
    out["started_utc"] = results[0].get("started_utc", out.get("started_utc"))   # the point's span:
    out["finished_utc"] = results[-1].get("finished_utc", out.get("finished_utc"))   # first to last launch
    out.update(_gpu(results))
    return out


def _single(results: list[dict]) -> dict:
    if len(results) != 1:
        raise ValueError(f"{len(results)} launches of a result without {METRIC}: nothing to merge them by")
    return copy.deepcopy(results[0])


def _gpu(results: list[dict]) -> dict:
    state = gpustate.combine([r.get("gpu_state") for r in results])
    return {"gpu_state": state} if state is not None else {}


def stamp(result: dict, spawned_unix: float, elapsed_s: float) -> dict:
    """A launch's result with its cost: launch_s, and start_s where its worker stamped its
    first timed step, with the launch split at its worker's stages (dpscale.measure.timing
    .STAGES): start_stages_s, spawn to first timed step (the warm-up ends there), and
    end_stages_s, from there to the process's exit (the timed epochs, the metrics, then
    the result written and the processes gone). The stamps themselves leave the metrics:
    a time of day is no metric."""
    m = result["metrics"]
    first, marks = m.pop(STAMP, None), m.pop(MARKS, None) or {}
    if first is not None:
        first = float(first)
        m["start_s"] = round(first - spawned_unix, 3)
        if marks:
            ends = sorted((float(t), name) for name, t in marks.items())
            m["start_stages_s"] = _stages(spawned_unix, [(n, t) for t, n in ends if t <= first] + [("warm-up", first)])
            m["end_stages_s"] = _stages(first, [(n, t) for t, n in ends if t > first]
                                        + [("result and exit", spawned_unix + elapsed_s)])
    m["launch_s"] = round(elapsed_s, 3)
    return result


def _stages(begin: float, ends: list[tuple[str, float]]) -> dict:
    """{stage: seconds} from each stage's end and the one before it (the first from begin)."""
    out = {}
    for name, t in ends:
        out[name], begin = round(t - begin, 3), t
    return out


def cost_fields(results: list[dict], wall_s: float) -> dict:
    """The job's cost from its stamped launches (in launch order) and its wall time."""
    out = {"launch_s_launches": [r["metrics"].get("launch_s") for r in results], "wall_s": round(wall_s, 3)}
    for name in ("start_s", "start_stages_s", "end_stages_s", "compile_cache"):   # where a launch's worker recorded it
        values = [r["metrics"].get(name) for r in results]
        if any(v is not None for v in values):
            out[f"{name}_launches"] = values
    return out
