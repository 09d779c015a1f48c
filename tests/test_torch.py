"""Multi-process tier: every PyTorch experiment at k=1 and k=2 with gloo
processes standing in for GPUs, launched exactly as the workflow launches them
(watchdog + torchrun), plus the failure paths: a crashed rank, a hung
collective, a wrong all-reduce sum."""
from __future__ import annotations

import os
import statistics
import time
from types import SimpleNamespace

import pytest
from conftest import TINY, free_port, make_spec, run_job

from dpscale.analysis import stats
from dpscale.results import validate_result
from dpscale.measure.torch_ddp import throughput_metrics

pytestmark = pytest.mark.multiproc


def ok(res):
    assert res is not None, "no result JSON"
    validate_result(res)
    assert res["status"] == "ok", res.get("reason")
    return res["metrics"]


# Each experiment, each variant and each k twice over, not every combination (~11 s a case on
# two cores): both experiments share one worker, and what differs (the batch per rank, the
# input path) is checked in each case.
# warm: the protocol's warmup_steps (None: the book's warm-up epoch); 20 steps is more than
# an epoch of the seed's DataLoader at k=2 (4 steps), so the warm-up goes round it.
@pytest.mark.parametrize("experiment, variant, k, warm", [
    ("ddp_weak", "seed", 1, None), ("ddp_weak", "cached", 2, 3), ("ddp_strong", "cached", 1, None),
    ("ddp_strong", "seed", 2, 20)])
