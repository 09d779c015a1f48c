"""Provenance, first: which machines, at what scale, on real or synthetic data, with
what code, from which command and configuration; then the full fingerprints, and what
each job cost (its wall time, its launches, each launch's start)."""
from __future__ import annotations

import json

from dpscale.report.document import Cell, Chapter, Page, Table
from dpscale.report.machines import Machine, ReportData
from dpscale.report.chapters.common import prose
from dpscale.report.numbers import fmt_num
from dpscale.results import job_label

FP_KEYS = ("gpu_model", "gpu_count", "gpu_memory_MiB", "interconnect", "driver", "cuda", "torch_cuda",
           "nccl", "torch", "torchvision", "jax", "jaxlib", "flax", "optax", "numpy", "python",
           "cpu_model", "cpu_count", "hostname")


def counts_text(m: Machine) -> str:
    c = m.counts()
    planned = sum(c.values())
    return f"{planned} planned: " + ", ".join(f"{n} {s}" for s, n in c.items() if n or s == "ok")


def code_text(code: dict | None) -> str:
    code = code or {}
    sha = code.get("commit")
    where = f"commit {sha[:12]}" + (" (dirty: uncommitted changes)" if code.get("dirty") else "") if sha else \
        f"commit unknown ({code.get('source', 'not recorded')})"
    return f"dpscale {code.get('version', '?')}, {where}"


def header(data: ReportData) -> list[tuple[str, str]]:
    """The top of the report: what built it, and each machine in one line."""
    b = data.build
    rows = [("report built", f"{b.get('built_utc', '?')} by {code_text(b.get('code'))}"),
            ("snakemake command", b.get("command") or "– (built by scripts/report.py, outside Snakemake)"),
            ("resolved config", f"sha256 {b['config_hash']}" if b.get("config_hash") else "–")]
    for m in data.measured:
        sources = ", ".join(m.data_sources()) or "–"
        rows.append((m.label, f"{m.hardware}; scale {m.scale}; data {sources}; measured with "
                              f"{', '.join(m.commits()) or '–'}; {counts_text(m)}"))
    if data.book:
        rows.append(("book", f"{data.book.hardware}, the numbers section 13.6 printed ({data.book.source})"))
    return rows


def banners(data: ReportData) -> list[tuple[str, str]]:
    out = []
    for m in data.measured:
        if m.scale == "smoke":
            out.append(("warn", f"{m.name}: SMOKE SCALE, a tiny protocol on the same code path (backends "
                                f"{', '.join(m.backends) or '?'}). These numbers check that the pipeline works; "
                                "they are not a measurement of the book's experiment."))
        if "synthetic" in m.data_sources():
            out.append(("alert", f"{m.name}: SYNTHETIC DATA. Fashion-MNIST was not used; a deterministic synthetic "
                                 "stand-in of the same shape fed these runs. Throughput does not depend on pixel "
                                 "values; losses do."))
        if how := m.plan_info.get("reconstructed"):
            out.append(("info", f"{m.name}: its plan was reconstructed {how}."))
        out += [("alert", f"{m.name}: unreadable artifact: {e}") for e in m.errors]
        out += [("alert", f"{m.name}: {a}") for a in m.alerts]
        if m.not_planned:
            out.append(("alert", f"{m.name}: {len(m.not_planned)} result(s) were not measured as this report's plan "
                                 "asks, and are shown as they are: " + "; ".join(m.not_planned)))
        if not any(r["status"] != "not run" for r in m.results.values()):
            out.append(("alert", f"{m.name}: no result JSONs found under {m.source}."))
    return out + [("info", n) for n in data.notes]


def machines_table(data: ReportData) -> Table:
    rows = []
    for m in data.measured:
        start, end = m.dates()
        rows.append([m.label, m.hardware, m.scale, ", ".join(m.data_sources()) or "–", ", ".join(m.backends) or "–",
                     f"{start or '?'} … {end or '?'}", ", ".join(m.commits()) or "–", counts_text(m),
                     m.planned_by(), m.source])
    return Table("machines", "Machines, scale, data and code", ["machine", "hardware", "scale", "data",
                    "backends", "measured (UTC)", "code", "plan", "planned by", "results"], rows)


