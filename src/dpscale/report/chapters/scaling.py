"""DDP weak and strong scaling: samples/s against k, speedup and efficiency, each
with its interval, like with like against the book."""
from __future__ import annotations

from dpscale import registry
from dpscale.report.document import Chapter, Cell, FigureSpec, Page, Table
from dpscale.report.machines import Machine, ReportData
from dpscale.report.numbers import THROUGHPUT, book_form_scaling, common_k, pct, scaling
from dpscale.report.chapters.book_table import scaling_rows
from dpscale.report.chapters.common import figure, jobs_table, label, missing_notes, prose, records_table

FIGURES = (FigureSpec("scaling_weak", "DDP weak scaling: samples/s against k, with the ideal line"),
           FigureSpec("scaling_strong", "DDP strong scaling: samples/s against k, with the ideal line"),
           FigureSpec("efficiency", "Weak- and strong-scaling efficiency against k"))
DETAILS = ["machine", "experiment", "variant", "k", "status", "samples_per_s", "mean", "interval", "repeats",
           "covers", "cv", "speedup", "speedup_interval", "efficiency", "efficiency_interval", "ratio_covers",
           "ratio_method", "per_rank_batch",
           "global_batch", "step_ms_median", "peak_mem_MiB", "mfu", "slow_ranks", "gpu", "host"]


def primary_variant(m: Machine, experiment: str) -> str | None:
    """The series drawn first: the book's protocol where it has a number (registry.Variant.book)."""
    have = registry.get(experiment).series_order(m.variants(experiment))
    good = [v for v in have if any(r["status"] == "ok" for r in m.series(experiment, v).values())]
    return good[0] if good else (have[0] if have else None)


def phrase(row: dict) -> str:
    eff = pct(row["efficiency"])
    if row["efficiency_lo"] is not None:
        eff += f" [{pct(row['efficiency_lo'])}, {pct(row['efficiency_hi'])}] over {row['ratio_covers']}"
    return f"{row['speedup']:.2f}x ({eff})"


def covers_note(data: ReportData, experiments, ratio: bool = False, variants=None) -> list[str]:
    """Lines saying what the drawn intervals cover, and how many points have none."""
    rows = [r for m in data.measured for e in experiments for v in m.variants(e) for r in scaling(m, e, v)
            if r["status"] == "ok" and r["mean"] is not None and (r["k"] > 1 or not ratio)
            and (variants is None or v in variants)]
    key, lo = ("ratio_covers", "efficiency_lo") if ratio else ("covers", "ci_lo")
    what = "the efficiency, computed on the ratio (Fieller's interval)" if ratio else "the mean samples/s"
    out = [f"Error bars: 95% intervals of {what} over {c}" for c in sorted({r[key] for r in rows if r[lo] is not None})]
    if bare := sum(r[lo] is None for r in rows):
        out.append(f"{bare} point(s) without an error bar: one number per side (no repeats), so no interval")
    return out


def headline(data: ReportData, experiment: str, title: str) -> str:
    """Each machine's book-protocol series at one shared k; the largest k after it."""
    per = {}
    for m in data.machines:
        if v := primary_variant(m, experiment):
            rows = {r["k"]: r for r in scaling(m, experiment, v) if r["speedup"] is not None and r["k"] > 1}
            if rows:
                per[m.key] = (m, v, rows)
    k = common_k({key: {kk: r["speedup"] for kk, r in rows.items()} for key, (_m, _v, rows) in per.items()})
    if k is None:
        return f"{title}: no multi-device measurement"
    same = [f"{label(m)} [{v}] {phrase(rows[k])}" for m, v, rows in per.values() if k in rows]
    beyond = [f"{label(m)} k={max(rows)} {phrase(rows[max(rows)])}" for m, _v, rows in per.values()
              if max(rows) != k]
    return f"{title} at k={k}: " + "; ".join(same) + (f". Largest k: {'; '.join(beyond)}" if beyond else "")


def side_by_side(data: ReportData, experiment: str, strong: bool, key: str, title: str) -> Table:
    """Rows k; a column per machine x variant; each cell in the book's printed form."""
    cols = [(m, v) for m in data.machines for v in m.variants(experiment)]
    rows_of = {(m.key, v): {r["k"]: r for r in scaling(m, experiment, v)} for m, v in cols}
    ks = sorted({k for d in rows_of.values() for k in d})
    rows = []
    for k in ks:
        cells = [str(k)]
        for m, v in cols:
            row = rows_of[(m.key, v)].get(k)
            if row is None:   # the CSV holds the book's figure, samples/s: empty without one
                cells.append(Cell("not planned", "missing", raw=None))
            elif row["status"] != "ok":
                cells.append(Cell(f"{row['status'].upper()}: {row['reason']}", row["status"].replace(" ", ""), raw=None))
            elif row.get("gpu_flags") or row.get("host_flags"):   # a shared or slowed device: suspect, and said
                said = [f"GPU {'; '.join(row['gpu_flags'])}"] * bool(row.get("gpu_flags")) + row.get("host_flags", [])
                cells.append(Cell(f"{book_form_scaling(m, row, strong).split(': ', 1)[1]} ({'; '.join(said)})",
                                  "alert"))
            else:
                cells.append(Cell(book_form_scaling(m, row, strong).split(": ", 1)[1],
                                  "book" if m.kind == "book" else "", raw=row["samples_per_s"]))
        rows.append(cells)
    return Table(key, title, ["k"] + [f"{m.name} [{v}]" for m, v in cols], rows)