@pytest.mark.slow
def test_ddp_throughput(tiny_data, tmp_path, experiment, variant, k, warm):
    rc, res, log = run_job(make_spec(tiny_data, experiment, k, variant, proto={"warmup_steps": warm}), tmp_path)
    assert rc == 0, log
    m = ok(res)
    assert m["samples_per_s"] > 0 and len(m["per_rank"]) == k
    batch = 4 if experiment == "ddp_weak" else 8 // k
    assert m["per_rank_batch"] == batch and m["global_batch"] == batch * k
    # every rank saw its own shard: TINY's images / k ranks, whole batches only
    images = TINY["train_images"]
    assert all(r["samples"] == (images // k // batch) * batch for r in m["per_rank"])
    assert res["data"]["source"] == "synthetic" and res["backend"] == "gloo"
    assert m["step_ms_p10"] <= m["step_ms_median"] <= m["step_ms_p90"]
    # repeats: every rank timed each of them; throughput per repeat from the slowest rank
    n = TINY["repeats"]
    assert m["repeats"] == n and len(m["samples_per_s_repeats"]) == n
    assert all(len(r["seconds_repeats"]) == n and r["seconds"] == r["seconds_repeats"][0] for r in m["per_rank"])
    for i, sps in enumerate(m["samples_per_s_repeats"]):
        slowest = max(r["seconds_repeats"][i] for r in m["per_rank"])
        assert sps == pytest.approx(sum(r["samples_repeats"][i] for r in m["per_rank"]) / slowest)
    assert m["samples_per_s"] == m["samples_per_s_repeats"][0]   # the book's figure: the first timed epoch
    lo, hi = m["samples_per_s_ci95"]
    assert lo <= m["samples_per_s_mean"] <= hi and m["samples_per_s_min"] <= m["samples_per_s_median"]
    assert m["epoch_s"] == max(r["seconds"] for r in m["per_rank"])
    assert m["slow_ranks"] == stats.stragglers([r["seconds_repeats"] for r in m["per_rank"]])
    assert f"(timed, repeat {n}/{n})" in log
    assert m["warmup_steps"] == [warm] and m["warmup_s"] > 0
    assert ("warm-up 1/1: epoch" if warm is None else f"warm-up 1/1: {warm} steps, {warm * batch} samples") in log


def test_a_warm_up_of_steps_goes_round_the_epoch_and_ends_on_its_short_batch():
    """warmup_steps=5 over an epoch of 3 batches (4, 4, 2 samples: the DataLoader's short
    last batch): 5 batches of epoch 0 going round it, then one batch of the tail's 2, so
    cuDNN's autotune for that shape is not timed; None: the book's whole epoch."""
    import torch
    from dpscale.measure.torch_ddp import warmup_batches
    epoch = [(torch.full((n, 1), float(i)), torch.zeros(n)) for i, n in enumerate((4, 4, 2))]
    got = [len(X) for X, _ in warmup_batches(lambda e: epoch, 0, 5, tail=2)]
    assert got == [4, 4, 2, 4, 4, 2]
    assert [len(X) for X, _ in warmup_batches(lambda e: epoch, 0, 2, tail=2)] == [4, 4, 2]
    assert [len(X) for X, _ in warmup_batches(lambda e: epoch, 0, 2)] == [4, 4]
    assert [len(X) for X, _ in warmup_batches(lambda e: epoch, 0, None, tail=2)] == [4, 4, 2]


def test_throughput_is_the_slowest_ranks_and_a_straggler_is_flagged():
    """Rank 1 is 10% slower in the second repeat: that repeat's samples/s is both ranks'
    samples over rank 1's seconds, and rank 1 is flagged (> 5% over the median rank)."""
    def row(rank, secs):
        return {"rank": rank, "samples": 100, "seconds": secs[0], "seconds_repeats": secs,
                "samples_repeats": [100] * len(secs), "per_rank_batch": 4, "loss_last": 2.3,
                "peak_mem_MiB": None, "steps": {"median_ms": 10.0 * (1 + rank), "p10_ms": 9.0, "p90_ms": 11.0}}
    rows = [row(0, [1.0, 1.0, 1.02]), row(1, [1.01, 1.2, 1.0])]
    m = throughput_metrics(SimpleNamespace(world=2), rows, None, None)
    assert m["samples_per_s_repeats"] == pytest.approx([200 / 1.01, 200 / 1.2, 200 / 1.02])
    assert m["samples_per_s"] == pytest.approx(200 / 1.01)
    assert m["samples_per_s_per_device"] == pytest.approx(100 / 1.01)
    assert m["slow_ranks"] == [1] and m["epoch_s_repeats"] == [1.01, 1.2, 1.02]
    assert m["step_ms_rank"] == 1 and m["step_ms_median"] == 20.0   # whose steps: the slowest rank's
    iv = stats.interval(m["samples_per_s_repeats"])
    assert m["samples_per_s_ci95"] == [iv["ci_lo"], iv["ci_hi"]] and m["samples_per_s_median"] == iv["median"]


@pytest.mark.slow
def test_tuned_variant_runs_on_cpu_without_compile(tiny_data, tmp_path):
    spec = make_spec(tiny_data, "ddp_weak", 2, "tuned")
    spec["config"]["tuned"] = dict(spec["config"]["tuned"], compile=False)   # inductor on 2 CPU cores takes minutes
    rc, res, log = run_job(spec, tmp_path)
    assert rc == 0, log
    m = ok(res)
    assert m["samples_per_s"] > 0
    # the roofline beside MFU; without measured rates (gloo on CPU) the bytes, no bound
    assert m["roofline_fusion"] == "ideal" and m["roofline_bytes_per_sample_MB"] > 0
    assert "roofline_fraction" not in m and "copy_bandwidth_GBps" not in m


def test_tuned_ddp_compiles_the_model_as_one_graph(monkeypatch):
    """build_ddp compiles the model inside DDP. torch.compile(DDP(model)) graph-breaks
    in DDP.forward, runs the stem, pool and head eagerly and compiles each residual
    block as its own frame (the H200 step was 15% slower). Checked with dynamo's
    counters, on a backend that skips inductor's minutes of code generation."""
    import torch
    import torch.distributed as dist
    from torch._dynamo.utils import counters

    from dpscale.measure import torch_ddp as tr
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: compile_(model, backend="aot_eager"))
    for key, val in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, val)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        torch._dynamo.reset()
        counters.clear()
        ctx = tr.Ctx({"backend": "gloo", "config": {"protocol": {}, "tuned": {"compile": True, "ddp": []}}})
        model = tr.build_ddp(ctx, tuned=True, bucket_cap_mb=10)
        model(torch.randn(2, 1, 16, 16).contiguous(memory_format=torch.channels_last)).sum().backward()
        assert not counters["graph_break"], dict(counters["graph_break"])
        assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
        assert all(p.grad is not None for p in model.parameters())
    finally:
        torch._dynamo.reset()
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2])
def test_fsdp_shards_state(tiny_data, tmp_path, k):
    rc, res, log = run_job(make_spec(tiny_data, "fsdp", k), tmp_path)
    assert rc == 0, log
    m = ok(res)
    # parameters, gradients and momentum are each 1/k of DDP's (up to padding)
    assert m["state_ratio_fsdp_over_ddp"] == pytest.approx(1 / k, rel=0.02)
    assert all(len(m[side]["step_ms_ci95"]) == 2 and m[side]["step_ms_median"] > 0 for side in ("fsdp", "ddp"))
    assert [r["stage"] for r in m["zero_sizing_7B_8x80GB"]] == [0, 1, 2, 3]


ROW_KEYS = {"bytes", "count", "type", "redop", "root", "time_us", "time_us_median", "time_us_ci95", "time_us_cv",
            "iters", "algbw_GBps", "busbw_GBps", "book_GBps", "wrong"}
