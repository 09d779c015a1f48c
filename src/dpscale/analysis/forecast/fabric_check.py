"""The forecast's fabric model checked on clusters this project never ran on: public
nccl-tests outputs of one cluster at two or more scales (a manifest, scales.yaml, names
the files and which cases were held out before the check first ran). The model built
from the smaller scale (fabric_file.fabric_tiers: the tier between nodes fitted to its
times, the in-node ring from a one-host file where one is given, else neglected)
predicts the larger scale's time per payload (model.hierarchical_time at the larger
layout), and so its bus bandwidth.

Per case, at the largest payload both outputs measured (the large-message busbw): the
prediction, its band, the measured value, the error, and beside it the naive predictor
nccl-tests' busbw is built for, the smaller scale's busbw at that payload. The band is
the percentile interval of the prediction over bootstrap draws of the smaller output's
rows, widened by the model's misfit estimated out of sample: from the other clusters'
cases (misfit.tau_mle on the log errors, Student's t with their number of degrees of
freedom: misfit.widen); a held-out case takes it from every case not held out.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from dpscale.analysis.forecast import fabric_file, misfit, model as fc


@dataclass(frozen=True)
class Case:
    cluster: str
    small: tuple[str, ...]       # the smaller scale's outputs (one multi-host; a one-host one optional)
    large: str                   # the output predicted
    held_out: bool = False
    note: str = ""


def read_cases(manifest) -> list[Case]:
    """The cases of a manifest (scales.yaml), file names relative to its folder."""
    p = Path(manifest)
    doc = yaml.safe_load(p.read_text()) or {}
    out = []
    for c in doc.get("cases") or []:
        out.append(Case(c["cluster"], tuple(str(p.parent / f) for f in c["small"]), str(p.parent / c["large"]),
                        bool(c.get("held_out")), c.get("note", "")))
    if not out:
        raise ValueError(f"{p}: no cases (expected 'cases:' with cluster, small, large)")
    return out


def layout(s: fabric_file.Sweep) -> str:
    return f"{s.hosts} node(s) x {s.gpus_per_node or '?'}"


def tiers_of(small: list[fabric_file.Sweep], rows=None) -> fabric_file.Tiers:
    """The tiers of the smaller scale: a one-host output's ring, a multi-host one's tier
    between nodes (the ring subtracted). rows: a resample of the multi-host rows."""
    one = [s for s in small if s.hosts <= 1]
    multi = [s for s in small if s.hosts > 1]
    if len(multi) != 1:
        raise ValueError(f"{[s.source for s in small]}: one multi-host output expected for the smaller scale")
    m = multi[0] if rows is None else resampled(multi[0], rows)
    intra = fabric_file.fabric_tiers(one[0]).intra if one else None
    return fabric_file.fabric_tiers(m, intra)


def resampled(s: fabric_file.Sweep, rows) -> fabric_file.Sweep:
    from dataclasses import replace
    return replace(s, table={**s.table, s.placement: tuple(rows)})


def busbw_GBps(size_bytes: float, time_s: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: size / time x 2(n-1)/n, in GB/s."""
    return size_bytes / time_s * 2 * (ranks - 1) / ranks / fc.GB


def per_size(tiers: fabric_file.Tiers, small: fabric_file.Sweep, large: fabric_file.Sweep) -> list[dict]:
    """Predicted and measured time of every payload of the larger output within the smaller
    one's range (sizes the model saw), and the busbw each gives."""
    lo, hi = min(small.bytes), max(small.bytes)
    g = large.gpus_per_node or large.ranks
    good, _wrong = fabric_file.fitted_rows(large)
    out = []
    for r in good:
        if lo <= r.bytes <= hi:
            t = tiers.allreduce_time(r.bytes, large.hosts, g)
            out.append({"bytes": r.bytes, "predicted_s": t, "measured_s": r.time_s,
                        "predicted_busbw_GBps": busbw_GBps(r.bytes, t, large.ranks),
                        "measured_busbw_GBps": busbw_GBps(r.bytes, r.time_s, large.ranks),
                        "error_pct": 100 * (t / r.time_s - 1)})
    return out


