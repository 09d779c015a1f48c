"""Draw every figure the chapters declare: figures/<chapter>.py has one function per
figure, named after it, taking the ReportData and returning a matplotlib Figure."""
from __future__ import annotations

import importlib
from pathlib import Path

from dpscale.report.chapters import figure_specs
from dpscale.report.machines import ReportData
from dpscale.report.figures import kit


def draw_all(data: ReportData, figdir: Path) -> dict[str, dict]:
    """{figure: what the page needs to show it}. A figure that raises is replaced by
    one saying so, and the error is raised after the others are written: the rule
    fails loudly and the report's other figures are still there to look at."""
    out, errors = {}, []
    for chapter, spec in figure_specs():
        try:
            fig = getattr(importlib.import_module(f"{__name__}.{chapter.key}"), spec.name)(data)
        except Exception as e:  # noqa: BLE001
            kit.plt.close("all")
            errors.append((spec.name, e))
            fig, axes = kit.new(height=2.5)
            kit.empty(axes[0, 0], f"figure {spec.name} failed: {type(e).__name__}: {e}")
        out[spec.name] = kit.save(fig, figdir, spec.name)
    if errors:
        name, e = errors[0]
        raise RuntimeError(f"figure {name!r} failed: {type(e).__name__}: {e}") from e
    return out
