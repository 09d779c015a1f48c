"""Draw every figure the chapters declare: figures/<chapter>.py has one function per
figure, named after it, taking the ReportData and returning a matplotlib Figure."""
from __future__ import annotations

import importlib
import multiprocessing
import sys
import threading
from pathlib import Path

from dpscale.report.chapters import figure_specs
from dpscale.report.machines import ReportData
from dpscale.report.figures import kit

_DATA: ReportData | None = None   # what a forked worker draws from (inherited, never pickled)


def draw_one(chapter_key: str, name: str, data: ReportData, figdir: Path) -> tuple[dict, str | None]:
    """(what the page needs, None), or, where the figure raised, a figure saying so
    and the error's text."""
    try:
        fig, error = getattr(importlib.import_module(f"{__name__}.{chapter_key}"), name)(data), None
    except Exception as e:  # noqa: BLE001
        kit.plt.close("all")
        error = f"{type(e).__name__}: {e}"
        fig, axes = kit.new(height=2.5)
        kit.empty(axes[0, 0], f"figure {name} failed: {error}")
    return kit.save(fig, figdir, name), error


def _forked(job: tuple[str, str, str]) -> tuple[dict, str | None]:
    return draw_one(job[0], job[1], _DATA, Path(job[2]))


def alone() -> bool:
    """No other Python thread in this process. Trap: threading.active_count() counts only
    threads started through `threading`; pytest-xdist's execnet starts its receiver with
    _thread.start_new_thread, and a fork beside it deadlocked a CI run's report fixture
    until the run's timeout. sys._current_frames() has a frame for every thread running Python."""
    return len(sys._current_frames()) == 1 and threading.active_count() == 1


def draw_all(data: ReportData, figdir: Path, workers: int = 1) -> dict[str, dict]:
    """{figure: what the page needs to show it}. A figure that raises is replaced by
    one saying so, and the error is raised after the others are written: the rule
    fails loudly and the report's other figures are still there to look at.
    workers > 1 draws them in forked processes (each figure is independent, and drawing
    them is most of the report's time in one process: docs/measurements/
    readme-run_h200_2026-12-03.md), but only from a process with no other Python
    thread: a lock another thread holds at the fork stays held in the child for ever
    (two children of a pytest-xdist worker, whose execnet threads were running, waited
    on a futex until the run was killed). The
    report rule's script is such a process; anywhere else the figures are drawn here."""
    global _DATA
    jobs = [(chapter.key, spec.name, str(figdir)) for chapter, spec in figure_specs()]
    workers = max(1, min(workers, len(jobs)))
    if workers > 1 and "fork" in multiprocessing.get_all_start_methods() and alone():
        _DATA = data
        try:
            # Pool, not ProcessPoolExecutor: leaving its block terminates the children, so an
            # interrupt or a test's timeout while they draw leaves none behind.
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                done = pool.map(_forked, jobs, chunksize=1)
        finally:
            _DATA = None
    else:
        done = [draw_one(key, name, data, figdir) for key, name, _ in jobs]
    errors = [(name, e) for (_, name, _), (_, e) in zip(jobs, done) if e]
    if errors:
        name, e = errors[0]
        raise RuntimeError(f"figure {name!r} failed: {e}")
    return {name: meta for (_, name, _), (meta, _) in zip(jobs, done)}

