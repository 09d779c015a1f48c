"""What the forecast is fed, in its own terms: one training series of one machine (its
throughput at each k, the all-reduce sweeps, the no_sync() probe, DDP's buckets),
each measurement with the replicates it was measured in. The report turns a machine's
results into these (dpscale.report.forecast); nothing here names an experiment.

A throughput point's replicates are launches (independent processes) where it had
several, else the timed epochs of its one launch: never pooled as if alike. Its rate is
total samples over total time (each epoch the same samples: the harmonic mean of the
epochs' samples/s), per launch and over launches alike.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

LAUNCHES, EPOCHS, ONCE = "independent launches", "timed epochs within one launch", "measured once"


def harmonic(xs) -> float:
    """Total samples over total time of equal-sample epochs (or launches)."""
    xs = np.asarray(xs, float)
    return float(len(xs) / np.sum(1.0 / xs))


@dataclass(frozen=True)
class Rate:
    """samples/s of one throughput point and its replicates."""
    value: float                                   # as the result states it (the book's figure)
    launches: tuple[tuple[float, ...], ...] = ()   # per launch, its timed epochs' samples/s
    repeats: tuple[float, ...] = ()                # the one launch's timed epochs

    def units(self) -> tuple[str, list[float]]:
        """(what a replicate is, each replicate's samples/s)."""
        if len(self.launches) >= 2:
            return LAUNCHES, [harmonic(ep) for ep in self.launches]
        if len(self.repeats) >= 2:
            return EPOCHS, list(self.repeats)
        return ONCE, [self.value]

    def estimate(self, rng=None) -> float:
        """Total samples over total time over the replicates; one bootstrap resample
        of them with rng."""
        _, xs = self.units()
        if rng is not None and len(xs) > 1:
            xs = rng.choice(xs, size=len(xs), replace=True)
        return harmonic(xs)

    def cv(self) -> float | None:
        """Spread of one replicate (sd / mean), None when measured once."""
        _, xs = self.units()
        return float(np.std(xs, ddof=1) / np.mean(xs)) if len(xs) > 1 else None


@dataclass(frozen=True)
class Sweep:
    """An all-reduce payload sweep: seconds per payload, at k ranks over `nodes` nodes."""
    bytes: tuple[float, ...]
    time_s: tuple[float, ...]
    k: int
    nodes: int = 1
    rse: tuple[float | None, ...] = ()             # per payload, its time's relative standard error
    source: str = ""

    def window(self, min_bytes: float = 2**20) -> "Sweep":
        """The payloads of min_bytes and up (DDP's first bucket: the smallest the forecast
        asks about; below it launch latency and a shaper's burst rule the time), where
        two or more are; else the whole sweep (fabric_file.fabric_tiers does the same)."""
        keep = [i for i, b in enumerate(self.bytes) if b >= min_bytes]
        if len(keep) < 2 or len(keep) == len(self.bytes):
            return self
        pick = lambda xs: tuple(xs[i] for i in keep) if xs else xs   # noqa: E731
        return Sweep(pick(self.bytes), pick(self.time_s), self.k, self.nodes, pick(self.rse), self.source)

    def draw(self, rng=None) -> tuple[list[float], list[float]]:
        """(bytes, seconds): as measured, or resampled over payloads (keeping two sizes at
        least) with each time jittered by its own relative standard error."""
        b, t = list(self.bytes), list(self.time_s)
        if rng is None:
            return b, t
        idx = rng.integers(0, len(b), len(b)) if len(b) > 2 else range(len(b))
        if len({b[i] for i in idx}) < 2:
            idx = range(len(b))
        rse = list(self.rse) or [None] * len(b)
        return [b[i] for i in idx], [t[i] * float(np.exp((rse[i] or 0.0) * rng.standard_normal())) for i in idx]


@dataclass(frozen=True)
class Series:
    """One training series of one machine, as the forecast reads it."""
    name: str                                      # e.g. "ddp [cached]"
    per_rank_batch: float | None                   # weak scaling's
    global_batch: float | None                     # strong scaling's
    weak: dict = field(default_factory=dict)       # {k: Rate}
    strong: dict = field(default_factory=dict)
    layout: dict = field(default_factory=dict)     # {k: nodes} where a point spans nodes (default 1)
    sigma_s: float = 0.0                           # k=1's per-rank step-time spread
    sigma_how: str = ""
    probes: dict = field(default_factory=dict)     # {k: paired synced - no_sync seconds}
    buckets: tuple[float, ...] = ()                # bytes of each all-reduce of one step, in launch order
    buckets_how: str = ""
    sweeps: dict = field(default_factory=dict)     # {k: Sweep} within one node
    internode: Sweep | None = None                 # measured across nodes
    fabric_from: str = ""                          # where a borrowed fabric came from
    noise_cv: float | None = None                  # one measurement's spread, where k=1's own says nothing
    noise_how: str = ""                            # where that spread came from
    no_overlap: str = ""                           # why nothing can hide the all-reduce ("": something can)
    stragglers: dict = field(default_factory=dict) # {k: the probe's no_sync trials' (slowest - mean) / mean}

    def nodes_at(self, k: int) -> int:
        return int(self.layout.get(k, 1))

    def rates(self, scaling: str) -> dict:
        return self.weak if scaling == "weak" else self.strong

    def batch(self, scaling: str, k: int) -> float | None:
        """Per-rank batch of a point: weak's fixed one, strong's global / k."""
        if scaling == "weak":
            return self.per_rank_batch
        return self.global_batch / k if self.global_batch else None