def draws_at(small: list[fabric_file.Sweep], large: fabric_file.Sweep, size: float, n: int, seed: int) -> np.ndarray:
    """log busbw predicted at `size` for bootstrap resamples of the smaller output's rows
    (kept to two payloads or more; a draw no bandwidth fits is dropped)."""
    multi = next(s for s in small if s.hosts > 1)
    rows, _ = fabric_file.fitted_rows(multi)
    rng, out = np.random.default_rng(seed), []
    for _ in range(n):
        idx = rng.integers(0, len(rows), len(rows))
        pick = [rows[i] for i in sorted(idx)]
        if len({r.bytes for r in pick if r.bytes >= fc.DDP_FIRST_BUCKET_BYTES}) < 2:
            continue
        try:
            t = tiers_of(small, pick).allreduce_time(size, large.hosts, large.gpus_per_node or large.ranks)
        except ValueError:
            continue
        out.append(np.log(busbw_GBps(size, t, large.ranks)))
    return np.asarray(out)


def check_case(case: Case, draws: int = 400, seed: int = 0) -> dict:
    """One case: the per-size table, and at the largest common payload the prediction,
    the naive predictor and the measured busbw, with the draws for the band."""
    small = [fabric_file.read_sweep(p) for p in case.small]
    large = fabric_file.read_sweep(case.large)
    multi = next(s for s in small if s.hosts > 1)
    tiers = tiers_of(small)
    rows = per_size(tiers, multi, large)
    if not rows:
        raise ValueError(f"{case.large}: no payload within {case.small}'s sizes")
    at = max(rows, key=lambda r: r["bytes"])
    naive_row = next(r for r in fabric_file.fitted_rows(multi)[0] if r.bytes == at["bytes"]) \
        if at["bytes"] in multi.bytes else None
    naive = busbw_GBps(naive_row.bytes, naive_row.time_s, multi.ranks) if naive_row else None
    d = draws_at(small, large, at["bytes"], draws, seed)
    return {"cluster": case.cluster, "held_out": case.held_out, "note": case.note,
            "small": ", ".join(Path(p).name for p in case.small), "large": Path(case.large).name,
            "small_layout": layout(multi), "large_layout": layout(large), "tiers": tiers.source, "rows": rows,
            "bytes": at["bytes"], "measured_busbw_GBps": at["measured_busbw_GBps"],
            "predicted_busbw_GBps": at["predicted_busbw_GBps"], "error_pct": 100 * (at["predicted_busbw_GBps"]
                                                                                     / at["measured_busbw_GBps"] - 1),
            "naive_busbw_GBps": naive,
            "naive_error_pct": 100 * (naive / at["measured_busbw_GBps"] - 1) if naive else None,
            "error_log": float(np.log(at["predicted_busbw_GBps"] / at["measured_busbw_GBps"])),
            "noise_var": float(np.var(d, ddof=1)) if len(d) > 1 else 0.0, "_draws": d}


def band(results: list[dict], level: float, seed: int = 0) -> list[dict]:
    """Each case's band: its draws widened by the misfit of the other clusters' cases not
    held out (a held-out case: every case not held out), and whether the measured busbw
    fell inside."""
    rng = np.random.default_rng(seed)
    for r in results:
        pool = [x for x in results if x["cluster"] != r["cluster"] and not x["held_out"]]
        tau = misfit.tau_mle([x["error_log"] for x in pool], [x["noise_var"] for x in pool])
        d = misfit.widen(r["_draws"], tau, len(pool), rng)
        tail = 100 * (1 - level) / 2
        lo, hi = np.exp(np.percentile(d, [tail, 100 - tail])) if len(d) else (None, None)
        r.update(misfit=tau, misfit_cases=len(pool), band_lo=float(lo) if lo else None,
                 band_hi=float(hi) if hi else None,
                 inside=bool(lo <= r["measured_busbw_GBps"] <= hi) if lo else None)
    return results


def summary(results: list[dict]) -> dict:
    """Over the cases not held out and over the held-out ones: mean |error| (%) of the
    model and of the naive busbw, and the band's coverage."""
    def part(rows):
        m = [abs(r["error_pct"]) for r in rows]
        nv = [abs(r["naive_error_pct"]) for r in rows if r["naive_error_pct"] is not None]
        banded = [r for r in rows if r["inside"] is not None]
        return {"cases": len(rows), "clusters": len({r["cluster"] for r in rows}),
                "model_mean_abs_pct": float(np.mean(m)) if m else None,
                "naive_mean_abs_pct": float(np.mean(nv)) if nv else None,
                "inside": sum(r["inside"] for r in banded), "banded": len(banded)}
    return {"checked": part([r for r in results if not r["held_out"]]),
            "held_out": part([r for r in results if r["held_out"]])}


def run(manifest, level: float = 0.9, draws: int = 400, seed: int = 0) -> dict:
    results = [check_case(c, draws, seed) for c in read_cases(manifest)]
    band(results, level, seed)
    return {"manifest": str(manifest), "level": level, "cases": results, "summary": summary(results)}
