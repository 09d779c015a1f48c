"""The report: every result JSON (this machine's, committed reference machines',
and the book's published numbers) -> figures, tables, report.html and report.md.

    build(runs_dir, fingerprint_path, references_dir, out_dir)

writes, under out_dir:
    report.html          self-contained (figures inlined as base64 PNG): opens from disk
    report.md            the same content, figures referenced as figures/<name>.png
    figures/<name>.png   and .svg, one pair per entry of FIGURES (always all of them:
                         a figure without data says why instead of going missing)
    tables/<name>.csv    one per entry of TABLES

Machines. The current results are one machine ("this run"); each folder
`reference/<name>/` holding `fingerprint.json` and `runs/{experiment}/{variant}/k{k}.json`
is another; `reference/book_4090.yaml` is the book's. Every figure and table shows
them side by side.
"""
from __future__ import annotations

import base64
import collections
import csv
import datetime as _dt
import html
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from . import costmodel
from .results import load_result, write_atomic

# name -> (category, one-line description). The order is the report's order.
FIGURES: dict[str, tuple[str, str]] = {
    "status": ("Overview", "Which artifacts ran, and which were skipped or hung (and why)"),
    "scaling_weak": ("DDP scaling", "DDP weak scaling: samples/s against k, with the ideal line"),
    "scaling_strong": ("DDP scaling", "DDP strong scaling: samples/s against k, with the ideal line"),
    "efficiency": ("DDP scaling", "Weak- and strong-scaling efficiency against k"),
    "loader": ("Input pipeline", "The book's DataLoader against the device-resident resize cache"),
    "tuned": ("Tuned series", "Per-device throughput and MFU: the book's protocol against the tuned series"),
    "comm_probe": ("Communication", "no_sync() probe: measured communication against the cost model"),
    "allreduce": ("Communication", "Bare all-reduce: bus bandwidth against payload, default vs memcpy"),
    "bucket_sweep": ("Communication", "DDP throughput against bucket_cap_mb (exercise 1)"),
    "fsdp_memory": ("FSDP", "Training state per rank, FSDP against DDP; ZeRO sizing of a 7B model"),
    "ddp_vs_jax": ("JAX", "DDP against JAX data parallelism, weak scaling"),
    "jax_hlo": ("JAX", "The all-reduces XLA inserted into the compiled step"),
    "k8_prediction": ("Prediction", "Exercise 6: weak-scaling efficiency at k=8 from the cost model"),
}

TABLES: dict[str, str] = {
    "book_comparison": "Each number the book printed, beside the same number from every machine",
    "scaling": "DDP and JAX throughput, every machine, variant and k",
    "comm_probe": "no_sync() probe and its predictions",
    "allreduce": "All-reduce payload sweep",
    "bucket_sweep": "Bucket-size sweep",
    "fsdp": "FSDP against DDP, per k",
    "zero_sizing": "ZeRO stages for a 7B model on 8 x 80 GB",
    "k8_prediction": "Predicted weak-scaling efficiency at k=8",
    "jax_checks": "JAX all-reduce census and update-equality check",
    "status": "Every artifact: status, reason, backend, scale, data, time",
}

THROUGHPUT = ("ddp_weak", "ddp_strong", "jax_weak")
VARIANT_ORDER = ("seed", "cached", "tuned", "host", "device", "default", "memcpy")
VARIANT_TEXT = {
    "seed": "book's DataLoader", "cached": "resize cache on device", "tuned": "bf16+channels_last+compile+graph",
    "host": "host-staged batches", "device": "device-resident data", "default": "NCCL default",
    "memcpy": "NCCL_SHM_USE_CUDA_MEMCPY=1",
}


# ---------------------------------------------------------------- machines

@dataclass
class Machine:
    """One set of results measured on one machine (or the book's)."""
    key: str                       # "current", a reference folder name, or "book"
    kind: str                      # current | reference | book
    fingerprint: dict
    results: dict = field(default_factory=dict)   # (experiment, variant, k) -> result
    source: str = ""
    errors: list = field(default_factory=list)    # unreadable files, with the reason
    book: dict | None = None                      # the raw YAML, for the book

    def get(self, experiment: str, variant: str, k: int) -> dict | None:
        return self.results.get((experiment, variant, int(k)))

    def series(self, experiment: str, variant: str) -> dict[int, dict]:
        return {k: r for (e, v, k), r in sorted(self.results.items()) if e == experiment and v == variant}

    def variants(self, experiment: str) -> list[str]:
        vs = {v for (e, v, _k) in self.results if e == experiment}
        return sorted(vs, key=lambda v: (VARIANT_ORDER.index(v) if v in VARIANT_ORDER else 99, v))

    def ks(self, experiment: str | None = None) -> list[int]:
        return sorted({k for (e, _v, k) in self.results if experiment in (None, e)})

    def all(self, experiment: str | None = None) -> list[dict]:
        return [r for (e, _v, _k), r in sorted(self.results.items()) if experiment in (None, e)]

    @property
    def scale(self) -> str:
        if self.kind == "book":
            return (self.book or {}).get("machine", {}).get("scale", "paper")
        scales = collections.Counter((r.get("config") or {}).get("scale") for r in self.results.values())
        scales.pop(None, None)
        return scales.most_common(1)[0][0] if scales else "unknown"

    @property
    def backends(self) -> list[str]:
        return sorted({r.get("backend") for r in self.results.values() if r.get("backend")})

    @property
    def gpu(self) -> bool:
        return bool(self.fingerprint.get("gpu_count")) or any(b in ("nccl", "xla-gpu") for b in self.backends)

    @property
    def hardware(self) -> str:
        """'4x RTX 4090', '8x H200 (NV18)', 'CPU x2 (AMD EPYC)'."""
        if self.kind == "book" and (self.book or {}).get("machine", {}).get("label"):
            return self.book["machine"]["label"].removeprefix("book: ")
        fp = self.fingerprint
        if fp.get("gpu_count"):
            link = fp.get("interconnect")
            return (f"{fp['gpu_count']}x {short_gpu(fp.get('gpu_model'))}"
                    + (f" ({link})" if link and link != "none" else ""))
        cpu = (fp.get("cpu_model") or "CPU").split(" @")[0]
        return f"CPU x{fp.get('cpu_count') or '?'} ({cpu})"

    @property
    def short(self) -> str:
        """Tag for ticks and headlines: 'this run', the reference folder, 'book'."""
        return {"current": "this run", "book": "book"}.get(self.kind, self.key)

    @property
    def name(self) -> str:
        """Legend label: who, what hardware, what scale."""
        who = {"current": "this run", "book": "book"}.get(self.kind, self.key)
        return f"{who}: {self.hardware}, {self.scale}"

    @property
    def unit(self) -> str:
        """What the book calls 'GPU(s)', honestly named on CPU stand-ins."""
        if self.gpu:
            return "GPU(s)"
        if self.backends == ["xla-cpu"]:
            return "host device(s)"
        return "CPU process(es)"

    def data_sources(self) -> list[str]:
        return sorted({(r.get("data") or {}).get("source") for r in self.results.values()
                       if (r.get("data") or {}).get("source")})

    def dates(self) -> tuple[str | None, str | None]:
        if self.kind == "book":
            return None, None
        starts = [r.get("started_utc") for r in self.results.values() if r.get("started_utc")]
        ends = [r.get("finished_utc") for r in self.results.values() if r.get("finished_utc")]
        return (min(starts) if starts else None, max(ends) if ends else None)


