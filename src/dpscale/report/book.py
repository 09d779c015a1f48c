"""The book's published numbers (reference/book_4090.yaml) as one more machine,
its results in the same shape as ours, so every table and figure treats it alike."""
from __future__ import annotations

from pathlib import Path

import yaml

from .. import costmodel
from ..results import make_result
from .machines import Machine

SOURCE = "reference/book_4090.yaml"
THROUGHPUT = (("ddp_weak", "seed"), ("ddp_strong", "seed"), ("jax_weak", "host"))


def load(path) -> Machine | None:
    p = Path(path) if path else None
    if not p or not p.exists():
        return None
    book = yaml.safe_load(p.read_text())
    mach = book.get("machine", {})
    fp = {k: mach.get(k) for k in ("gpu_model", "gpu_count", "interconnect")}
    m = Machine(key="book", kind="book", label="book", fingerprint=fp, source=SOURCE, book=book)
    for key, r in _records(book, mach, fp):
        m.results[key] = r
    m.plan = sorted(m.results)
    return m


def _result(mach: dict, fp: dict, exp: str, variant: str, k: int, metrics: dict, cite, status="ok",
            reason=None) -> tuple:
    r = make_result(experiment=exp, variant=variant, k=k, status=status, reason=reason, metrics=metrics,
                    backend=mach.get("backend", "nccl"), config={"scale": mach.get("scale", "paper")},
                    fingerprint=fp, data={"source": "real", "origin": "published in the book"}, cite=cite)
    r["started_utc"] = r["finished_utc"] = None
    r["_path"] = SOURCE
    return (exp, variant, int(k)), r


def _records(book: dict, mach: dict, fp: dict):
    for exp, variant in THROUGHPUT:
        b = book.get(exp) or {}
        for k, s in (b.get("samples_per_s") or {}).items():
            k = int(k)
            prb = b["per_rank_batch"] if "per_rank_batch" in b else b.get("global_batch", 0) // k
            yield _result(mach, fp, exp, variant, k, {"samples_per_s": float(s), "samples_per_s_per_device": s / k,
                                                      "per_rank_batch": prb, "global_batch": prb * k}, b.get("cite"))
    if b := book.get("ddp_comm_probe"):
        yield _result(mach, fp, "ddp_comm_probe", "default", b.get("k", 2),
                      {n: b[n] for n in ("synced_ms", "no_sync_ms", "comm_ms", "pred_book_ms") if n in b},
                      b.get("cite"))
    if b := book.get("allreduce"):
        yield from _allreduce(mach, fp, b)
    if b := book.get("ddp_memcpy_training"):
        yield _result(mach, fp, "ddp_memcpy_training", "default", b.get("k", 2), {}, b.get("cite"),
                      status=b.get("status", "hung"), reason=b.get("reason", "as published"))
    if b := book.get("jax_hlo"):
        yield _result(mach, fp, "jax_hlo", "default", b.get("k", 4),
                      {"n_allreduce": b.get("n_allreduce"), "largest_floats": b.get("largest_floats")}, b.get("cite"))
    if b := book.get("jax_equality"):
        yield _result(mach, fp, "jax_equality", "default", b.get("k", 2),
                      {"max_abs_diff": b.get("max_abs_diff"), "max_abs_update": b.get("update_magnitude")},
                      b.get("cite"))


def _allreduce(mach: dict, fp: dict, b: dict):
    """The book quotes 2S/t ('effective bytes/device/s') at one size; we store the row
    as our sweep does, with algbw and busbw derived by the same definitions."""
    k, mib = b.get("k", 2), b.get("MiB", 64)
    for variant, key in (("default", "default_GBps"), ("memcpy", "memcpy_GBps")):
        if key not in b:
            continue
        size = mib * 2**20
        t = 2 * size / (float(b[key]) * 1e9)
        row = {"MiB": mib, "bytes": size, "time_us": 1e6 * t, "algbw_GBps": costmodel.algbw(size, t) / 1e9,
               "busbw_GBps": costmodel.busbw(size, t, k) / 1e9, "book_GBps": float(b[key]), "wrong": 0}
        yield _result(mach, fp, "allreduce", variant, k, {"table": {"in_place": [row]}}, b.get("cite"))


def cite(m: Machine | None, key: str) -> str:
    return (((m.book if m else None) or {}).get(key) or {}).get("cite") or "–"


def printed(m: Machine | None, key: str) -> list[str]:
    return list((((m.book if m else None) or {}).get(key) or {}).get("printed") or [])
