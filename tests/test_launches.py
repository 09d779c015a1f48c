"""Independent launches per throughput point: the pure merge (dpscale.run.launches) and
the watchdog running a fake worker several times (no torch, no GPU: a few seconds)."""
from __future__ import annotations

import json
import sys

import pytest

from dpscale.analysis import stats
from dpscale.plan import configcheck
from dpscale.plan.config import ConfigError
from dpscale.run import launches


def launch_result(v: float, repeats=None, gpu_state=None) -> dict:
    reps = repeats or [v, v * 1.02]
    iv = stats.interval(reps)
    out = {"experiment": "ddp_weak", "variant": "cached", "k": 2, "status": "ok", "reason": None,
           "backend": "gloo", "config": {}, "fingerprint": {}, "started_utc": f"t{v}", "finished_utc": f"f{v}",
           "metrics": {"samples_per_s": v, "samples_per_s_repeats": reps, "epoch_s": 1000 / v,
                       "samples_per_s_ci95": [iv["ci_lo"], iv["ci_hi"]], "samples_per_s_cv": iv["cv"]}}
    if gpu_state is not None:
        out["gpu_state"] = gpu_state
    return out


def test_merge_takes_the_median_launch_and_the_interval_across_launches():
    rs = [launch_result(100.0), launch_result(130.0), launch_result(110.0, [110.0, 111.0, 109.0])]
    merged = launches.merge(rs)
    m = merged["metrics"]
    iv = stats.interval([100.0, 130.0, 110.0])
    assert (merged["started_utc"], merged["finished_utc"]) == ("t100.0", "f110.0")   # first launch to last
    assert m["samples_per_s"] == 110.0 and m["representative_launch"] == 3 and m["launches"] == 3
    assert m["epoch_s"] == pytest.approx(1000 / 110)          # every metric from that one launch
    assert m["samples_per_s_launches"] == [100.0, 130.0, 110.0]
    assert m["samples_per_s_launch_repeats"][2] == [110.0, 111.0, 109.0]
    assert m["samples_per_s_ci95"] == [iv["ci_lo"], iv["ci_hi"]]
    assert m["samples_per_s_ci95_covers"] == "independent launches"
    assert m["samples_per_s_within_ci95"] == rs[2]["metrics"]["samples_per_s_ci95"]
    assert m["samples_per_s_within_ci95_covers"] == "timed epochs within one launch"
    assert m["samples_per_s_launches_cv"] == pytest.approx(iv["cv"])
    assert rs[2]["metrics"]["samples_per_s_ci95"] != m["samples_per_s_ci95"]   # the inputs are left alone


def test_an_even_count_takes_the_lower_median_a_real_launch():
    m = launches.merge([launch_result(120.0), launch_result(100.0)])["metrics"]
    assert m["samples_per_s"] == 100.0 and m["representative_launch"] == 2


def test_one_launch_says_its_interval_covers_one_launch():
    r = launch_result(100.0)
    m = launches.merge([r])["metrics"]
    assert m["samples_per_s_ci95"] == r["metrics"]["samples_per_s_ci95"]
    assert m["samples_per_s_ci95_covers"] == "timed epochs within one launch" and m["launches"] == 1


def test_no_half_merges():
    bad = {**launch_result(90.0), "status": "failed", "reason": "x"}
    with pytest.raises(ValueError, match=r"launch\(es\) \[2\]"):
        launches.merge([launch_result(100.0), bad])


def test_gpu_flags_of_any_launch_reach_the_merged_result():
    clean = {"source": "nvml", "flags": [], "devices": [{"id": "g", "samples": [], "slowdowns": [],
                                                         "other_processes": []}]}
    hot = {"source": "nvml", "flags": ["throttled: sw_power_cap"],
           "devices": [{"id": "g", "samples": [], "slowdowns": ["sw_power_cap"], "other_processes": []}]}
    out = launches.merge([launch_result(100.0, gpu_state=clean), launch_result(101.0, gpu_state=hot)])
    assert out["gpu_state"]["flags"] == ["throttled: sw_power_cap"]
    assert "gpu_state" not in launches.merge([launch_result(100.0)])   # CPU: absent, not empty


def test_count_reads_the_protocol():
    assert launches.count({"config": {"protocol": {"launches": 3}}}) == 3
    assert launches.count({"config": {"protocol": {}}}) == 1


# ---------------------------------------------------------------- the watchdog, with a fake worker

