"""The fault battery: bad configs, a killed run, corrupted inputs, ranks that die
or hang in every place a torchrun experiment's rank can stop (conftest's
FAULT_EXPERIMENTS), concurrency, and an unwritable disk. Each
case here is a row of the README's table of faults."""
from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (CPU_FP, FAULT_EXPERIMENTS, ROOT, SMALL, SNAKEMAKE, copy_done, copy_primed, copy_repo,
                      env_with_src, fault_variant, local_env, make_spec, run_job, smk)

from dpscale import results
from dpscale.data import load as dload, resize as dresize

# ---------------------------------------------------------------- 1. bad configs

def readme_bad_inputs() -> list[tuple[str, str]]:
    """docs/configuration.md's table 'Bad input, as it prints': (the --config argument, the line)."""
    text = (ROOT / "docs" / "configuration.md").read_text().split("## Bad input, as it prints", 1)[1]
    rows = re.findall(r"^\| `(.+?)` \| `(.+)` \|$", text, re.M)
    return [(arg[1:-1] if arg.startswith("'") else arg, line) for arg, line in rows]


BAD_CONFIGS = readme_bad_inputs()   # every row of the documented table, checked as printed
assert len(BAD_CONFIGS) >= 15, "docs/configuration.md's table of bad input was not found"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return copy_repo(tmp_path_factory.mktemp("rel"))


@pytest.mark.workflow
@pytest.mark.parametrize("arg, line", BAD_CONFIGS, ids=[a for a, _ in BAD_CONFIGS])
def test_bad_config_prints_the_readmes_line_and_nothing_else(repo, arg, line):
    p = smk(repo, "-n", "--cores", "1", "report", "--config", arg, check=False)
    ours = [ln for ln in (p.stdout + p.stderr).splitlines()
            if not ln.startswith(("Using workflow specific profile", "Config file "))]
    assert p.returncode != 0
    assert ours == [line], ours
    assert not (repo / "results/runs").exists()


@pytest.mark.workflow
def test_a_key_written_twice_in_the_config_file_is_named(repo):
    """YAML keeps the last of two equal keys silently: a second `local_dir:` under
    `data:` (the first left below it) would be dropped without a word."""
    text = (repo / "config.yaml").read_text()
    assert text.count("\n  local_dir: null\n") == 1
    lines = text.splitlines()
    at = lines.index("  local_dir: null") + 1   # its 1-based line number
    (repo / "twice.yaml").write_text(text.replace("\n  local_dir: null\n", "\n  local_dir: /mine\n  local_dir: null\n"))
    p = smk(repo, "-n", "--cores", "1", "report", "--configfile", "twice.yaml", check=False)
    assert p.returncode != 0
    assert p.stderr.strip().splitlines()[-1] == (
        f"Invalid configuration: {repo / 'twice.yaml'}: local_dir is written twice (lines {at} and {at + 1}); "
        "YAML keeps only the last, so delete one")
    assert not (repo / "results/runs").exists()


@pytest.mark.workflow
def test_a_config_file_that_is_not_yaml_is_named_with_its_line(repo):
    """Snakemake's loader says only "not valid JSON or YAML": a quote left open on the
    `scale:` line is named there, and where the parser ran out."""
    lines = (repo / "config.yaml").read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("scale: ")) + 1
    broken = [ln.replace("scale: ", 'scale: "', 1) if i + 1 == at else ln for i, ln in enumerate(lines)]
    (repo / "config.yaml").write_text("\n".join(broken) + "\n")
    p = smk(repo, "-n", "--cores", "1", "report", check=False)
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("Invalid configuration: config.yaml is not YAML: found unexpected end of stream "
                           f"at line {len(lines) + 1}, column 1, while scanning a quoted scalar from line {at}, "), last
    assert "Traceback" not in p.stderr
    assert not (repo / "results/runs").exists()


# ---------------------------------------------------------------- 2. killed mid-run

def _result_files(repo: Path) -> dict[str, int]:
    return {str(p.relative_to(repo)): p.stat().st_mtime_ns for p in (repo / "results/runs").glob("*/*/k*.json")}


def _incomplete(repo: Path) -> set[str]:
    """Outputs Snakemake itself marks as still running (.snakemake/incomplete/<base64 path>)."""
    import base64
    out = set()
    for marker in (repo / ".snakemake/incomplete").glob("*"):
        try:
            out.add(base64.urlsafe_b64decode(marker.name.encode()).decode())
        except ValueError:
            pass
    return out


