"""Compile once per machine (dpscale.run.caches) and what a launch's start costs
(dpscale.run.launches.stamp): the cache's key and layout, a cache that cannot be used
turning itself off without failing the job, the watchdog's stamps and heartbeat on a
fake worker (seconds), and on real workers: a gloo ddp_weak job that records each
launch's start, and a JAX job on host devices whose second launch loads every program
the first one compiled (JAX's persistent cache: the cheap place to see a hit)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CPU_FP, env_with_src, make_spec, run_job
from dpscale.run import caches, launches

GPU_FP = {**CPU_FP, "gpu_model": "NVIDIA H200", "gpu_count": 1, "driver": "580.95.05", "torch": "2.11.0+cu130",
          "jax": "0.11.2", "jaxlib": "0.11.2"}


# ---------------------------------------------------------------- the key

@pytest.mark.parametrize("family, field", [("torch", "torch"), ("torch", "driver"), ("torch", "gpu_model"),
                                           ("jax", "jax"), ("jax", "jaxlib"), ("jax", "driver"),
                                           ("jax", "gpu_model")])
def test_a_new_framework_driver_or_gpu_misses_the_old_folder(family, field):
    before = caches.folder_name(caches.key(family, GPU_FP))
    assert caches.folder_name(caches.key(family, {**GPU_FP, field: "other"})) != before


@pytest.mark.parametrize("field", ["numpy", "python", "flax", "nccl", "cpu_model", "hostname", "gpu_count"])
def test_nothing_else_of_a_gpu_fingerprint_is_in_the_key(field):
    for family in ("torch", "jax"):
        assert (caches.folder_name(caches.key(family, {**GPU_FP, field: "other"}))
                == caches.folder_name(caches.key(family, GPU_FP)))


def test_families_never_share_a_folder_and_a_cpu_stand_in_is_keyed_by_its_cpu():
    t, j = caches.folder_name(caches.key("torch", CPU_FP)), caches.folder_name(caches.key("jax", CPU_FP))
    assert t.startswith("torch-") and j.startswith("jax-") and len(t) == len("torch-") + 12
    assert caches.key("torch", CPU_FP)["cpu_model"] == "test-cpu"
    assert "cpu_model" not in caches.key("torch", GPU_FP)   # a GPU's code does not depend on the host CPU
    assert caches.folder_name(caches.key("torch", {**CPU_FP, "cpu_model": "other"})) != t


def test_the_layout_the_variables_and_the_key_file(tmp_path):
    env, note = caches.env_for(tmp_path, "torch", GPU_FP)
    folder = tmp_path / caches.folder_name(caches.key("torch", GPU_FP))
    assert env == {"TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"), "TRITON_CACHE_DIR": str(folder / "triton"),
                   "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
    assert (folder / "inductor").is_dir() and (folder / "triton").is_dir()
    held = json.loads((tmp_path / f"{folder.name}.json").read_text())
    assert held["key"] == {"family": "torch", "torch": "2.11.0+cu130", "driver": "580.95.05",
                           "gpu_model": "NVIDIA H200"} and held["folder"] == folder.name
    assert "empty" in note and str(folder) in note and "driver 580.95.05" in note
    (folder / "triton" / "kernel").write_text("x")
    assert "warm" in caches.env_for(tmp_path, "torch", GPU_FP)[1]   # the key file is read back, not rewritten
    jenv, _ = caches.env_for(tmp_path, "jax", GPU_FP)
    assert jenv["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"   # every program kept, the step too
    assert jenv["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] == "-1"
    assert jenv["JAX_COMPILATION_CACHE_DIR"].endswith("/xla")
    assert caches.env_for(None, "torch", GPU_FP) == ({}, None)   # no root: the environment as it is


def test_empty_jax_entries_a_full_disk_left_are_removed_and_not_called_warm(tmp_path):
    """A disk that filled while JAX wrote its entries leaves them empty; JAX never rewrites
    an entry that exists, so each later job would recompile while its log said 'warm'."""
    caches.env_for(tmp_path, "jax", GPU_FP)
    xla = tmp_path / caches.folder_name(caches.key("jax", GPU_FP)) / "xla"
    for i in range(3):
        (xla / f"jit_step-{i}-cache").write_bytes(b"")
    _, note = caches.env_for(tmp_path, "jax", GPU_FP)
    assert "(empty; " in note and "removed 3 empty entries a full disk had left" in note, note
    assert not any(xla.iterdir())
    (xla / "jit_step-0-cache").write_bytes(b"compiled")
    (xla / "jit_step-1-cache").write_bytes(b"")
    _, note = caches.env_for(tmp_path, "jax", GPU_FP)
    assert "(warm; " in note and "removed 1 empty entry" in note, note
    assert [p.name for p in xla.iterdir()] == ["jit_step-0-cache"]
    torch_folder = tmp_path / caches.folder_name(caches.key("torch", GPU_FP))
    caches.env_for(tmp_path, "torch", GPU_FP)
    (torch_folder / "inductor" / "locks").mkdir()
    (torch_folder / "inductor" / "locks" / "abc.lock").write_bytes(b"")   # inductor's own, kept
    _, note = caches.env_for(tmp_path, "torch", GPU_FP)
    assert "(empty; " in note and (torch_folder / "inductor" / "locks" / "abc.lock").exists()


@pytest.mark.parametrize("how", ["corrupt", "another key", "a file in the way", "root is a file"])
def test_a_cache_that_cannot_be_used_is_turned_off_and_said(tmp_path, how):
    folder = caches.folder_name(caches.key("jax", GPU_FP))
    root = tmp_path / "cache"
    root.mkdir()
    if how == "corrupt":
        (root / f"{folder}.json").write_text('{"key": {"fam')
    elif how == "another key":
        (root / f"{folder}.json").write_text(json.dumps({"key": {"family": "jax", "jax": "0.1"}}))
    elif how == "a file in the way":
        (root / folder).write_text("not a folder")
    else:
        root.rmdir()
        root.write_text("not a folder")
    env, note = caches.env_for(root, "jax", GPU_FP)
    assert env == {"JAX_COMPILATION_CACHE_DIR": None}   # JAX's cache off, whatever the environment said
    assert note.startswith("compile cache off: ") and "this job compiles uncached" in note
    assert caches.apply({"JAX_COMPILATION_CACHE_DIR": "/x", "A": "1"}, env) == {"A": "1"}
    assert caches.uncached("torch")["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "0"


# ---------------------------------------------------------------- the watchdog's stamps, a fake worker

FAKE_WORKER = """
import json, os, sys, time
time.sleep(float(sys.argv[2]))
first = time.time()
json.dump({"experiment": "ddp_weak", "variant": "cached", "k": 1, "status": "ok", "reason": None,
           "backend": "gloo", "config": {}, "fingerprint": {}, "started_utc": "s", "finished_utc": "f",
           "metrics": {"samples_per_s": 100.0, "first_timed_step_unix": first,
                       "cache_env_txt": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}},
          open(sys.argv[1], "w"))
