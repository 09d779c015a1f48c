"""One row per number the book printed, one column per machine, each cell in the
book's printed form, so a reader can set the book's line beside ours."""
from __future__ import annotations

from .. import book as bookmod
from ..document import Cell, Table
from ..machines import Machine, ReportData
from ..numbers import allreduce_at, book_form_scaling, equality_summary, fmt_num, hlo_summary, k8_rows, ok, \
    probe_rows, scaling

SCALING = (("ddp_weak", "seed", False, "DDP weak scaling"), ("ddp_strong", "seed", True, "DDP strong scaling"),
           ("jax_weak", "host", False, "JAX weak scaling"))


def status_text(r: dict | None) -> Cell:
    if r is None:
        return Cell("not planned", "missing")
    return Cell(f"{r['status'].upper()}: {r.get('reason') or ''}", r["status"].replace(" ", ""))


def scaling_cell(m: Machine, exp: str, variant: str, k: int, strong: bool) -> Cell:
    r = m.get(exp, variant, k)
    if not ok(r):
        return status_text(r)
    row = next(x for x in scaling(m, exp, variant) if x["k"] == k)
    return Cell(book_form_scaling(m, row, strong), "book" if m.kind == "book" else "")


def probe_text(row: dict) -> str:
    f = fmt_num
    s = (f"k={row['k']}: predicted comm 2N/beta = {f(row['pred_book_ms'])} ms/step; measured "
         f"{f(row['comm_ms'])} ms (synced {f(row['synced_ms'])}, no_sync {f(row['no_sync_ms'])})")
    if row["comm_lo"] is not None:
        s += f", 95% interval [{f(row['comm_lo'])}, {f(row['comm_hi'])}] over {row['pairs']} pairs"
    if row.get("pred_flat_ms") is not None:
        s += (f" [with this machine's measured beta: {f(row['pred_flat_ms'])} ms flat, "
              f"{f(row['pred_ring_ms'])} ms ring]")
    return s


def probe_cell(m: Machine, k: int = 2) -> Cell:
    r = m.get("ddp_comm_probe", "default", k)
    if not ok(r):
        return status_text(r)
    return Cell(probe_text(next(x for x in probe_rows(m) if x["k"] == k)))


def allreduce_text(m: Machine, k: int = 2) -> str | None:
    d, c = m.get("allreduce", "default", k), m.get("allreduce", "memcpy", k)
    pd = allreduce_at(d) if ok(d) else None
    if not pd:
        return None if d is None else f"bare allreduce at k={k}: {d['status']} ({d.get('reason') or ''})"
    at = f" at {fmt_num(pd['bytes'] / 2**20)} MiB" if pd["bytes"] != 64 * 2**20 else ""
    eff = 2 * pd["bytes"] / (pd["time_us"] * 1e-6) / 1e9      # the book's 2S/t
    s = f"bare allreduce{at}, effective bytes/device/s: {eff:.1f} GB/s at the default"
    pc = allreduce_at(c, pd["bytes"] / 2**20) if ok(c) else None
    if pc:
        effc = 2 * pc["bytes"] / (pc["time_us"] * 1e-6) / 1e9
        s += f", {effc:.1f} GB/s configured ({effc / eff:.1f}x)"
    elif c:
        s += f"; configured (memcpy): {c['status']}"
    return s


def allreduce_cell(m: Machine) -> Cell:
    text = allreduce_text(m)
    return Cell(text) if text else Cell("not planned", "missing")


def memcpy_text(m: Machine) -> Cell:
    r = next(iter(m.series("ddp_memcpy_training", "default").values()), None)
    if r is None:
        return Cell("not planned", "missing")
    if r["status"] == "ok":
        return Cell(f"ran, {fmt_num(r['metrics'].get('samples_per_s'))} samples/s (did not hang on this machine)")
    after = (r.get("metrics") or {}).get("hung_after_s")
    return Cell(f"{r['status'].upper()}" + (f" (killed after {after:g} s)" if after else "")
                + f": {r.get('reason') or ''}", r["status"].replace(" ", ""))


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
    return Cell(f"max update difference, k=1 vs k=2: {e['max_abs_diff']:.1e}" + (f" ({', '.join(extra)})" if extra else ""))


def k8_cell(m: Machine) -> Cell:
    rs = k8_rows([m])
    if not rs:
        return Cell("needs k=1 and k>=2 weak runs", "missing")
    return Cell("; ".join(f"[{x['variant']}] flat {100 * x['predicted_flat']:.0f}%, ring {100 * x['predicted_ring']:.0f}%"
                          f" (from k={x['from_k']})" + (f", measured {100 * x['measured']:.0f}%" if x["measured"] else "")
                          for x in rs))


def _book(book: Machine | None, key: str) -> Cell:
    lines = bookmod.printed(book, key)
    return Cell(lines[0].rstrip(":"), "book") if lines else Cell("–")


def rows(data: ReportData) -> list[list[Cell]]:
    book, meas = data.book, data.measured
    out = []
    for exp, variant, strong, what in SCALING:
        ks = sorted(set((book.series(exp, variant) if book else {})) | {k for m in meas for k in m.series(exp, variant)})
        for k in ks:
            bcell = scaling_cell(book, exp, variant, k, strong) if book and book.get(exp, variant, k) else Cell("–")
            out.append([Cell(f"{what}, k={k} [{variant}]"), Cell(bookmod.cite(book, exp)), bcell]
                       + [scaling_cell(m, exp, variant, k, strong) for m in meas])
    cite = lambda key: bookmod.cite(book, key)  # noqa: E731
    singles = [("no_sync() probe, k=2", cite("ddp_comm_probe"), _book(book, "ddp_comm_probe"), probe_cell),
               ("bare all-reduce, k=2, 64 MB", cite("allreduce"), _book(book, "allreduce"), allreduce_cell),
               ("DDP training with the memcpy switch, k=2", cite("ddp_memcpy_training"),
                memcpy_text(book) if book else Cell("–"), memcpy_text),
               ("JAX all-reduce census", cite("jax_hlo"), _book(book, "jax_hlo"), hlo_cell),
               ("JAX update equality, k=1 vs k=2", cite("jax_equality"), _book(book, "jax_equality"), equality_cell),
               ("Exercise 6: weak-scaling efficiency at k=8", "13.6.7 exercise 6 (a prediction the book asks for)",
                k8_cell(book) if book else Cell("–"), k8_cell)]
    out += [[Cell(what), Cell(where), bcell] + [fn(m) for m in meas] for what, where, bcell, fn in singles]
    return out


def book_comparison(data: ReportData) -> Table:
    book = data.book
    cols = ["quantity", "where in the book (section 13.6)",
            f"{book.name} (published)" if book else "book"] + [m.name for m in data.measured]
    return Table("book_comparison", "The book's numbers beside this pipeline's", cols, rows(data),
                 note="Book cells quote the line the book printed (reference/book_4090.yaml cites the section "
                      "for each); the exercise-6 book cell is derived from the book's numbers by this "
                      "pipeline's cost model. Other cells print the same quantity in the same form.")