@pytest.mark.workflow
@pytest.mark.slow
def test_kill9_then_plain_rerun_completes(primed, tmp_path):
    repo = copy_primed(primed, tmp_path, machines=False)
    # four jobs (DDP seed and cached, all-reduce default and memcpy, at k=2): the kill
    # comes once two are done and Snakemake has another running. (Waiting for a third
    # result instead was flaky: the two all-reduce jobs can finish 0.2 s apart, so the
    # last two results landed between two looks and nothing was left running.)
    cfg = ["--config", *SMALL, "ks=[2]", "experiments=[ddp_weak,allreduce]"]
    proc = subprocess.Popen([SNAKEMAKE, "--cores", "2", "report", *cfg], cwd=repo, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=local_env())
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        running = {p for p in _incomplete(repo) if p.startswith("results/runs/")}
        done = set(_result_files(repo)) - running if (repo / "results/runs").exists() else set()
        if len(done) >= 2 and running:
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)   # Snakemake, its jobs' shells and watchdogs
    proc.wait()
    # done = Snakemake had recorded it as finished; a JSON whose job was still
    # tearing down when the kill came is rightly run again
    running = _incomplete(repo)
    before = {p: m for p, m in _result_files(repo).items() if p not in running}
    assert before and running, f"nothing to compare: done={before}, running={running}"
    time.sleep(3)   # torchrun gets SIGTERM from its dead watchdog and tears its ranks down
    for p in (repo / "results/runs").glob("*/*/*"):
        assert not p.name.endswith(".tmp"), f"half-written file {p}"
    out = smk(repo, "--cores", "2", "report", *cfg)   # plain rerun: no --unlock, no flags
    assert "stale lock" in out.stdout + out.stderr
    after = _result_files(repo)
    for path, mtime in before.items():
        assert after[path] == mtime, f"{path} was finished before the kill but ran again"
    for path in after:
        results.load_result(repo / path)   # every artifact parses and meets the contract
    assert (repo / "results/report/report.html").exists()


@pytest.mark.workflow
def test_a_job_mode_parse_leaves_the_live_runs_lock_alone(tmp_path):
    """The SLURM executor's Snakemake on a compute node (--mode remote) parses the
    Snakefile too, and cannot see the login node's live run: it must not release
    the lock. The main process of a plain rerun releases a stale one."""
    repo = copy_repo(tmp_path)
    locks = repo / ".snakemake/locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text("a run on another host\n")
    cfg = ["--config", *SMALL, "ks=[1]", "experiments=[ddp_weak]"]
    job = smk(repo, "--mode", "remote", "-n", "--cores", "1", "results/runs/ddp_weak/seed/k1.json", *cfg)
    assert (locks / "0.input.lock").exists() and "stale lock" not in job.stdout + job.stderr
    main = smk(repo, "-n", "--cores", "1", "report", *cfg)
    assert not (locks / "0.input.lock").exists() and "Removed a stale lock" in main.stdout + main.stderr


def test_release_stale_only_in_the_main_process(tmp_path):
    from dpscale.run.locks import release_stale
    (tmp_path / ".snakemake/locks").mkdir(parents=True)
    lock = tmp_path / ".snakemake/locks/0.input.lock"
    lock.write_text("x")
    assert release_stale(tmp_path, main_process=False) == [] and lock.exists()
    assert release_stale(tmp_path, main_process=True) == [str(lock)] and not lock.exists()


# ---------------------------------------------------------------- 3. corrupted inputs

def test_truncated_raw_file_is_named(tiny_data, tmp_path):
    import shutil
    root = tmp_path / "d"
    shutil.copytree(tiny_data, root)
    victim = dload.raw_dir(root) / "train-labels-idx1-ubyte"
    victim.write_bytes(victim.read_bytes()[:-100])
    with pytest.raises(dload.DataError, match=r"train-labels-idx1-ubyte.*truncated or altered.*--forcerun download"):
        dresize.build_cache(root, 16, tmp_path / "c.npz", tmp_path / "c.json")
    assert not (tmp_path / "c.npz").exists()