time.sleep(0.2)
"""


def fake_job(tmp_path, n: int, sleep_s: float, cache_dir, capsys):
    from dpscale.run.watchdog import main
    spec = {"experiment": "ddp_weak", "variant": "cached", "k": 1, "backend": "gloo", "limit_s": 60,
            "grace_s": 1, "config": {"protocol": {"launches": n}}, "fingerprint": CPU_FP}
    result = tmp_path / "k1.json"
    rc = main(["--spec", json.dumps(spec), "--result", str(result), "--rank-logs", str(tmp_path / "k1.log.ranks"),
               "--lock-dir", str(tmp_path / "locks"), *(["--cache-dir", str(cache_dir)] if cache_dir else []),
               "--", sys.executable, "-c", FAKE_WORKER, str(result), str(sleep_s)])
    assert rc == 0
    return json.loads(result.read_text()), capsys.readouterr().out


def test_each_launch_records_its_start_and_the_job_its_wall_time(tmp_path, capsys, monkeypatch):
    from dpscale.run import watchdog
    monkeypatch.setattr(watchdog, "HEARTBEAT_S", 0.5)
    r, out = fake_job(tmp_path, 2, 1.2, tmp_path / "cache", capsys)
    m = r["metrics"]
    assert r["status"] == "ok" and len(m["start_s_launches"]) == 2 and len(m["launch_s_launches"]) == 2
    for start, took in zip(m["start_s_launches"], m["launch_s_launches"]):
        assert 1.2 <= start < took < 30   # spawn -> first timed step, inside spawn -> exit
    assert m["start_s"] == m["start_s_launches"][0] and "first_timed_step_unix" not in m
    assert m["wall_s"] >= sum(m["launch_s_launches"])
    assert m["cache_env_txt"].startswith(str(tmp_path / "cache" / "torch-"))   # the worker ran with the cache
    assert "launch 1/2: running, " in out and "first timed step 1." in out and "compile cache " in out


def test_a_broken_cache_never_fails_the_job(tmp_path, capsys):
    root = tmp_path / "cache"
    root.write_text("a file where the cache folder should be")
    r, out = fake_job(tmp_path, 1, 0, root, capsys)
    assert r["status"] == "ok" and r["metrics"]["cache_env_txt"] is None
    assert "[watchdog] compile cache off: cannot use " in out and "this job compiles uncached" in out
    assert "start_s" in r["metrics"] and "launch_s_launches" in r["metrics"]


def test_stamp_and_cost_fields_are_pure():
    r = {"metrics": {"samples_per_s": 1.0, "first_timed_step_unix": 105.5}}
    launches.stamp(r, 100.0, 9.0)
    assert r["metrics"] == {"samples_per_s": 1.0, "start_s": 5.5, "launch_s": 9.0}
    bare = launches.stamp({"metrics": {"busbw_GBps": 1.0}}, 100.0, 3.0)   # a worker that stamps nothing
    assert "start_s" not in bare["metrics"]
    assert launches.cost_fields([bare], 3.5) == {"launch_s_launches": [3.0], "wall_s": 3.5}
    assert launches.cost_fields([r, bare], 12.0)["start_s_launches"] == [5.5, None]
    staged = {"metrics": {"samples_per_s": 1.0, "first_timed_step_unix": 110.0,
                          "stage_marks_unix": {"interpreter": 101.0, "imports": 104.5, "model and data": 106.0,
                                               "timed epochs": 113.0}}}
    m = launches.stamp(staged, 100.0, 15.0)["metrics"]
    assert m["start_stages_s"] == {"interpreter": 1.0, "imports": 3.5, "model and data": 1.5, "warm-up": 4.0}
    assert sum(m["start_stages_s"].values()) == m["start_s"] == 10.0 and "stage_marks_unix" not in m
    assert m["end_stages_s"] == {"timed epochs": 3.0, "result and exit": 2.0}   # 10 + 3 + 2 = launch_s
    tta = launches.stamp({"metrics": {"tta_s": 1.0, "stage_marks_unix": {"imports": 103.0}}}, 100.0, 5.0)
    assert tta["metrics"] == {"tta_s": 1.0, "launch_s": 5.0}   # no first timed step: no start, no stages
    assert launches.cost_fields([r, staged], 25.0)["start_stages_s_launches"] == [None, m["start_stages_s"]]


# ---------------------------------------------------------------- real workers

@pytest.mark.slow
@pytest.mark.multiproc
def test_a_gloo_ddp_weak_job_records_each_launchs_start(tiny_data, tmp_path):
    spec = make_spec(tiny_data, "ddp_weak", 2, "cached", proto={"launches": 2, "train_images": 32, "repeats": 1})
    rc, r, log = run_job(spec, tmp_path / "job", cache_dir=tmp_path / "cache")
    assert rc == 0 and r["status"] == "ok", log[-3000:]
    m = r["metrics"]
    assert len(m["start_s_launches"]) == 2 and all(0 < s < t for s, t in zip(m["start_s_launches"],
                                                                             m["launch_s_launches"]))
    assert m["start_s"] == m["start_s_launches"][m["representative_launch"] - 1]
    for start, took, stages, end in zip(m["start_s_launches"], m["launch_s_launches"], m["start_stages_s_launches"],
                                        m["end_stages_s_launches"]):   # the worker's stages, spawn to exit
        assert list(stages) == ["torchrun and interpreter", "imports", "process group", "matmul and copy rates",
                                "model", "data", "warm-up"], stages
        assert list(end) == ["timed epochs", "metrics and GPU state", "result and exit"], end
        assert all(v >= 0 for v in [*stages.values(), *end.values()])
        assert sum(stages.values()) == pytest.approx(start, abs=0.01)
        assert sum(stages.values()) + sum(end.values()) == pytest.approx(took, abs=0.01)
    assert m["wall_s"] >= sum(m["launch_s_launches"]) and "first_timed_step_unix" not in m
    assert all("first_timed_step_unix" not in row for row in m["per_rank"])
    folder = tmp_path / "cache" / caches.folder_name(caches.key("torch", spec["fingerprint"]))
    assert (folder / "inductor").is_dir() and f"compile cache {folder} (empty;" in log


@pytest.fixture(scope="module")
def jax_two_launches(tiny_data, tmp_path_factory):
    """A jax_weak job on one host device, two launches, with a cache of its own (module-wide)."""
    tmp = tmp_path_factory.mktemp("jax-cache-job")
    proto = {"launches": 2, "train_images": 8, "epochs": 2, "repeats": 1}
    spec = make_spec(tiny_data, "jax_weak", 1, "device", proto=proto)
    rc, r, log = run_job(spec, tmp / "job", cache_dir=tmp / "cache")
    assert rc == 0 and r["status"] == "ok", log[-3000:]
    return spec, r, tmp / "cache"


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_second_jax_launch_loads_what_the_first_compiled(jax_two_launches):
    """Not a timing on a shared CPU: the cache's own counts. Launch 1 writes every program
    it compiles; launch 2 compiles nothing and loads them all."""
    spec, r, root = jax_two_launches
    first, second = r["metrics"]["compile_cache_launches"]
    assert first["written"] > 0 and first["loaded"] == 0, first
    assert second["loaded"] == first["written"] and second["written"] == 0, second
    assert second["compile_s_saved"] > 0 and len(r["metrics"]["start_s_launches"]) == 2
    for stages in r["metrics"]["start_stages_s_launches"]:
        assert list(stages) == ["interpreter", "imports", "devices, data and model", "warm-up"], stages
    assert [list(e) for e in r["metrics"]["end_stages_s_launches"]] == \
        [["timed epochs", "metrics and GPU state", "result and exit"]] * 2
    folder = root / caches.folder_name(caches.key("jax", spec["fingerprint"]))
    assert len(os.listdir(folder / "xla")) >= first["written"]


@pytest.mark.multiproc
@pytest.mark.slow
def test_entries_gone_bad_are_compiled_again_and_the_job_stays_ok(jax_two_launches, tmp_path):
    spec, _, root = jax_two_launches
    shutil.copytree(root, tmp_path / "cache")
    folder = tmp_path / "cache" / caches.folder_name(caches.key("jax", spec["fingerprint"]))
    for entry in (folder / "xla").iterdir():
        if entry.is_file():
            entry.write_bytes(b"not an executable")
    one = {**spec, "config": {**spec["config"], "protocol": {**spec["config"]["protocol"], "launches": 1}}}
    rc, r, log = run_job(one, tmp_path / "job", cache_dir=tmp_path / "cache")
    assert rc == 0 and r["status"] == "ok", log[-3000:]
    assert r["metrics"]["compile_cache"]["written"] > 0 and r["metrics"]["compile_cache"]["loaded"] == 0


COMPILE_WORKER = """
import json, sys, time
import torch
from dpscale.measure.torch_job import compile_cache_counts
f = torch.compile(lambda x: torch.sin(x) * 2 + 1)
f(torch.randn(16))
json.dump({"experiment": "ddp_weak", "variant": "tuned", "k": 1, "status": "ok", "reason": None,
           "backend": "gloo", "config": {}, "fingerprint": {}, "started_utc": "s", "finished_utc": "f",
           "metrics": {"samples_per_s": 1.0, "first_timed_step_unix": time.time(),
                       "compile_cache": compile_cache_counts()}}, open(sys.argv[1], "w"))
