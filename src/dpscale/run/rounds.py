"""Rounds of one protocol pooled into one result per point: the launches of a throughput
point and the pairs of a probe, from several runs of the same specs minutes apart.

On a host whose cores' speed moves between windows a few minutes apart (the 16-core
stand-in, issue #30), the launches of one job share one window; rounds put every k in
several windows, so that k=1 and k=8 are compared over the same spread of windows.
A throughput point keeps one launch's coherent metrics, as launches.merge does: the
round whose recorded launch is the lower median of the rounds', with every round's
launches listed and the interval across all of them; a probe's pairs are concatenated
and its median, interval and straggler share recomputed over them. Other results (the
all-reduce sweeps: a collective, not the training) are the first round's. Each pooled
result lists its rounds in `pooled_from`. Pure: no processes.
"""
from __future__ import annotations

import copy
import statistics

from dpscale.analysis import stats
from dpscale.run import launches

M = launches.METRIC
PAIRS = ("synced_ms_pairs", "no_sync_ms_pairs", "straggler_share_pairs")


def throughput(rounds: list[dict]) -> dict:
    values = [r["metrics"][M] for r in rounds]
    out = copy.deepcopy(rounds[values.index(statistics.median_low(values))])
    m = out["metrics"]
    every = [x for r in rounds for x in r["metrics"].get(f"{M}_launches") or [r["metrics"][M]]]
    m[f"{M}_launches"] = every
    m[f"{M}_launch_repeats"] = [x for r in rounds for x in r["metrics"].get(f"{M}_launch_repeats")
                                or [r["metrics"].get(f"{M}_repeats")]]
    iv = stats.interval(every)
    m.update({launches.KEY: len(every), "representative_launch": every.index(m[M]) + 1,
              f"{M}_ci95": [iv["ci_lo"], iv["ci_hi"]], f"{M}_ci95_covers": launches.ACROSS,
              f"{M}_launches_cv": iv["cv"], f"{M}_launches_mean": iv["mean"]})
    return out


def probe(rounds: list[dict]) -> dict:
    out = copy.deepcopy(rounds[0])
    m = out["metrics"]
    for key in PAIRS:
        if all(key in r["metrics"] for r in rounds):
            m[key] = [x for r in rounds for x in r["metrics"][key]]
    if all("no_sync_ms_ranks" in r["metrics"] for r in rounds):
        m["no_sync_ms_ranks"] = [sum(ranks, []) for ranks in zip(*(r["metrics"]["no_sync_ms_ranks"] for r in rounds))]
    diffs = [a - b for a, b in zip(m["synced_ms_pairs"], m["no_sync_ms_pairs"])]
    mi = stats.median_interval(diffs)
    m.update({"pairs": len(diffs), "comm_ms_pairs": diffs, "comm_ms": mi["median"],
              "comm_ms_ci95": [mi["ci_lo"], mi["ci_hi"]], "comm_ms_ci95_coverage": mi["coverage"],
              "synced_ms": statistics.median(m["synced_ms_pairs"]),
              "no_sync_ms": statistics.median(m["no_sync_ms_pairs"]),
              "comm_vs_zero": stats.excludes(mi["ci_lo"], mi["ci_hi"], 0.0)})
    for key in ("pred_flat_ms", "pred_ring_ms", "pred_book_ms"):
        if key in m:
            m[f"comm_vs_{key}"] = stats.excludes(mi["ci_lo"], mi["ci_hi"], m[key])
    if "straggler_share_pairs" in m:
        m["straggler_share"] = statistics.fmean(m["straggler_share_pairs"])
    return out


def pool(rounds: list[dict], names: list[str]) -> dict:
    """One result from the same point's ok results of several rounds (names: where each
    came from, recorded in `pooled_from`)."""
    m = rounds[0]["metrics"]
    if len(rounds) == 1 or not (M in m or "comm_ms_pairs" in m):
        return copy.deepcopy(rounds[0])
    out = throughput(rounds) if M in m else probe(rounds)
    out["pooled_from"] = list(names)
    out["started_utc"] = min(r.get("started_utc", "") for r in rounds)
    out["finished_utc"] = max(r.get("finished_utc", "") for r in rounds)
    return out
