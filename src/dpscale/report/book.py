"""The book's published numbers (reference/book_4090.yaml) as one more machine,
its results in the same shape as ours, so every table and figure treats it alike.
Each block of the file is named after the experiment it is the book's run of."""
from __future__ import annotations

from pathlib import Path

import yaml

from dpscale.analysis import costmodel
from dpscale import provenance, registry
from dpscale.results import make_result
from dpscale.report.machines import Machine

SOURCE = "reference/book_4090.yaml"   # in the workflow's folder
PATH = provenance.ROOT / SOURCE


def load(path) -> Machine | None:
    p = Path(path) if path else None
    if not p or not p.exists():
        return None
    book = yaml.safe_load(p.read_text())
    mach = book.get("machine", {})
    fp = {k: mach.get(k) for k in ("gpu_model", "gpu_count", "interconnect")}
    m = Machine(key="book", kind="book", label="book", fingerprint=fp, source=SOURCE, book=book)
    for name, block in book.items():
        if name in registry.EXPERIMENTS and isinstance(block, dict):
            for key, metrics, extra in _records(block):
                m.results[(name, *key)] = _result(mach, fp, name, *key, metrics, block.get("cite"), **extra)
    m.plan = sorted(m.results)
    return m


def _result(mach: dict, fp: dict, exp: str, variant: str, k: int, metrics: dict, cite, status="ok",
            reason=None) -> dict:
    r = make_result(experiment=exp, variant=variant, k=k, status=status, reason=reason, metrics=metrics,
                    backend=mach.get("backend", "nccl"), config={"scale": mach.get("scale", "paper")},
                    fingerprint=fp, data={"source": "real", "origin": "published in the book"}, cite=cite)
    r["started_utc"] = r["finished_utc"] = None
    r["_path"] = SOURCE
    return r


def _records(b: dict):
    """((variant, k), metrics, status) of one block, by what the block holds."""
    if "samples_per_s" in b:   # a throughput sweep over k
        for k, s in b["samples_per_s"].items():
            k = int(k)
            prb = b["per_rank_batch"] if "per_rank_batch" in b else b.get("global_batch", 0) // k
            yield (b.get("variant", "default"), k), {"samples_per_s": float(s), "samples_per_s_per_device": s / k,
                                                     "per_rank_batch": prb, "global_batch": prb * k}, {}
    elif "effective_GBps" in b:   # the book's 2S/t at one size, per variant
        yield from _allreduce(b)
    elif "k" in b:
        extra = {"status": b["status"], "reason": b.get("reason", "as published")} if "status" in b else {}
        yield (b.get("variant", "default"), int(b["k"])), dict(b.get("metrics") or {}), extra


def _allreduce(b: dict):
    """One row per variant in the shape of our nccl-tests table: time from the book's
    2S/t, algbw and busbw by the same definitions as ours."""
    k, mib = int(b.get("k", 2)), b.get("MiB", 64)
    for variant, gbps in b["effective_GBps"].items():
        size = mib * 2**20
        t = 2 * size / (float(gbps) * 1e9)
        row = {"MiB": mib, "bytes": size, "time_us": 1e6 * t, "algbw_GBps": costmodel.algbw(size, t) / 1e9,
               "busbw_GBps": costmodel.busbw(size, t, k) / 1e9, "book_GBps": float(gbps), "wrong": 0}
        yield (variant, k), {"table": {"in_place": [row]}}, {}


def cite(m: Machine | None, key: str) -> str:
    return (((m.book if m else None) or {}).get(key) or {}).get("cite") or "–"


def printed(m: Machine | None, key: str) -> list[str]:
    return list((((m.book if m else None) or {}).get(key) or {}).get("printed") or [])
