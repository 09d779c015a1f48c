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

from dpscale.analysis import probe, stats
from dpscale.run import launches

M = launches.METRIC


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


def pooled_probe(rounds: list[dict]) -> dict:
    out = copy.deepcopy(rounds[0])
    m = out["metrics"]
    cat = lambda key: [x for r in rounds for x in r["metrics"][key]]   # noqa: E731
    m.update(probe.paired(cat("synced_ms_pairs"), cat("no_sync_ms_pairs")))
    if all("straggler_share_pairs" in r["metrics"] for r in rounds):   # each round's own, as measured
        m["straggler_share_pairs"] = cat("straggler_share_pairs")
        m["straggler_share"] = statistics.fmean(m["straggler_share_pairs"])
        m["no_sync_ms_ranks"] = [sum(ranks, []) for ranks in zip(*(r["metrics"]["no_sync_ms_ranks"] for r in rounds))]
    m.update(probe.verdicts(m))
    return out


def pool(rounds: list[dict], names: list[str]) -> dict:
    """One result from the same point's ok results of several rounds (names: where each
    came from, recorded in `pooled_from`)."""
    m = rounds[0]["metrics"]
    if len(rounds) == 1 or not (M in m or "comm_ms_pairs" in m):
        return copy.deepcopy(rounds[0])
    out = throughput(rounds) if M in m else pooled_probe(rounds)
    out["pooled_from"] = list(names)
    out["started_utc"] = min(r.get("started_utc", "") for r in rounds)
    out["finished_utc"] = max(r.get("finished_utc", "") for r in rounds)
    return out
