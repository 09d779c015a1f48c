"""Memory: FSDP's training state per rank against DDP's, and ZeRO sizing (exercise 5)."""
from __future__ import annotations

from dpscale.analysis import costmodel
from dpscale.report.document import Chapter, FigureSpec, Page
from dpscale.report.machines import Machine, ReportData
from dpscale.report.numbers import metric, ok
from dpscale.report.chapters.common import (by_machine, figure, jobs_table, label, missing_notes, not_ok_row, prose,
                                            records_table)

FIGURES = (FigureSpec("fsdp_memory", "Training state per rank, FSDP against DDP; ZeRO sizing of a 7B model"),)
STATE = ("params_MiB", "grads_MiB", "optimizer_MiB")
FSDP_COLUMNS = ["machine", "k", "status", "wrapper", "params_MiB", "grads_MiB", "optimizer_MiB",
                "state_MiB_per_rank", "peak_mem_MiB_max", "samples_per_s", "state_ratio_fsdp_over_ddp", "reason"]
ZERO_COLUMNS = ["stage", "params_GB", "grads_GB", "optimizer_GB", "total_GB", "gpu_GB", "fits"]


def fsdp_rows(m: Machine) -> list[dict]:
    rows = []
    for k, r in m.series("fsdp", "default").items():
        if not ok(r):
            rows.append(not_ok_row(m, k, r))
            continue
        for name in ("ddp", "fsdp"):
            d = metric(r, name, default={})
            biggest = max(d.get("per_rank") or [{}], key=lambda x: sum(x.get(n) or 0 for n in STATE))
            rows.append({"machine": m.name, "k": k, "status": "ok", "reason": "", "wrapper": name.upper(),
                         **{n: biggest.get(n) for n in STATE}, "state_MiB_per_rank": d.get("state_MiB_per_rank"),
                         "peak_mem_MiB_max": d.get("peak_mem_MiB_max"), "samples_per_s": d.get("samples_per_s"),
                         "state_ratio_fsdp_over_ddp":
                             metric(r, "state_ratio_fsdp_over_ddp") if name == "fsdp" else None})
    return rows


def zero_rows(data: ReportData) -> list[dict]:
    """Exercise 5, from the first fsdp result that carries it (else the cost model)."""
    for m in data.measured:
        for r in m.all("fsdp"):
            if metric(r, "zero_sizing_7B_8x80GB"):
                return [dict(x) for x in metric(r, "zero_sizing_7B_8x80GB")]
    return costmodel.zero_table()


def headline(data: ReportData) -> str:
    def one(m: Machine):
        good = [r for r in fsdp_rows(m) if r.get("wrapper") == "FSDP" and r.get("state_ratio_fsdp_over_ddp")]
        return (f"{label(m)} {good[-1]['state_ratio_fsdp_over_ddp']:.2f}x DDP's at k={good[-1]['k']} "
                f"(1/k = {1 / good[-1]['k']:.2f})") if good else None
    z = zero_rows(data)
    return ("FSDP training state per rank: " + ("; ".join(by_machine(data, one)) or "no measurement")
            + f". Exercise 5: ZeRO-3 puts a {z[0]['n_params'] / 1e9:g}B model in {z[-1]['total_GB']:.0f} GB per GPU, "
              f"DDP would need {z[0]['total_GB']:.0f} GB")


def page(data: ReportData) -> Page:
    return Page("memory", CHAPTER.title, prose("memory"),
                figures=[figure(FIGURES[0], headline(data), missing_notes(data, "fsdp"))],
                tables=[records_table("fsdp", "FSDP against DDP, per k",
                                      [r for m in data.measured for r in fsdp_rows(m)], FSDP_COLUMNS),
                        records_table("zero_sizing", "ZeRO sizing, 7B parameters on 8 x 80 GB (exercise 5)",
                                      zero_rows(data), ZERO_COLUMNS),
                        jobs_table(data, "memory")])


CHAPTER = Chapter("memory", "Memory: FSDP against DDP, and ZeRO sizing", FIGURES, ("fsdp", "zero_sizing"), page)