def test_corrupted_cache_fails_the_job_naming_it(tiny_data, tmp_path):
    import shutil
    root = tmp_path / "d"
    shutil.copytree(tiny_data, root)
    npz = root / "fmnist_16px.npz"
    blob = bytearray(npz.read_bytes())
    blob[-200] ^= 0xFF
    npz.write_bytes(bytes(blob))
    spec = make_spec(root, "ddp_weak", 1, "cached")
    rc, res, log = run_job(spec, tmp_path / "job")
    assert rc == 0 and res["status"] == "failed", log
    rank0 = (tmp_path / "job/k.rank0.log").read_text()
    assert "fmnist_16px.npz" in rank0 and "--forcerun resize" in rank0
    assert "fmnist_16px.npz" in res["reason"] and "rank 0" in res["reason"], res["reason"]


# ---------------------------------------------------------------- 4. ranks die or hang

@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("experiment", FAULT_EXPERIMENTS)
def test_rank_crash_fails_job_with_log(crashed_runs, experiment):
    rc, res, log = crashed_runs[experiment]
    tmp_path = crashed_runs.folder(experiment)
    assert "injected fault: rank 1 crashes at step" in (tmp_path / "k.rank1.log").read_text()
    # recorded, not raised: the watchdog exits 0 so that the report still builds
    assert rc == 0 and res["status"] == "failed", log
    assert res["reason"].startswith("RuntimeError: injected fault: rank 1 crashes at step (rank 1; exit code"), res
    assert res["log"] == str(tmp_path / "k.log") and res["exit_code"] != 0
    assert str(tmp_path / "k.rank1.log") in res["rank_logs"] and res["rank_tails"]["rank 1"] and res["log_tail"]
    assert (tmp_path / "k.failures").read_text().count("\n") == 1   # what makes a plain rerun retry it


# ---------------------------------------------------------------- 5. concurrency

STOPPED_AFTER_WRITING = """
import json, os, signal, sys, time
with open(sys.argv[1], "w") as f:
    json.dump({"experiment": "allreduce", "variant": "default", "k": 2, "status": "ok", "reason": None,
               "metrics": {"busbw_GBps": 1.0}}, f)
os.kill(os.getppid(), signal.SIGINT)   # Snakemake's stop reaches the watchdog after the worker wrote
time.sleep(30)
"""


def test_a_watchdog_stopped_after_its_worker_wrote_leaves_no_result(tmp_path):
    """One launch: the worker writes a complete result, then the watchdog is interrupted
    before it costs and writes the job's. Nothing is left at the result path (the worker
    wrote a file of its own), nor that file; the exit is 130 and says nothing was recorded."""
    result = tmp_path / "k2.json"
    spec = {"experiment": "allreduce", "variant": "default", "k": 2, "backend": "gloo", "limit_s": 60,
            "grace_s": 1, "config": {"protocol": {}}, "fingerprint": CPU_FP}
    p = subprocess.run([sys.executable, str(ROOT / "scripts/watchdog.py"), "--spec", json.dumps(spec),
                        "--result", str(result), "--rank-logs", str(tmp_path / "ranks"),
                        "--lock-dir", str(tmp_path / "locks"), "--", sys.executable, "-c", STOPPED_AFTER_WRITING,
                        str(result)], capture_output=True, text=True, timeout=60, env=env_with_src())
    assert p.returncode == 130 and "nothing recorded" in p.stderr, p.stdout + p.stderr
    assert sorted(x.name for x in tmp_path.iterdir() if x.name.endswith(".json")) == []


@pytest.mark.workflow
def test_second_run_in_same_folder_is_refused(tmp_path):
    repo = copy_repo(tmp_path)
    cfg = ["--config", *SMALL, "ks=[1]", "experiments=[ddp_weak]"]
    first = subprocess.Popen([SNAKEMAKE, "--cores", "1", "report", *cfg], cwd=repo, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=local_env())
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list((repo / ".snakemake/locks").glob("*.lock")):
            time.sleep(0.2)
        second = smk(repo, "--cores", "1", "report", *cfg, check=False)
        assert second.returncode != 0
        assert "Directory cannot be locked" in second.stdout + second.stderr
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.wait(timeout=60)