def short_gpu(model: str | None) -> str:
    if not model:
        return "GPU"
    for pre in ("NVIDIA ", "GeForce ", "Tesla "):
        model = model.replace(pre, "")
    return model.replace(" PCIe", "").replace(" SXM5", "").strip() or "GPU"


def ok(r: dict | None) -> bool:
    return bool(r) and r.get("status") == "ok"


def metric(r: dict | None, *names: str, default=None):
    """The first metric present under any of `names` (tolerant of naming drift)."""
    if not r:
        return default
    m = r.get("metrics") or {}
    for n in names:
        if m.get(n) is not None:
            return m[n]
    return default


def load_runs(runs_dir: str | Path) -> tuple[dict, list[str]]:
    results, errors = {}, []
    runs_dir = Path(runs_dir)
    for p in sorted(runs_dir.glob("*/*/k*.json")):
        try:
            r = load_result(p)
        except (ValueError, OSError) as e:
            errors.append(f"{p}: {e}")
            continue
        r["_path"] = str(p)
        results[(r["experiment"], r["variant"], int(r["k"]))] = r
    return results, errors


def load_machine(runs_dir, fingerprint_path, key: str = "current", kind: str = "current") -> Machine:
    fp, errors = {}, []
    try:
        fp = json.loads(Path(fingerprint_path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        errors.append(f"{fingerprint_path}: {e}")
    results, errs = load_runs(runs_dir)
    if not fp:   # fall back on what the results carry
        for r in results.values():
            fp = {**(r.get("fingerprint") or {}), **fp}
    return Machine(key=key, kind=kind, fingerprint=fp, results=results, source=str(runs_dir),
                   errors=errors + errs)


def load_references(references_dir) -> list[Machine]:
    out = []
    d = Path(references_dir) if references_dir else None
    if not d or not d.is_dir():
        return out
    for sub in sorted(p for p in d.iterdir() if p.is_dir()):
        if (sub / "runs").is_dir() or (sub / "fingerprint.json").exists():
            out.append(load_machine(sub / "runs", sub / "fingerprint.json", key=sub.name, kind="reference"))
    return out


def load_book(path) -> dict | None:
    import yaml
    p = Path(path) if path else None
    if not p or not p.exists():
        return None
    return yaml.safe_load(p.read_text())


def book_machine(book: dict) -> Machine:
    """The book's published numbers as results of the same shape as ours."""
    from .results import make_result

    mach = book.get("machine", {})
    fp = {k: mach.get(k) for k in ("gpu_model", "gpu_count", "interconnect")}
    res: dict = {}

    def add(exp, variant, k, metrics, status="ok", reason=None, cite=None):
        r = make_result(experiment=exp, variant=variant, k=k, status=status, reason=reason,
                        metrics=metrics, backend=mach.get("backend", "nccl"),
                        config={"scale": mach.get("scale", "paper")}, fingerprint=fp,
                        data={"source": "real", "origin": "published in the book"}, cite=cite)
        r["started_utc"] = r["finished_utc"] = None
        r["_path"] = "reference/book_4090.yaml"
        res[(exp, variant, int(k))] = r

    for exp, variant in (("ddp_weak", "seed"), ("ddp_strong", "seed"), ("jax_weak", "host")):
        b = book.get(exp)
        if not b:
            continue
        for k, s in (b.get("samples_per_s") or {}).items():
            k = int(k)
            prb = b["per_rank_batch"] if "per_rank_batch" in b else b.get("global_batch", 0) // k
            add(exp, variant, k, {"samples_per_s": float(s), "samples_per_s_per_device": s / k,
                                  "per_rank_batch": prb, "global_batch": prb * k}, cite=b.get("cite"))
    if (b := book.get("ddp_comm_probe")):
        add("ddp_comm_probe", "default", b.get("k", 2),
            {n: b[n] for n in ("synced_ms", "no_sync_ms", "comm_ms", "pred_book_ms") if n in b},
            cite=b.get("cite"))
    if (b := book.get("allreduce")):
        k, mib = b.get("k", 2), b.get("MiB", 64)
        for variant, key in (("default", "default_GBps"), ("memcpy", "memcpy_GBps")):
            if key not in b:
                continue
            eff = float(b[key]) * 1e9         # the book's 2 S / t
            size = mib * 2**20
            t = 2 * size / eff
            row = {"MiB": mib, "bytes": size, "time_ms_median": 1e3 * t,
                   "algbw_GBps": costmodel.algbw(size, t) / 1e9,
                   "busbw_GBps": costmodel.busbw(size, t, k) / 1e9, "book_GBps": eff / 1e9, "correct": True}
            add("allreduce", variant, k, {"sweep": [row], f"busbw_GBps_{mib}MiB": row["busbw_GBps"]},
                cite=b.get("cite"))
    if (b := book.get("ddp_memcpy_training")):
        add("ddp_memcpy_training", "default", b.get("k", 2), {}, status=b.get("status", "hung"),
            reason=b.get("reason", "as published"), cite=b.get("cite"))
    if (b := book.get("jax_hlo")):
        add("jax_hlo", "default", b.get("k", 4),
            {"n_allreduce": b.get("n_allreduce"), "largest_floats": b.get("largest_floats")}, cite=b.get("cite"))
    if (b := book.get("jax_equality")):
        add("jax_equality", "default", b.get("k", 2),
            {"max_abs_diff": b.get("max_abs_diff"), "max_abs_update": b.get("update_magnitude")},
            cite=b.get("cite"))
    return Machine(key="book", kind="book", fingerprint=fp, results=res,
                   source="reference/book_4090.yaml", book=book)


@dataclass
class ReportData:
    machines: list[Machine]       # current first, then references, then the book

    @property
    def measured(self) -> list[Machine]:
        return [m for m in self.machines if m.kind != "book"]

    @property
    def current(self) -> Machine | None:
        return next((m for m in self.machines if m.kind == "current"), None)

    @property
    def book(self) -> Machine | None:
        return next((m for m in self.machines if m.kind == "book"), None)


def load_all(runs_dir, fingerprint_path, references_dir=None, book_path=None) -> ReportData:
    machines = [load_machine(runs_dir, fingerprint_path)]
    machines += load_references(references_dir)
    if book_path is None and references_dir:
        book_path = Path(references_dir) / "book_4090.yaml"
    book = load_book(book_path)
    if book:
        machines.append(book_machine(book))
    return ReportData(machines)


# ---------------------------------------------------------------- numbers

def scaling(m: Machine, experiment: str, variant: str) -> list[dict]:
    """Per k: samples/s, speedup and efficiency against the same series' k=1."""
    ser = m.series(experiment, variant)
    base = ser.get(1)
    s1 = metric(base, "samples_per_s") if ok(base) else None
    rows = []
    for k, r in ser.items():
        s = metric(r, "samples_per_s") if ok(r) else None
        row = {"machine": m.name, "experiment": experiment, "variant": variant, "k": k,
               "status": r["status"], "reason": r.get("reason") or "", "samples_per_s": s,
               "samples_per_s_per_device": metric(r, "samples_per_s_per_device") if s else None,
               "speedup": s / s1 if s and s1 else None,
               "efficiency": s / s1 / k if s and s1 else None,
               "per_rank_batch": metric(r, "per_rank_batch"), "global_batch": metric(r, "global_batch"),
               "step_ms_median": metric(r, "step_ms_median"), "step_ms_p10": metric(r, "step_ms_p10"),
               "step_ms_p90": metric(r, "step_ms_p90"), "peak_mem_MiB": metric(r, "peak_mem_MiB"),
               "mfu": metric(r, "mfu"), "backend": r.get("backend"), "scale": m.scale}
        rows.append(row)
    return rows


def fmt_num(x, digits: int = 3) -> str:
    """Short human form: 3706, 41.2, 0.734, 1.5e-04."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if not isinstance(x, (int, float)):
        return str(x)
    a = abs(x)
    if a == 0:
        return "0"
    if a >= 100 or (float(x).is_integer() and a < 1e15):
        return f"{x:,.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 0.01:
        return f"{x:.{digits - 1}f}" if a < 1 else f"{x:.2f}"
    return f"{x:.1e}"


def book_form_scaling(m: Machine, row: dict, strong: bool) -> str:
    """'2 GPU(s): 3706 samples/s, 1.76x, 88% weak-scaling efficiency' (the book's print)."""
    k = row["k"]
    if row["status"] != "ok":
        return f"{k} {m.unit}: {row['status']}"
    s = row["samples_per_s"]
    head = f"{k} {m.unit}: {s:.0f} samples/s" if s >= 100 else f"{k} {m.unit}: {s:.1f} samples/s"
    if row["speedup"] is None:
        return head + " (no k=1 baseline)"
    kind = "strong" if strong else "weak"
    return f"{head}, {row['speedup']:.2f}x, {100 * row['efficiency']:.0f}% {kind}-scaling efficiency"


def status_row(m: Machine, k: int, r: dict, **values) -> dict:
    """A table row: which machine and k, how the run ended, then its values."""
    return {"machine": m.name, "k": k, "status": r["status"], "reason": r.get("reason") or "", **values}


def probe_rows(m: Machine) -> list[dict]:
    rows = []
    for k, r in m.series("ddp_comm_probe", "default").items():
        rows.append(status_row(
            m, k, r, synced_ms=metric(r, "synced_ms"), no_sync_ms=metric(r, "no_sync_ms"),
            comm_ms=metric(r, "comm_ms"), pred_flat_ms=metric(r, "pred_flat_ms"),
            pred_ring_ms=metric(r, "pred_ring_ms"), pred_book_ms=metric(r, "pred_book_ms"),
            grad_MB=(metric(r, "grad_bytes") or 0) / 1e6 or None,
            n_buckets=len(metric(r, "bucket_bytes") or []) or None))
    return rows


def book_form_probe(row: dict) -> str:
    if row["status"] != "ok":
        return f"k={row['k']}: {row['status']}"
    f = lambda x: fmt_num(x) if x is not None else "–"  # noqa: E731
    s = (f"k={row['k']}: predicted comm 2N/beta = {f(row['pred_book_ms'])} ms/step; measured "
         f"{f(row['comm_ms'])} ms (synced {f(row['synced_ms'])}, no_sync {f(row['no_sync_ms'])})")
    if row.get("pred_flat_ms") is not None:
        s += (f" [with this machine's measured beta: {f(row['pred_flat_ms'])} ms flat, "
              f"{f(row['pred_ring_ms'])} ms ring]")
    return s


def allreduce_rows(m: Machine) -> list[dict]:
    rows = []
    for variant in m.variants("allreduce"):
        for k, r in m.series("allreduce", variant).items():
            if not ok(r) and not metric(r, "sweep"):
                rows.append({"machine": m.name, "variant": variant, "k": k, "status": r["status"],
                             "reason": r.get("reason") or ""})
                continue
            for p in metric(r, "sweep", default=[]):
                rows.append({"machine": m.name, "variant": variant, "k": k, "status": r["status"],
                             "reason": r.get("reason") or "", "MiB": p.get("MiB"),
                             "time_ms_median": p.get("time_ms_median"), "time_ms_p10": p.get("time_ms_p10"),
                             "time_ms_p90": p.get("time_ms_p90"), "algbw_GBps": p.get("algbw_GBps"),
                             "busbw_GBps": p.get("busbw_GBps"), "book_GBps": p.get("book_GBps"),
                             "correct": p.get("correct")})
    return rows


def allreduce_at(r: dict | None, mib: float = 64) -> dict | None:
    """The sweep point at `mib` MiB, else the largest payload measured."""
    sweep = metric(r, "sweep", default=[]) if r else []
    if not sweep:
        return None
    exact = [p for p in sweep if p.get("MiB") == mib]
    return exact[0] if exact else max(sweep, key=lambda p: p.get("MiB") or 0)


def book_form_allreduce(m: Machine, k: int = 2) -> str | None:
    d, c = m.get("allreduce", "default", k), m.get("allreduce", "memcpy", k)
    if not d:
        return None
    pd = allreduce_at(d)
    if not ok(d) or not pd:
        return f"bare allreduce at k={k}: {d['status']} ({d.get('reason') or ''})"
    at = f" at {fmt_num(pd['MiB'])} MiB" if pd.get("MiB") != 64 else ""
    s = f"bare allreduce{at}, effective bytes/device/s: {pd['book_GBps']:.1f} GB/s at the default"
    pc = allreduce_at(c, pd.get("MiB")) if ok(c) else None
    if pc:
        s += f", {pc['book_GBps']:.1f} GB/s configured ({pc['book_GBps'] / pd['book_GBps']:.1f}x)"
    elif c:
        s += f"; configured (memcpy): {c['status']}"
    return s


def memcpy_training_text(m: Machine) -> list[str]:
    out = []
    for k, r in m.series("ddp_memcpy_training", "default").items():
        if r["status"] == "hung":
            after = metric(r, "hung_after_s")
            out.append(f"DDP training with NCCL_SHM_USE_CUDA_MEMCPY=1 at k={k}: HUNG"
                       + (f" (killed after {after:g} s)" if after else "") + f" — {r.get('reason') or ''}")
        elif r["status"] == "ok":
            out.append(f"DDP training with NCCL_SHM_USE_CUDA_MEMCPY=1 at k={k}: ran, "
                       f"{fmt_num(metric(r, 'samples_per_s'))} samples/s (did not hang on this machine)")
        else:
            out.append(f"DDP training with NCCL_SHM_USE_CUDA_MEMCPY=1 at k={k}: {r['status']} — "
                       f"{r.get('reason') or ''}")
    return out


def bucket_rows(m: Machine) -> list[dict]:
    rows = []
    for k, r in m.series("ddp_bucket_sweep", "default").items():
        if not ok(r):
            rows.append(status_row(m, k, r))
            continue
        best = metric(r, "best_bucket_cap_MiB")
        for p in metric(r, "sweep", default=[]):
            rows.append({"machine": m.name, "k": k, "status": "ok", "reason": "",
                         "bucket_cap_MiB": p.get("bucket_cap_MiB"), "n_buckets": p.get("n_buckets"),
                         "samples_per_s": p.get("samples_per_s"), "step_ms_median": p.get("step_ms_median"),
                         "step_ms_p10": p.get("step_ms_p10"), "step_ms_p90": p.get("step_ms_p90"),
                         "best": p.get("bucket_cap_MiB") == best})
    return rows


def fsdp_rows(m: Machine) -> list[dict]:
    rows = []
    for k, r in m.series("fsdp", "default").items():
        if not ok(r):
            rows.append(status_row(m, k, r))
            continue
        mt = r["metrics"]
        for name in ("ddp", "fsdp"):
            d = mt.get(name) or {}
            pr = d.get("per_rank") or [{}]
            r0 = max(pr, key=lambda x: sum(x.get(n) or 0 for n in ("params_MiB", "grads_MiB", "optimizer_MiB")))
            rows.append({"machine": m.name, "k": k, "status": "ok", "reason": "", "wrapper": name.upper(),
                         "params_MiB": r0.get("params_MiB"), "grads_MiB": r0.get("grads_MiB"),
                         "optimizer_MiB": r0.get("optimizer_MiB"), "state_MiB_per_rank": d.get("state_MiB_per_rank"),
                         "peak_mem_MiB_max": d.get("peak_mem_MiB_max"), "samples_per_s": d.get("samples_per_s"),
                         "state_ratio_fsdp_over_ddp": mt.get("state_ratio_fsdp_over_ddp") if name == "fsdp" else None})
    return rows


def zero_rows(data: ReportData) -> list[dict]:
    """Exercise 5, from the first fsdp result that carries it (else the cost model)."""
    for m in data.measured:
        for r in m.all("fsdp"):
            if metric(r, "zero_sizing_7B_8x80GB"):
                return [dict(x) for x in metric(r, "zero_sizing_7B_8x80GB")]
    return costmodel.zero_table()


def weak_efficiencies(m: Machine, variant: str, below: int | None = None) -> dict[int, float]:
    out = {}
    for row in scaling(m, "ddp_weak", variant):
        if row["efficiency"] is not None and (below is None or row["k"] < below):
            out[row["k"]] = row["efficiency"]
    return out


def k8_rows(data: ReportData, target: int = 8) -> list[dict]:
    rows = []
    for m in data.machines:
        for variant in m.variants("ddp_weak"):
            eff = weak_efficiencies(m, variant, below=target)
            pred = costmodel.weak_efficiency_k(eff, target)
            if not pred:
                continue
            meas = weak_efficiencies(m, variant).get(target)
            rows.append({"machine": m.name, "variant": variant, "from_k": pred["from_k"],
                         "efficiency_at_from_k": eff[pred["from_k"]], "k": target,
                         "predicted_flat": pred["flat"], "predicted_ring": pred["ring"],
                         "measured": meas})
    return rows


def hlo_summary(r: dict) -> dict:
    sizes = metric(r, "allreduce_elements", "sizes", "allreduce_sizes", "sizes_floats", "all_reduce_sizes",
                   default=[]) or []
    sizes = [s for s in sizes if isinstance(s, (int, float))]
    n = metric(r, "n_allreduce", "n_all_reduce", "num_allreduce", "allreduce_count")
    if n is None and sizes:
        n = len(sizes)
    largest = metric(r, "largest_floats", "largest")
    two = metric(r, "largest_two_elements", "largest_two", "largest_two_floats")
    if isinstance(largest, list):
        largest = max(largest) if largest else None
    if largest is None and isinstance(two, list) and two:
        largest = max(two)
    if largest is None and sizes:
        largest = max(sizes)
    if not isinstance(two, list):
        two = sorted(sizes, reverse=True)[:2] if sizes else None
    total = metric(r, "total_floats", "total_elements")
    total_bytes = metric(r, "total_bytes", "allreduce_total_bytes", "total_allreduce_bytes")
    return {"n_allreduce": n, "largest_floats": largest, "largest_two": two, "sizes": sizes,
            "total_floats": total if total is not None else (sum(sizes) if sizes else None),
            "total_bytes": total_bytes}


def book_form_hlo(r: dict) -> str:
    h = hlo_summary(r)
    if h["n_allreduce"] is None:
        return "all-reduce census: not recorded"
    s = f"{h['n_allreduce']} all-reduce ops in the compiled step"
    if h["largest_floats"]:
        s += f"; the largest sums {h['largest_floats'] / 1e6:.1f}M floats"
    return s


def equality_summary(r: dict) -> dict:
    broken = metric(r, "broken", default={})
    broken = broken if isinstance(broken, dict) else {}
    return {
        "max_abs_diff": metric(r, "max_abs_diff", "max_update_diff", "max_diff"),
        "max_abs_update": metric(r, "max_abs_update", "update_magnitude"),
        "rel_diff": metric(r, "rel_diff", "relative_diff"),
        "threshold": metric(r, "threshold", "rel_threshold"),
        "passed": metric(r, "passed", "ok"),
        "broken_rel_diff": metric(r, "broken_rel_diff", "broken_variant_rel_diff", "rel_diff_broken",
                                  default=broken.get("rel_diff")),
        "broken_flagged": metric(r, "broken_flagged", "broken_detected"),
    }


def book_form_equality(r: dict) -> str:
    e = equality_summary(r)
    if e["max_abs_diff"] is None:
        return "update-equality check: not recorded"
    return f"max update difference, k=1 vs k=2: {e['max_abs_diff']:.1e}"


def text_pictures(r: dict) -> dict[str, str]:
    """Multi-line string metrics (e.g. visualize_array_sharding's pictures), any depth."""
    out = {}

    def walk(prefix, x):
        if isinstance(x, str) and "\n" in x:
            out[prefix] = x
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
    walk("", r.get("metrics") or {})
    return out


# ---------------------------------------------------------------- document model

@dataclass
class Table:
    key: str
    title: str
    columns: list[str]
    rows: list[list]                 # cells: str, or (text, css-class)
    note: str = ""


@dataclass
class Section:
    anchor: str
    title: str
    paragraphs: list[str] = field(default_factory=list)     # plain text (escaped on output)
    figures: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    pre: list[tuple[str, str]] = field(default_factory=list)  # (caption, preformatted text)
    banners: list[tuple[str, str]] = field(default_factory=list)   # (css class, text)
    tables_first: bool = False
    findings: list[tuple[str, str]] = field(default_factory=list)   # (figure, its headline)


STATUS_CLASS = {"ok": "ok", "hung": "hung", "failed": "failed", "skipped": "skipped"}


def status_cell(status: str) -> tuple[str, str]:
    return (status.upper() if status != "ok" else "ok", STATUS_CLASS.get(status, ""))


def series_columns(data: ReportData, experiment: str) -> list[tuple[Machine, str]]:
    return [(m, v) for m in data.machines for v in m.variants(experiment)]


def side_by_side(data: ReportData, experiment: str, strong: bool, key: str, title: str) -> Table:
    """Rows k; one column per machine x variant; cells in the book's printed form."""
    cols = series_columns(data, experiment)
    table_rows = {(m.key, v): {row["k"]: row for row in scaling(m, experiment, v)} for m, v in cols}
    ks = sorted({k for d in table_rows.values() for k in d})
    rows = []
    for k in ks:
        cells = [str(k)]
        for m, v in cols:
            row = table_rows[(m.key, v)].get(k)
            if row is None:
                cells.append(("not run", "missing"))
            elif row["status"] != "ok":
                cells.append((f"{row['status'].upper()}: {row['reason']}", row["status"]))
            else:
                cells.append((book_form_scaling(m, row, strong).split(": ", 1)[1],
                              "book" if m.kind == "book" else ""))
        rows.append(cells)
    columns = ["k"] + [f"{m.name} [{v}]" for m, v in cols]
    return Table(key, title, columns, rows)


def printed_block(data: ReportData, experiment: str, strong: bool) -> str:
    lines = []
    for m in data.machines:
        for v in m.variants(experiment):
            lines.append(f"# {m.name} [{v}: {VARIANT_TEXT.get(v, v)}]")
            if m.kind == "book":
                lines += list((m.book or {}).get(experiment, {}).get("printed") or [])
            else:
                lines += [book_form_scaling(m, row, strong) + (f"  ({row['reason']})" if row["reason"] else "")
                          for row in scaling(m, experiment, v)]
            lines.append("")
    return "\n".join(lines).rstrip()


def book_comparison(data: ReportData) -> Table:
    """One row per number the book printed; one column per machine."""
    book = data.book
    meas = data.measured
    rows = []

    def cite(key):
        if key == "exercise6":
            return "13.6.7 exercise 6 (a prediction the book asks for; not printed)"
        b = ((book.book if book else None) or {}).get(key) or {}
        return b.get("cite") or "–"

    def scaling_cell(m, exp, variant, k, strong):
        r = m.get(exp, variant, k)
        if r is None:
            return ("not run", "missing")
        if not ok(r):
            return (f"{r['status'].upper()}: {r.get('reason') or ''}", r["status"])
        row = next(x for x in scaling(m, exp, variant) if x["k"] == k)
        return (book_form_scaling(m, row, strong), "")

    for exp, variant, strong, what in (("ddp_weak", "seed", False, "DDP weak scaling"),
                                       ("ddp_strong", "seed", True, "DDP strong scaling"),
                                       ("jax_weak", "host", False, "JAX weak scaling")):
        ks = sorted(set((book.series(exp, variant) if book else {}).keys())
                    | {k for m in meas for k in m.series(exp, variant)})
        for k in ks:
            bcell = "–"
            if book and book.get(exp, variant, k):
                brow = next(x for x in scaling(book, exp, variant) if x["k"] == k)
                bcell = (book_form_scaling(book, brow, strong), "book")
            rows.append([f"{what}, k={k} [{variant}]", cite(exp), bcell]
                        + [scaling_cell(m, exp, variant, k, strong) for m in meas])

    def simple(label, key, book_text, fn):
        rows.append([label, cite(key), (book_text, "book") if book_text else "–"] + [fn(m) for m in meas])

    def probe_cell(m, k=2):
        r = m.get("ddp_comm_probe", "default", k)
        if r is None:
            return ("not run", "missing")
        if not ok(r):
            return (f"{r['status'].upper()}: {r.get('reason') or ''}", r["status"])
        return book_form_probe(next(x for x in probe_rows(m) if x["k"] == k))

    bp = (book.book or {}).get("ddp_comm_probe", {}).get("printed", [None])[0] if book else None
    simple("no_sync() probe, k=2", "ddp_comm_probe", bp, probe_cell)

    def ar_cell(m):
        t = book_form_allreduce(m)
        return t if t else ("not run", "missing")
    ba = (book.book or {}).get("allreduce", {}).get("printed", [None])[0] if book else None
    simple("bare all-reduce, k=2, 64 MB", "allreduce", ba, ar_cell)

    def memcpy_cell(m):
        t = memcpy_training_text(m)
        r = next(iter(m.series("ddp_memcpy_training", "default").values()), None)
        return (" ".join(t), r["status"] if r else "missing") if t else ("not run", "missing")
    bm = None
    if book and (b := (book.book or {}).get("ddp_memcpy_training")):
        bm = f"{b.get('status', 'hung').upper()}: {b.get('reason', '')}"
    simple("DDP training with the memcpy switch, k=2", "ddp_memcpy_training", bm, memcpy_cell)

    def hlo_cell(m):
        rs = [r for r in m.all("jax_hlo") if ok(r)]
        if not rs:
            r = next(iter(m.all("jax_hlo")), None)
            return (f"{r['status'].upper()}: {r.get('reason') or ''}", r["status"]) if r else ("not run", "missing")
        return "; ".join(f"k={r['k']}: {book_form_hlo(r)}" for r in rs)
    bh = None
    if book and (b := (book.book or {}).get("jax_hlo")):
        bh = f"k={b.get('k', 4)}: " + (b.get("printed") or [""])[0].rstrip(":")
    simple("JAX all-reduce census", "jax_hlo", bh, hlo_cell)

    def eq_cell(m):
        r = next(iter(m.all("jax_equality")), None)
        if r is None:
            return ("not run", "missing")
        if not ok(r):
            return (f"{r['status'].upper()}: {r.get('reason') or ''}", r["status"])
        e = equality_summary(r)
        extra = []
        if e["rel_diff"] is not None:
            extra.append(f"relative {e['rel_diff']:.1e}")
        if e["passed"] is not None:
            extra.append("passed" if e["passed"] else "FAILED")
        if e["broken_flagged"] is not None:
            extra.append("broken variant " + ("flagged" if e["broken_flagged"] else "NOT flagged"))
        return book_form_equality(r) + (f" ({', '.join(extra)})" if extra else "")
    be = (book.book or {}).get("jax_equality", {}).get("printed", [None])[0] if book else None
    simple("JAX update equality, k=1 vs k=2", "jax_equality", be, eq_cell)

    def k8_cell(m):
        rs = [x for x in k8_rows(ReportData([m]))]
        if not rs:
            return ("needs k=1 and k>=2 weak runs", "missing")
        return "; ".join(f"[{x['variant']}] flat {100 * x['predicted_flat']:.0f}%, ring "
                         f"{100 * x['predicted_ring']:.0f}% (from k={x['from_k']})"
                         + (f", measured {100 * x['measured']:.0f}%" if x["measured"] is not None else "")
                         for x in rs)
    bk = None
    if book:
        bk8 = k8_rows(ReportData([book]))
        if bk8:
            x = bk8[0]
            bk = (f"(derived from the book's numbers by this pipeline's cost model) flat "
                  f"{100 * x['predicted_flat']:.0f}%, ring {100 * x['predicted_ring']:.0f}% (from k={x['from_k']})")
    simple("Exercise 6: weak-scaling efficiency at k=8", "exercise6", bk, k8_cell)
    cols = ["quantity", "where in the book (section 13.6)",
            book.name + " (published)" if book else "book"] + [m.name for m in meas]
    return Table("book_comparison", "The book's numbers beside this pipeline's", cols, rows,
                 note="Book cells quote the line the book's cell printed (reference/book_4090.yaml "
                      "cites the section for each). Other cells print the same quantity in the same form.")


# ---------------------------------------------------------------- provenance

def provenance_banners(data: ReportData) -> list[tuple[str, str]]:
    out = []
    for m in data.measured:
        scale = m.scale
        srcs = m.data_sources()
        if scale == "smoke":
            out.append(("warn", f"{m.name}: SMOKE SCALE — a tiny protocol on the same code path "
                                f"(backends {', '.join(m.backends) or '?'}). These numbers check that the "
                                "pipeline works; they are not a measurement of the book's experiment."))
        if "synthetic" in srcs:
            origin = {(r.get("data") or {}).get("origin") for r in m.results.values()
                      if (r.get("data") or {}).get("source") == "synthetic"}
            origin.discard(None)
            out.append(("alert", f"{m.name}: SYNTHETIC DATA — Fashion-MNIST was not used; a deterministic "
                                 "synthetic stand-in of the same shape fed these runs"
                                 + (f" ({'; '.join(sorted(map(str, origin)))})" if origin else "")
                                 + ". Throughput does not depend on pixel values; losses do."))
        elif srcs:
            out.append(("info", f"{m.name}: data source {', '.join(srcs)} "
                                "(real = downloaded Fashion-MNIST, checked against its published md5; "
                                "local = the same files from a local folder)."))
        elif m.results:
            out.append(("warn", f"{m.name}: no result records its data source (every run was skipped or hung)."))
        if not m.results:
            out.append(("alert", f"{m.name}: no result JSONs found under {m.source}."))
        for e in m.errors:
            out.append(("alert", f"{m.name}: unreadable artifact: {e}"))
    return out


def status_table(data: ReportData) -> Table:
    rows = []
    for m in data.measured:
        for (e, v, k), r in sorted(m.results.items()):
            d = r.get("data") or {}
            dur = ""
            try:
                t0 = _dt.datetime.fromisoformat(r["started_utc"])
                t1 = _dt.datetime.fromisoformat(r["finished_utc"])
                dur = f"{(t1 - t0).total_seconds():.0f}"
            except (TypeError, ValueError, KeyError):
                pass
            rows.append([m.name, e, v, str(k), status_cell(r["status"]), r.get("reason") or "",
                         r.get("backend") or "", (r.get("config") or {}).get("scale") or "",
                         (d.get("source") or "–", "alert" if d.get("source") == "synthetic" else ""),
                         r.get("started_utc") or "", dur, r.get("_path", "")])
    return Table("status", "Every artifact", ["machine", "experiment", "variant", "k", "status", "reason",
                                              "backend", "scale", "data", "started (UTC)", "took (s)", "file"],
                 rows)


FP_KEYS = ("gpu_model", "gpu_count", "gpu_memory_MiB", "interconnect", "driver", "cuda", "torch_cuda",
           "nccl", "torch", "torchvision", "jax", "jaxlib", "flax", "optax", "numpy", "python",
           "cpu_model", "cpu_count", "hostname")


def fingerprint_table(data: ReportData) -> Table:
    ms = data.measured
    keys = [k for k in FP_KEYS if any(m.fingerprint.get(k) is not None for m in ms)]
    keys += sorted({k for m in ms for k in m.fingerprint} - set(keys))
    rows = [[k] + [fmt_fp(m.fingerprint.get(k)) for m in ms] for k in keys]
    rows.append(["backends (from results)"] + [", ".join(m.backends) or "–" for m in ms])
    rows.append(["scale"] + [m.scale for m in ms])
    rows.append(["data source"] + [", ".join(m.data_sources()) or "–" for m in ms])
    rows.append(["measured (UTC)"] + [" … ".join(x for x in m.dates() if x) or "–" for m in ms])
    rows.append(["results from"] + [m.source for m in ms])
    return Table("fingerprint", "Machines and versions", ["key"] + [m.name for m in ms], rows)


def fmt_fp(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return str(v)


# ---------------------------------------------------------------- assembling

def records_table(key: str, title: str, records: list[dict], columns: list[str] | None = None,
                  note: str = "") -> Table:
    columns = columns or list(dict.fromkeys(c for r in records for c in r))
    rows = []
    for r in records:
        cells = []
        for c in columns:
            v = r.get(c)
            if c == "status" and isinstance(v, str):
                cells.append(status_cell(v))
            elif c in ("efficiency", "mfu", "predicted_flat", "predicted_ring", "measured",
                       "efficiency_at_from_k") and isinstance(v, float):
                cells.append(f"{100 * v:.1f}%")
            elif c == "speedup" and isinstance(v, float):
                cells.append(f"{v:.2f}x")
            else:
                cells.append(fmt_num(v))
        rows.append(cells)
    return Table(key, title, columns, rows, note)


def sections(data: ReportData, headlines: dict[str, str] | None = None) -> list[Section]:
    S = []
    ov = Section("overview", "Overview", figures=["status"], tables_first=True)
    ov.banners = provenance_banners(data)
    ov.paragraphs.append(
        "This report regenerates the measurements of d2l section 13.6 (Multi-GPU in Practice) on the "
        "machines listed below and sets them beside the numbers the book published for its four RTX 4090s. "
        "Every figure and table names the machine and the scale of each series; a run that was skipped or "
        "hung is shown as such, with the reason, instead of going missing.")
    if headlines:
        ov.findings = [(name, text) for name, text in headlines.items() if text]
    ov.tables.append(book_comparison(data))
    S.append(ov)

    sc = Section("ddp-scaling", "DDP scaling (weak and strong)",
                 figures=["scaling_weak", "scaling_strong", "efficiency"])
    sc.paragraphs.append(
        "Weak scaling holds the per-rank batch fixed (the global batch grows as k); strong scaling holds the "
        "global batch fixed (the per-rank batch shrinks as 1/k). samples/s is summed over ranks, as in the book; "
        "efficiency is samples/s divided by k times the same series' k=1. Variants: seed = the book's DataLoader "
        "(PIL resize per image per epoch), cached = a resize cache resident on the device, tuned = bf16 + "
        "channels_last + torch.compile + fused SGD, the whole step replayed as one CUDA graph, on the "
        "device-resident cache (GPUs only).")
    sc.tables.append(side_by_side(data, "ddp_weak", False, "weak_side", "Weak scaling, in the book's form"))
    sc.tables.append(side_by_side(data, "ddp_strong", True, "strong_side", "Strong scaling, in the book's form"))
    sc.pre.append(("What each series would print, in the book's words",
                   printed_block(data, "ddp_weak", False) + "\n\n" + printed_block(data, "ddp_strong", True)))
    recs = [row for m in data.measured for e in THROUGHPUT for v in m.variants(e)
            for row in scaling(m, e, v)]
    sc.tables.append(records_table("scaling", "Details: step times (median, p10, p90), memory, MFU", recs,
                                   ["machine", "experiment", "variant", "k", "status", "samples_per_s",
                                    "speedup", "efficiency", "per_rank_batch", "global_batch",
                                    "step_ms_median", "step_ms_p10", "step_ms_p90", "peak_mem_MiB", "mfu"]))
    S.append(sc)

    ld = Section("loader", "Input pipeline: the book's DataLoader against the resize cache", figures=["loader"])
    ld.paragraphs.append(
        "The same DDP run fed two ways: the book's torchvision DataLoader (decode and resize every image every "
        "epoch, on the CPU) and a cache of pre-resized images kept on the device. Where the cached bar is much "
        "taller, the seed protocol was measuring its input pipeline, not the GPUs and the fabric.")
    S.append(ld)

    tu = Section("tuned", "The tuned series beside the book's protocol", figures=["tuned"])
    tu.paragraphs.append(
        "The book's protocol is kept as it is; the tuned series is a second series on the same model and "
        "per-rank batch (GPUs only, config key tuned). DDP: bf16 autocast, channels_last, torch.compile, fused "
        "SGD on the device-resident cache, and the whole step (forward, backward with DDP's all-reduce, update) "
        "captured once as a CUDA graph and replayed, because the compiled step needs more host time to launch "
        "than the GPU needs to run it. JAX: bf16 compute with float32 parameters, the data on the device, "
        "jax.jit over the flat model state. MFU is the FLOPs counted by torch.utils.flop_counter times "
        "samples/s, over the bf16 matmul rate measured in the same job; the dotted line is where MFU = 1.")
    S.append(tu)

    cm = Section("communication", "Communication: the no_sync() probe and the bare all-reduce",
                 figures=["comm_probe", "allreduce", "bucket_sweep"])
    cm.paragraphs.append(
        "The probe times a DDP step with and without gradient synchronisation (no_sync()); the difference "
        "estimates what communication costs per step. Predictions price DDP's actual gradient buckets with the "
        "all-reduce bandwidth measured at k=2 (flat: Eq. 13.5.2, bandwidth independent of k; ring: Eq. 13.5.1, "
        "2(k-1)/k bytes per device) and with the book's beta = 4.5 GB/s. Bandwidth conventions follow nccl-tests: "
        "busbw = S/t x 2(k-1)/k; the book's 'effective bytes/device/s' is 2S/t (twice busbw at k=2).")
    cm.tables.append(records_table("comm_probe", "no_sync() probe", [r for m in data.machines for r in probe_rows(m)],
                                   ["machine", "k", "status", "synced_ms", "no_sync_ms", "comm_ms", "pred_flat_ms",
                                    "pred_ring_ms", "pred_book_ms", "grad_MB", "n_buckets", "reason"]))
    cm.pre.append(("The probe and the all-reduce, in the book's words", "\n".join(
        f"# {m.name}\n" + "\n".join([book_form_probe(r) for r in probe_rows(m)]
                                    + ([book_form_allreduce(m)] if book_form_allreduce(m) else [])
                                    + memcpy_training_text(m))
        for m in data.machines)))
    cm.tables.append(records_table("allreduce", "All-reduce sweep", [r for m in data.machines for r in allreduce_rows(m)],
                                   ["machine", "variant", "k", "status", "MiB", "time_ms_median", "time_ms_p10",
                                    "time_ms_p90", "algbw_GBps", "busbw_GBps", "book_GBps", "correct", "reason"]))
    cm.tables.append(records_table("bucket_sweep", "Bucket-size sweep (exercise 1)",
                                   [r for m in data.measured for r in bucket_rows(m)],
                                   ["machine", "k", "status", "bucket_cap_MiB", "n_buckets", "samples_per_s",
                                    "step_ms_median", "step_ms_p10", "step_ms_p90", "best", "reason"]))
    S.append(cm)

    fs = Section("fsdp", "FSDP against DDP; ZeRO sizing", figures=["fsdp_memory"])
    fs.paragraphs.append(
        "Training state per rank (parameters, gradients, optimizer state; SGD with momentum) under DDP, which "
        "replicates it, and FSDP2 (fully_shard per residual stage), which shards it 1/k. The book only sketched "
        "this code; exercise 5 sizes ZeRO stages for a 7B-parameter model on 8 x 80 GB (16 bytes per parameter, "
        "activations excluded).")
    fs.tables.append(records_table("fsdp", "FSDP against DDP", [r for m in data.measured for r in fsdp_rows(m)],
                                   ["machine", "k", "status", "wrapper", "params_MiB", "grads_MiB", "optimizer_MiB",
                                    "state_MiB_per_rank", "peak_mem_MiB_max", "samples_per_s",
                                    "state_ratio_fsdp_over_ddp", "reason"]))
    fs.tables.append(records_table("zero_sizing", "ZeRO sizing, 7B parameters on 8 x 80 GB (exercise 5)",
                                   zero_rows(data), ["stage", "params_GB", "grads_GB", "optimizer_GB", "total_GB",
                                                     "gpu_GB", "fits"]))
    S.append(fs)

    jx = Section("jax", "JAX: declarative data parallelism", figures=["ddp_vs_jax", "jax_hlo"])
    jx.paragraphs.append(
        "One process, a Mesh and a NamedSharding, and jit of the unchanged step: XLA inserts the all-reduces. "
        "JAX variants: host = batches staged from host arrays (the book's loop), device = the data set resident "
        "on the devices, tuned = bf16 compute on the device-resident set, dispatched through jax.jit over the flat "
        "model state (nnx.jit's per-call Python cost was a third of an 11 ms bf16 step on the H200; GPUs only). "
        "As the book warns, absolute samples/s is not a framework "
        "shoot-out; the scaling curve is the comparison.")
    jx.tables.append(side_by_side(data, "jax_weak", False, "jax_side", "JAX weak scaling, in the book's form"))
    jrows = []
    for m in data.machines:
        for r in m.all("jax_hlo"):
            h = hlo_summary(r)
            jrows.append([m.name, "all-reduce census", str(r["k"]), status_cell(r["status"]),
                          book_form_hlo(r) if ok(r) else (r.get("reason") or ""),
                          "; ".join(f"{k}={fmt_num(v)}" for k, v in h.items()
                                    if k not in ("sizes",) and v is not None and not isinstance(v, list))
                          + (f"; largest two={h['largest_two']}" if h.get("largest_two") else "")])
        for r in m.all("jax_equality"):
            e = equality_summary(r)
            jrows.append([m.name, "update equality", str(r["k"]), status_cell(r["status"]),
                          book_form_equality(r) if ok(r) else (r.get("reason") or ""),
                          "; ".join(f"{k}={fmt_num(v)}" for k, v in e.items() if v is not None)])
    jx.tables.append(Table("jax_checks", "All-reduce census and k=1 vs k=2 equality",
                           ["machine", "check", "k", "status", "in the book's words", "details"], jrows))
    for m in data.measured:
        for r in m.all("jax_hlo") + m.all("jax_equality"):
            for name, pic in text_pictures(r).items():
                jx.pre.append((f"{m.name}, {r['experiment']} k={r['k']}: {name}", pic))
    S.append(jx)

    k8 = Section("k8", "Exercise 6: predicting k=8", figures=["k8_prediction"])
    k8.paragraphs.append(
        "Model: a step costs t_compute + t_comm(k), so efficiency e(k) = t_c / (t_c + t_comm(k)) and "
        "t_comm/t_c = 1/e - 1 at the largest measured k. Flat assumes t_comm stops growing past k=2 "
        "(Eq. 13.5.2); ring scales it by 2(k-1)/k (Eq. 13.5.1). A measured k=8, where one exists, stands beside "
        "the prediction and was not used to make it.")
    k8.tables.append(records_table("k8_prediction", "Predicted weak-scaling efficiency at k=8", k8_rows(data),
                                   ["machine", "variant", "from_k", "efficiency_at_from_k", "k", "predicted_flat",
                                    "predicted_ring", "measured"]))
    S.append(k8)

    pv = Section("provenance", "Provenance")
    pv.paragraphs.append(
        f"Report built {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}. "
        "Each result JSON carries the fingerprint subset its rule depends on, the backend, the scale and "
        "protocol, the data provenance and timestamps; the machine fingerprints below are the full probes.")
    if data.book:
        pv.paragraphs.append(f"Book numbers: {data.book.source}, transcribed from d2l section 13.6 "
                             "(each entry cites its subsection).")
    pv.tables.append(fingerprint_table(data))
    pv.tables.append(status_table(data))
    S.append(pv)
    return S


# ---------------------------------------------------------------- rendering

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;max-width:1200px;padding:1em 2em;
color:#1a1a1a;line-height:1.45}
h1{margin-bottom:.2em} h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}
nav a{margin-right:1em} figure{margin:1.2em 0;text-align:center} figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.9em;color:#555}
table{border-collapse:collapse;margin:.8em 0;font-size:.85em;display:block;overflow-x:auto}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3} caption{caption-side:top;text-align:left;font-weight:600;padding:.3em 0}
td.ok{color:#1b5e20} td.skipped{background:#eeeeee;color:#555} td.hung{background:#ffe0b2}
td.failed{background:#ffcdd2} td.missing{color:#999} td.book{background:#f1f8e9} td.alert{color:#b71c1c;font-weight:700}
.banner{padding:.6em 1em;margin:.4em 0;border-radius:4px;border-left:6px solid}
.banner.alert{background:#ffebee;border-color:#c62828;font-weight:600}
.banner.warn{background:#fff8e1;border-color:#f9a825} .banner.info{background:#e3f2fd;border-color:#1565c0}
td:first-child{white-space:nowrap}
#table-book_comparison td:nth-child(2){font-size:.85em;color:#555;max-width:16em}
ul.findings{font-size:.92em} ul.findings a{color:inherit;text-decoration:none}
ul.findings a:hover{text-decoration:underline}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.85em} .note{font-size:.85em;color:#555}
"""


def _cell(c) -> tuple[str, str]:
    if isinstance(c, tuple):
        return str(c[0]), c[1]
    return str(c), ""


def table_html(t: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in t.columns)
    body = []
    for row in t.rows:
        tds = []
        for c in row:
            text, cls = _cell(c)
            tds.append(f"<td class=\"{cls}\">{html.escape(text)}</td>" if cls else f"<td>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    if not body:
        body = [f"<tr><td colspan=\"{len(t.columns)}\" class=\"missing\">no results</td></tr>"]
    note = f"<p class=\"note\">{html.escape(t.note)}</p>" if t.note else ""
    return (f"<table id=\"table-{t.key}\" data-table=\"{t.key}\"><caption>{html.escape(t.title)}</caption>"
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{note}")


def table_md(t: Table) -> str:
    def esc(s):
        return s.replace("|", "\\|").replace("\n", " ")
    lines = [f"**{t.title}**", "", "| " + " | ".join(map(esc, t.columns)) + " |",
             "|" + "---|" * len(t.columns)]
    for row in t.rows:
        lines.append("| " + " | ".join(esc(_cell(c)[0]) for c in row) + " |")
    if not t.rows:
        lines.append("| no results |" + " |" * (len(t.columns) - 1))
    if t.note:
        lines += ["", f"_{t.note}_"]
    return "\n".join(lines)


def render_html(data: ReportData, secs: list[Section], figdir: Path) -> str:
    title = "dpscale report: multi-GPU data parallelism (d2l 13.6), regenerated"
    machines = "; ".join(m.name for m in data.machines)
    out = [f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>",
           f"<style>{CSS}</style></head><body>",
           f"<h1>{html.escape(title)}</h1><p><b>Machines:</b> {html.escape(machines)}</p>",
           "<nav>" + "".join(f"<a href=\"#{s.anchor}\">{html.escape(s.title.split(':')[0])}</a>" for s in secs)
           + "</nav>"]
    for s in secs:
        out.append(f"<section id=\"{s.anchor}\"><h2>{html.escape(s.title)}</h2>")
        for cls, text in s.banners:
            out.append(f"<div class=\"banner {cls}\">{html.escape(text)}</div>")
        for p in s.paragraphs:
            out.append(f"<p>{html.escape(p)}</p>")
        if s.findings:
            out.append("<p><b>At a glance</b> (each figure's headline; click to jump):</p><ul class=\"findings\">"
                       + "".join(f"<li><a href=\"#fig-{n}\">{html.escape(t)}</a></li>" for n, t in s.findings)
                       + "</ul>")
        figs = []
        for name in s.figures:
            png = figdir / f"{name}.png"
            b64 = base64.b64encode(png.read_bytes()).decode()
            figs.append(f"<figure id=\"fig-{name}\"><img alt=\"{html.escape(FIGURES[name][1])}\" "
                        f"src=\"data:image/png;base64,{b64}\"><figcaption>{html.escape(FIGURES[name][1])} "
                        f"(figures/{name}.png, .svg)</figcaption></figure>")
        tabs = [table_html(t) for t in s.tables]
        out += (tabs + figs) if s.tables_first else (figs + tabs)
        for cap, text in s.pre:
            out.append(f"<p class=\"note\">{html.escape(cap)}</p><pre>{html.escape(text)}</pre>")
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out)


def render_md(data: ReportData, secs: list[Section]) -> str:
    out = ["# dpscale report: multi-GPU data parallelism (d2l 13.6), regenerated", "",
           "Machines: " + "; ".join(m.name for m in data.machines), ""]
    for s in secs:
        out += [f"## {s.title}", ""]
        for cls, text in s.banners:
            out += [f"> **{cls.upper()}**: {text}", ""]
        for p in s.paragraphs:
            out += [p, ""]
        if s.findings:
            out += ["**At a glance** (each figure's headline):", ""]
            out += [f"- [{t}](figures/{n}.png)" for n, t in s.findings] + [""]
        figs, tabs = [], []
        for name in s.figures:
            figs += [f"![{FIGURES[name][1]}](figures/{name}.png)", "", f"_{FIGURES[name][1]}_ "
                     f"([svg](figures/{name}.svg))", ""]
        for t in s.tables:
            tabs += [table_md(t), ""]
        out += (tabs + figs) if s.tables_first else (figs + tabs)
        for cap, text in s.pre:
            out += [f"_{cap}_", "", "```", text, "```", ""]
    return "\n".join(out)


def write_csv(path: Path, t: Table) -> None:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(t.columns)
    for row in t.rows:
        w.writerow([_cell(c)[0] for c in row])
    write_atomic(path, buf.getvalue())


def build(runs_dir, fingerprint_path, references_dir=None, out_dir="results/report",
          book_path=None) -> dict:
    """Load every result, draw FIGURES, write TABLES, report.html and report.md."""
    from . import plots

    data = load_all(runs_dir, fingerprint_path, references_dir, book_path)
    out = Path(out_dir)
    figdir = out / "figures"
    figdir.mkdir(parents=True, exist_ok=True)
    drawn = plots.draw_all(data, figdir)
    secs = sections(data, drawn)
    tables = {t.key: t for s in secs for t in s.tables}
    tabdir = out / "tables"
    for key in TABLES:
        write_csv(tabdir / f"{key}.csv", tables[key])
    write_atomic(out / "report.md", render_md(data, secs))
    write_atomic(out / "report.html", render_html(data, secs, figdir))
    statuses = collections.Counter(r["status"] for m in data.measured for r in m.results.values())
    return {"machines": [m.name for m in data.machines], "figures": list(drawn), "statuses": dict(statuses),
            "html": str(out / "report.html"), "md": str(out / "report.md")}


def expected_outputs(out_dir: str = "results/report") -> dict[str, list[str]]:
    """Every file build() writes, for the rule's output: (figures as PNG and SVG, tables)."""
    return {"png": [f"{out_dir}/figures/{n}.png" for n in FIGURES],
            "svg": [f"{out_dir}/figures/{n}.svg" for n in FIGURES],
            "csv": [f"{out_dir}/tables/{n}.csv" for n in TABLES]}


__all__ = ["FIGURES", "TABLES", "Machine", "ReportData", "build", "load_all", "expected_outputs"]