# The probe's known delay: 200 ms on every third synced backward (a DDP comm hook;
# no_sync() calls none). The undelayed pairs are the control, measured in the same job:
# on this shared 2-core box back-to-back jobs see different loads (gloo's own 45 MB
# all-reduce, ~50 ms of the synced arm, moved by 10-60 ms from job to job), so a
# second job without the hook is no baseline.
# Why 200 ms, not 50: the steps of two gloo ranks sharing two loaded cores vary by
# 20-30 ms, and (likely) a sleeping rank hands its core to the other rank's backward,
# so a 50 ms delay was found as 8-71 ms in eight 45-pair runs at load 1-4; 200 ms was
# found as 194-236 ms in six 30-pair runs at load 3.5-9.
DELAY_MS, EVERY, PAIRS = 200.0, 3, 30
# A quarter of the delay: above the largest error seen (36 ms, at load 9 on 2 cores),
# and far from what 0 ms gives (-11 to +18 ms in nine runs): injecting 0 ms fails.
TOL_MS = 50.0


@pytest.mark.slow
def test_allreduce_and_probe_k2(tiny_data, tmp_path):
    rc, res, log = run_job(make_spec(tiny_data, "allreduce", 2), tmp_path / "ar")
    assert rc == 0, log
    m = ok(res)
    table = m["table"]
    assert set(table) == {"out_of_place", "in_place"} and m["correct"]
    for rows in table.values():
        assert [r["bytes"] for r in rows] == [65536, 262144] and [r["count"] for r in rows] == [16384, 65536]
        for r in rows:
            assert set(r) == ROW_KEYS and r["wrong"] == 0 and r["iters"] == 20 and r["time_us"] > 0
            assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])   # k=2: 2(k-1)/k = 1
            assert r["time_us_ci95"][0] <= r["time_us_median"] <= r["time_us_ci95"][1]
    busbw = [r["busbw_GBps"] for rows in table.values() for r in rows]
    assert m["avg_busbw_GBps"] == pytest.approx(sum(busbw) / len(busbw))
    assert "mean over ranks" in m["time_aggregation"]
    assert "# Out of bounds values : 0 OK" in log and "# Avg bus bandwidth" in log
    assert "out-of-place" in log and "in-place" in log

    spec = make_spec(tiny_data, "ddp_comm_probe", 2, proto={"probe_pairs": PAIRS},
                     inputs={"allreduce": {"2": str(tmp_path / "ar/k.json")}})
    rc, res, log = run_job(spec, tmp_path / "probe", fault=f"delay_comm:ms={DELAY_MS:g}:every={EVERY}")
    assert rc == 0, log
    m = ok(res)
    assert m["pairs"] == PAIRS == len(m["comm_ms_pairs"]) == len(m["synced_ms_pairs"]) == len(m["no_sync_ms_pairs"])
    assert m["comm_ms_pairs"] == pytest.approx([a - b for a, b in zip(m["synced_ms_pairs"], m["no_sync_ms_pairs"])])
    assert m["comm_ms"] == statistics.median(m["comm_ms_pairs"]) and m["comm_vs_zero"] is True
    # the no_sync() arm's ranks kept apart: the trial's time is its slowest rank's, each
    # rank's own row its own median, the straggler share (slowest - mean) / mean per trial
    ranks = m["no_sync_ms_ranks"]
    assert len(ranks) == 2 and all(len(r) == PAIRS for r in ranks) and ranks[0] != ranks[1]
    assert m["no_sync_ms_pairs"] == pytest.approx([max(t) for t in zip(*ranks)])
    assert [r["no_sync_ms_median"] for r in m["per_rank"]] == pytest.approx([statistics.median(r) for r in ranks])
    assert m["straggler_share_pairs"] == pytest.approx([(max(t) - sum(t) / 2) / (sum(t) / 2) for t in zip(*ranks)])
    assert m["straggler_share"] == pytest.approx(statistics.fmean(m["straggler_share_pairs"]))
    assert sum(m["bucket_bytes"]) == m["grad_bytes"] == 4 * 11_175_818
    assert m["pred_flat_ms"] == pytest.approx(m["pred_ring_ms"])  # identical at k=2 by construction
    assert m["beta_placement"] == "in_place" and isinstance(m["comm_vs_pred_flat_ms"], bool)

    delayed = set(m["injected_delay"]["delayed_pairs"])
    assert len(delayed) == PAIRS // EVERY and {i % 2 for i in delayed} == {0, 1}   # both orders delayed
    control = statistics.median([d for i, d in enumerate(m["comm_ms_pairs"]) if i not in delayed])
    mi = stats.median_interval([d for i, d in enumerate(m["comm_ms_pairs"]) if i in delayed])
    found, lo, hi = mi["median"] - control, mi["ci_lo"] - control, mi["ci_hi"] - control
    # found: the median within TOL_MS of the injected delay, which the interval, widened
    # by TOL_MS, contains (injecting 0 ms fails here) ...
    assert abs(found - DELAY_MS) <= TOL_MS, f"found {found:.1f} ms for an injected {DELAY_MS:g} ms"
    assert lo - TOL_MS <= DELAY_MS <= hi + TOL_MS, f"[{lo:.1f}, {hi:.1f}] ms, widened by {TOL_MS}, misses {DELAY_MS}"
    # ... and told apart from no delay at all
    assert lo > 0, f"the delay's interval [{lo:.1f}, {hi:.1f}] ms does not exclude 0"