@pytest.mark.slow
def test_measurements_never_overlap(done):
    """Measurement jobs each take measure=1 of the default profile's measure=1: conftest's
    finished smoke run, whose four jobs (seed and cached at k=1 and 2) were all ready at
    once on two cores (the data stage done), ran one after another."""
    spans = []
    for p in (done / "results/runs").glob("*/*/k*.json"):
        r = json.loads(p.read_text())
        if r["status"] == "ok":
            spans.append((r["started_utc"], r["finished_utc"], str(p.relative_to(done))))
    spans.sort()
    assert len(spans) == 4
    for (s0, f0, a), (s1, f1, b) in zip(spans, spans[1:]):
        assert s1 >= f0, f"{a} ({s0}..{f0}) overlaps {b} ({s1}..{f1})"


# ---------------------------------------------------------------- 6. disk

def test_failed_write_keeps_previous_artifact(tmp_path, monkeypatch):
    p = tmp_path / "r.json"
    results.write_json_atomic(p, {"old": True})

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        results.write_json_atomic(p, {"new": True})
    assert json.loads(p.read_text()) == {"old": True}
    assert [f.name for f in tmp_path.iterdir()] == ["r.json"]


@pytest.mark.slow
@pytest.mark.workflow
def test_unwritable_results_folder_fails_clearly_and_keeps_artifact(done, tmp_path):
    if os.system("chattr -V >/dev/null 2>&1") != 0 and os.system("command -v chattr >/dev/null") != 0:
        pytest.skip("chattr is not available to make a folder unwritable for root")
    repo, cfg = copy_done(done, tmp_path / "repo")
    folder = repo / "results/runs/ddp_weak/cached"
    target = folder / "k1.json"
    old = target.read_bytes()
    if subprocess.run(["chattr", "+i", str(folder)]).returncode != 0:
        pytest.skip("this filesystem does not support the immutable attribute")
    try:
        p = smk(repo, "--cores", "1", target.relative_to(repo).as_posix(), *cfg, "--forcerun", "ddp_weak",
                check=False)
    finally:
        subprocess.run(["chattr", "-i", str(folder)])
    text = p.stdout + p.stderr
    assert p.returncode != 0
    assert "Operation not permitted" in text or "Permission denied" in text or "Read-only" in text, text[-2000:]
    assert target.read_bytes() == old


def test_a_hung_reason_names_the_timeout_that_fired():
    """Issue #53: a stopped rank, killed by the outer watchdog after gloo's own timeout had
    fired in rank 0's log ('Timed out waiting 108000ms'), was recorded as if no
    process-group timeout had fired. The reason names which clock stopped the job."""
    from dpscale.run import joblogs, watchdog
    out = watchdog.Outcome(rc=None, elapsed=180.2, killed="limit", stray=False)
    gloo = {"rank 0": "[default0]: RuntimeError: [../gloo/transport/tcp/pair.cc:534] Timed out waiting 108000ms"}
    assert joblogs.timed_out(gloo)
    said = watchdog.hung_how(out, 180, joblogs.timed_out(gloo))
    assert "process-group timeout" in said and "had fired first" in said and "no rank's" not in said
    quiet = watchdog.hung_how(out, 180, joblogs.timed_out({"rank 0": "step 12"}))
    assert "no rank's process-group timeout" in quiet
    alone = watchdog.hung_how(watchdog.Outcome(rc=1, elapsed=110.0, killed=None, stray=False), 180, True)
    assert alone.startswith("a rank's process-group timeout fired after 110.0 s")


def test_a_lock_folder_on_a_full_disk_is_one_line_naming_it_and_locks_dir(tmp_path):
    """locks.dir on a disk that filled: taking a device's lock cannot write who holds it.
    The job gets a LockError naming the folder and locks.dir (the watchdog records it as a
    failed attempt, and the workflow builds the report), never a raw OSError; no lock stays held."""
    import subprocess as sp
    from conftest import fill_disk, mount_tmpfs
    from dpscale.run import devices
    folder = tmp_path / "locks"
    if not mount_tmpfs(folder, "64k"):
        pytest.skip("needs root and tmpfs to fill a disk of its own")
    try:
        devices.try_acquire(["cpu-0"], folder, "ddp_weak/seed/k1").release()   # the lock file exists, empty now
        fill_disk(folder)
        with pytest.raises(devices.LockError) as e:
            devices.try_acquire(["cpu-0", "cpu-1"], folder, "ddp_weak/seed/k2")
        msg = str(e.value)
        assert str(folder) in msg and "locks.dir" in msg and "No space left on device" in msg, msg
        (folder / "filler").unlink()
        devices.try_acquire(["cpu-0", "cpu-1"], folder, "ddp_weak/seed/k2").release()   # nothing stayed held
    finally:
        sp.run(["umount", "-l", str(folder)])


