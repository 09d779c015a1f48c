"""Communication: the paired no_sync() probe against the cost model, the bare
all-reduce as nccl-tests prints it, the memcpy switch inside training, bucket sizes."""
from __future__ import annotations

from dpscale.report import book as bookmod
from dpscale.report.document import Cell, Chapter, FigureSpec, Page
from dpscale.report.machines import Machine, ReportData
from dpscale.report.numbers import allreduce_at, allreduce_table, avg_busbw, distinguishable, fmt_num, metric, ok, probe_rows
from dpscale.report.chapters.book_table import printed_cell, row, status_text
from dpscale.report.chapters.common import (by_machine, figure, jobs_table, label, missing_notes, not_ok_row, prose,
                                            records_table)

FIGURES = (FigureSpec("comm_probe", "no_sync() probe: measured communication against the cost model"),
           FigureSpec("allreduce", "Bare all-reduce: bus bandwidth against payload, default and memcpy"),
           FigureSpec("bucket_sweep", "DDP throughput against bucket_cap_mb (exercise 1)"))
PROBE = ["machine", "k", "status", "synced_ms", "no_sync_ms", "comm_ms", "comm_interval", "pairs", "covers", "verdict",
         "pred_flat_ms", "pred_ring_ms", "pred_book_ms", "grad_MB", "n_buckets", "reason"]
NCCL_COLUMNS = ["machine", "variant", "k", "status", "size_B", "count", "type", "redop", "oop_time_us",
                "oop_algbw_GBps", "oop_busbw_GBps", "oop_wrong", "ip_time_us", "ip_algbw_GBps", "ip_busbw_GBps",
                "ip_wrong", "avg_busbw_GBps", "reason"]
BUCKETS = ["machine", "k", "status", "bucket_cap_MiB", "n_buckets", "samples_per_s", "step_ms_median",
           "step_ms_interval", "best", "reason"]


def probe_text(r: dict) -> str:
    f = fmt_num
    s = (f"k={r['k']}: predicted comm 2N/beta = {f(r['pred_book_ms'])} ms/step; measured "
         f"{f(r['comm_ms'])} ms (synced {f(r['synced_ms'])}, no_sync {f(r['no_sync_ms'])})")
    if r["comm_lo"] is not None:
        s += f", 95% interval [{f(r['comm_lo'])}, {f(r['comm_hi'])}] over {r['pairs']} {r['covers']}"
    if r.get("pred_flat_ms") is not None:
        s += f" [with this machine's measured beta: {f(r['pred_flat_ms'])} ms flat, {f(r['pred_ring_ms'])} ms ring]"
    return s


def probe_cell(m: Machine, k: int = 2) -> Cell:
    r = m.get("ddp_comm_probe", "default", k)
    return Cell(probe_text(next(x for x in probe_rows(m) if x["k"] == k))) if ok(r) else status_text(r)


def allreduce_text(m: Machine, k: int = 2) -> str | None:
    """The book's print: 'effective bytes/device/s' (2S/t) at 64 MB, default and configured."""
    d, c = m.get("allreduce", "default", k), m.get("allreduce", "memcpy", k)
    pd = allreduce_at(d) if ok(d) else None
    if not pd:
        return None if d is None else f"bare allreduce at k={k}: {d['status']} ({d.get('reason') or ''})"
    at = f" at {fmt_num(pd['bytes'] / 2**20)} MiB" if pd["bytes"] != 64 * 2**20 else ""
    eff = 2 * pd["bytes"] / (pd["time_us"] * 1e-6) / 1e9
    s = f"bare allreduce{at}, effective bytes/device/s: {eff:.1f} GB/s at the default"
    if pc := (allreduce_at(c, pd["bytes"] / 2**20) if ok(c) else None):
        effc = 2 * pc["bytes"] / (pc["time_us"] * 1e-6) / 1e9
        return s + f", {effc:.1f} GB/s configured ({effc / eff:.1f}x)"
    return s + (f"; configured (memcpy): {c['status']}" if c else "")


def memcpy_cell(m: Machine) -> Cell:
    r = next(iter(m.series("ddp_memcpy_training", "default").values()), None)
    if r is None or r["status"] == "ok":
        return status_text(r) if r is None else Cell(
            f"ran, {fmt_num(r['metrics'].get('samples_per_s'))} samples/s (did not hang on this machine)")
    after = (r.get("metrics") or {}).get("hung_after_s")
    return Cell(f"{r['status'].upper()}" + (f" (killed after {after:g} s)" if after else "")
                + f": {r.get('reason') or ''}", r["status"].replace(" ", ""))


