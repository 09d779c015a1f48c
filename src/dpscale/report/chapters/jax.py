"""JAX data parallelism: weak scaling beside DDP's, the all-reduce census of the
compiled step, the k=1 against k=2 update-equality check."""
from __future__ import annotations

from dpscale.report import book as bookmod
from dpscale.report.document import Cell, Chapter, FigureSpec, Page, Table, status_cell
from dpscale.report.machines import Machine, ReportData
from dpscale.report.numbers import equality_summary, fmt_num, hlo_summary, ok, scaling
from dpscale.report.chapters.book_table import printed_cell, row, scaling_rows, status_text
from dpscale.report.chapters.common import by_machine, figure, jobs_table, label, missing_notes, prose
from dpscale.report.numbers import common_k
from dpscale.report.chapters.scaling import covers_note, primary_variant, side_by_side

FIGURES = (FigureSpec("ddp_vs_jax", "DDP against JAX data parallelism, weak scaling"),
           FigureSpec("jax_hlo", "The all-reduces XLA inserted into the compiled step"))


def efficiencies(m: Machine, experiment: str) -> dict[int, float]:
    v = primary_variant(m, experiment)
    return {r["k"]: r["efficiency"] for r in scaling(m, experiment, v) if r["efficiency"] is not None} if v else {}


def versus_headline(data: ReportData) -> str:
    both = {m.key: (m, efficiencies(m, "jax_weak"), efficiencies(m, "ddp_weak")) for m in data.machines}
    both = {key: t for key, t in both.items() if t[1] and t[2]}
    k = common_k({key: {kk: t[1].get(kk) if kk in t[2] else None for kk in t[1]} for key, t in both.items()})
    if k is None:
        return "Weak-scaling efficiency, JAX against DDP: no pair measured"
    parts = [f"{label(m)} JAX {100 * j[k]:.0f}% vs DDP {100 * d[k]:.0f}%" for m, j, d in both.values()
             if k in j and k in d]
    return f"Weak-scaling efficiency at k={k}, JAX against DDP: " + "; ".join(parts)


def hlo_headline(data: ReportData) -> str:
    def one(m: Machine):
        out = []
        for r in (r for r in m.all("jax_hlo") if ok(r)):
            h = hlo_summary(r)
            out.append(f"{label(m)} k={r['k']}: {h['n_allreduce']} all-reduces"
                       + (f", largest {h['largest_floats'] / 1e6:.1f}M floats" if h["largest_floats"] else ""))
        return "; ".join(out) or None
    return "All-reduces XLA inserted into the compiled step: " + ("; ".join(by_machine(data, one)) or "no census")


def hlo_cell(m: Machine) -> Cell:
    rs = m.all("jax_hlo")
    good = [r for r in rs if ok(r)]
    if not good:
        return status_text(rs[0] if rs else None)
    parts = []
    for r in good:
        h = hlo_summary(r)
        parts.append(f"k={r['k']}: {h['n_allreduce']} all-reduce ops in the compiled step"
                     + (f"; the largest sums {h['largest_floats'] / 1e6:.1f}M floats" if h["largest_floats"] else ""))
    return Cell("; ".join(parts))


def equality_cell(m: Machine) -> Cell:
    r = next(iter(m.all("jax_equality")), None)
    if not ok(r):
        return status_text(r)
    e = equality_summary(r)
    if e["max_abs_diff"] is None:
        return Cell("update-equality check: not recorded")
    extra = [f"relative {e['rel_diff']:.1e}"] if e["rel_diff"] is not None else []
    extra += ["passed" if e["passed"] else "FAILED"] if e["passed"] is not None else []
    if e["broken_flagged"] is not None:
        extra.append("broken variant " + ("flagged" if e["broken_flagged"] else "NOT flagged"))
    return Cell(f"max update difference, k=1 vs k=2: {e['max_abs_diff']:.1e}"
                + (f" ({', '.join(extra)})" if extra else ""))


def book_rows(data: ReportData) -> list:
    return (scaling_rows(data, "jax_weak", "host", False, "JAX weak scaling")
            + [row(data, "JAX all-reduce census", bookmod.cite(data.book, "jax_hlo"), printed_cell(data, "jax_hlo"),
                   hlo_cell),
               row(data, "JAX update equality, k=1 vs k=2", bookmod.cite(data.book, "jax_equality"),
                   printed_cell(data, "jax_equality"), equality_cell)])


def checks_table(data: ReportData) -> Table:
    rows = []
    for m in data.machines:
        for r in m.all("jax_hlo"):
            h = {k: v for k, v in hlo_summary(r).items() if k != "sizes" and v is not None}
            rows.append([m.name, "all-reduce census", str(r["k"]), status_cell(r["status"]),
                         "; ".join(f"{k}={v if isinstance(v, list) else fmt_num(v)}" for k, v in h.items())
                         if ok(r) else r.get("reason") or ""])
        for r in m.all("jax_equality"):
            e = {k: v for k, v in equality_summary(r).items() if v is not None}
            rows.append([m.name, "update equality", str(r["k"]), status_cell(r["status"]),
                         "; ".join(f"{k}={fmt_num(v)}" for k, v in e.items()) if ok(r) else r.get("reason") or ""])
    return Table("jax_checks", "All-reduce census and k=1 against k=2 equality",
                    ["machine", "check", "k", "status", "details"], rows)


def pictures(data: ReportData) -> list[tuple[str, str]]:
    """visualize_array_sharding's text pictures, as the runs recorded them."""
    out = []
    for m in data.measured:
        for r in m.all("jax_hlo"):
            for key in ("sharding_batch_txt", "sharding_weight_txt"):
                if ok(r) and isinstance(r["metrics"].get(key), str):
                    out.append((f"{m.name}, jax_hlo k={r['k']}: {key}", r["metrics"][key]))
    return out


def page(data: ReportData) -> Page:
    vs, hlo = FIGURES
    return Page("jax", CHAPTER.title, prose("jax"),
                figures=[figure(vs, versus_headline(data), missing_notes(data, "jax_weak")
                                + covers_note(data, ("ddp_weak", "jax_weak"))
                                + covers_note(data, ("ddp_weak", "jax_weak"), ratio=True)),
                         figure(hlo, hlo_headline(data), missing_notes(data, "jax_hlo"))],
                tables=[side_by_side(data, "jax_weak", False, "jax_side", "JAX weak scaling, in the book's form"),
                        checks_table(data), jobs_table(data, "jax")],
                pre=pictures(data))


CHAPTER = Chapter("jax", "JAX: declarative data parallelism", FIGURES, ("jax_side", "jax_checks"), page, book_rows)
