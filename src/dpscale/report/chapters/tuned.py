"""The tuned series beside the book's protocol, per device at the smallest k, with MFU."""
from __future__ import annotations

from dpscale import registry
from dpscale.analysis import roofline
from dpscale.report.document import Chapter, FigureSpec, Page, Table
from dpscale.report.machines import Machine, ReportData
from dpscale.report.numbers import fmt_num, metric, ok, point
from dpscale.report.chapters.common import by_machine, figure, label, missing_notes, prose, records_table
from dpscale.report.chapters.scaling import covers_note

FIGURES = (FigureSpec("tuned", "Per-device throughput and MFU: the book's protocol against the tuned series"),)
# (experiment, framework, the variants from the book's protocol to the tuned series)
GROUPS = (("ddp_weak", "DDP", ("seed", "cached", "tuned", "tuned_fp16")), ("jax_weak", "JAX", ("host", "device", "tuned")))


def tuned_variants(experiment: str, variants: tuple) -> list[str]:
    """The group's tuned series (registry.Variant.tuned), in order: bf16, then fp16."""
    return [v for v in variants if registry.get(experiment).variant(v).tuned]


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
    base = per_device(m.get(experiment, variants[0], k))[0] if k else None
    parts = []
    for v in tuned_variants(experiment, variants):
        if not ok(r := m.get(experiment, v, k) if k else None):
            continue
        s = per_device(r)[0]
        mfu, frac = metric(r, "mfu"), metric(r, "roofline_fraction")
        parts.append(f"{framework}{'' if v == 'tuned' else ' ' + v} {fmt_num(s)}" + (f" ({s / base:.1f}x)" if base else "")
                     + (f", MFU {mfu:.2f}" if mfu else "") + (f", {frac:.2f} of its roofline" if frac else ""))
    return "; ".join(parts) or None


def headline(data: ReportData) -> str:
    parts = by_machine(data, lambda m: (f"{label(m)} k={smallest_k(m)}: " + "; ".join(p)) if m.kind != "book" and (
        p := [t for e, f, vs in GROUPS if (t := tuned_part(m, e, f, vs))]) else None)
    if not parts:
        return "The tuned series beside the book's protocol: no tuned run (tuned: auto runs it on GPUs)"
    return "The tuned series beside the book's protocol, samples/s per device (speed-up over the book's): " + \
        "; ".join(parts)


ROOFLINE = ["machine", "experiment", "variant", "k", "samples_per_s_per_device", "mfu", "roofline_samples_per_s",
            "roofline_fraction", "roofline_samples_per_s_compiler", "roofline_fraction_compiler",
            "bf16_matmul_peak_TFLOPs", "copy_bandwidth_GBps"]
LAYERS = ["machine", "layer", "kind", "GFLOP", "MB_unfused", "MB_ideal", "bound_unfused_ms", "bound_ideal_ms",
          "binds", "eager_ms", "fraction_of_bound"]


def roofline_records(data: ReportData) -> list[dict]:
    out = []
    for m in data.measured:
        for e, _f, variants in GROUPS:
            for v in tuned_variants(e, variants):
                for k, r in m.series(e, v).items():
                    if ok(r) and metric(r, "roofline_bytes_per_sample_MB"):
                        out.append({"machine": m.name, "experiment": e, "variant": v, "k": k,
                                    **{c: metric(r, c) for c in ROOFLINE[4:]}})
    return out


def layer_rows(m: Machine, r: dict) -> list[dict]:
    """Per layer: the bounds at the rates measured in the tuned job, and the time of an
    eager profile where one was kept with the machine (on CPU: FLOPs and bytes only)."""
    peak = 1e12 * (metric(r, "bf16_matmul_peak_TFLOPs") or 0) or None
    bw = 1e9 * (metric(r, "copy_bandwidth_GBps") or 0) or None
    batch, size = metric(r, "per_rank_batch"), (r.get("config") or {}).get("protocol", {}).get("image_size", 64)
    kept = ((m.profile or {}).get("stages", {}).get("layers") or [{}])[-1].get("rows", [])
    times = {x["layer"]: {"time_ms": x["time_ms"]} for x in kept if x.get("time_ms") is not None}
    return [{"machine": m.label, "layer": x["layer"], "kind": roofline.kind(x["layer"]), "GFLOP": x["flops"] / 1e9,
             "MB_unfused": x["bytes_none"] / 1e6, "MB_ideal": x["bytes_ideal"] / 1e6,
             "bound_unfused_ms": x.get("bound_none_ms"), "bound_ideal_ms": x.get("bound_ideal_ms"),
             "binds": x.get("binds", "–"), "eager_ms": x.get("time_ms"), "fraction_of_bound": x.get("fraction_of_bound")}
            for x in roofline.layer_table(batch, size, peak, bw, times, unmodelled=False)]


def layers_table(data: ReportData) -> Table:
    """The first machine with a tuned DDP result at k=1 (one with a kept profile first)."""
    tuned = [(m, r) for m in data.measured if ok(r := m.get("ddp_weak", "tuned", 1))]
    tuned.sort(key=lambda mr: mr[0].profile is None)
    rows = layer_rows(*tuned[0]) if tuned else []
    return records_table("roofline_layers", "Per layer: the roofline's bounds at the tuned job's measured rates, "
                         "and the time of an eager bf16 profile where one was kept (tools/lab/probe_roofline.py)",
                         rows, LAYERS)


def page(data: ReportData) -> Page:
    notes = [n for e, _f, vs in GROUPS for n in missing_notes(data, e, vs, data.measured) if " k=1 " in n + " "]
    notes += [n for n in covers_note(data, [e for e, _f, _vs in GROUPS], variants={v for _e, _f, vs in GROUPS
                                                                                   for v in vs})
              if n.startswith("Error bars")]   # the count of bare points spans every k; this figure shows one
    return Page("tuned", CHAPTER.title, prose("tuned"), figures=[figure(FIGURES[0], headline(data), notes)],
                tables=[records_table("roofline", "The tuned series against its roofline: the ideal bound (BN "
                                      "statistics in the convolution's epilogue) and the compiler's (what fuses "
                                      "around opaque convolutions)", roofline_records(data), ROOFLINE),
                        layers_table(data)])


CHAPTER = Chapter("tuned", "The tuned series beside the book's protocol", FIGURES, ("roofline", "roofline_layers"),
                  page)