"""


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_second_torch_compile_launch_hits_inductors_cache(tmp_path, monkeypatch):
    """torch.compile on the CPU (inductor's C++ backend): launch 1 misses the FX graph
    cache the watchdog set up and fills it, launch 2 hits it."""
    from conftest import env_with_src
    from dpscale.run.watchdog import main
    spec = {"experiment": "ddp_weak", "variant": "tuned", "k": 1, "backend": "gloo", "limit_s": 240,
            "grace_s": 1, "config": {"protocol": {"launches": 2}}, "fingerprint": CPU_FP}
    result = tmp_path / "k1.json"
    monkeypatch.setenv("PYTHONPATH", env_with_src()["PYTHONPATH"])   # the worker imports dpscale
    rc = main(["--spec", json.dumps(spec), "--result", str(result), "--rank-logs", str(tmp_path / "k1.log.ranks"),
               "--lock-dir", str(tmp_path / "locks"), "--cache-dir", str(tmp_path / "cache"),
               "--", sys.executable, "-c", COMPILE_WORKER, str(result)])
    r = json.loads(result.read_text())
    assert rc == 0 and r["status"] == "ok", r.get("reason")
    first, second = r["metrics"]["compile_cache_launches"]
    assert first["fx_graph_misses"] >= 1 and first["fx_graph_hits"] == 0, first
    assert second["fx_graph_hits"] >= 1 and second["fx_graph_misses"] == 0, second
    folder = tmp_path / "cache" / caches.folder_name(caches.key("torch", CPU_FP))
    assert any((folder / "inductor").iterdir())


# ---------------------------------------------------------------- the config key, in the workflow

def test_cache_dir_resolves_to_one_absolute_folder(tmp_path, monkeypatch):
    from dpscale.plan import config
    assert config.resolve_cache({}, {"XDG_CACHE_HOME": "/x/cache", "HOME": "/home/u"}) == {"dir": "/x/cache/dpscale"}
    assert config.resolve_cache({"cache": {"dir": None}}, {"HOME": "/home/u"}) == {"dir": "/home/u/.cache/dpscale"}
    monkeypatch.chdir(tmp_path)
    assert config.resolve_cache({"cache": {"dir": "c"}}, {}) == {"dir": str(tmp_path / "c")}   # from the working folder
    assert config.resolve_cache({"cache": {"dir": "/scratch/c"}}, {}) == {"dir": "/scratch/c"}


@pytest.mark.slow
@pytest.mark.workflow
def test_moving_the_cache_reruns_nothing_and_reaches_the_watchdog(primed, tmp_path):
    """cache.dir is a resource, as locks.dir is: a job that ran with one cache folder is
    up to date with another, and the watchdog's command line carries the new one."""
    from conftest import SMALL, copy_primed, job_counts, smk
    repo = copy_primed(primed, tmp_path / "repo", machines=False)
    target = "results/runs/ddp_weak/cached/k1.json"
    cfg = ["--config", *SMALL, "ks=[1]", "experiments=[ddp_weak]", f"locks={{dir: {tmp_path / 'locks'}}}"]
    smk(repo, "--cores", "2", target, *cfg, f"cache={{dir: {tmp_path / 'a'}}}")
    assert (tmp_path / "a").is_dir() and any(p.name.startswith("torch-") for p in (tmp_path / "a").iterdir())
    res = json.loads((repo / target).read_text())
    assert res["status"] == "ok" and res["metrics"]["start_s"] > 0 and res["metrics"]["wall_s"] > 0
    moved = smk(repo, "-n", "--cores", "2", target, *cfg, f"cache={{dir: {tmp_path / 'b'}}}")
    assert "Nothing to be done" in moved.stdout, moved.stdout[-2000:]
    forced = smk(repo, "-n", "-p", "--cores", "2", target, "--forcerun", "ddp_weak", *cfg,
                 f"cache={{dir: {tmp_path / 'b'}}}")
    assert f"--cache-dir {tmp_path / 'b'}" in forced.stdout and job_counts(forced.stdout) == {"ddp_weak": 1}


# ---------------------------------------------------------------- the report's cost table

def test_the_cost_table_lists_each_job_its_launches_and_a_total():
    from dpscale.report.chapters import provenance
    from dpscale.report.machines import Machine, ReportData

    def res(exp, variant, k, status="ok", **metrics):
        return {"experiment": exp, "variant": variant, "k": k, "status": status, "metrics": metrics}
    m = Machine("current", "current", "this run", {}, results={
        ("ddp_weak", "cached", 1): res("ddp_weak", "cached", 1, wall_s=30.5, start_s=9.0, start_s_launches=[12.0, 9.0],
                                       start_stages_s={"imports": 4.0, "warm-up": 5.0},
                                       launch_s_launches=[15.0, 14.0], compile_cache_launches=[
                                           {"fx_graph_hits": 0, "fx_graph_misses": 3, "fx_graph_bypasses": 1}, None]),
        ("jax_weak", "device", 1): res("jax_weak", "device", 1, wall_s=20.0, launch_s_launches=[19.0],
                                       start_s_launches=[8.0],
                                       compile_cache_launches=[{"loaded": 38, "written": 0, "compile_s_saved": 5.7}]),
        ("allreduce", "default", 2): res("allreduce", "default", 2, busbw_GBps=1.0),   # an older result
        ("fsdp", "default", 4): res("fsdp", "default", 4, status="skipped")})
    t = provenance.cost_table(ReportData([m]))
    rows = [[c.text for c in row] for row in t.rows]
    assert rows[0][:7] == ["this run", "ddp_weak/cached/k1", "ok", "30.5", "2", "12, 9", "15, 14"]
    assert rows[0][7] == "0 hits, 3 misses, 1 not cacheable; –" and rows[1][7] == "38 loaded, 0 compiled"
    assert rows[0][8] == "imports 4, warm-up 5" and rows[1][8] == "–"
    assert rows[-1][1] == "all 2 jobs" and t.rows[-1][3].value == 50.5 and rows[-1][4] == "3"
    assert "this run: 1 result(s) measured before jobs recorded their cost" in t.note
    assert "cost" in provenance.CHAPTER.tables   # written as tables/cost.csv too


def test_later_launches_start_no_compile_workers_only_where_the_cache_serves_them():
    on = caches.apply({"PATH": "/bin"}, caches.variables("torch", Path("/c")))
    assert caches.later_launch(on)["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in on                  # a copy: launch 1 keeps the pool
    off = caches.apply({"PATH": "/bin"}, caches.uncached("torch"))    # every launch compiles: keep it
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in caches.later_launch(off)
    mine = {**on, "TORCHINDUCTOR_COMPILE_THREADS": "8"}                # the user's setting wins
    assert caches.later_launch(mine)["TORCHINDUCTOR_COMPILE_THREADS"] == "8"
    jax = caches.apply({}, caches.variables("jax", Path("/c")))
    assert caches.later_launch(jax) == jax


def test_bytecode_cache_only_where_the_environment_forbids_bytecode(tmp_path):
    """An image with PYTHONDONTWRITEBYTECODE compiles torch from source in every job (8.4-9.1 s
    against 2.7 s on the H200 image): the workflow points such jobs at a bytecode cache, and
    leaves every other environment, and a prefix the user set, as it is."""
    assert caches.bytecode_env(tmp_path, {}) == {}
    assert caches.bytecode_env(tmp_path, {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/mine"}) == {}
    env = caches.bytecode_env(tmp_path, {"PYTHONDONTWRITEBYTECODE": "1"})
    assert env == {"PYTHONPYCACHEPREFIX": str(tmp_path / caches.BYTECODE), "PYTHONDONTWRITEBYTECODE": ""}
    code = "import json, dpscale.results"
    p = subprocess.run([sys.executable, "-c", code], env={**env_with_src(), **env}, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert list((tmp_path / caches.BYTECODE).rglob("results*.pyc")), "no bytecode written under the prefix"
