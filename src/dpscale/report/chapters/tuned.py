"""The tuned series beside the book's protocol, per device at the smallest k, with MFU."""
from __future__ import annotations

from ..document import Chapter, FigureSpec, Page
from ..machines import Machine, ReportData
from ..numbers import fmt_num, metric, ok, point
from .common import by_machine, figure, label, missing_notes, prose

FIGURES = (FigureSpec("tuned", "Per-device throughput and MFU: the book's protocol against the tuned series"),)
# (experiment, framework, the variants from the book's protocol to the tuned series)
GROUPS = (("ddp_weak", "DDP", ("seed", "cached", "tuned")), ("jax_weak", "JAX", ("host", "device", "tuned")))


def smallest_k(m: Machine) -> int | None:
    ks = m.ks("ddp_weak") + m.ks("jax_weak")
    return min(ks) if ks else None


def per_device(r: dict | None) -> tuple:
    """(samples/s per device, interval low, high) of one result."""
    v, lo, hi = point(r)
    k = (r or {}).get("k") or 1
    return (None, None, None) if v is None else (v / k, lo / k if lo else None, hi / k if hi else None)


def tuned_part(m: Machine, experiment: str, framework: str, variants: tuple) -> str | None:
    k = smallest_k(m)
    r = m.get(experiment, variants[-1], k) if k else None
    if not ok(r):
        return None
    s = per_device(r)[0]
    base = per_device(m.get(experiment, variants[0], k))[0]
    mfu = metric(r, "mfu")
    return (f"{framework} {fmt_num(s)}" + (f" ({s / base:.1f}x)" if base else "")
            + (f", MFU {mfu:.2f}" if mfu else ""))


def headline(data: ReportData) -> str:
    parts = by_machine(data, lambda m: (f"{label(m)} k={smallest_k(m)}: " + "; ".join(p)) if m.kind != "book" and (
        p := [t for e, f, vs in GROUPS if (t := tuned_part(m, e, f, vs))]) else None)
    if not parts:
        return "The tuned series beside the book's protocol: no tuned run (tuned: auto runs it on GPUs)"
    return "The tuned series beside the book's protocol, samples/s per device (speed-up over the book's): " + \
        "; ".join(parts)


def page(data: ReportData) -> Page:
    notes = [n for e, _f, vs in GROUPS for n in missing_notes(data, e, vs, data.measured) if " k=1 " in n + " "]
    return Page("tuned", CHAPTER.title, prose("tuned"), figures=[figure(FIGURES[0], headline(data), notes)])


CHAPTER = Chapter("tuned", "The tuned series beside the book's protocol", FIGURES, (), page)
