"""The book's cost model (section 13.5) and the bandwidth conventions.

Bandwidths follow nccl-tests (github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
  algbw = S / t                       bytes of the buffer over the time
  busbw = algbw * 2 (k-1) / k         for all-reduce: what each link carries,
                                      comparable across k and with the hardware peak
The book's "effective bytes/device/s" (section 13.6's benchmark) is 2 S / t.
GB here is 1e9 bytes, as in nccl-tests.
The compute side, MFU, is defined here once too (mfu_fields), for both frameworks.
"""
from __future__ import annotations

import math


def algbw(size_bytes: float, t_s: float) -> float:
    return size_bytes / t_s


def busbw(size_bytes: float, t_s: float, k: int) -> float:
    return algbw(size_bytes, t_s) * 2 * (k - 1) / k


def mfu_fields(flops_per_sample: int | None, samples_per_s_per_device: float, peak_flops: float | None) -> dict:
    """MFU = counted model FLOPs x samples/s per device / the bf16 matmul FLOP/s measured
    on the same device in the same job; with the numbers it is made of."""
    m = {}
    if flops_per_sample:
        m["flops_per_sample"] = flops_per_sample
        m["achieved_TFLOPs_per_device"] = flops_per_sample * samples_per_s_per_device / 1e12
    if flops_per_sample and peak_flops:
        m["bf16_matmul_peak_TFLOPs"] = peak_flops / 1e12
        m["mfu"] = flops_per_sample * samples_per_s_per_device / peak_flops
    return m


def book_beta(size_bytes: float, t_s: float) -> float:
    return 2 * size_bytes / t_s


def interp_time(sizes: list[float], times: list[float], size: float) -> float:
    """All-reduce time at `size` bytes, log-log interpolated in a measured sweep
    (extrapolated at constant bandwidth past its ends)."""
    pts = sorted(zip(sizes, times))
    if size <= pts[0][0]:
        return pts[0][1] * size / pts[0][0] if size > 0 else 0.0
    if size >= pts[-1][0]:
        return pts[-1][1] * size / pts[-1][0]
    for (s0, t0), (s1, t1) in zip(pts, pts[1:]):
        if s0 <= size <= s1:
            f = (math.log(size) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    raise AssertionError("unreachable")


def allreduce_rows(metrics: dict) -> dict[str, list[dict]]:
    """{placement: rows} of an all-reduce result. Results from before the nccl-tests
    table hold one in-place `sweep` in ms: read as in-place rows in us."""
    if metrics.get("table"):
        return {p: list(rows) for p, rows in metrics["table"].items()}
    rows = [{**r, "time_us": 1e3 * r["time_ms_median"], "time_us_median": 1e3 * r["time_ms_median"],
             "wrong": None if r.get("correct") is None else (0 if r["correct"] else 1)}
            for r in metrics.get("sweep") or []]
    return {"in_place": rows} if rows else {}


def allreduce_sweep(metrics: dict, placement: str = "in_place") -> dict:
    """{"bytes", "time_s", "placement"} of an all-reduce result, for predict_comm.

    `placement` first, else the other one: in-place by default, because DDP's default
    comm hook all-reduces each bucket's flat buffer in place (out-of-place adds a copy
    of the payload). The time is the median over iterations of the slowest rank's."""
    table = allreduce_rows(metrics)
    used = placement if table.get(placement) else "out_of_place" if placement == "in_place" else "in_place"
    rows = table[used]
    return {"bytes": [r["bytes"] for r in rows], "time_s": [r["time_us_median"] / 1e6 for r in rows],
            "placement": used}


def predict_comm(bucket_bytes: list[float], sweep_k2: dict, k: int) -> dict:
    """Predicted communication time per step for DDP's buckets.

    sweep_k2: {"bytes": [...], "time_s": [...]} measured at k=2.
    - flat (Eq. 13.5.2): t = sum_b 2 S_b / beta(S_b), beta measured once at k=2 and
      assumed not to change with k;
    - ring (Eq. 13.5.1): the per-link bandwidth from k=2 (busbw), scaled by the
      2(k-1)/k bytes each device sends: t = sum_b 2(k-1)/k * S_b / busbw_2(S_b).
    At k=2 the two agree by construction; exercise 2 asks which fits at k=4.
    """
    flat = ring = 0.0
    for s in bucket_bytes:
        t2 = interp_time(sweep_k2["bytes"], sweep_k2["time_s"], s)
        beta = book_beta(s, t2)
        flat += 2 * s / beta
        ring += 2 * (k - 1) / k * s / busbw(s, t2, 2)
    return {"pred_flat_ms": 1e3 * flat, "pred_ring_ms": 1e3 * ring}


def zero_table(params: float = 7e9, k: int = 8, gpu_GB: float = 80.0,
               bytes_param: float = 4, bytes_grad: float = 4, bytes_opt: float = 8) -> list[dict]:
    """Exercise 5: per-GPU training state for ZeRO stages 0-3 (activations excluded).

    Defaults are the book's 16P anatomy (section 13.4): fp32 weights (4P), fp32
    gradients (4P), Adam's two fp32 moments (8P). Stage 0 is DDP (nothing sharded).
    """
    p, g, o = params * bytes_param, params * bytes_grad, params * bytes_opt
    stages = {0: (p, g, o), 1: (p, g, o / k), 2: (p, g / k, o / k), 3: (p / k, g / k, o / k)}
    rows = []
    for stage, (pp, gg, oo) in stages.items():
        total = (pp + gg + oo) / 1e9
        rows.append({"stage": stage, "params_GB": pp / 1e9, "grads_GB": gg / 1e9,
                     "optimizer_GB": oo / 1e9, "total_GB": total, "gpu_GB": gpu_GB,
                     "fits": total <= gpu_GB, "k": k, "n_params": params})
    return rows