def book_rows(data: ReportData) -> list:
    cite, book = (lambda key: bookmod.cite(data.book, key)), data.book
    return [row(data, "no_sync() probe, k=2", cite("ddp_comm_probe"), printed_cell(data, "ddp_comm_probe"),
                probe_cell),
            row(data, "bare all-reduce, k=2, 64 MB", cite("allreduce"), printed_cell(data, "allreduce"),
                lambda m: Cell(allreduce_text(m)) if allreduce_text(m) else status_text(None)),
            row(data, "DDP training with the memcpy switch, k=2", cite("ddp_memcpy_training"),
                memcpy_cell(book) if book else Cell("–"), memcpy_cell)]


def probe_records(data: ReportData) -> list[dict]:
    return [{**r, "comm_interval": (r["comm_lo"], r["comm_hi"]), "verdict": distinguishable(r)}
            for m in data.machines for r in probe_rows(m)]


def probe_headline(data: ReportData) -> str:
    def one(m: Machine):
        rows = [r for r in probe_rows(m) if r["status"] == "ok" and r["comm_ms"] is not None]
        if not rows:
            return None
        r = rows[0]
        iv = f" [{fmt_num(r['comm_lo'])}, {fmt_num(r['comm_hi'])}]" if r["comm_lo"] is not None else ""
        pred = r["pred_flat_ms"] if r["pred_flat_ms"] is not None else r["pred_book_ms"]
        which = "flat, measured beta" if r["pred_flat_ms"] is not None else "book beta"
        return (f"{label(m)} k={r['k']} {fmt_num(r['comm_ms'])} ms{iv} measured vs {fmt_num(pred)} predicted "
                f"({which})" + (f": {distinguishable(r)}" if r["comm_lo"] is not None else ""))
    parts = by_machine(data, one)
    return "Communication per step, no_sync() probe against the cost model: " + ("; ".join(parts) or "no data")


def nccl_rows(m: Machine) -> list[dict]:
    """One row per size, out-of-place and in-place side by side, as nccl-tests prints."""
    out = []
    for variant in m.variants("allreduce"):
        for k, r in m.series("allreduce", variant).items():
            table = allreduce_table(r)
            if not table:
                out.append({"machine": m.name, "variant": variant, "k": k, "status": r["status"],
                            "reason": r.get("reason") or ""})
                continue
            oop = {p["bytes"]: p for p in table.get("out_of_place", [])}
            ip = {p["bytes"]: p for p in table.get("in_place", [])}
            for size in sorted(set(oop) | set(ip)):
                row = {"machine": m.name, "variant": variant, "k": k, "status": r["status"], "size_B": size,
                       "count": size // 4, "type": "float", "redop": "sum", "avg_busbw_GBps": avg_busbw(r),
                       "reason": r.get("reason") or ""}
                for tag, side in (("oop", oop.get(size)), ("ip", ip.get(size))):
                    for key in ("time_us", "algbw_GBps", "busbw_GBps", "wrong"):
                        row[f"{tag}_{key}"] = (side or {}).get(key)
                out.append(row)
    return out


def nccl_text(m: Machine, variant: str, k: int, r: dict) -> str:
    """The sweep in nccl-tests' own layout, with its 'Avg bus bandwidth' line."""
    rows = [x for x in nccl_rows(m) if x["variant"] == variant and x["k"] == k and "size_B" in x]
    f = lambda v, w, p=2: f"{v:>{w}.{p}f}" if isinstance(v, (int, float)) else f"{'–':>{w}}"  # noqa: E731
    w = lambda v: f"{v:>7}" if v is not None else f"{'–':>7}"  # noqa: E731
    lines = [f"# {m.name}, {variant}, k={k} ({r.get('backend')}); time: "
             + (metric(r, "time_aggregation") or "median over iterations of the slowest rank (older result)"),
             f"#{'':>52}{'out-of-place':>32}{'in-place':>32}",
             f"#{'size':>12}{'count':>14}{'type':>8}{'redop':>8}{'root':>8}"
             + f"{'time':>9}{'algbw':>8}{'busbw':>8}{'#wrong':>7}" * 2,
             f"#{'(B)':>12}{'(elements)':>14}{'':>24}" + f"{'(us)':>9}{'(GB/s)':>8}{'(GB/s)':>8}{'':>7}" * 2]
    for x in rows:
        lines.append(f"{x['size_B']:>13}{x['count']:>14}{'float':>8}{'sum':>8}{-1:>8}"
                     + "".join(f(x[f"{t}_time_us"], 9) + f(x[f"{t}_algbw_GBps"], 8) + f(x[f"{t}_busbw_GBps"], 8)
                               + w(x[f"{t}_wrong"]) for t in ("oop", "ip")))
    wrong = sum(x[f"{t}_wrong"] or 0 for x in rows for t in ("oop", "ip"))
    lines += [f"# Out of bounds values : {wrong} {'OK' if not wrong else 'WRONG'}",
              f"# Avg bus bandwidth    : {fmt_num(avg_busbw(r))}"]
    return "\n".join(lines)