def fmt_fp(v) -> str:
    if v is None:
        return "–"
    return json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else str(v)


def fingerprint_table(data: ReportData) -> Table:
    ms = data.measured
    keys = [k for k in FP_KEYS if any(m.fingerprint.get(k) is not None for m in ms)]
    keys += sorted({k for m in ms for k in m.fingerprint} - set(keys))
    rows = [[Cell(k)] + [Cell(fmt_fp(m.fingerprint.get(k))) for m in ms] for k in keys]
    return Table("fingerprint", "Fingerprints: the hardware and software each machine's results depend on",
                 ["key"] + [m.name for m in ms], rows)


def launch_list(values: list | None) -> str:
    return ", ".join("–" if v is None else fmt_num(v) for v in values) if values else "–"


def cache_text(counts: dict | None) -> str:
    """A launch's lookups in the compilation caches (dpscale.run.caches): what it loaded
    and what it compiled and wrote (JAX), or hits and misses (torch.compile's FX graphs)."""
    if not counts:
        return "–"
    if "loaded" in counts:
        return f"{counts['loaded']} loaded, {counts['written']} compiled"
    bypassed = counts.get("fx_graph_bypasses") or 0
    return (f"{counts.get('fx_graph_hits', 0)} hits, {counts.get('fx_graph_misses', 0)} misses"
            + (f", {bypassed} not cacheable" if bypassed else ""))


def stages_text(stages: dict | None) -> str:
    """A launch's start split at its worker's stages (dpscale.run.launches.stamp), seconds."""
    return ", ".join(f"{name} {fmt_num(v)}" for name, v in stages.items()) if stages else "–"


def cost_rows(m: Machine) -> tuple[list[list], int]:
    """A row per job of `m` that recorded its cost, then the machine's total; and how
    many of its results predate the record (no wall_s)."""
    rows, older, total = [], 0, 0.0
    for r in m.all():
        mt = r.get("metrics") or {}
        if r["status"] in ("not run", "skipped"):
            continue
        if mt.get("wall_s") is None:
            older += 1
            continue
        total += mt["wall_s"]
        rows.append([m.label, job_label(r["experiment"], r["variant"], r["k"]), r["status"], mt["wall_s"],
                     len(mt.get("launch_s_launches") or [None]), launch_list(mt.get("start_s_launches")),
                     launch_list(mt.get("launch_s_launches")),
                     "; ".join(cache_text(c) for c in mt.get("compile_cache_launches") or []) or "–",
                     stages_text(mt.get("start_stages_s"))])
    if rows:
        rows.append([m.label, f"all {len(rows)} jobs", "", round(total, 3), sum(r[4] for r in rows), "", "", "", ""])
    return rows, older


def cost_table(data: ReportData) -> Table:
    rows, notes = [], []
    for m in data.measured:
        mine, older = cost_rows(m)
        rows += mine
        if older:
            notes.append(f"{m.label}: {older} result(s) measured before jobs recorded their cost")
    note = ("wall s: the job from the spawn of its first launch to the end of its last; start s: from a "
            "launch's spawn to its first timed step (imports, process group, data, warm-up and compiling), "
            "the part a warm compilation cache shortens, split at the worker's stages for the representative launch; "
            "compile cache: each launch's loads from it. "
            + "; ".join(notes)).strip()
    return Table("cost", "What each job cost: wall time, launches, each launch's start",
                 ["machine", "job", "status", "wall s", "launches", "start s, each launch", "seconds, each launch",
                  "compile cache, each launch", "start s by stage, the representative launch"], rows, note)


def page(data: ReportData) -> Page:
    return Page("provenance", CHAPTER.title, prose("provenance"), banners=banners(data),
                tables=[machines_table(data), fingerprint_table(data), cost_table(data)])


CHAPTER = Chapter("provenance", "Provenance", (), ("machines", "fingerprint", "cost"), page)