# ---------------------------------------------------------------- 7. ranks that hang (started with the first test)

def fault_sites(fn, seen=None) -> set[str]:
    """The functions that inject a fault at a step (`ctx.maybe_fault("step")`) which `fn`
    reaches, by the names it calls, within dpscale.measure."""
    import inspect
    seen = set() if seen is None else seen
    if fn in seen:
        return set()
    seen.add(fn)
    src = inspect.getsource(fn)
    out = {f"{fn.__module__}.{fn.__qualname__}"} if 'maybe_fault("step")' in src else set()
    for name in set(re.findall(r"\b(\w+)\(", src)):
        g = fn.__globals__.get(name)
        if inspect.isfunction(g) and g.__module__.startswith("dpscale.measure") and g is not fn:
            out |= fault_sites(g, seen)
    return out


def test_the_fault_cases_reach_every_place_a_rank_can_stop():
    """FAULT_EXPERIMENTS (conftest) reach every function where a torch experiment's rank
    can be made to crash or hang, and each experiment SAME_LOOP leaves out reaches the same
    ones as the experiment it names (a rewrite giving it a loop of its own fails here)."""
    from conftest import SAME_LOOP

    from dpscale import registry
    sites = {e: fault_sites(registry.entry_point(e)) for e in registry.names("torch")}
    covered = set().union(*(sites[e] for e in FAULT_EXPERIMENTS))
    assert all(sites[e] for e in FAULT_EXPERIMENTS), sites
    assert set().union(*sites.values()) == covered, {e: v - covered for e, v in sites.items() if v - covered}
    for left_out, same in SAME_LOOP.items():
        assert same in FAULT_EXPERIMENTS and sites[left_out] == sites[same], (left_out, sites[left_out], sites[same])


# The hang cases run last in this module but start with its first test: each job mostly
# waits for its watchdog's limit, so the module's other tests run while they wait (they
# ran after them, and the limit was a minute of one worker's core idle in command 2).
# The limit covers their start beside those tests on two cores: 12 ranks alone took
# 36-43 s to their first line and 16 s more to step 2 (CI, 2026-12-02).
HANG_LIMIT_S = 150
HANG_TEST = "test_rank_hang_is_recorded_within_limit"


@pytest.fixture(scope="module", autouse=True)
def hangs_started(request, tiny_data, tmp_path_factory):
    """The hang cases started in the background when the module's first test runs, if
    this session runs a hang test at all (not under -m "not slow" or -k); the module's
    teardown waits for them (each ends by its limit)."""
    if not any(i.module is request.module and i.originalname == HANG_TEST for i in request.session.items):
        yield None
        return
    from concurrent.futures import ThreadPoolExecutor
    root = tmp_path_factory.mktemp("hangs")

    def one(experiment):
        spec = make_spec(tiny_data, experiment, 2, fault_variant(experiment), limit_s=HANG_LIMIT_S, inputs={"allreduce": {}})
        t0 = time.monotonic()
        rc, res, log = run_job(spec, root / experiment, fault="hang:rank=1")
        return rc, res, log, time.monotonic() - t0, spec["grace_s"]
    with ThreadPoolExecutor(len(FAULT_EXPERIMENTS)) as pool:
        yield {e: pool.submit(one, e) for e in FAULT_EXPERIMENTS}, root


@pytest.fixture(scope="module")
def hung_runs(hangs_started):
    futures, root = hangs_started
    return {e: f.result() for e, f in futures.items()}, root


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("experiment", FAULT_EXPERIMENTS)
def test_rank_hang_is_recorded_within_limit(hung_runs, experiment):
    runs, root = hung_runs
    rc, res, log, elapsed, grace = runs[experiment]
    assert rc == 0, log
    assert res["status"] == "hung" and res["stray_processes"] is False
    assert res["metrics"]["hung_after_s"] <= HANG_LIMIT_S + 1
    # torch start-up of 8 processes beside the module's other tests, teardown and grace included
    assert elapsed < HANG_LIMIT_S + grace + 60
    assert "hangs at step" in (root / experiment / "k.rank1.log").read_text()
