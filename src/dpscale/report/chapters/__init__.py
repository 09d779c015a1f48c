"""The report's chapters, in the order a reader meets them: provenance first."""
from __future__ import annotations

from dpscale.report.chapters import (communication, exercise6, input_pipeline, jax, memory, overview, provenance,
                                     scaling, tta, tuned)

CHAPTERS = [m.CHAPTER for m in (provenance, overview, scaling, tta, input_pipeline, tuned, communication, memory,
                                jax, exercise6)]


def figure_specs() -> list[tuple]:
    """(chapter, figure) in the report's order."""
    return [(c, f) for c in CHAPTERS for f in c.figures]


def csv_tables() -> list[str]:
    return [key for c in CHAPTERS for key in c.tables]
