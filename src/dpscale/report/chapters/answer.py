"""The report's first screen: will k GPUs train sooner? One figure (samples/s and time
to accuracy against k, relative to k=1, each machine beside the book) and a few lines.
The provenance's one-line summary sits above it (the report's header); its tables and
notes are a chapter of their own further down."""
from __future__ import annotations

from dpscale.report.document import Chapter, FigureSpec, Page
from dpscale.report.machines import Machine, ReportData
from dpscale.report.chapters.common import figure, prose
from dpscale.report.chapters.tta import goodput_rows, weak_samples_per_s

FIGURES = (FigureSpec("answer", "Speed-up over one device against k: samples/s (weak scaling) and time to "
                                "accuracy, each machine beside the book"),)


def speedups(data: ReportData, m: Machine) -> list[dict]:
    """Per k: samples/s(k) / samples/s(1), and time to accuracy(1) / time to accuracy(k)
    at the book's LR rule (k x goodput efficiency, evaluation left out: None where unknown)."""
    sps = weak_samples_per_s(m)
    good = {r["k"]: r for r in goodput_rows(data, m) if r["lr_rule"] == "book"} if m.kind != "book" else {}
    out = []
    for k in sorted(set(sps) | set(good)):
        g = good.get(k, {})
        out.append({"k": k, "throughput": sps[k] / sps[1] if k in sps and sps.get(1) else None,
                    "tta": k * g["goodput_efficiency"] if g.get("goodput_efficiency") is not None else None,
                    "statistical_efficiency": g.get("statistical_efficiency"), "emulated": g.get("emulated", False),
                    "samples_per_s_source": g.get("samples_per_s_source"), "no_score": g.get("no_score")})
    return out


def line(data: ReportData, m: Machine) -> str | None:
    rows = [r for r in speedups(data, m) if r["k"] > 1]
    if not rows:
        return None
    parts = []
    for r in rows:
        t = f"{r['throughput']:.2f}x the samples/s" if r["throughput"] is not None else "samples/s not measured here"
        if r["tta"] is not None:
            t += (f", time to target {1 / r['tta']:.2f}x k=1's (statistical efficiency "
                  f"{r['statistical_efficiency']:.0%}{', emulated' if r['emulated'] else ''}"
                  f"{', samples/s forecast' if r['samples_per_s_source'] == 'forecast' else ''})")
        elif r["statistical_efficiency"] is not None:
            t += f", needs {1 / r['statistical_efficiency']:.2f}x the samples to the target" + \
                (" (emulated)" if r["emulated"] else "")
        elif r["no_score"]:
            t += f", time to target: {r['no_score']}" + (" (emulated)" if r["emulated"] else "")
        parts.append(f"k={r['k']}: {t}")
    who = "the book" if m.kind == "book" else m.label
    caveat = ("; smoke scale: checks the pipeline, not the book's experiment" if m.scale == "smoke" else "")
    sources = m.data_sources()
    caveat += ("; SYNTHETIC data" if sources == ["synthetic"] else
               "; some results on SYNTHETIC data (see the provenance)" if "synthetic" in sources else "")
    return f"{who}: " + "; ".join(parts) + caveat


def lines(data: ReportData) -> list[str]:
    return [t for m in data.machines if (t := line(data, m))] or ["No scaling result yet."]


def page(data: ReportData) -> Page:
    ls = lines(data)
    return Page("answer", CHAPTER.title, prose("answer"), figures=[figure(FIGURES[0], ls[0], ls[1:])])


CHAPTER = Chapter("answer", "Will k GPUs train sooner?", FIGURES, (), page)
