"""The paired no_sync() probe's statistics, from its trial times alone (pure: the probe
in dpscale.measure.torch_comm measures them, dpscale.standin.rounds pools rounds of them).
"""
from __future__ import annotations

import statistics

from dpscale.analysis import stats

PREDICTIONS = ("pred_flat_ms", "pred_ring_ms", "pred_book_ms")


def paired(synced: list[float], silent: list[float]) -> dict:
    """The paired differences, their median with its order-statistic 95% interval."""
    diffs = [a - b for a, b in zip(synced, silent)]
    mi = stats.median_interval(diffs)
    return {"pairs": len(diffs), "pair_order": "synced first on even pairs, no_sync() first on odd ones",
            "synced_ms_pairs": synced, "no_sync_ms_pairs": silent, "comm_ms_pairs": diffs,
            "comm_ms": mi["median"], "comm_ms_ci95": [mi["ci_lo"], mi["ci_hi"]],
            "comm_ms_ci95_coverage": mi["coverage"],
            "synced_ms": statistics.median(synced), "no_sync_ms": statistics.median(silent)}


def straggler_shares(no_sync_ms: list[list[float]]) -> list[float]:
    """Per no_sync() trial (no communication: each rank's own compute), what waiting for
    the slowest rank adds over the ranks' mean, as a share of that mean:
    (max - mean) / mean over ranks. no_sync_ms: [ranks][trials]."""
    return [(max(t) - statistics.fmean(t)) / statistics.fmean(t) for t in zip(*no_sync_ms)]


def stragglers(no_sync_ms: list[list[float]]) -> dict:
    """The no_sync() arm's ranks apart: each rank's trial times and the straggler share
    per trial (what the forecast's straggler term reads), with its mean (what a step pays
    on average: the forecast's expectation)."""
    shares = straggler_shares(no_sync_ms)
    return {"no_sync_ms_ranks": no_sync_ms, "straggler_share_pairs": shares,
            "straggler_share": statistics.fmean(shares)}


def verdicts(m: dict) -> dict:
    """Whether the comm interval leaves out 0 and each prediction m holds (True: it does)."""
    lo, hi = m["comm_ms_ci95"]
    return {"comm_vs_zero": stats.excludes(lo, hi, 0.0),
            **{f"comm_vs_{key}": stats.excludes(lo, hi, m[key]) for key in PREDICTIONS if key in m}}
