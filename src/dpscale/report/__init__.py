"""The report: this run beside every reference machine and the book, in chapters.

    build(runs_dir, fingerprint_path, out_dir, targets=..., references=[...], book_path=...)

writes, under out_dir:
    report.html          self-contained (figures inlined): opens from disk
    report.md            the same text, figures referenced as figures/<name>.png
    figures/<name>.png   and .svg, one pair per figure a chapter declares (always all of them)
    tables/<key>.csv     one per table a chapter declares for CSV
    results.csv          the tidy table: one row per machine, result and metric (report/tidy.py)
    plan.json            what was planned, and how: `dpscale keep` copies it with the results
    forecast.json        the forecast of every machine, its band and its validation (report/forecast.py)
    summary.txt          the answer in plain text, which `snakemake ... report` prints last (report/summary.py)

A chapter (chapters/<key>.py) owns its figures, tables and prose (prose/<key>.rst,
prose/figures/<name>.rst); its figures are drawn by figures/<key>.py. The
declarations are light: the workflow reads them when it is parsed (no matplotlib).
"""
from __future__ import annotations

from pathlib import Path

from dpscale import layout, provenance
from dpscale.plan import replan
from dpscale.results import audit, job_label, portable, write_json_atomic
from dpscale.report import book as bookmod, forecast, render
from dpscale.report.chapters import CHAPTERS, csv_tables, figure_specs
from dpscale.report.chapters.common import prose
from dpscale.report.chapters.provenance import header
from dpscale.report.document import utc_now
from dpscale.report.machines import (ReportData, kept_profile, load_found, load_planned, reference_folders,
                                     refused_data, with_references)


class Refused(ValueError):
    """The planned results are not all there and sound: no report is built from them."""


def check_targets(targets) -> None:
    """Every planned result that is there is sound (dpscale.results.audit), or Refused
    naming each one that is not: the report never reads a number its file does not hold.
    A planned result with no file is shown "not run" (a kept machine's plan may list what
    was not kept; Snakemake starts the report job only once every input exists)."""
    bad = [a for a in map(audit, targets) if not a.sound and a.state != "missing"]
    if bad:
        raise Refused("\n".join([f"report: {len(bad)} planned result(s) cannot be read as measured; "
                                  "no report is built from them:"] + [f"  {a.line()}" for a in bad]
                                 + ["a plain `snakemake --cores 1 report` measures them again"]))


def load(runs_dir, fingerprint_path, targets=None, references=(), book_path=None, name="this run",
         build_info=None, plan_info=None) -> ReportData:
    """This run (its planned targets, or every result found), the references, the book.
    plan_info: how this run's plan was made, when it was read from a kept plan.json."""
    if targets is not None:
        check_targets(targets)
        current = load_planned(runs_dir, fingerprint_path, targets, label=name, plan_info=plan_info)
    else:
        current = load_found(runs_dir, fingerprint_path, label=name)
    current.profile = kept_profile(layout.of_runs(runs_dir))   # a kept machine's, rebuilt from its folder
    current.alerts += refused_data(layout.of_runs(runs_dir))
    if targets is not None and (build_info or {}).get("resolved"):   # a run's report, its plan known
        current.not_planned = replan.not_this_plan(targets, build_info["resolved"], fingerprint_path)
    same = Path(runs_dir).resolve()
    folders = [f for f in reference_folders(references) if layout.kept(f).runs.resolve() != same and f.name != name]
    refs, notes = with_references(current, folders)
    book = bookmod.load(book_path)
    machines = [current] + refs + ([book] if book else [])
    return ReportData(machines, build=dict(build_info or {}), notes=notes)


def build(runs_dir, fingerprint_path, out_dir, *, targets=None, references=(), book_path=None,
          name="this run", build_info=None, plan_info=None, workers=1) -> dict:
    data = load(runs_dir, fingerprint_path, targets, references, book_path, name, build_info, plan_info)
    data.build.setdefault("built_utc", utc_now())
    data.build.setdefault("code", provenance.code_record(()))
    out = Path(out_dir)
    data.book_rows = [r for chapter in CHAPTERS if chapter.book_rows for r in chapter.book_rows(data)]
    pages = [chapter.page(data) for chapter in CHAPTERS]
    from dpscale.report.figures import draw_all   # matplotlib: only here, never when the workflow is parsed
    images = draw_all(data, out / "figures", workers)
    for f in (f for p in pages for f in p.figures):
        f.image = images[f.name]
    captions = {spec.name: prose(f"figures/{spec.name}") for _chapter, spec in figure_specs()}
    render.write_all(out, pages, header(data), captions, csv_tables())
    from dpscale.report import tidy   # pandas: only here, never when the workflow is parsed
    from dpscale.report.chapters.tta import tidy_rows
    tidy.write(data.measured, out / "results.csv", tidy_rows(data))
    write_json_atomic(out / layout.PLAN, plan_record(data))
    forecast.write(out / "forecast.json", forecast.compute(data))
    from dpscale.report import summary
    summary.write(out / "summary.txt", summary.text(data, out / "report.html"))   # what the run prints last
    counts = {m.label: m.counts() for m in data.measured}
    return {"machines": [m.name for m in data.machines], "figures": list(images), "counts": counts,
            "headlines": {f.name: f.headline for p in pages for f in p.figures},
            "html": str(out / "report.html"), "md": str(out / "report.md")}


def plan_record(data: ReportData) -> dict:
    """What `dpscale keep` stores beside a machine's results: its plan and its provenance."""
    m = data.current
    targets = [f"{job_label(e, v, k)}.json" for e, v, k in (m.plan or sorted(m.results))]
    # what the report read: the closing lines print its summary only while these still hold
    read = {f"{job_label(*key)}.json": r["digest"]["sha256"] for key, r in sorted(m.results.items())
            if isinstance(r.get("digest"), dict)}
    return portable({"targets": targets, "planned": len(targets), "counts": m.counts(), "read": read,
                     **{k: v for k, v in data.build.items()
                        if k in ("command", "config_hash", "resolved", "code", "built_utc")}})


__all__ = ["CHAPTERS", "Refused", "build", "check_targets", "load"]
