"""Communication, measured: the paired no_sync() probe against the cost model, and the
bare all-reduce as nccl-tests measures and prints it (out-of-place and in-place).
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fcol
from torch import nn

from dpscale.analysis import costmodel, probe, stats
from dpscale.results import load_result
from dpscale.measure.timing import summary, sync
from dpscale.measure.torch_ddp import bucket_sizes, build_ddp
from dpscale.measure.torch_job import Ctx, per_rank_merge, synthetic_batch


def install_comm_delay(ctx: Ctx, model) -> list[bool] | None:
    """Test hook (DPSCALE_FAULT=delay_comm:ms=M[:every=N][:rank=R]): a DDP comm hook
    that sleeps M ms at the first bucket of every N-th synced backward (N=1: all of
    them; every rank without rank=), then all-reduces as DDP's default hook does.
    Under no_sync() DDP calls no hook, so the delay lands on the synced arm only: a
    known comm cost for the probe to recover. With N > 1 the undelayed pairs are a
    control measured in the same job, under the same load. Returns the list the hook
    appends to, one flag per synced backward: whether it slept."""
    f = ctx.fault
    if not f or f["kind"] != "delay_comm" or f.get("rank", ctx.rank) != ctx.rank:
        return None
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    delay_s, every = float(f.get("ms", 50)) / 1e3, int(f.get("every", 1))
    slept: list[bool] = []

    def delayed(state, bucket):
        if bucket.index() == 0:   # once per backward
            slept.append((len(slept) + 1) % every == 0)
            if slept[-1]:
                time.sleep(delay_s)
        return allreduce_hook(state, bucket)
    model.register_comm_hook(None, delayed)
    ctx.log(f"injected delay: {1e3 * delay_s:g} ms in every {every} synced backward(s) (first bucket)")
    return slept


def trial_ms(ctx: Ctx, fn) -> float:
    """One call of fn, timed from a device sync and a barrier to a device sync."""
    sync(ctx.device)
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    sync(ctx.device)
    return 1e3 * (time.perf_counter() - t0)


def paired_trials(ctx: Ctx, synced, silent, pairs: int) -> torch.Tensor:
    """`pairs` pairs of one synced and one no_sync() trial, synced first on even pairs
    and second on odd ones, so a slow drift (clocks, thermals, a neighbour's load)
    adds the same to both arms and cancels in the difference. Returns every rank's ms
    per trial, [world, pairs, 2] (arm 0 synced, 1 no_sync); every trial starts at a
    barrier, so the slowest rank's time is the trial's."""
    mine = torch.zeros(pairs, 2, dtype=torch.float64)
    for i in range(pairs):
        for arm in ((0, 1) if i % 2 == 0 else (1, 0)):
            mine[i, arm] = trial_ms(ctx, (synced, silent)[arm])
        if i == 0:
            ctx.maybe_fault("step")
    # Trap: on a CPU device .to() returns the same tensor, so a collective on it in place
    # overwrote this rank's own times with the slowest's: gather copies instead.
    every = [torch.zeros_like(mine, device=ctx.device) for _ in range(ctx.world)]
    dist.all_gather(every, mine.to(ctx.device))
    return torch.stack([t.cpu() for t in every])


def probe_predictions(ctx: Ctx, buckets: list[int]) -> dict:
    """The cost model's comm time for these buckets, priced with the k=2 all-reduce sweep."""
    path = ctx.spec["inputs"].get("allreduce", {}).get("2")
    if not path:
        return {}
    res = load_result(path)
    if res["status"] != "ok":
        return {}
    sweep = costmodel.allreduce_sweep(res["metrics"])
    return {**costmodel.predict_comm(buckets, sweep, ctx.world), "beta_source": path,
            "beta_placement": sweep["placement"]}


def exp_comm_probe(ctx: Ctx):
    """synced vs no_sync() step time in interleaved pairs: the paired difference
    estimates what communication costs a step, against the cost model's predictions."""
    model = build_ddp(ctx)
    slept = install_comm_delay(ctx, model)
    loss_fn = nn.CrossEntropyLoss()
    X, y = synthetic_batch(ctx, ctx.proto["per_rank_batch"])

    def fwd_bwd():
        model.zero_grad(set_to_none=True)
        loss_fn(model(X), y).backward()

    def silent():
        with model.no_sync():
            fwd_bwd()
    for _ in range(ctx.proto["probe_warmup"]):
        fwd_bwd()
        silent()
    every = paired_trials(ctx, fwd_bwd, silent, ctx.proto["probe_pairs"])
    slowest = every.max(dim=0).values
    mine = every[ctx.rank]
    rows = per_rank_merge(ctx, {"synced_ms_median": statistics.median(mine[:, 0].tolist()),
                                "no_sync_ms_median": statistics.median(mine[:, 1].tolist())})
    buckets = bucket_sizes(ctx)
    n_bytes = 4 * sum(p.numel() for p in model.parameters())
    m = {**probe.paired(slowest[:, 0].tolist(), slowest[:, 1].tolist()), **probe.stragglers(every[:, :, 1].tolist()),
         "grad_bytes": n_bytes, "bucket_bytes": buckets,
         "per_rank": rows, "book_beta_GBps": 4.5, "pred_book_ms": 1e3 * 2 * n_bytes / 4.5e9}
    m.update(probe_predictions(ctx, buckets or [n_bytes]))
    m.update(probe.verdicts(m))
    lo, hi = m["comm_ms_ci95"]
    if slept is not None:   # a result measured with the test hook says so, and where it slept
        w = ctx.proto["probe_warmup"]
        m["injected_delay"] = {"ms": float(ctx.fault.get("ms", 50)), "every": int(ctx.fault.get("every", 1)),
                               "delayed_pairs": [i for i, s in enumerate(slept[w:]) if s]}
    if ctx.rank == 0:
        iv = f"95% [{lo:.2f}, {hi:.2f}]" if lo is not None else "no interval"
        ctx.log(f"comm {m['comm_ms']:.2f} ms, {iv} over {m['pairs']} pairs "
                f"(medians: synced {m['synced_ms']:.2f} ms, no_sync {m['no_sync_ms']:.2f} ms); the slowest rank's "
                f"no_sync step {100 * m['straggler_share']:.1f}% over the ranks' mean")
    return m


# ---------------------------------------------------------------- all-reduce, as nccl-tests

PLACEMENTS = ("out_of_place", "in_place")   # nccl-tests' order, per size
TIME_AGGREGATION = (
    "time_us as nccl-tests' default (-a 1, src/common.cu BenchTime): per rank, a host clock around the "
    "timed calls issued back to back, stopped after a device sync, divided by the calls; then the mean "
    "over ranks. algbw, busbw and the Avg bus bandwidth come from it. time_us_median, _ci95 and _cv: per "
    "call, the slowest rank's time (CUDA events; perf_counter on gloo), then the median over calls with "
    "its order-statistic 95% interval, and the cv")
PLACEMENT_TEXT = {
    "out_of_place": "torch.distributed._functional_collectives.all_reduce: a copy into a new output, "
                    "then the in-place all-reduce of that output",
    "in_place": "torch.distributed.all_reduce on the input"}


def allreduce_op(placement: str):
    """x -> the reduced tensor. in_place: dist.all_reduce on x. out_of_place: the
    functional all_reduce, which returns a new tensor and leaves x alone. Trap: c10d
    implements it as x.clone() into a fresh contiguous output, then the in-place
    all-reduce of that output (torch/csrc/distributed/c10d/Functional.cpp), so torch's
    out-of-place is a device copy plus NCCL's in-place kernel, where nccl-tests hands
    NCCL distinct send and receive buffers."""
    if placement == "in_place":
        def in_place(x):
            dist.all_reduce(x)
            return x
        return in_place
    return lambda x: fcol.wait_tensor(fcol.all_reduce(x, "sum", dist.group.WORLD))


def wrong_elements(ctx: Ctx, op, n: int, placement: str) -> int:
    """nccl-tests' check: every rank's input filled with rank + 1, so every element of
    the sum is k(k+1)/2; the elements that are not, summed over ranks (its #wrong)."""
    x = torch.full((n,), float(ctx.rank + 1), device=ctx.device)
    if ctx.corrupts(placement):
        x[n // 2] += 1.0   # test hook: one element of this rank's input is off
    bad = (op(x) != ctx.world * (ctx.world + 1) / 2).sum()
    dist.all_reduce(bad)
    return int(bad.item())


def call_clock(ctx: Ctx, calls: int):
    """(mark(i), read() -> ms per call) from boundary marks between back-to-back calls,
    as nccl-tests' per-iteration timing. CUDA events are made before the loop: making
    one per call would add host time to the calls being timed."""
    if ctx.cuda:
        events = [torch.cuda.Event(enable_timing=True) for _ in range(calls + 1)]
        return (lambda i: events[i].record(),
                lambda: [a.elapsed_time(b) for a, b in zip(events, events[1:])])
    stamps = [0.0] * (calls + 1)

    def mark(i):
        stamps[i] = time.perf_counter()
    return mark, lambda: [1e3 * (b - a) for a, b in zip(stamps, stamps[1:])]


def time_allreduce(ctx: Ctx, op, x, warmup: int, iters: int) -> tuple[float, list[float]]:
    """(seconds per call, nccl-tests' aggregate: mean over ranks of each rank's mean;
    ms of every call, the slowest rank's)."""
    for _ in range(warmup):
        op(x)
    sync(ctx.device)
    dist.barrier()
    mark, read = call_clock(ctx, iters)
    t0 = time.perf_counter()
    for i in range(iters):
        mark(i)
        op(x)
    mark(iters)
    sync(ctx.device)
    mean_s = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(mean_s)   # summed, then / k below: nccl-tests -a 1
    per_call = torch.tensor(read(), dtype=torch.float64, device=ctx.device)
    dist.all_reduce(per_call, op=dist.ReduceOp.MAX)   # a call ends when its slowest rank ends
    return mean_s.item() / ctx.world, per_call.tolist()


def allreduce_row(n: int, wrong: int, mean_s: float, per_call_ms: list[float], k: int) -> dict:
    size = 4 * n
    mi = stats.median_interval(per_call_ms)
    ci = [1e3 * mi["ci_lo"], 1e3 * mi["ci_hi"]] if mi["ci_lo"] is not None else [None, None]
    return {"bytes": size, "count": n, "type": "float", "redop": "sum", "root": -1,
            "time_us": 1e6 * mean_s, "time_us_median": 1e3 * mi["median"], "time_us_ci95": ci,
            "time_us_cv": summary(per_call_ms)["cv"], "iters": len(per_call_ms),
            "algbw_GBps": costmodel.algbw(size, mean_s) / 1e9,
            "busbw_GBps": costmodel.busbw(size, mean_s, k) / 1e9,
            "book_GBps": costmodel.book_beta(size, mean_s) / 1e9, "wrong": wrong}


def allreduce_metrics(table: dict, k: int) -> dict:
    rows = [r for p in PLACEMENTS for r in table[p]]
    oop = {r["bytes"]: r for r in table["out_of_place"]}
    m = {"table": table, "placements": PLACEMENT_TEXT, "time_aggregation": TIME_AGGREGATION,
         # nccl-tests' 'Avg bus bandwidth': the mean busbw over every row of both placements
         "avg_busbw_GBps": statistics.fmean(r["busbw_GBps"] for r in rows),
         "wrong_total": sum(r["wrong"] for r in rows), "correct": all(r["wrong"] == 0 for r in rows)}
    for mib in (64, 256):
        if mib * 2**20 in oop:
            m[f"busbw_GBps_{mib}MiB"] = oop[mib * 2**20]["busbw_GBps"]
    m["busbw_GBps_max"] = max(r["busbw_GBps"] for r in oop.values())
    if not m["correct"]:
        bad = "; ".join(f"{p} at {r['bytes'] / 2**20:g} MiB: {r['wrong']} wrong element(s)"
                        for p in PLACEMENTS for r in table[p] if r["wrong"])
        m["_status"] = ("failed", f"correctness check failed: wrong all-reduce sum ({bad}); expected every "
                        f"element = k(k+1)/2 = {k * (k + 1) / 2:g}")
    return m


def _nccl_float(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: the most decimals (2, 1, 0) that fit the width, else e-notation."""
    for digits in (2, 1, 0):
        text = f"{value:{width}.{digits}f}"
        if len(text) <= width:
            return text
    return f"{value:{width}.{1 if width >= 7 else 0}e}"


def nccl_header(ctx: Ctx, counts: list[int]) -> str:
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if ctx.cuda else None
    blank = f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}"
    return "\n".join([
        "# dpscale allreduce in nccl-tests' layout (all_reduce_perf, nccl-tests 2.19.6), through torch.distributed",
        f"# torch {torch.__version__}, backend {ctx.spec['backend']}" + (f" (NCCL {nccl})" if nccl else "")
        + f", {ctx.world} rank(s), one device per process",
        f"# minBytes {4 * min(counts)} maxBytes {4 * max(counts)} sizes: {len(counts)} "
        f"warmup iters: {ctx.proto['allreduce_warmup']} iters: {ctx.proto['allreduce_iters']} agg iters: 1 "
        "validation: 1 (before timing) graph: 0",
        "# time: mean over ranks of each rank's mean per call (nccl-tests -a 1); out-of-place: "
        "functional all_reduce (copy + in-place)", "#",
        f"{blank}           out-of-place                       in-place          ",
        f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}"
        + f"  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}" * 2,
        f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}"
        + f"  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}" * 2])


def nccl_line(rows: list[dict]) -> str:
    """One size, out-of-place then in-place, in nccl-tests' columns."""
    r0 = rows[0]
    return f"{r0['bytes']:12d}  {r0['count']:12d}  {'float':>8}  {'sum':>6}  {-1:6d}" + "".join(
        f"  {_nccl_float(r['time_us'], 7)}  {_nccl_float(r['algbw_GBps'], 6)}  {_nccl_float(r['busbw_GBps'], 6)}"
        f"  {r['wrong']:6g}" for r in rows)


def nccl_footer(m: dict) -> str:
    failed = sum(1 for p in PLACEMENTS for r in m["table"][p] if r["wrong"])   # nccl-tests counts tests, not elements
    return "\n".join([f"# {'Out of bounds values':<20} : {failed} {'FAILED' if failed else 'OK'}",
                      f"# {'Avg bus bandwidth':<20} : {m['avg_busbw_GBps']:g} ", "#"])


def exp_allreduce(ctx: Ctx):
    """nccl-tests' all_reduce_perf in torch.distributed: per payload, out-of-place then
    in-place, each with a correctness check, warm-up and allreduce_iters timed calls.
    Rank 0 prints the table in nccl-tests' layout (print, not ctx.log: no prefixes)."""
    counts = [int(mib * 2**20) // 4 for mib in ctx.proto["allreduce_MiB"]]
    table = {p: [] for p in PLACEMENTS}
    if ctx.rank == 0:
        print(nccl_header(ctx, counts), flush=True)
    for n in counts:
        for placement in PLACEMENTS:
            op = allreduce_op(placement)
            wrong = wrong_elements(ctx, op, n, placement)
            x = torch.empty(n, device=ctx.device).normal_()
            ctx.maybe_fault("step")
            mean_s, per_call = time_allreduce(ctx, op, x, ctx.proto["allreduce_warmup"], ctx.proto["allreduce_iters"])
            table[placement].append(allreduce_row(n, wrong, mean_s, per_call, ctx.world))
            del x
        if ctx.rank == 0:
            print(nccl_line([table[p][-1] for p in PLACEMENTS]), flush=True)
    m = allreduce_metrics(table, ctx.world)
    if ctx.rank == 0:
        print(nccl_footer(m), flush=True)
    return m
