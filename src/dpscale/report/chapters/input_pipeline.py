"""The input pipeline: the book's DataLoader against the device-resident resize cache."""
from __future__ import annotations

from dpscale.report.document import Chapter, FigureSpec, Page
from dpscale.report.machines import Machine, ReportData
from dpscale.report.numbers import point
from dpscale.report.chapters.common import by_machine, figure, label, missing_notes, prose
from dpscale.report.chapters.scaling import covers_note

FIGURES = (FigureSpec("loader", "The book's DataLoader against the device-resident resize cache, same DDP job"),)
VARIANTS = ("seed", "cached", "tuned")


def ratios(m: Machine, experiment: str = "ddp_weak") -> list[tuple[int, float]]:
    """(k, cached / seed) where both ran."""
    out = []
    for k in m.ks(experiment):
        s, c = point(m.get(experiment, "seed", k))[0], point(m.get(experiment, "cached", k))[0]
        if s and c:
            out.append((k, c / s))
    return out


def headline(data: ReportData) -> str:
    parts = by_machine(data, lambda m: (f"{label(m)} " + ", ".join(f"{r:.2f}x at k={k}" for k, r in ratios(m)))
                       if m.kind != "book" and ratios(m) else None)
    if not parts:
        return "Resize cache against the book's DataLoader: no pair of runs to compare"
    return "Resize cache on the device against the book's DataLoader (weak scaling, cached / seed): " + "; ".join(parts)


def page(data: ReportData) -> Page:
    notes = missing_notes(data, "ddp_weak", VARIANTS, data.measured) + \
        missing_notes(data, "ddp_strong", VARIANTS, data.measured) + \
        covers_note(data, ("ddp_weak", "ddp_strong"), variants=VARIANTS)
    return Page("input_pipeline", CHAPTER.title, prose("input_pipeline"),
                figures=[figure(FIGURES[0], headline(data), notes)])


CHAPTER = Chapter("input_pipeline", "Input pipeline: the book's DataLoader against the resize cache", FIGURES, (), page)