FAKE_WORKER = """
import json, pathlib, sys
out, counter, fail_at = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
i = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(i + 1))
if i == fail_at:
    sys.exit("RuntimeError: launch broke")
v = [100.0, 130.0, 110.0][i]
flags = json.loads(sys.argv[4])
json.dump({"experiment": "ddp_weak", "variant": "cached", "k": 1, "status": "ok", "reason": None,
           "backend": "gloo", "config": {}, "fingerprint": {}, "started_utc": "s", "finished_utc": "f",
           "metrics": {"samples_per_s": v, "samples_per_s_repeats": [v, v + 1], "samples_per_s_ci95": [v - 9, v + 10]},
           **({"gpu_state": {"source": "nvml", "flags": flags, "devices": [{"id": "g", "samples": [],
               "slowdowns": [], "other_processes": [{"pid": 9, "name": "other", "used_MiB": 1}]}]}} if flags else {})},
          open(out, "w"))
"""


def run_watchdog(tmp_path, n: int, fail_at: int = -1, flags=(), policy=None):
    from dpscale.run.watchdog import main
    spec = {"experiment": "ddp_weak", "variant": "cached", "k": 1, "backend": "gloo", "limit_s": 60,
            "grace_s": 1, "config": {"protocol": {"launches": n}}, **({"gpu_state": policy} if policy else {})}
    result, counter = tmp_path / "k1.json", tmp_path / "count"
    rc = main(["--spec", json.dumps(spec), "--result", str(result), "--rank-logs", str(tmp_path / "k1.log.ranks"),
               "--lock-dir", str(tmp_path / "locks"), "--", sys.executable, "-c", FAKE_WORKER, str(result),
               str(counter), str(fail_at), json.dumps(list(flags))])
    assert rc == 0
    left = sorted(p.name for p in tmp_path.glob(".k1.launch*"))
    return json.loads(result.read_text()), int(counter.read_text()), left


def test_watchdog_runs_every_launch_and_writes_one_merged_result(tmp_path):
    r, ran, left = run_watchdog(tmp_path, 3)
    assert ran == 3 and left == [] and r["status"] == "ok"
    assert r["metrics"]["samples_per_s"] == 110.0 and r["metrics"]["samples_per_s_launches"] == [100.0, 130.0, 110.0]
    assert r["metrics"]["samples_per_s_ci95_covers"] == "independent launches"


def test_a_failed_launch_fails_the_point_with_its_reason(tmp_path):
    r, ran, left = run_watchdog(tmp_path, 3, fail_at=1)
    assert ran == 2 and left == []          # the third launch never started
    assert r["status"] == "failed" and r["reason"].startswith("launch 2/3: ") and "exit code 1" in r["reason"]
    assert "samples_per_s" not in r["metrics"]


def test_the_gpu_policy_fails_a_shared_device_only_when_told(tmp_path):
    r, _, _ = run_watchdog(tmp_path / "warn", 1, flags=["shared"], policy={"on_shared": "warn", "on_throttle": "warn"})
    assert r["status"] == "ok" and r["gpu_state"]["flags"] == ["shared"]
    r, _, _ = run_watchdog(tmp_path / "fail", 1, flags=["shared"], policy={"on_shared": "fail", "on_throttle": "warn"})
    assert r["status"] == "failed" and "9 (other)" in r["reason"] and r["reason"].startswith("gpu_state: ")


def test_a_bad_gpu_state_policy_is_one_line_naming_the_key():
    with pytest.raises(ConfigError) as e:
        configcheck.check({"gpu_state": {"on_shared": "maybe"}})
    text = str(e.value)
    assert "gpu_state" in text and "on_shared" in text and "maybe" in text and "\n" not in text.strip()


def test_specs_carry_launches_and_on_a_gpu_the_gpu_policy(tmp_path):
    from conftest import CPU_FP, make_spec
    gpu_fp = {**CPU_FP, "gpu_count": 1, "gpu_model": "NVIDIA H200"}
    cpu = make_spec(tmp_path, "ddp_weak", 1, "cached", proto={"launches": 3})
    assert cpu["config"]["protocol"]["launches"] == 3 and "gpu_state" not in cpu   # CPU specs stay as they were
    assert "launches" not in make_spec(tmp_path, "allreduce", 2)["config"]["protocol"]   # not a throughput point
    from dpscale.plan import config, specs
    r = config.resolve({"scale": "smoke", "ks": [1], "tuned": False, "watchdog": {"hang_timeout_s": 60, "grace_s": 1},
                        "data": {"source": "synthetic"}, "experiments": "all",
                        "gpu_state": {"on_shared": "fail"}}, gpu_fp)
    assert r["gpu_state"] == {"on_shared": "fail", "on_throttle": "warn"}
    spec = specs.job_spec(r, gpu_fp, "ddp_weak", "cached", 1, {})
    assert spec["gpu_state"] == {"on_shared": "fail", "on_throttle": "warn"}
    assert spec["config"]["protocol"]["launches"] == 1