def printed_block(data: ReportData, experiment: str, strong: bool) -> str:
    lines = []
    for m in data.machines:
        for v in m.variants(experiment):
            lines.append(f"# {m.name} [{v}]")
            if m.kind == "book":
                lines += list((m.book or {}).get(experiment, {}).get("printed") or [])
            else:
                lines += [book_form_scaling(m, row, strong) + (f"  ({row['reason']})" if row["reason"] else "")
                          for row in scaling(m, experiment, v)]
            lines.append("")
    return "\n".join(lines).rstrip()


def detail_records(data: ReportData) -> list[dict]:
    out = []
    for m in data.measured:
        for e in THROUGHPUT:
            for v in m.variants(e):
                for r in scaling(m, e, v):
                    out.append({**r, "interval": (r["ci_lo"], r["ci_hi"]),
                                "speedup_interval": (r["speedup_lo"], r["speedup_hi"]),
                                "efficiency_interval": (r["efficiency_lo"], r["efficiency_hi"]),
                                "slow_ranks": ", ".join(map(str, r["slow_ranks"])) or "–",
                                "gpu": "; ".join(r.get("gpu_flags") or []) or "–",
                                "host": "; ".join(r.get("host_flags") or []) or "–"})
    return out


def straggler_banners(data: ReportData) -> list[tuple[str, str]]:
    out = []
    for r in detail_records(data):
        if r["slow_ranks"] != "–":
            out.append(("warn", f"{r['machine']}: {r['experiment']} [{r['variant']}] k={r['k']}: rank(s) "
                                f"{r['slow_ranks']} more than 5% slower than the median rank in a timed epoch; "
                                "samples/s comes from the slowest rank"))
    return out


def gpu_banners(data: ReportData) -> list[tuple[str, str]]:
    """A warning per throughput measured on a shared or slowed GPU (its gpu_state flags)."""
    return [("warn", f"{r['machine']}: {r['experiment']} [{r['variant']}] k={r['k']}: the GPU was {r['gpu']} "
                     "during the timing, so its samples/s may read low (the result's gpu_state holds the "
                     "samples; gpu_state.on_shared / on_throttle: fail records such a run as failed)")
            for r in detail_records(data) if r["gpu"] != "–"] + [
        ("warn", f"{r['machine']}: {r['experiment']} [{r['variant']}] k={r['k']}: {r['host']} took turns during "
                 "the timing, so its samples/s measures the host's scheduler too (cluster.gpus_per_node, or fewer "
                 "k: one rank per core)") for r in detail_records(data) if r["host"] != "–"]


def page(data: ReportData) -> Page:
    weak, strong, eff = FIGURES
    notes = (missing_notes(data, "ddp_weak") + missing_notes(data, "ddp_strong")
             + covers_note(data, ("ddp_weak", "ddp_strong"), ratio=True))
    eff_head = "; ".join(headline(data, e, t) for e, t in (("ddp_weak", "weak"), ("ddp_strong", "strong")))
    return Page(
        "scaling", CHAPTER.title, prose("scaling"),
        banners=straggler_banners(data) + gpu_banners(data),
        figures=[figure(weak, headline(data, "ddp_weak", "DDP weak scaling"),
                        missing_notes(data, "ddp_weak") + covers_note(data, ("ddp_weak",))),
                 figure(strong, headline(data, "ddp_strong", "DDP strong scaling"),
                        missing_notes(data, "ddp_strong") + covers_note(data, ("ddp_strong",))),
                 figure(eff, "Scaling efficiency, " + eff_head, notes)],
        tables=[side_by_side(data, "ddp_weak", False, "weak_side", "Weak scaling, in the book's form"),
                side_by_side(data, "ddp_strong", True, "strong_side", "Strong scaling, in the book's form"),
                records_table("scaling", "Every throughput, DDP and JAX: the book's figure (first timed "
                              "epoch), the mean with its 95% interval and what it covers (timed epochs within "
                              "one launch, or independent launches), speedup and efficiency with theirs, "
                              "computed on the ratio (ratio_method)",
                              detail_records(data), DETAILS),
                jobs_table(data, "scaling")],
        pre=[("What each series would print, in the book's words",
              printed_block(data, "ddp_weak", False) + "\n\n" + printed_block(data, "ddp_strong", True))])


def book_rows(data: ReportData) -> list:
    return (scaling_rows(data, "ddp_weak", "seed", False, "DDP weak scaling")
            + scaling_rows(data, "ddp_strong", "seed", True, "DDP strong scaling"))


CHAPTER = Chapter("scaling", "DDP scaling, weak and strong", FIGURES, ("weak_side", "strong_side", "scaling"), page,
                  book_rows)
