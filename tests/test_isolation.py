"""No orphans, no overlap, and a record of every failure (README, "Faults tried").

- Whatever dies (Snakemake's main process, the job's shell, the watchdog), every
  process of the measurement is gone within seconds, and the plain rerun completes.
- One file lock per device: a measurement whose devices are taken waits, then
  records `failed: devices busy` naming the holder.
- A crashed job leaves a `failed` record that the report shows, and the run's last
  lines name it; a plain rerun retries that job only.
- A hung NCCL job names its collective and the ranks that never arrived (the
  flight recorder's dumps, here synthetic: no GPU in CI).
"""
from __future__ import annotations

import csv
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (ROOT, SMALL, SNAKEMAKE, copy_primed, env_with_src, job_counts, local_env, make_spec,
                      run_job, smk)

from dpscale.plan import config
from dpscale.plan import specs
from dpscale.run import devices, flight, joblogs, lifeline
from dpscale import results
from dpscale.report import summary

WATCHDOG = str(ROOT / "scripts/watchdog.py")


def gone(pid: int) -> bool:
    p = lifeline.Proc.read(pid)
    return p is None or p.dead


def wait_until(cond, timeout: float, step: float = 0.2) -> float:
    """Seconds it took for cond() to hold; raises after timeout."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(step)
    return time.monotonic() - t0


def watchdog_cmd(tmp: Path, spec: dict, *cmd: str, wait_s: float = 30) -> list[str]:
    return [sys.executable, WATCHDOG, "--spec", json.dumps(spec), "--result", str(tmp / "k.json"),
            "--rank-logs", str(tmp / "k.log.ranks"), "--lock-dir", str(tmp / "locks"),
            "--lock-wait-s", str(wait_s), "--", *cmd]


FAKE = {"experiment": "allreduce", "variant": "default", "k": 1, "backend": "gloo", "limit_s": 120, "grace_s": 1}
# a job that ignores SIGTERM and has a grandchild; both write their pids to argv[1]
STUBBORN = ("import os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
            "open(sys.argv[1], 'w').write(f'{os.getpid()} {g.pid}'); time.sleep(600)")


# ---------------------------------------------------------------- the ancestry watch

def test_is_snakemake_by_its_program_not_a_word_in_its_arguments():
    assert lifeline.is_snakemake(["/venv/bin/python3", "/venv/bin/snakemake", "--cores", "2"])
    assert lifeline.is_snakemake(["python", "-m", "snakemake", "--executor", "slurm-jobstep"])
    assert lifeline.is_snakemake(["snakemake", "report"])
    assert not lifeline.is_snakemake(["/usr/bin/bash", "-c", "python /x/snakemake-wf/scripts/watchdog.py"])
    assert not lifeline.is_snakemake(["python", "scripts/watchdog.py", "--spec", "snakemake"])


def start_under_a_stand_in_shell(tmp_path: Path, cmd: list[str]) -> tuple[subprocess.Popen, int]:
    """A stand-in for Snakemake's job shell that starts `cmd` (its output to k.log);
    returns the shell and the pid of `cmd`."""
    starter = ("import subprocess, sys, time; "
               "p = subprocess.Popen(sys.argv[2:], stdout=open(sys.argv[1], 'w'), stderr=subprocess.STDOUT); "
               "print(p.pid, flush=True); time.sleep(600)")
    shell = subprocess.Popen([sys.executable, "-c", starter, str(tmp_path / "k.log"), *cmd],
                             stdout=subprocess.PIPE, text=True, env=env_with_src())
    return shell, int(shell.stdout.readline())


def test_watchdog_kills_the_job_when_its_parent_dies(tmp_path):
    """The job's shell dies by SIGKILL: the watchdog notices the changed chain, kills
    the job's group (a child that ignores SIGTERM, and its child) and exits."""
    pids = tmp_path / "pids"
    shell, watchdog = start_under_a_stand_in_shell(
        tmp_path, watchdog_cmd(tmp_path, FAKE, sys.executable, "-c", STUBBORN, str(pids)))
    wait_until(lambda: pids.exists() and pids.read_text(), 60)
    job = [int(p) for p in pids.read_text().split()]
    os.kill(shell.pid, signal.SIGKILL)
    shell.wait()
    took = wait_until(lambda: all(gone(p) for p in [watchdog, *job]), 10)
    log = (tmp_path / "k.log").read_text()
    assert "no one waits for this job any more" in log and "re-parented" in log, log
    assert not (tmp_path / "k.json").exists()   # nothing recorded: the next run redoes it
    print(f"job gone {took:.1f} s after its parent")


