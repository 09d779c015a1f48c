"""The report's chapters, in the order a reader meets them: the answer first (under the
provenance's one-line summary, the header), the provenance's tables last."""
from __future__ import annotations

from dpscale.report.chapters import (answer, communication, forecast, input_pipeline, jax, memory, overview, provenance,
                                     scaling, tta, tuned)

CHAPTERS = [m.CHAPTER for m in (answer, overview, scaling, tta, input_pipeline, tuned, communication, memory,
                                jax, forecast, provenance)]


def figure_specs() -> list[tuple]:
    """(chapter, figure) in the report's order."""
    return [(c, f) for c in CHAPTERS for f in c.figures]


def csv_tables() -> list[str]:
    return [key for c in CHAPTERS for key in c.tables]