@pytest.mark.slow
def test_allreduce_k1_is_trivially_correct(tiny_data, tmp_path):
    rc, res, log = run_job(make_spec(tiny_data, "allreduce", 1), tmp_path)
    assert rc == 0, log
    assert ok(res)["correct"]


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["out_of_place", "in_place"])
def test_allreduce_wrong_sum_is_caught(tiny_data, tmp_path, placement):
    rc, res, log = run_job(make_spec(tiny_data, "allreduce", 2), tmp_path, fault=f"wrong_sum:rank=1:at={placement}")
    assert rc == 0, log
    assert res["status"] == "failed" and "wrong all-reduce sum" in res["reason"] and placement in res["reason"], log
    m = res["metrics"]
    assert m["correct"] is False and "# Out of bounds values : 2 FAILED" in log
    for side, rows in m["table"].items():   # one element off on one rank: wrong on both ranks, that placement only
        assert [r["wrong"] for r in rows] == ([2, 2] if side == placement else [0, 0])


@pytest.mark.slow
def test_bucket_sweep_k2(tiny_data, tmp_path):
    rc, res, log = run_job(make_spec(tiny_data, "ddp_bucket_sweep", 2), tmp_path)
    assert rc == 0, log
    rows = ok(res)["sweep"]
    assert [r["bucket_cap_MiB"] for r in rows] == [1, 25]
    assert rows[0]["n_buckets"] > rows[1]["n_buckets"] >= 1   # smaller cap, more buckets
    assert all(len(r["step_ms_ci95"]) == 2 for r in rows)     # [None, None] below 6 steps


def test_memcpy_variants_skip_on_gloo(tiny_data, tmp_path):
    rc, res, _ = run_job(make_spec(tiny_data, "ddp_memcpy_training", 2), tmp_path / "t")
    assert rc == 0 and res["status"] == "skipped" and "gloo" in res["reason"]
    spec = make_spec(tiny_data, "allreduce", 2, "memcpy")
    assert spec["env"] == {"NCCL_SHM_USE_CUDA_MEMCPY": "1", "NCCL_P2P_DISABLE": "1"}
    rc, res, _ = run_job(spec, tmp_path / "a")
    assert rc == 0 and res["status"] == "skipped" and res["env"] == spec["env"]


def test_k_above_devices_is_skipped(tiny_data, tmp_path):
    rc, res, _ = run_job(make_spec(tiny_data, "ddp_weak", 4, "cached"), tmp_path)
    assert rc == 0 and res["status"] == "skipped"
    assert "k=4 needs 4 devices" in res["reason"]
    assert res["code"]["sources_sha256"] and "dpscale.measure.torch_ddp" in res["code"]["sources"]   # every record names its code


@pytest.mark.slow
def test_crashed_rank_is_recorded_failed_and_keeps_log(crashed_runs):
    rc, res, log = crashed_runs["ddp_weak"]   # cached, k=2: test_reliability.py's run, when it ran
    assert rc == 0 and res["status"] == "failed" and res["metrics"] == {}   # no number, a reason
    rank1 = (crashed_runs.folder("ddp_weak") / "k.rank1.log").read_text()
    assert "injected fault: rank 1 crashes" in rank1 and "injected fault" in res["reason"]
    assert "[watchdog] recorded failed: RuntimeError: injected fault" in log


def _pids_of(marker: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        out.append(int(pid))
            except OSError:
                pass
    return out


@pytest.mark.slow
def test_hung_collective_is_recorded_within_limit(tiny_data, tmp_path):
    limit = 8
    spec = make_spec(tiny_data, "allreduce", 2, limit_s=limit)
    t0 = time.monotonic()
    rc, res, log = run_job(spec, tmp_path, fault="hang:rank=1:at=init")
    elapsed = time.monotonic() - t0
    assert rc == 0, log
    assert res["status"] == "hung" and res["metrics"]["hung_after_s"] <= limit + 1
    assert elapsed < limit + spec["grace_s"] + 30   # torch import and teardown included
    assert res["stray_processes"] is False
    assert not _pids_of(str(tmp_path / "k.json")), "a rank survived the watchdog"
    assert "hangs at init" in (tmp_path / "k.rank1.log").read_text()