def test_launches_of_a_result_without_samples_per_s_are_not_merged():
    r = {**launch_result(1.0), "metrics": {"busbw_GBps": 1.0}}
    with pytest.raises(ValueError, match="nothing to merge them by"):
        launches.merge([r, r])
    assert launches.merge([r]) == r


def test_one_timed_epoch_needs_launches_for_an_interval():
    """Paper times the book's one epoch per launch (repeats 1), its interval over the 3
    launches; one launch of one epoch would have none: the config says so, naming the key."""
    from conftest import CPU_FP
    from dpscale.plan import config
    base = {"ks": [1], "tuned": False, "watchdog": {"hang_timeout_s": 60, "grace_s": 1},
            "data": {"source": "synthetic"}, "experiments": "all"}
    paper = config.resolve({**base, "scale": "paper"}, CPU_FP)["protocol"]
    assert paper["repeats"] == 1 and paper["launches"] == 3
    with pytest.raises(ConfigError, match=r"^scales.paper.repeats: 1 timed epoch in 1 launch .*launches: 2"):
        config.resolve({**base, "scale": "paper", "scales": {"paper": {"launches": 1}}}, CPU_FP)
    assert config.resolve({**base, "scale": "paper", "scales": {"paper": {"launches": 1, "repeats": 2}}},
                          CPU_FP)["protocol"]["repeats"] == 2
    with pytest.raises(ConfigError, match=r"^scales.smoke.repeats: 1 timed"):
        config.resolve({**base, "scale": "smoke", "scales": {"smoke": {"repeats": 1}}}, CPU_FP)


def test_rounds_pool_every_launch_and_keep_one_launch_coherent():
    """Two rounds of one point (dpscale.standin.rounds): every launch listed, the interval
    across all six, the recorded figure and its metrics one launch's (the lower median
    of the rounds'); a probe's pairs concatenated and its median and straggler share
    recomputed; a lone round's result as it was."""
    from dpscale.standin import rounds
    a = launches.merge([launch_result(v) for v in (100.0, 104.0, 102.0)])
    b = launches.merge([launch_result(v) for v in (130.0, 90.0, 120.0)])
    p = rounds.pool([a, b], ["r1", "r2"])
    m = p["metrics"]
    assert m["samples_per_s_launches"] == [100.0, 104.0, 102.0, 130.0, 90.0, 120.0] and m["launches"] == 6
    assert len(m["samples_per_s_launch_repeats"]) == 6 and p["pooled_from"] == ["r1", "r2"]
    iv = stats.interval(m["samples_per_s_launches"])
    assert m["samples_per_s_ci95"] == [iv["ci_lo"], iv["ci_hi"]] and m["samples_per_s_ci95_covers"] == "independent launches"
    assert m["samples_per_s"] == 102.0 and m["epoch_s"] == pytest.approx(1000 / 102.0)   # one launch's, coherent
    assert m["samples_per_s_launches"][m["representative_launch"] - 1] == 102.0

    def probe(synced, silent, shares):
        return {"status": "ok", "metrics": {"synced_ms_pairs": synced, "no_sync_ms_pairs": silent,
                                            "comm_ms_pairs": [x - y for x, y in zip(synced, silent)],
                                            "straggler_share_pairs": shares, "no_sync_ms_ranks": [silent, silent]}}
    q = rounds.pool([probe([10.0, 12.0], [5.0, 6.0], [0.1, 0.2]), probe([20.0], [5.0], [0.6])], ["r1", "r2"])["metrics"]
    assert q["comm_ms_pairs"] == [5.0, 6.0, 15.0] and q["comm_ms"] == 6.0 and q["pairs"] == 3
    assert q["straggler_share"] == pytest.approx(0.3) and q["no_sync_ms_ranks"] == [[5.0, 6.0, 5.0]] * 2
    assert rounds.pool([a], ["r1"]) == a