def allreduce_headline(data: ReportData) -> str:
    def one(m: Machine):
        d, c = m.get("allreduce", "default", 2), m.get("allreduce", "memcpy", 2)
        pd = allreduce_at(d) if ok(d) else None
        if not pd:
            return None
        pc = allreduce_at(c, pd["bytes"] / 2**20) if ok(c) else None
        tail = (f", memcpy {pc['busbw_GBps'] / pd['busbw_GBps']:.1f}x" if pc
                else f", memcpy {c['status'] if c else 'not planned'}")
        return f"{label(m)} default {fmt_num(pd['busbw_GBps'])} GB/s busbw at {fmt_num(pd['bytes'] / 2**20)} MiB{tail}"
    parts = by_machine(data, one)
    hung = [label(m) for m in data.machines if any(r["status"] == "hung" for r in m.all("ddp_memcpy_training"))]
    text = "All-reduce at k=2: " + ("; ".join(parts) or "no data")
    return text + (f". The memcpy switch hung DDP training on: {', '.join(hung)}" if hung else "")


def bucket_records(m: Machine) -> list[dict]:
    out = []
    for k, r in m.series("ddp_bucket_sweep", "default").items():
        if not ok(r):
            out.append(not_ok_row(m, k, r))
            continue
        best = metric(r, "best_bucket_cap_MiB")
        for p in metric(r, "sweep", default=[]):
            out.append({"machine": m.name, "k": k, "status": "ok", "reason": "", **p,
                        "step_ms_interval": tuple(p.get("step_ms_ci95") or (None, None)),
                        "best": p.get("bucket_cap_MiB") == best})
    return out


def bucket_headline(data: ReportData) -> str:
    def one(m: Machine):
        parts = []
        for k in m.ks("ddp_bucket_sweep"):
            rows = [r for r in bucket_records(m) if r["k"] == k and r["status"] == "ok"]
            if rows:
                best, worst = max(rows, key=lambda r: r["samples_per_s"]), min(rows, key=lambda r: r["samples_per_s"])
                parts.append(f"{label(m)} k={k}: best {fmt_num(best['bucket_cap_MiB'])} MiB, "
                             f"{best['samples_per_s'] / worst['samples_per_s']:.2f}x the worst "
                             f"({fmt_num(worst['bucket_cap_MiB'])} MiB)")
        return "; ".join(parts) or None
    return "DDP gradient bucket size (exercise 1): " + ("; ".join(by_machine(data, one)) or "no data")


def printed(data: ReportData) -> str:
    blocks = []
    for m in data.machines:
        lines = [probe_text(r) for r in probe_rows(m) if r["status"] == "ok"]
        lines += [t] if (t := allreduce_text(m)) else []
        if lines:
            blocks.append(f"# {m.name}\n" + "\n".join(lines))
    return "\n\n".join(blocks)


def page(data: ReportData) -> Page:
    probe, ar, buckets = FIGURES
    ar_notes = missing_notes(data, "allreduce") + missing_notes(data, "ddp_memcpy_training")
    pre = [("The probe and the all-reduce, in the book's words", printed(data))]
    pre += [("The all-reduce sweep as nccl-tests prints it", "\n\n".join(
        nccl_text(m, v, k, r) for m in data.measured for v in m.variants("allreduce")
        for k, r in m.series("allreduce", v).items() if allreduce_table(r)))]
    return Page(
        "communication", CHAPTER.title, prose("communication"),
        figures=[figure(probe, probe_headline(data), missing_notes(data, "ddp_comm_probe")),
                 figure(ar, allreduce_headline(data), ar_notes),
                 figure(buckets, bucket_headline(data), missing_notes(data, "ddp_bucket_sweep"))],
        tables=[records_table("comm_probe", "no_sync() probe: the median of paired differences, its 95% interval, "
                              "and the predictions", probe_records(data), PROBE),
                records_table("allreduce", "All-reduce sweep, nccl-tests' columns (GB = 1e9 bytes)",
                              [r for m in data.machines for r in nccl_rows(m)], NCCL_COLUMNS),
                records_table("bucket_sweep", "Bucket-size sweep (exercise 1)",
                              [r for m in data.measured for r in bucket_records(m)], BUCKETS),
                jobs_table(data, "communication")],
        pre=[p for p in pre if p[1]])


CHAPTER = Chapter("communication", "Communication: the no_sync() probe, the bare all-reduce, bucket sizes",
                  FIGURES, ("comm_probe", "allreduce", "bucket_sweep"), page, book_rows)
