"""Timing helpers: synchronise before reading clocks, warm up, repeat, report
the median and the spread."""
from __future__ import annotations

import statistics
import time

from dpscale.analysis import stats


# The stages of this launch, each stage's end on the wall clock (time.time()), in order:
# what a throughput launch does between its spawn and its first timed step (its worker's
# first line, the imports, the process group or devices, the rates, model and data; the
# warm-up closes at the first timed step), and after it (the timed epochs, the metrics).
# dpscale.run.launches.stamp turns them into seconds per stage.
STAGES: dict[str, float] = {}


def mark(stage: str, at: float | None = None) -> None:
    """The end of one stage of this launch: now, or `at` (a stamp taken before this
    module could be imported). A stage marked twice keeps its first end."""
    STAGES.setdefault(stage, time.time() if at is None else at)


def summary(values_ms: list[float]) -> dict:
    """Median and spread of a list of times in ms; cv = stdev / mean (step-to-step noise)."""
    if not values_ms:
        return {"median_ms": None, "p10_ms": None, "p90_ms": None, "min_ms": None, "max_ms": None, "n": 0,
                "cv": None}
    s = sorted(values_ms)

    def q(p):  # nearest-rank quantile: honest for small n
        return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]
    mean = statistics.fmean(s)
    return {"median_ms": statistics.median(s), "p10_ms": q(0.1), "p90_ms": q(0.9),
            "min_ms": s[0], "max_ms": s[-1], "n": len(s),
            "cv": statistics.stdev(s) / mean if len(s) > 1 and mean else None}


def warmup_plan(proto: dict) -> list[int | None]:
    """The passes before the timed epochs, as each pass's steps (None: one whole epoch):
    the book's epochs-1 warm-up epochs, or, where the protocol sets warmup_steps, that
    many steps in one pass. The tuned step is steady after its compile and capture, a
    few tens of steps, long before the book's fp32 epoch ends, so a whole warm-up epoch
    per launch mostly waits (docs/measurements/launch-cost_h200_2026-12-03.md)."""
    n = proto.get("warmup_steps")
    return [None] * (proto["epochs"] - 1) if n is None else [int(n)]


def spread_fields(name: str, xs: list[float]) -> dict:
    """A number measured once per timed repeat, with its spread: `<name>_repeats`,
    `<name>_median/_min/_max/_mean/_cv` and `<name>_ci95` [lo, hi], the Student-t 95%
    interval of the mean (stats.interval; [None, None] below two repeats), and
    `<name>_ci95_covers`, what it covers: the timed repeats of this one launch."""
    iv = stats.interval(xs)
    return {f"{name}_repeats": list(xs), **{f"{name}_{key}": iv[key] for key in ("median", "min", "max", "mean", "cv")},
            f"{name}_ci95": [iv["ci_lo"], iv["ci_hi"]],
            f"{name}_ci95_covers": stats.WITHIN if iv["ci_lo"] is not None else ""}


class StepTimer:
    """Per-step times without a host sync inside the loop.

    On CUDA, an event is recorded at every step boundary (a sync would stall the
    CPU's run-ahead and change what is measured); elapsed times are read once, at
    the end. On CPU the work is synchronous, so the wall clock is exact.
    """

    def __init__(self, device):
        self.cuda = getattr(device, "type", str(device)) == "cuda"
        self.marks = []

    def mark(self):
        if self.cuda:
            import torch
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())

    def step_ms(self) -> list[float]:
        if len(self.marks) < 2:
            return []
        if self.cuda:
            self.marks[-1].synchronize()  # this is a sync point
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [1e3 * (b - a) for a, b in zip(self.marks, self.marks[1:])]


def sync(device):
    if getattr(device, "type", str(device)) == "cuda":
        import torch
        torch.cuda.synchronize(device)
