"""Pure logic, fast: cost model, results contract, config resolution, specs and
reruns, fingerprint, timing, the watchdog's process-group kill."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
import subprocess
import sys
import time

import pytest
from conftest import CPU_FP, ROOT

from dpscale.plan import config as dsconfig, fingerprint, specs
from dpscale.analysis import costmodel
from dpscale.measure import timing
from dpscale import results


# ---------------------------------------------------------------- cost model

def test_bandwidth_definitions_follow_nccl_tests():
    size, t = 64 * 2**20, 0.01
    assert costmodel.algbw(size, t) == size / t
    assert costmodel.busbw(size, t, 2) == pytest.approx(size / t)          # 2(k-1)/k = 1
    assert costmodel.busbw(size, t, 8) == pytest.approx(size / t * 1.75)
    assert costmodel.book_beta(size, t) == 2 * size / t


def test_interp_is_exact_on_points_and_monotone_between():
    sizes, times = [1e6, 1e7, 1e8], [1e-4, 5e-4, 4e-3]
    for s, t in zip(sizes, times):
        assert costmodel.interp_time(sizes, times, s) == pytest.approx(t)
    mid = costmodel.interp_time(sizes, times, 3e6)
    assert 1e-4 < mid < 5e-4
    assert costmodel.interp_time(sizes, times, 2e8) == pytest.approx(8e-3)   # constant bw past the end


def test_predictions_agree_at_k2_and_part_at_k4():
    sweep = {"bytes": [1e6, 1e8], "time_s": [1e-3, 1e-2]}
    p2 = costmodel.predict_comm([25e6, 20e6], sweep, 2)
    assert p2["pred_flat_ms"] == pytest.approx(p2["pred_ring_ms"])
    p4 = costmodel.predict_comm([25e6, 20e6], sweep, 4)
    assert p4["pred_flat_ms"] == pytest.approx(p2["pred_flat_ms"])           # flat in k
    assert p4["pred_ring_ms"] == pytest.approx(1.5 * p2["pred_ring_ms"])     # 2(k-1)/k: 1 -> 1.5


def test_allreduce_sweep_reads_the_table_and_old_results():
    row = {"bytes": 2**20, "time_us_median": 100.0}
    table = {"out_of_place": [dict(row, time_us_median=120.0)], "in_place": [row]}
    assert costmodel.allreduce_sweep({"table": table}) == {"bytes": [2**20], "time_s": [1e-4], "placement": "in_place"}
    assert costmodel.allreduce_sweep({"table": {"out_of_place": [row]}})["placement"] == "out_of_place"
    old = {"sweep": [{"MiB": 1, "bytes": 2**20, "time_ms_median": 0.1, "correct": True}]}   # before the table
    assert costmodel.allreduce_sweep(old) == {"bytes": [2**20], "time_s": [1e-4], "placement": "in_place"}


def test_spread_fields_over_repeats():
    f = timing.spread_fields("samples_per_s", [100.0, 110.0, 90.0])
    assert f["samples_per_s_repeats"] == [100.0, 110.0, 90.0] and f["samples_per_s_median"] == 100.0
    assert (f["samples_per_s_min"], f["samples_per_s_max"], f["samples_per_s_mean"]) == (90.0, 110.0, 100.0)
    lo, hi = f["samples_per_s_ci95"]
    assert lo == pytest.approx(100 - 4.303 * 10 / 3 ** 0.5, abs=0.01) and hi == pytest.approx(200 - lo)
    assert f["samples_per_s_ci95_covers"] == "timed epochs within one launch"
    assert timing.spread_fields("x", [1.0])["x_ci95"] == [None, None]


def test_zero_table_book_anatomy():
    rows = {r["stage"]: r for r in costmodel.zero_table()}
    assert rows[0]["total_GB"] == pytest.approx(112) and not rows[0]["fits"]   # 16 B x 7e9
    assert rows[1]["total_GB"] == pytest.approx(56 + 7)
    assert rows[2]["total_GB"] == pytest.approx(28 + 10.5)
    assert rows[3]["total_GB"] == pytest.approx(14) and rows[3]["fits"]


# ---------------------------------------------------------------- results

def test_atomic_write_leaves_old_file_when_writing_fails(tmp_path):
    p = tmp_path / "r.json"
    results.write_json_atomic(p, {"a": 1})
    with pytest.raises(TypeError):
        results.write_json_atomic(p, {"a": object()})
    assert json.loads(p.read_text()) == {"a": 1}
    assert [f.name for f in tmp_path.iterdir()] == ["r.json"], "temp file left behind"


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_atomic_write_gives_the_mode_the_umask_asks(tmp_path, umask):
    """A result is readable as any file the user writes is (a shared box, a web server
    serving report.html), not mkstemp's 0600."""
    old = os.umask(umask)
    try:
        results.write_atomic(tmp_path / "r.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o666 & ~umask


def test_contract_validation():
    r = results.make_result(experiment="allreduce", variant="default", k=2, status="ok",
                            metrics={"busbw_GBps_max": 1.0}, backend="gloo")
    assert results.validate_result(r) is r
    with pytest.raises(ValueError, match="needs a reason"):
        results.make_result(experiment="allreduce", variant="default", k=2, status="hung", backend="gloo")
    bad = dict(r, status="weird")
    with pytest.raises(ValueError, match="status 'weird'"):
        results.validate_result(bad, "x.json")


def test_load_result_names_the_file_on_garbage(tmp_path):
    p = tmp_path / "half.json"
    p.write_text('{"experiment": "allr')
    with pytest.raises(ValueError, match="half.json: unreadable: not valid JSON"):
        results.load_result(p)


# ---------------------------------------------------------------- config

def _config(**over):
    sch = dsconfig.schema()
    cfg = {"scale": "smoke", "ks": [1, 2], "hardware_file": None, "tuned": "auto",
           "data": {"source": "auto", "local_dir": None}, "watchdog": {"hang_timeout_s": "auto", "grace_s": 15},
           "experiments": sch["properties"]["experiments"]["default"], "scales": {}}
    cfg.update(over)
    return cfg


def test_a_home_relative_local_dir_is_checked_as_the_users_home(tmp_path, monkeypatch):
    (tmp_path / "fm").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    dsconfig.resolve(_config(data={"source": "local", "local_dir": "~/fm"}), CPU_FP)
    with pytest.raises(dsconfig.ConfigError, match="'~/nope' is not a folder"):
        dsconfig.resolve(_config(data={"source": "local", "local_dir": "~/nope"}), CPU_FP)


def test_auto_scale_follows_gpus():
    assert dsconfig.resolve(_config(scale="auto"), CPU_FP)["scale"] == "smoke"
    gpu = dict(CPU_FP, gpu_count=1, gpu_model="NVIDIA H200")
    r = dsconfig.resolve(_config(scale="auto", ks=[1, 2, 4]), gpu)
    assert r["scale"] == "paper" and r["protocol"]["per_rank_batch"] == 256 and r["tuned"]
    assert r["watchdog"]["hang_timeout_s"] == 900


def test_extended_variants_are_planned_on_request_only():
    """The registry's `extended` variants: planned at no scale by default, at every scale
    with extended=true; whatever is planned, the rest stays the same."""
    from dpscale import registry
    gpu = dict(CPU_FP, gpu_count=1, gpu_model="NVIDIA H200")
    marked = {(e.name, v.name) for e in registry.EXPERIMENTS.values() for v in e.variants if v.extended}
    assert ("ddp_tta", "linear") in marked and ("ddp_weak", "cached") not in marked
    paper = {(e, v) for e, v, _ in specs.planned(dsconfig.resolve(_config(scale="auto", ks=[1]), gpu))}
    everything = {(e, v) for e, v, _ in specs.planned(dsconfig.resolve(_config(scale="auto", ks=[1], extended=True), gpu))}
    assert not paper & marked and everything - paper == marked & everything and ("ddp_tta", "book_fp32") in everything
    smoke = {(e, v) for e, v, _ in specs.planned(dsconfig.resolve(_config(ks=[1, 2], extended=True), CPU_FP))}
    assert ("jax_weak", "device") in smoke and ("ddp_tta", "linear") in smoke
    assert not {(e, v) for e, v, _ in specs.planned(dsconfig.resolve(_config(ks=[1, 2]), CPU_FP))} & marked


def test_global_batch_not_divisible_shows_the_arithmetic():
    with pytest.raises(dsconfig.ConfigError) as e:
        dsconfig.resolve(_config(ks=[1, 3]), CPU_FP)
    assert "scales.smoke.global_batch: 16 is not divisible by k=3" in str(e.value)
    assert "16 / 3 = 5.33333" in str(e.value)


def test_protocol_override_merges_with_defaults():
    r = dsconfig.resolve(_config(scales={"smoke": {"image_size": 16}}), CPU_FP)
    assert r["protocol"]["image_size"] == 16 and r["protocol"]["per_rank_batch"] == 8


def test_cli_strings_are_coerced_by_schema():
    cfg = {"ks": ["1", "2"], "hardware_file": "null", "tuned": "false",
           "watchdog": {"hang_timeout_s": "30"}, "scales": {"smoke": {"allreduce_MiB": ["0.5", "1"]}}}
    dsconfig.coerce_cli_types(cfg)
    assert cfg["ks"] == [1, 2] and cfg["hardware_file"] is None and cfg["tuned"] is False
    assert cfg["watchdog"]["hang_timeout_s"] == 30 and cfg["scales"]["smoke"]["allreduce_MiB"] == [0.5, 1]
    odd = {"ks": ["1.5", "x"]}
    dsconfig.coerce_cli_types(odd)
    assert odd["ks"] == [1.5, "x"]   # left for the schema to reject, naming ks


# ---------------------------------------------------------------- specs: what reruns

def _resolved(**over):
    return dsconfig.resolve(_config(**over), CPU_FP)


def test_targets_per_experiment():
    t = specs.targets(_resolved(ks=[1, 2, 4]))
    assert "results/runs/ddp_weak/seed/k4.json" in t and "results/runs/ddp_weak/tuned/k1.json" not in t
    assert "results/runs/allreduce/memcpy/k2.json" in t and "results/runs/allreduce/default/k1.json" not in t
    assert [p for p in t if "ddp_bucket_sweep" in p] == ["results/runs/ddp_bucket_sweep/default/k2.json"]
    assert [p for p in t if "jax_equality" in p] == ["results/runs/jax_equality/default/k2.json"]


def test_spec_depends_only_on_what_the_experiment_reads():
    a = specs.job_spec(_resolved(), CPU_FP, "ddp_weak", "cached", 1, {})
    b = specs.job_spec(_resolved(scales={"smoke": {"allreduce_MiB": [8]}}), CPU_FP, "ddp_weak", "cached", 1, {})
    assert specs.dumps(a) == specs.dumps(b)
    c = specs.job_spec(_resolved(scales={"smoke": {"image_size": 16}}), CPU_FP, "ddp_weak", "cached", 1, {})
    assert specs.dumps(a) != specs.dumps(c)


def test_more_devices_do_not_change_k1_but_enable_k2():
    one = dict(CPU_FP, gpu_count=1, gpu_model="H200")
    two = dict(one, gpu_count=2, interconnect="NV18")
    r = _resolved()
    k1 = [specs.dumps(specs.job_spec(r, fp, "ddp_weak", "cached", 1, {})) for fp in (one, two)]
    assert k1[0] == k1[1]
    k2 = [specs.job_spec(r, fp, "ddp_weak", "cached", 2, {}) for fp in (one, two)]
    assert k2[0]["skip_reason"] and not k2[1]["skip_reason"]
    changed = dict(one, driver="999.0")
    assert specs.dumps(specs.job_spec(r, changed, "ddp_weak", "cached", 1, {})) != k1[0]


def test_a_lone_k1_is_skipped_where_no_k2_can_run_unless_another_result_reads_it():
    """One GPU: a series' k=1 is a number with no ratio, so it is skipped, saying why; the
    k=1 time to accuracy reads its samples/s from (the tuned step on a GPU) is measured;
    two devices, or lone_k1=true, measure every k=1."""
    gpu = dict(CPU_FP, gpu_count=1, gpu_model="H200")
    cfg = {**dsconfig_defaults(), "tuned": "auto"}
    r = dsconfig.resolve(cfg, gpu)
    skipped = {(e, v) for e, v, k in specs.planned(r) if k == 1
               and (specs.job_spec(r, gpu, e, v, 1, {})["skip_reason"] or "").startswith(specs.LONE_K1)}
    assert skipped == {("ddp_weak", "seed"), ("ddp_weak", "cached"), ("ddp_strong", "cached"), ("fsdp", "default"),
                       ("jax_weak", "host")}, skipped
    assert not specs.job_spec(r, gpu, "ddp_weak", "tuned", 1, {})["skip_reason"]   # time to accuracy's rate
    assert not specs.job_spec(r, gpu, "ddp_tta", "book", 1, {})["skip_reason"]
    two = dict(gpu, gpu_count=2)
    assert all(not specs.job_spec(dsconfig.resolve(cfg, two), two, e, v, 1, {})["skip_reason"] for e, v in skipped)
    on = dsconfig.resolve({**cfg, "lone_k1": True}, gpu)
    assert all(not specs.job_spec(on, gpu, e, v, 1, {})["skip_reason"] for e, v in skipped)


def dsconfig_defaults() -> dict:
    """config.yaml with every schema default filled in, as the workflow sees it."""
    import yaml
    from snakemake.utils import validate
    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    validate(cfg, str(ROOT / "schemas" / "config.schema.yaml"))
    return cfg


def test_jax_specs_ignore_torch_versions():
    r = _resolved()
    a = specs.job_spec(r, CPU_FP, "jax_weak", "host", 1, {})
    b = specs.job_spec(r, dict(CPU_FP, torch="9.9"), "jax_weak", "host", 1, {})
    assert specs.dumps(a) == specs.dumps(b)


# ---------------------------------------------------------------- fingerprint

TOPO = """\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV18\tSYS\t0-15\t0
GPU1\tNV18\t X \tNV18\t0-15\t0
GPU2\tSYS\tNV18\t X \t0-15\t0

Legend:
  X    = Self
  SYS  = Connection traversing PCIe
"""


def test_topology_summary():
    assert fingerprint.summarise_topology(TOPO) == "NV18,SYS"
    assert fingerprint.summarise_topology(None) == "none"


def test_probe_is_cheap_and_complete():
    t0 = time.perf_counter()
    fp = fingerprint.probe()
    assert time.perf_counter() - t0 < 5
    for key in ("gpu_count", "torch", "jax", "cpu_model", "cpu_count", "nccl", "interconnect"):
        assert key in fp


def test_probe_does_not_import_torch_or_jax():
    code = ("import sys; sys.path.insert(0, 'src'); from dpscale.plan import fingerprint; fingerprint.probe(); "
            "print('torch' in sys.modules, 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(__file__))).stdout
    assert out.strip() == "False False"


def test_save_only_when_changed(tmp_path):
    p = tmp_path / "fp.json"
    assert fingerprint.save_if_changed({"a": 1}, p)
    mtime = p.stat().st_mtime_ns
    assert not fingerprint.save_if_changed({"a": 1}, p) and p.stat().st_mtime_ns == mtime
    assert fingerprint.save_if_changed({"a": 2}, p)


def test_hardware_file_errors_name_the_key(tmp_path):
    with pytest.raises(ValueError, match="hardware_file: cannot read"):
        fingerprint.load(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ValueError, match="no 'gpu_count'"):
        fingerprint.load(tmp_path / "x.json")
    (tmp_path / "empty.json").write_text("")   # `srun ... > hw/compute-node.json` that failed
    with pytest.raises(ValueError, match=r"empty\.json is empty: the probe that wrote it failed"):
        fingerprint.load(tmp_path / "empty.json")


def test_a_hand_written_hardware_file_names_the_keys_it_leaves_out(tmp_path):
    """A probe's fingerprint states every key a job depends on (null where absent), so it
    draws no warning; one written by hand with gpu_count alone names every such key."""
    probed = fingerprint.probe()
    assert fingerprint.unstated(probed) == [] and fingerprint.unstated_warning("a.json", probed) is None
    (tmp_path / "hw.json").write_text('{"gpu_count": 2}')
    fp = fingerprint.load(tmp_path / "hw.json")
    depended = set(fingerprint.TORCH_KEYS + fingerprint.JAX_KEYS + fingerprint.MULTI_DEVICE_KEYS)
    assert set(fingerprint.unstated(fp)) == depended
    del probed["torch"]
    line = fingerprint.unstated_warning("hw.json", probed)
    assert line.startswith("hardware_file hw.json leaves out torch: a change of that on the machine "), line


# ---------------------------------------------------------------- timing, watchdog

def test_summary_quantiles():
    s = timing.summary([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s["median_ms"] == 3.0 and s["min_ms"] == 1.0 and s["max_ms"] == 5.0 and s["n"] == 5
    assert s["p10_ms"] <= s["median_ms"] <= s["p90_ms"]


def test_watchdog_kills_the_whole_group(tmp_path):
    """A child that ignores SIGTERM and a grandchild: both gone after the limit. The
    watchdog runs in its own process, as the workflow starts it (called in this worker
    it forked from a process where an earlier test had started JAX's threads, and JAX
    warned of a deadlock that no real job can meet)."""
    script = ("import os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)")
    spec = {"experiment": "allreduce", "variant": "default", "k": 2, "backend": "gloo",
            "limit_s": 1.5, "grace_s": 0.5}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(ROOT / "scripts/watchdog.py"), "--spec", json.dumps(spec),
                        "--result", str(tmp_path / "r.json"), "--rank-logs", str(tmp_path / "r.log.ranks"),
                        "--lock-dir", str(tmp_path / "locks"), "--", sys.executable, "-c", script],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and time.monotonic() - t0 < 15, p.stderr[-2000:]
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["status"] == "hung" and r["stray_processes"] is False


def test_mfu_is_counted_flops_times_rate_over_measured_peak():
    from dpscale.analysis.costmodel import mfu_fields
    m = mfu_fields(13_000_000_000, 20_000.0, 780e12)
    assert m["mfu"] == pytest.approx(13e9 * 2e4 / 780e12) == pytest.approx(1 / 3)
    assert m["achieved_TFLOPs_per_device"] == pytest.approx(260.0) and m["bf16_matmul_peak_TFLOPs"] == 780.0
    assert "mfu" not in mfu_fields(13_000_000_000, 20_000.0, None)   # no GPU: no peak, no MFU
    assert mfu_fields(None, 20_000.0, 780e12) == {}


def test_a_short_list_says_how_many_it_needs():
    """MLPerf's scoring drops the fastest and the slowest seed: two seeds were refused as
    'the list is empty', which sent a user (this project, on the H200) looking for a parse bug."""
    import yaml
    from dpscale.plan.config import ConfigError
    from dpscale.plan.configcheck import check
    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    with pytest.raises(ConfigError, match=r"^scales.paper.tta_seeds: \[1, 2\] has 2 items; it needs at least 3"):
        check({**cfg, "scales": {"paper": {"tta_seeds": [1, 2]}}})


@pytest.mark.parametrize("value, fix", [(2, "'ks=[2]'"), ("1, 2", "'ks=[1, 2]'"), (None, "'ks=[1, 2, 4]'"),
                                        ("[1, 2", None)])
def test_a_list_written_without_brackets_gets_a_fix_that_parses(value, fix):
    """'ks: 1, 2' in config.yaml (or 'ks:' left empty) was told to write 'ks=['1, 2']'
    ('ks=[null]'): a fix that is itself refused."""
    import yaml
    from dpscale.plan.config import ConfigError
    from dpscale.plan.configcheck import check
    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    with pytest.raises(ConfigError) as got:
        check({**cfg, "ks": value})
    if fix:
        assert str(got.value) == f"ks must be a list: write {fix}"
        fixed = yaml.safe_load(fix.strip("'").split("=", 1)[1])
        check({**cfg, "ks": fixed})   # the fix is accepted
    else:
        assert "bracket is not closed" in str(got.value)


def test_a_scales_key_is_fixed_with_that_scales_own_value():
    import yaml
    from dpscale.plan.config import ConfigError, protocol_defaults
    from dpscale.plan.configcheck import check
    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    for scale in ("smoke", "paper"):
        batch = protocol_defaults(scale)["per_rank_batch"]
        with pytest.raises(ConfigError, match=rf"^scales.{scale}.per_rank_batch: 0 is below the minimum of 1; "
                                              rf"e.g. 'scales={{{scale}: {{per_rank_batch: {batch}}}}}'$"):
            check({**cfg, "scales": {scale: {"per_rank_batch": 0}}})


def test_strong_scaling_is_planned_where_ks_asks_for_a_curve():
    """ks = [1]: no strong point (nothing to split; the weak series is the answer); any
    k >= 2 in ks, even one this machine skips: every k, k=1 included."""
    gpu = dict(CPU_FP, gpu_count=1, gpu_model="NVIDIA H200")
    def strong(ks, fp):
        return sorted(k for e, v, k in specs.planned(dsconfig.resolve(_config(scale="auto", ks=ks), fp)) if e == "ddp_strong")
    assert strong([1], gpu) == [] and strong([1], CPU_FP) == []
    assert strong([1, 2], gpu) == [1, 2] and strong([1, 2, 4], CPU_FP) == [1, 2, 4]   # cached (seed is extended)
    weak = [k for e, v, k in specs.planned(dsconfig.resolve(_config(scale="auto", ks=[1]), gpu)) if e == "ddp_weak"]
    assert weak and set(weak) == {1}


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`dpscale experiments --digest | head -3` (docs/results.md): the reader closes the
    pipe early; dpscale ends as a process SIGPIPE ended, with nothing on stderr. The pipe's
    reading end is closed before dpscale starts, so every write fails, whatever the timing."""
    exe = str(Path(sys.executable).parent / "dpscale")
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([exe, "experiments", "--digest"], stdout=w, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(w)
    assert p.returncode == 141 and p.stderr.decode() == "", (p.returncode, p.stderr.decode())


def test_the_slurm_precommand_leaves_no_folder_when_the_job_is_cancelled(tmp_path):
    """profiles/slurm's precommand links a venv whose path has a space into a folder of
    mktemp -d. scancel sends SIGTERM to every process of the job: the folder must go with
    the job (bash runs no EXIT trap when an untrapped signal ends it)."""
    import signal
    import yaml
    pre = yaml.safe_load((ROOT / "profiles/slurm/config.yaml").read_text())["precommand"]
    venv = tmp_path / "a venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PATH": f"{venv}/bin:/usr/bin:/bin", "TMPDIR": str(tmp)}
    p = subprocess.Popen(["bash", "-c", pre + " && python -c 'import time; time.sleep(60)'"], env=env,
                         start_new_session=True)
    deadline = time.monotonic() + 20
    while not any(tmp.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    made = list(tmp.iterdir())
    assert len(made) == 1 and (made[0] / "venv").resolve() == venv.resolve(), made
    time.sleep(0.5)
    os.killpg(p.pid, signal.SIGTERM)
    assert p.wait(timeout=30) == 143
    assert not any(tmp.iterdir()), list(tmp.iterdir())