def test_a_watchdog_waiting_for_its_devices_gives_up_when_its_parent_dies(tmp_path):
    with devices.try_acquire(["cpu-0"], tmp_path / "locks", "other/job/k1"):
        shell, watchdog = start_under_a_stand_in_shell(
            tmp_path, watchdog_cmd(tmp_path, FAKE, sys.executable, "-c", "print('ran')", wait_s=600))
        wait_until(lambda: "waiting up to 600 s for cpu-0" in (tmp_path / "k.log").read_text(), 30)
        shell.kill()
        shell.wait()
        wait_until(lambda: gone(watchdog), 5)
    log = (tmp_path / "k.log").read_text()
    assert "gave up waiting for its devices" in log and "ran" not in log, log


def test_a_worker_dies_with_its_parent(tmp_path):
    """What each rank does at the top of torch_worker.py: die when torchrun dies."""
    child = ("import sys, time; from dpscale.run.lifeline import die_with_parent; die_with_parent(); "
             "open(sys.argv[1], 'w').write('up'); time.sleep(600)")
    parent = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]]); "
              "print(p.pid, flush=True); time.sleep(600)")
    flag = tmp_path / "up"
    p = subprocess.Popen([sys.executable, "-c", parent, child, str(flag)], stdout=subprocess.PIPE, text=True,
                         env=env_with_src())
    pid = int(p.stdout.readline())
    wait_until(flag.exists, 30)
    p.kill()
    p.wait()
    wait_until(lambda: gone(pid), 5)


# ---------------------------------------------------------------- device locks

