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
freedom: misfit.widen); a held-out case takes it from every case not held out. The band
stops at what the larger layout's NICs carry where the manifest names them (nic_GBps), and
its width (hi / lo) is reported. Per case too, the mean |error| over its payloads of the
model and of the naive predictor; the node-count cases (N nodes predicting M > N of the
same nodes) are summarised apart (summary()["nodes"]).
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
    nic_GBps: float | None = None   # what one node's NICs carry (GB/s, all of them), where the source says
    nic_source: str = ""


def read_cases(manifest) -> list[Case]:
    """The cases of a manifest (scales.yaml), file names relative to its folder."""
    p = Path(manifest)
    doc = yaml.safe_load(p.read_text()) or {}
    out = []
    for c in doc.get("cases") or []:
        out.append(Case(c["cluster"], tuple(str(p.parent / f) for f in c["small"]), str(p.parent / c["large"]),
                        bool(c.get("held_out")), c.get("note", ""),
                        float(c["nic_GBps"]) if c.get("nic_GBps") else None, c.get("nic_source", "")))
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
    one's range (sizes the model saw), and the busbw each gives; beside it the naive
    predictor's busbw (the smaller output's at that payload, where it measured it)."""
    lo, hi = min(small.bytes), max(small.bytes)
    g = large.gpus_per_node or large.ranks
    good, _wrong = fabric_file.fitted_rows(large)
    seen = {r.bytes: busbw_GBps(r.bytes, r.time_s, small.ranks) for r in fabric_file.fitted_rows(small)[0]}
    out = []
    for r in good:
        if lo <= r.bytes <= hi:
            t = tiers.allreduce_time(r.bytes, large.hosts, g)
            measured = busbw_GBps(r.bytes, r.time_s, large.ranks)
            naive = seen.get(r.bytes)
            out.append({"bytes": r.bytes, "predicted_s": t, "measured_s": r.time_s,
                        "predicted_busbw_GBps": busbw_GBps(r.bytes, t, large.ranks),
                        "measured_busbw_GBps": measured,
                        # busbw's error, as the naive predictor's and the case's: a time
                        # error (t / measured - 1) would count a model at half the busbw
                        # as +100% and the naive one at half as -50%
                        "error_pct": 100 * (r.time_s / t - 1),
                        "naive_busbw_GBps": naive,
                        "naive_error_pct": 100 * (naive / measured - 1) if naive else None})
    return out


def kind(small: fabric_file.Sweep, large: fabric_file.Sweep) -> str:
    """"nodes": the same nodes, more of them (a node-count case); "per_node": another number
    of devices per node (the GH200 cases); "other"."""
    if large.gpus_per_node == small.gpus_per_node and large.hosts > small.hosts:
        return "nodes"
    return "per_node" if large.gpus_per_node != small.gpus_per_node else "other"


def hardware_bound(case: Case, large: fabric_file.Sweep) -> tuple[float | None, str]:
    """The most busbw the larger layout's nodes can carry, where the case names its NICs:
    NCCL's ring moves 2(n-1)/n S through each node's NICs, so its busbw is at most the NICs'
    (nccl-tests#160: on 3+ nodes busbw reflects "the total NIC bandwidth"); a tree on 2 nodes
    moves S, so up to 2(n-1)/n times them (NVIDIA/nccl#946: "up to ~2x the network speed")."""
    if not case.nic_GBps:
        return None, ""
    algo, _ = fabric_file.nccl_algorithm(large)
    n = large.ranks
    if algo == "tree":
        return case.nic_GBps * 2 * (n - 1) / n, (f"2(n-1)/n x the node's NICs, {case.nic_GBps:g} GB/s "
                                                 f"({case.nic_source}): a tree on 2 nodes")
    return case.nic_GBps, f"the node's NICs, {case.nic_GBps:g} GB/s ({case.nic_source}): a ring"


def columns_say(case: Case, small: fabric_file.Sweep) -> str:
    """What the smaller output's own columns say of its algorithm: a busbw above the node's
    NICs cannot be a ring's (NVIDIA/nccl#812: 2-node tree busbw "exceed[s] the theoretical limit
    of the network cards"); at or below it, the columns do not tell."""
    if not case.nic_GBps or small.hosts < 2 or (small.gpus_per_node or 0) < 2:
        return ""
    top = max(busbw_GBps(r.bytes, r.time_s, small.ranks) for r in fabric_file.fitted_rows(small)[0])
    if top > case.nic_GBps:
        return f"busbw {top:.1f} GB/s above the NICs' {case.nic_GBps:g}: not a ring"
    return f"busbw {top:.1f} GB/s within the NICs' {case.nic_GBps:g}: the columns do not tell"


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
    both = [r for r in rows if r["naive_error_pct"] is not None]
    model_mean = float(np.mean([abs(r["error_pct"]) for r in both])) if both else None
    naive_mean = float(np.mean([abs(r["naive_error_pct"]) for r in both])) if both else None
    bound, bound_how = hardware_bound(case, large)
    algo, algo_why = fabric_file.nccl_algorithm(multi)
    return {"cluster": case.cluster, "held_out": case.held_out, "note": case.note,
            "kind": kind(multi, large), "small_nodes": sorted({s.hosts for s in small}), "large_nodes": large.hosts,
            "algo": algo, "algo_why": algo_why, "columns": columns_say(case, multi),
            "payloads": len(both), "model_mean_abs_pct": model_mean, "naive_mean_abs_pct": naive_mean,
            "first": "naive" if naive_mean is not None and model_mean is not None and naive_mean < model_mean
            else "model",
            "bound_GBps": bound, "bound_how": bound_how,
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
    held out, of its own kind (node count, devices per node) where there are
    misfit.MIN_ROWS of them, else of every kind; cut at what the larger layout's nodes can
    carry where the case names their NICs (hardware_bound); its width (hi / lo), and
    whether the measured busbw fell inside."""
    rng = np.random.default_rng(seed)
    for r in results:
        pool = [x for x in results if x["cluster"] != r["cluster"] and not x["held_out"]]
        alike = [x for x in pool if x["kind"] == r["kind"]]
        if len(alike) >= misfit.MIN_ROWS:   # the same extrapolation's misfit, where there are enough cases of it
            pool = alike
        tau = misfit.tau_mle([x["error_log"] for x in pool], [x["noise_var"] for x in pool])
        d = misfit.widen(r["_draws"], tau, len(pool), rng)
        tail = 100 * (1 - level) / 2
        lo, hi = np.exp(np.percentile(d, [tail, 100 - tail])) if len(d) else (None, None)
        bounded = bool(hi is not None and r.get("bound_GBps") and hi > r["bound_GBps"])
        if bounded:   # no node carries more than its NICs: the band stops there
            hi = r["bound_GBps"]
            lo = min(lo, hi)
        r.update(misfit=tau, misfit_cases=len(pool), band_lo=float(lo) if lo else None,
                 band_hi=float(hi) if hi else None, band_bounded=bounded,
                 band_width=float(hi / lo) if lo else None,
                 inside=bool(lo <= r["measured_busbw_GBps"] <= hi) if lo else None)
    return results


def summary(results: list[dict]) -> dict:
    """Over the cases not held out and over the held-out ones: mean |error| (%) of the
    model and of the naive busbw, and the band's coverage."""
    def part(rows):
        m = [abs(r["error_pct"]) for r in rows]
        nv = [abs(r["naive_error_pct"]) for r in rows if r["naive_error_pct"] is not None]
        banded = [r for r in rows if r["inside"] is not None]
        widths = [r["band_width"] for r in banded if r.get("band_width")]
        pm = [r["model_mean_abs_pct"] for r in rows if r.get("model_mean_abs_pct") is not None]
        pn = [r["naive_mean_abs_pct"] for r in rows if r.get("naive_mean_abs_pct") is not None]
        model, naive = (float(np.mean(m)) if m else None), (float(np.mean(nv)) if nv else None)
        return {"cases": len(rows), "clusters": len({r["cluster"] for r in rows}),
                "model_mean_abs_pct": model, "naive_mean_abs_pct": naive,
                "first": "naive" if model is not None and naive is not None and naive < model else "model",
                "model_payload_mean_abs_pct": float(np.mean(pm)) if pm else None,
                "naive_payload_mean_abs_pct": float(np.mean(pn)) if pn else None,
                "inside": sum(r["inside"] for r in banded), "banded": len(banded),
                "band_width_median": float(np.median(widths)) if widths else None,
                "band_width_max": float(np.max(widths)) if widths else None}
    return {"checked": part([r for r in results if not r["held_out"]]),
            "held_out": part([r for r in results if r["held_out"]]),
            "nodes": part([r for r in results if r["kind"] == "nodes"])}


def run(manifest, level: float = 0.9, draws: int = 400, seed: int = 0) -> dict:
    results = [check_case(c, draws, seed) for c in read_cases(manifest)]
    band(results, level, seed)
    return {"manifest": str(manifest), "level": level, "cases": results, "summary": summary(results)}
