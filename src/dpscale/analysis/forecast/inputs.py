"""What the forecast is fed, in its own terms: one training series of one machine (its
throughput at each k, the all-reduce sweeps, the no_sync() probe, DDP's buckets),
each measurement with the replicates it was measured in. The report turns a machine's
results into these (dpscale.report.forecast); nothing here names an experiment.

A model never reads a Series directly: it reads `Series.reading(log)`, a view whose every
measured value (a throughput point, a sweep, a probe's pairs or its ranks' spread, DDP's
buckets, k=1's step spread, the reason nothing hides) is appended to `log` as a `Used`
(what, at which k) at the moment it is handed out. Which k's exist (a mapping's keys) and
the protocol (batches, layout) are not logged: they are not measurements. The leak check
(check.leaks) and the nested leave-out of the band's misfit (misfit.py) read that log,
never a label a caller attached.

A throughput point's replicates are launches (independent processes) where it had
several, else the timed epochs of its one launch: never pooled as if alike. Its rate is
total samples over total time (each epoch the same samples: the harmonic mean of the
epochs' samples/s), per launch and over launches alike.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

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
    started_utc: str = ""                          # when it was measured (ISO 8601), "" where unknown

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

    def mean_cv(self) -> float | None:
        """Spread of the point's estimate, a mean over its n replicates: cv / sqrt(n)
        (a point of 5 launches is not as noisy as one launch). Timed epochs within one
        launch understate what a new launch would scatter by; the band's misfit term,
        estimated out of sample, carries what they miss."""
        cv = self.cv()
        return cv / float(np.sqrt(len(self.units()[1]))) if cv is not None else None


@dataclass(frozen=True)
class Used:
    """One input of a model: what kind of measurement, at which k (None: not tied to a k)."""
    kind: str                   # throughput | sweep | internode sweep | probe | buckets | step spread | ...
    k: int | None
    what: str = ""

    def text(self) -> str:
        return f"{self.kind}{f' k={self.k}' if self.k is not None else ''}{f' ({self.what})' if self.what else ''}"


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

    def reading(self, log: list | None = None) -> "Reading":
        """This series as a model reads it: every measured value it hands out logged."""
        return Reading(self, [] if log is None else log)


# How each measured field is logged when read: (kind, what). A mapping field logs the
# key it was read at as the k; a scalar field logs READ_AT_K's k (None: not tied to one).
LOGGED = {"weak": ("throughput", "weak"), "strong": ("throughput", "strong"),
          "probes": ("probe", ""), "stragglers": ("probe", "its ranks' no_sync() spread"),
          "sweeps": ("sweep", ""), "internode": ("internode sweep", ""), "buckets": ("buckets", ""),
          "sigma_s": ("step spread", "k=1's per-rank p10/p90"), "no_overlap": ("no overlap", "")}
READ_AT_K = {"sigma_s": 1}
PROTOCOL = {"name", "per_rank_batch", "global_batch", "layout", "sigma_how", "buckets_how"}


class LoggedMap(Mapping):
    """{k: measurement} whose item reads are logged; keys, `in` and len are not (which k's
    were measured is the protocol, not a measurement)."""

    def __init__(self, field_name: str, data: dict, log: list):
        self._field, self._data, self._log = field_name, data, log
        self._kind, self._what = LOGGED[field_name]

    def __getitem__(self, k):
        value = self._data[k]
        self._log.append(Used(self._kind, k, self._what))
        return value

    def __contains__(self, k) -> bool:   # Mapping's own would read the item
        return k in self._data

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


class Reading:
    """A Series as a model reads it (Series.reading): the same attributes, each measured
    value logged where it is handed out. A field the tables above do not name is refused,
    so a new measurement cannot be read undeclared."""

    def __init__(self, s: Series, log: list):
        self._s, self.log = s, log

    def __getattr__(self, name):
        s = object.__getattribute__(self, "_s")
        if name in PROTOCOL:
            return getattr(s, name)
        if name not in LOGGED:
            raise AttributeError(f"Series.{name} is not a declared input (inputs.LOGGED, inputs.PROTOCOL)")
        value = getattr(s, name)
        if isinstance(value, dict):
            return LoggedMap(name, value, self.log)
        if name == "internode":
            if value is not None:
                self.log.append(Used("internode sweep", value.k, f"{value.nodes} nodes"))
        elif name == "no_overlap":
            if value:
                self.log.append(Used("no overlap", None, value))
        else:
            kind, what = LOGGED[name]
            self.log.append(Used(kind, READ_AT_K.get(name), s.buckets_how if name == "buckets" else what))
        return value

    def nodes_at(self, k: int) -> int:
        return self._s.nodes_at(k)

    def internode_at(self) -> int | None:
        """k of the across-node sweep, None without one (the protocol: not logged)."""
        return self._s.internode.k if self._s.internode is not None else None

    def internode_layout(self) -> int | None:
        """Devices per node of the across-node sweep (not logged)."""
        sw = self._s.internode
        return max(1, sw.k // sw.nodes) if sw is not None else None

    def rates(self, scaling: str) -> LoggedMap:
        return getattr(self, scaling)

    def batch(self, scaling: str, k: int) -> float | None:
        return self._s.batch(scaling, k)


assert {f.name for f in fields(Series)} == set(LOGGED) | PROTOCOL, "every Series field is logged or protocol"