def test_device_names():
    spec = {"k": 2, "backend": "nccl"}
    assert devices.device_names(spec, {}) == ["gpu-0", "gpu-1"]
    assert devices.device_names(spec, {"CUDA_VISIBLE_DEVICES": "3,5,7"}) == ["gpu-3", "gpu-5"]
    assert devices.device_names({**spec, "launch": {"nodes": 2, "gpus_per_node": 4}}, {}) == [
        "gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert devices.device_names({"k": 2, "backend": "xla-cpu"}, {"CUDA_VISIBLE_DEVICES": "3"}) == ["cpu-0", "cpu-1"]
    assert devices.device_names({"k": 1, "backend": "nccl"}, {"CUDA_VISIBLE_DEVICES": "GPU-1a/2b"}) == ["gpu-GPU-1a_2b"]


def free(lock_dir: Path, *names: str) -> bool:
    """Whether `names` could be locked now (and given back at once)."""
    got = devices.try_acquire(list(names), lock_dir, "test/probe/k1")
    if isinstance(got, devices.Held):
        got.release()
        return True
    return False


def test_locks_are_all_or_none_and_say_who_holds_them(tmp_path):
    with devices.try_acquire(["cpu-1"], tmp_path, "a/b/k1"):
        got = devices.try_acquire(["cpu-0", "cpu-1"], tmp_path, "c/d/k2")
        assert got[0] == "cpu-1" and got[1]["pid"] == os.getpid() and got[1]["job"] == "a/b/k1"
        assert free(tmp_path, "cpu-0")   # given back when cpu-1 was refused
    assert free(tmp_path, "cpu-0", "cpu-1")
    assert oct((tmp_path / "cpu-0.lock").stat().st_mode & 0o777) == "0o666"
    assert (tmp_path.stat().st_mode & 0o1777) == 0o1777
    with pytest.raises(devices.LockError, match="set locks.dir"):
        devices.try_acquire(["cpu-0"], tmp_path / "cpu-0.lock" / "sub", "x")


def test_busy_devices_make_the_job_wait_then_fail_naming_the_holder(tiny_data, tmp_path, monkeypatch):
    # the holder and the job in one run folder, whose path has a space (a clone in one)
    run = tmp_path / "a run folder with space"
    run.mkdir()
    monkeypatch.chdir(run)
    held = devices.try_acquire(["cpu-0"], tmp_path / "locks", "ddp_weak/tuned/k1")
    assert devices.holder(tmp_path / "locks" / "cpu-0.lock")["cwd"] == str(run)   # the lock says where
    spec = make_spec(tiny_data, "ddp_weak", 1, "cached")
    t0 = time.monotonic()
    rc, res, log = run_job(spec, tmp_path / "job", lock_dir=tmp_path / "locks", lock_wait_s=3)
    elapsed = time.monotonic() - t0
    held.release()
    assert rc == 0 and res["status"] == "failed", log
    assert elapsed >= 3
    # the holder's folder as a record names a path: "." when it runs in this run's folder
    holder = f"cpu-0 held by pid {os.getpid()} (ddp_weak/tuned/k1 in ., since "
    assert res["reason"].startswith(f"devices busy: {holder}"), res["reason"]
    assert "for more than 3 s" in res["reason"] and "locks.wait_s" in res["reason"]
    assert f"waiting up to 3 s for cpu-0 held by pid {os.getpid()}" in log
    assert not list((tmp_path / "job").glob("k.rank*.log"))   # it never started


def test_a_job_runs_once_its_devices_are_free(tmp_path):
    held = devices.try_acquire(["cpu-0"], tmp_path / "locks", "other/job/k1")
    write = ("import sys; from dpscale.results import make_result, write_json_atomic; "
             "write_json_atomic(sys.argv[1], make_result(experiment='allreduce', variant='default', k=1, "
             "status='ok', backend='gloo'))")
    p = subprocess.Popen(watchdog_cmd(tmp_path, FAKE, sys.executable, "-c", write, str(tmp_path / "k.json")),
                         env=env_with_src(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(2)
    assert p.poll() is None and not (tmp_path / "k.json").exists()
    held.release()
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0 and json.loads((tmp_path / "k.json").read_text())["status"] == "ok", out


def test_a_job_leaves_no_rank_log_of_an_earlier_run_beside_its_own(tmp_path):
    """A k that ran on four ranks (or two nodes) before and on two processes now (emulated,
    one node) would leave k.rank3.log or k.node1.rank0.log beside this run's, read as
    this run's. The job's own log and other jobs' rank logs stay."""
    stale = [tmp_path / n for n in ("k.rank3.log", "k.node1.rank0.log", "k.rank0.log")]
    kept = [tmp_path / n for n in ("k.log", "k2.rank0.log", "kx.rank0.log")]
    for f in stale + kept:
        f.write_text("an earlier run\n")
    write = ("import sys; from dpscale.results import make_result, write_json_atomic; "
             "write_json_atomic(sys.argv[1], make_result(experiment='allreduce', variant='default', k=1, "
             "status='ok', backend='gloo'))")
    r = subprocess.run(watchdog_cmd(tmp_path, FAKE, sys.executable, "-c", write, str(tmp_path / "k.json")),
                       env=env_with_src(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads((tmp_path / "k.json").read_text())["status"] == "ok", r.stdout + r.stderr
    assert not [f.name for f in stale if f.exists()], sorted(p.name for p in tmp_path.iterdir())
    assert all(f.read_text() == "an earlier run\n" for f in kept)


def test_a_killed_watchdog_s_locks_last_as_long_as_its_worker(tmp_path):
    """The locks go to the worker too (pass_fds): a watchdog killed by SIGKILL does not
    free the devices while torchrun is still tearing down."""
    worker = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(4)")
    p = subprocess.Popen(watchdog_cmd(tmp_path, FAKE, sys.executable, "-c", worker), env=env_with_src(),
                         stdout=subprocess.DEVNULL)
    lock = tmp_path / "locks" / "cpu-0.lock"
    wait_until(lambda: (devices.holder(lock) or {}).get("pid") == p.pid, 30)
    time.sleep(0.5)
    p.kill()
    p.wait()
    got = devices.try_acquire(["cpu-0"], tmp_path / "locks", "x")
    assert isinstance(got, tuple) and "that pid is gone" in devices.describe(*got)
    wait_until(lambda: free(tmp_path / "locks", "cpu-0"), 10)


def test_lock_settings_resolve_with_the_scale():
    assert config.resolve_locks({}, "smoke") == {"dir": devices.DEFAULT_DIR, "wait_s": 300}
    assert config.resolve_locks({"locks": {"wait_s": "auto"}}, "paper")["wait_s"] == 1800
    assert config.resolve_locks({"locks": {"dir": "/x/y", "wait_s": 5}}, "paper") == {"dir": "/x/y", "wait_s": 5}
    with pytest.raises(config.ConfigError, match="locks.dir: 'here' is relative"):
        config.resolve_locks({"locks": {"dir": "here"}}, "smoke")


# ---------------------------------------------------------------- hang diagnosis

def test_the_process_group_timeout_fires_first():
    assert specs.pg_timeout_s(120) == 108 and specs.pg_timeout_s(900) == 810
    assert specs.pg_timeout_s(60) == 50 and specs.pg_timeout_s(12) == 6
    for limit in (20, 30, 60, 120, 600, 900, 3600):
        assert limit - specs.pg_timeout_s(limit) >= 10


def entry(seq, name="nccl:all_reduce", state="completed", pg=("0", "default_pg")):
    """One flight-recorder entry, with the keys FlightRecorder::dump writes."""
    return {"record_id": seq, "pg_id": 0, "process_group": pg, "collective_seq_id": seq, "p2p_seq_id": 0,
            "op_id": seq, "profiling_name": name, "time_created_ns": 1_000 * seq, "input_sizes": [[1024]],
            "input_dtypes": ["Float"], "output_sizes": [[1024]], "output_dtypes": ["Float"], "state": state,
            "time_discovered_started_ns": 0, "time_discovered_completed_ns": 0, "retired": state == "completed",
            "timeout_ms": 50_000, "is_p2p": False, "frames": []}


def dump(entries, ranks="[0, 1, 2]"):
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
            "pg_status": {"0": {"last_enqueued_collective": 4, "last_started_collective": 4,
                                "last_completed_collective": 3}}, "entries": entries}


def write_dumps(prefix: str) -> None:
    """Ranks 0 and 2 wait in all_reduce #4; rank 1 stopped after #3; rank 2 left no dump."""
    done = [entry(1, "nccl:broadcast"), entry(2), entry(3)]
    for rank, entries in ((0, done + [entry(4, state="started")]), (1, done)):
        Path(f"{prefix}{rank}").write_bytes(pickle.dumps(dump(entries)))


def test_flight_recorder_names_the_collective_and_the_missing_ranks(tmp_path):
    prefix = str(tmp_path / flight.PREFIX)
    write_dumps(prefix)
    os.mkfifo(f"{prefix}0.pipe")   # the rank's dump-request FIFO is not a dump
    dumps = flight.load_dumps(prefix)
    assert sorted(dumps) == [0, 1]
    hung = flight.hung_collective(dumps)
    assert hung["collective"] == "nccl:all_reduce" and hung["seq"] == 4 and hung["arrived"] == [0]
    assert hung["missing_ranks"] == [1, 2] and hung["no_dump"] == [2]
    assert flight.summary(hung) == "nccl:all_reduce #4 of process group 0, never reached by rank(s) 1, 2"
    assert flight.hung_collective({0: dump([entry(1)])}) is None


def test_flight_recorder_dump_on_request(tmp_path):
    prefix = str(tmp_path / flight.PREFIX)
    os.mkfifo(f"{prefix}0.pipe")
    reader = os.open(f"{prefix}0.pipe", os.O_RDONLY | os.O_NONBLOCK)   # what a live NCCL rank holds
    try:
        assert flight.request_dumps(prefix, wait_s=0.2) == 1 and os.read(reader, 10) == b"1"
    finally:
        os.close(reader)
    assert flight.request_dumps(prefix, wait_s=0.2) == 0   # no reader: that rank is gone
    env = flight.env_for(tmp_path, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"})
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env and env["TORCH_FR_DUMP_TEMP_FILE"] == prefix
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"


def test_an_nccl_hang_is_recorded_with_its_collective(tmp_path):
    """A stand-in for an NCCL job whose collective timed out: it leaves the flight
    recorder's dumps where the watchdog told it to and exits 1."""
    fake = ("import os, sys; sys.path.insert(0, sys.argv[1]); from test_isolation import write_dumps; "
            "write_dumps(os.environ['TORCH_FR_DUMP_TEMP_FILE']); sys.exit(1)")
    spec = {**FAKE, "backend": "nccl", "k": 2, "limit_s": 60}
    env = {**env_with_src(), "CUDA_VISIBLE_DEVICES": "4,6"}
    out = subprocess.run(watchdog_cmd(tmp_path, spec, sys.executable, "-c", fake, str(ROOT / "tests")),
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    r = json.loads((tmp_path / "k.json").read_text())
    assert r["status"] == "hung" and r["missing_ranks"] == [1, 2], r
    assert "a rank's process-group timeout fired" in r["reason"]
    assert r["reason"].endswith("nccl:all_reduce #4 of process group 0, never reached by rank(s) 1, 2")
    assert r["nccl_traces"] == [str(tmp_path / f"k.{flight.PREFIX}{i}") for i in (0, 1)]   # kept beside the logs
    assert "devices gpu-4, gpu-6" in out.stdout


def test_failure_reason_is_the_first_failed_rank_s_exception():
    job_log = ("[default1]:RuntimeError: boom\nRoot Cause (first observed failure):\n[0]:\n"
               "  time      : now\n  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 9)\n")
    ranks = {"rank 0": "===== stdout.log =====\n[rank0]: RuntimeError: Connection closed by peer\n",
             "rank 1": "[rank1]: Traceback (most recent call last):\n[rank1]: ValueError: the root cause\n"}
    assert joblogs.failure_reason(job_log, ranks, 1) == "ValueError: the root cause (rank 1; exit code 1)"
    # torchrun saw rank 0 go first, of the broken connection rank 1's crash left it
    second = job_log.replace("rank      : 1 (local_rank: 1)", "rank      : 0 (local_rank: 0)")
    assert joblogs.failure_reason(second, ranks, 1) == "ValueError: the root cause (rank 1; exit code 1)"
    assert joblogs.failure_reason("Traceback\nOSError: disk\n", {}, 2) == "OSError: disk (exit code 2)"
    crashed = job_log.replace("[default1]:RuntimeError: boom\n", "").replace(
        "exitcode  : 1 (pid: 9)\n", "exitcode  : -11 (pid: 9)\n  error_file: <N/A>\n"
        "  traceback : Signal 11 (SIGSEGV) received by PID 9\n") + "ChildFailedError: (exit code 1)\n"
    assert (joblogs.failure_reason(crashed, {"rank 0": "", "rank 1": "step 3\n"}, 1)
            == "rank 1 was killed: Signal 11 (SIGSEGV) received by PID 9 (exit code 1)")
    bare = job_log.replace("[default1]:RuntimeError: boom\n", "") + "ChildFailedError: (exit code 1)\n"
    assert (joblogs.failure_reason(bare, {"rank 1": ""}, 1)
            == "rank 1 exited with code 1 and printed no traceback (exit code 1)")
    assert (joblogs.failure_reason("last words\n", {}, -9)
            == "the worker exited with exit code -9; its last line: last words")


# ---------------------------------------------------------------- the workflow

def copy_processes(repo: Path) -> list[str]:
    """Processes whose command line or working folder lies in the copy `repo`."""
    out, me = [], os.getpid()
    for pid in (int(e) for e in os.listdir("/proc") if e.isdigit()):
        if pid == me or gone(pid):
            continue
        argv = lifeline.cmdline(pid)
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = ""
        if str(repo) in " ".join(argv) or cwd == str(repo) or cwd.startswith(f"{repo}/"):
            out.append(f"{pid}: {' '.join(argv)[:160]}")
    return out


def workflow_config(tmp_path: Path) -> list[str]:
    # k=2 only: two jobs (seed, cached), each torchrun and two ranks; what these tests
    # prove needs one job to fail or hang and another beside it, not a k=1 pair too.
    # The copy's own lock folder: CI's other jobs on this host must not make it wait.
    return ["--config", *SMALL, "ks=[2]", "experiments=[ddp_weak]", f"locks={{dir: {tmp_path / 'locks'}}}"]


@pytest.mark.workflow
@pytest.mark.slow
def test_kill9_of_snakemake_main_alone_leaves_no_process(primed, tmp_path):
    """Before the ancestry watch, the job's shell, the watchdog, torchrun and the ranks
    lived on, re-parented to init, until the watchdog's limit. A smoke job ends by
    itself in ~10 s, so here the first run's ranks wait at init (a hang fault): what
    is alive 15 s after the kill was left alive by the kill, not still finishing."""
    repo = copy_primed(primed, tmp_path / "repo", machines=False)
    cfg = workflow_config(tmp_path)
    env = local_env(DPSCALE_FAULT="hang:rank=0:at=init")
    with open(tmp_path / "first.log", "w") as out:
        main = subprocess.Popen([SNAKEMAKE, "--cores", "2", "report", *cfg], cwd=repo, start_new_session=True,
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    hanging = repo / "logs/ddp_weak"
    wait_until(lambda: any("hangs at init" in p.read_text() for p in hanging.glob("*/*.ranks/*/*/*/stdout.log")),
               300, 0.5)
    os.kill(main.pid, signal.SIGKILL)   # Snakemake's main process only: not its group
    main.wait()
    t0 = time.monotonic()
    while (left := copy_processes(repo)) and time.monotonic() - t0 < 15:
        time.sleep(0.2)
    assert not left, "alive 15 s after Snakemake's main process was killed:\n" + "\n".join(left)
    print(f"every process of the job gone {time.monotonic() - t0:.1f} s after the kill")
    # The plain rerun's start: no --unlock, no flags, the killed run's lock released and
    # both jobs planned. That such a rerun then completes is test_reliability's
    # test_kill9_then_plain_rerun_completes (its kill takes the whole group); measuring
    # both jobs and the report again here cost ~18 s of command 2 and proved nothing more.
    again = smk(repo, "-n", "--cores", "2", "report", *cfg)
    assert "Removed a stale lock left by a killed run" in again.stdout + again.stderr
    assert job_counts(again.stdout) == {"ddp_weak": 2, "report": 1}, again.stdout[-3000:]
    assert not list((repo / ".snakemake/locks").glob("*.lock"))


def status_rows(repo: Path) -> dict[str, dict]:
    """This run's rows of the report's status table (the reference machines' aside)."""
    with open(repo / "results/report/tables/status.csv") as f:
        return {f"{r['experiment']}/{r['variant']}/k{r['k']}": r for r in csv.DictReader(f)
                if r["machine"] == "this run"}


@pytest.mark.workflow
@pytest.mark.slow
def test_a_crashed_job_is_reported_and_a_plain_rerun_retries_it_only(primed, tmp_path):
    """Two k=2 jobs, one made to crash. The first run's last lines (test_summary.py checks
    their text from a report's): after Snakemake's own, the answer, what failed with its
    log, and the report's path, last."""
    repo = copy_primed(primed, tmp_path / "repo", machines=False)
    cfg = workflow_config(tmp_path)
    victim = "ddp_weak/cached/k2"
    fault = {**os.environ, "DPSCALE_FAULT": f"crash:rank=1:job={victim}"}
    first = smk(repo, "--cores", "2", "report", *cfg, env=fault)
    assert "1 measurement(s) failed or hung" in first.stdout + first.stderr, first.stderr[-3000:]
    err = first.stderr.rstrip("\n").splitlines()
    assert err[-1] == f"report: {(repo / 'results/report/report.html').resolve()}", err[-30:]
    tail = "\n".join(err[-60:])
    assert tail.rfind("Complete log") < tail.index(summary.HEAD), "printed after Snakemake's own last lines"
    assert f"{victim} failed: RuntimeError: injected fault" in tail and f"(log logs/{victim}.log)" in tail, tail
    assert (repo / "results/report/summary.txt").read_text().rstrip("\n").splitlines()[-1] == err[-1]
    rows = status_rows(repo)
    assert rows[victim]["status"] == "FAILED" and rows[victim]["file"] == f"logs/{victim}.log", rows[victim]
    assert rows[victim]["reason"].startswith("RuntimeError: injected fault: rank 1 crashes at step (rank 1;")
    assert [r["status"] for k, r in rows.items() if k != victim] == ["ok"], rows   # ddp_weak/seed/k2
    others = {p: p.stat().st_mtime_ns for p in (repo / "results/runs").glob("*/*/k*.json") if victim not in str(p)}
    assert len(others) == 1, others

    dry = smk(repo, "-n", "--cores", "2", "report", *cfg)
    assert job_counts(dry.stdout) == {"attempt_stamp": 1, "ddp_weak": 1, "report": 1}, dry.stdout[-3000:]
    text = dry.stdout + dry.stderr
    assert f"results/runs/{victim}.json" in text and "failed attempts: 1" in text, text[-3000:]
    assert "the last attempt failed (RuntimeError: injected fault" in text

    smk(repo, "--cores", "2", "report", *cfg)   # plain rerun, the fault gone
    assert results.load_result(repo / f"results/runs/{victim}.json")["status"] == "ok"
    assert status_rows(repo)[victim]["status"] == "ok"
    assert {p: p.stat().st_mtime_ns for p in others} == others   # the others did not rerun
    assert "Nothing to be done" in smk(repo, "-n", "--cores", "2", "report", *cfg).stdout
