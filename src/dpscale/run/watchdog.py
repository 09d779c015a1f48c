"""Run one measurement under a watchdog, and always leave a record of how it ended.

torchrun restarts and tears down ranks, but nothing in it bounds a job whose
collective never returns (the memcpy switch is known to wedge DDP), nothing ties it
to the Snakemake run that wants its result, and nothing keeps another measurement
off its GPUs. So this wrapper:

- takes a file lock per device the job uses (dpscale.run.devices), waiting up to
  locks.wait_s for a holder to finish, and records `failed: devices busy` if it
  does not;
- starts the worker (dpscale.run.command.worker_command) in its own process group, tied
  to this process by PR_SET_PDEATHSIG, with the lock descriptors passed on, and the
  persistent compilation caches of its family in its environment (dpscale.run.caches:
  config cache.dir; a cache that cannot be used turns them off, never fails the job);
- prints a heartbeat line into the job's log every HEARTBEAT_S while a launch runs;
- records what the answer cost: each launch's start (from the spawn of its process to
  the wall-clock time its worker stamped on its first timed step, `start_s`), each
  launch's seconds and the job's wall time (dpscale.run.launches.cost_fields);
- polls: if the job's shell or Snakemake dies (dpscale.run.lifeline.Ancestry), it kills
  the group at once and exits, recording nothing (the next run redoes the job, which
  Snakemake marked incomplete); at the limit it kills the group and records `hung`;
- records `failed` (reason = the exception that ended it, exit code, log path, last
  log lines) for a worker that exits non-zero, and `hung` for one whose rank timed
  out (NCCL: the collective and the ranks that never arrived, from the flight
  recorder). Either way it exits 0, so the rest of the workflow and the report run;
  a failed record is never up to date: a plain rerun retries it (rules/common.smk).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from dpscale.measure import gpustate
from dpscale.plan import specs
from dpscale.run import caches, command, devices, flight, joblogs, launches, lifeline
from dpscale import provenance, registry
from dpscale.results import job_label, make_result, record_failure, save, utc_now

POLL_S = 0.5          # how soon a dead Snakemake or a finished worker is noticed
ORPHAN_GRACE_S = 3    # SIGTERM -> SIGKILL when no one waits for the job: all gone within 10 s
LOG_TAIL = 30         # lines of the job's log kept in a failed or hung record
RANK_TAIL = 10        # lines of each rank's log
HEARTBEAT_S = 60      # a line in the job's log this often while a launch runs (tail -f)


class Stop(Exception):
    """SIGTERM or SIGHUP: Snakemake (or a person) stops the job."""


def _raise_stop(signum, frame):
    raise Stop(signal.Signals(signum).name)


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the watchdog dies, even by SIGKILL.
    The job runs in its own session (so a hang can be killed as a group), which also
    means killing Snakemake's group would not reach it; torchrun turns the SIGTERM
    into an orderly teardown of its ranks (and each rank dies with torchrun)."""
    lifeline.set_parent_death_signal(signal.SIGTERM)


@dataclass
class Job:
    """One measurement's paths and what every record of it carries."""
    spec: dict
    result: Path
    rank_dir: Path     # torchrun --log-dir, flattened and removed at the end
    log: Path          # the job's log, which the rule sends our output to
    prefix: Path       # flattened rank logs: <prefix>.rank<r>.log
    trace_prefix: str | None = None   # NCCL flight-recorder dumps: <trace_prefix><rank>
    single: bool = False   # the worker alone, no torchrun (command.single_rank): its streams are teed here
    started_utc: str = field(default_factory=utc_now)

    @classmethod
    def of(cls, spec: dict, result: str, rank_logs: str) -> Job:
        log = Path(str(rank_logs).removesuffix(".ranks"))
        return cls(spec, Path(result), Path(rank_logs), log, Path(str(log).removesuffix(".log")))

    def clear_rank_logs(self) -> None:
        """Remove the flattened rank logs of this job's earlier runs: a run on other ranks
        or nodes (emulated, then real; two nodes, then one) left files this one would not
        overwrite, read beside its own as if they were."""
        for old in self.prefix.parent.glob(glob.escape(self.prefix.name) + ".*rank*.log"):
            old.unlink(missing_ok=True)

    @property
    def label(self) -> str:
        return job_label(self.spec["experiment"], self.spec["variant"], self.spec["k"])

    def write(self, status: str, reason: str | None, **extra) -> None:
        s = self.spec
        save(self.result, make_result(
            experiment=s["experiment"], variant=s["variant"], k=s["k"], backend=s["backend"],
            config=s.get("config"), fingerprint=s.get("fingerprint"), env=s.get("env", {}),
            status=status, reason=reason, started_utc=self.started_utc,
            code=provenance.code_record(registry.get(s["experiment"]).sources), **extra))

    def fail(self, reason: str, **evidence) -> int:
        """Record a failed attempt: the report shows it, a plain rerun retries it."""
        self.write("failed", reason, log=str(self.log), **evidence)
        record_failure(self.result, reason)
        print(f"[watchdog] recorded failed: {reason}", flush=True)
        return 0

    def read_log(self) -> str:
        sys.stdout.flush()
        try:
            return self.log.read_text(errors="replace")
        except OSError:   # output not sent to {log} (by hand, in a terminal)
            return ""

    def evidence(self, log_text: str, rank_logs: dict[str, Path]) -> dict:
        """What a failed or hung record keeps, to be read without the log files."""
        return {"rank_logs": [str(p) for p in rank_logs.values()],
                "log_tail": joblogs.tail(log_text, LOG_TAIL),
                "rank_tails": {lb: joblogs.tail(p.read_text(errors="replace"), RANK_TAIL)
                               for lb, p in rank_logs.items()}}


@dataclass
class Outcome:
    rc: int | None        # the worker's exit status; None when the watchdog killed it
    elapsed: float
    killed: str | None    # None, "limit", or why the job had no one left to wait for it
    stray: bool           # processes of the group still alive after the kill
    spawned_unix: float = 0.0   # wall-clock time of the spawn: a worker's timestamps are measured from it


TEE_PREFIX = "[default0]:"   # what torchrun --tee puts before rank 0's lines


def _tee(src, sink, path: Path) -> None:
    """One stream of a single-rank worker, line by line, into its rank log (torchrun
    --redirects' file) and, prefixed as torchrun --tee prints it, into the job's log."""
    with open(path, "w") as f:
        for line in iter(src.readline, b""):
            text = line.decode(errors="replace")
            f.write(text)
            f.flush()
            sink.write(TEE_PREFIX + text)
            sink.flush()


def tee_streams(proc: subprocess.Popen, rank_dir: Path) -> list[threading.Thread]:
    """The layout torchrun writes (<dir>/<run>/attempt_0/<rank>/{stdout,stderr}.log),
    so collect_rank_logs reads a single-rank launch as it reads torchrun's."""
    d = rank_dir / "single" / "attempt_0" / "0"
    d.mkdir(parents=True, exist_ok=True)
    threads = [threading.Thread(target=_tee, args=(proc.stdout, sys.stdout, d / "stdout.log"), daemon=True),
               threading.Thread(target=_tee, args=(proc.stderr, sys.stderr, d / "stderr.log"), daemon=True)]
    for t in threads:
        t.start()
    return threads


def supervise(cmd: list[str], env: dict, limit: float, grace: float, pass_fds=(),
              ancestry: lifeline.Ancestry | None = None, before_kill=None, label: str = "",
              tee: Path | None = None) -> Outcome:
    """Run `cmd` in its own process group until it exits, passes `limit` seconds, or
    its ancestry breaks; the group is gone (or `stray`) when this returns. tee: a
    single-rank worker's rank-log folder (its streams are copied there and here)."""
    spawned, t0 = time.time(), time.monotonic()
    pipe = subprocess.PIPE if tee is not None else None
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_die_with_parent,
                            pass_fds=tuple(pass_fds), stdout=pipe, stderr=pipe)
    pumps = tee_streams(proc, tee) if tee is not None else []
    killed, beat = None, t0 + HEARTBEAT_S
    try:
        while (rc := proc.poll()) is None:
            if ancestry and (broken := ancestry.broken()):
                killed = f"no one waits for this job any more: {broken}"
                break
            if (now := time.monotonic()) - t0 >= limit:
                killed = "limit"
                break
            if now >= beat:
                print(f"[watchdog] {label}running, {now - t0:.0f} s of the {limit:g} s limit", flush=True)
                beat += HEARTBEAT_S
            time.sleep(POLL_S)
    except (KeyboardInterrupt, Stop):   # Snakemake stops us: take the ranks down with us
        lifeline.kill_group(proc.pid, ORPHAN_GRACE_S, proc)
        raise
    elapsed = time.monotonic() - t0
    if killed == "limit":
        print(f"[watchdog] no result after {elapsed:.0f} s: killing process group {proc.pid}", flush=True)
        if before_kill:
            before_kill()
    if killed or lifeline.group_alive(proc.pid):   # also ranks left behind by an exited torchrun
        lifeline.kill_group(proc.pid, grace if killed == "limit" else ORPHAN_GRACE_S, proc)
    proc.wait()
    for t in pumps:   # the streams' last lines are in the logs before anyone reads them
        t.join(timeout=5)
    return Outcome(None if killed else rc, elapsed, killed, lifeline.group_alive(proc.pid), spawned)


def collect_rank_logs(torchrun_dir: Path, dest_prefix: Path) -> dict[str, Path]:
    """torchrun writes <dir>/<run_id>_<rand>/attempt_<n>/<local rank>/{stdout,stderr}.log,
    one <run_id>_<rand> folder per node. Flatten each node's last attempt into
    <prefix>.rank<r>.log (one node), or <prefix>.node<i>.rank<r>.log (several: i in
    the order the agents started; the global rank is in each line's [rank r/k]).
    Returns {"rank 1": path, ...} or {"node 1 rank 0": path, ...}."""
    out = {}
    runs = sorted({p.parent for p in torchrun_dir.glob("*/attempt_*")}, key=lambda p: p.stat().st_mtime)
    for i, run in enumerate(runs):
        last = max(run.glob("attempt_*"), key=lambda p: p.stat().st_mtime)
        tag = f".node{i}" if len(runs) > 1 else ""
        for rank_dir in sorted(last.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
            if not rank_dir.is_dir():
                continue
            target = Path(f"{dest_prefix}{tag}.rank{rank_dir.name}.log")
            with open(target, "w") as f:
                for stream in ("stdout.log", "stderr.log"):
                    p = rank_dir / stream
                    if p.exists():
                        f.write(f"===== {stream} =====\n{p.read_text(errors='replace')}\n")
            out[joblogs.rank_label(target, dest_prefix)] = target
    shutil.rmtree(torchrun_dir, ignore_errors=True)
    return out


def flight_evidence(job: Job) -> dict:
    """On NCCL: the hung collective and the ranks that never arrived, from the flight
    recorder's dumps, which are kept beside the rank logs ({} without dumps)."""
    if not job.trace_prefix:
        return {}
    dumps = flight.load_dumps(job.trace_prefix)
    hung = flight.hung_collective(dumps) if dumps else None
    kept = []
    for rank, path in flight.dump_files(job.trace_prefix).items():
        if job.rank_dir.resolve() in path.resolve().parents:   # ours: save it from the rmtree
            dest = Path(f"{job.prefix}.{flight.PREFIX}{rank}")
            shutil.move(path, dest)
            path = dest
        kept.append(str(path))
    out = {"nccl_traces": sorted(kept)} if kept else {}
    if hung:
        out.update(hung_collective=hung, missing_ranks=hung["missing_ranks"])
    return out


def hung_how(out: Outcome, limit: float, rank_timed_out: bool) -> str:
    """Which clock stopped a job that made no progress: the outer watchdog, and whether a
    rank's process-group timeout (its log says so: gloo's 'Timed out waiting', NCCL's
    watchdog) had fired first, or that timeout alone."""
    pg = specs.pg_timeout_s(limit)
    if out.killed and rank_timed_out:
        return (f"killed by the outer watchdog after {out.elapsed:.1f} s (limit {limit:g} s); a rank's "
                f"process-group timeout of {pg:g} s had fired first (its log says so) without ending the job")
    if out.killed:
        return (f"killed by the outer watchdog after {out.elapsed:.1f} s (limit {limit:g} s; no rank's "
                f"process-group timeout of {pg:g} s fired before it)")
    return f"a rank's process-group timeout fired after {out.elapsed:.1f} s (timeout {pg:g} s, limit {limit:g} s)"


def record_outcome(job: Job, out: Outcome, produced: Path, label: str = "") -> dict | None:
    """The end of one launch: its ok result (which the worker wrote to `produced`), or
    None once the job's record is written: hung, failed, or not ok by the worker's own
    check (one such launch ends the job: no half merges). `label` prefixes the reason."""
    limit = float(job.spec["limit_s"])
    fr = flight_evidence(job)
    logs = collect_rank_logs(job.rank_dir, job.prefix)
    texts = {lb: p.read_text(errors="replace") for lb, p in logs.items()}
    log_text = job.read_log()
    evidence = {**job.evidence(log_text, logs), **fr, "stray_processes": out.stray}
    if out.killed == "limit" or (out.rc != 0 and (joblogs.timed_out(texts) or fr.get("hung_collective"))):
        produced.unlink(missing_ok=True)
        how = hung_how(out, limit, joblogs.timed_out(texts))
        detail = (flight.summary(fr["hung_collective"]) if fr.get("hung_collective")
                  else joblogs.stuck_lines(texts))
        reason = f"{label}no progress: {how}" + (f"; {detail}" if detail else "")
        job.write("hung", reason, metrics={"hung_after_s": round(out.elapsed, 1)}, log=str(job.log), **evidence)
        print(f"[watchdog] recorded hung: {reason}; stray processes left: {out.stray}", flush=True)
        return None
    if out.rc != 0:
        produced.unlink(missing_ok=True)
        job.fail(label + joblogs.failure_reason(log_text, texts, out.rc), exit_code=out.rc, **evidence)
        return None
    if not produced.exists():
        job.fail(f"{label}the worker exited 0 but wrote no result", exit_code=0, **evidence)
        return None
    written = json.loads(produced.read_text())
    if written.get("status") == "ok":
        return written
    if isinstance(written.get("metrics"), dict):   # its cost, and no time of day left in its metrics
        launches.stamp(written, out.spawned_unix, out.elapsed)
    save(job.result, written)   # the launch's own record becomes the job's
    produced.unlink()
    if written.get("status") == "failed":   # a check beside the timing failed it: retried too
        record_failure(job.result, label + (written.get("reason") or "failed"))
    return None


def finish(job: Job, done: list[dict], wall_s: float) -> int:
    """The job's one result from its launches' (dpscale.run.launches.merge), with what it
    cost (each launch's start and seconds, the job's wall time), failed where the config's
    gpu_state policy says a shared or throttled device fails it."""
    try:
        merged = launches.merge(done)
    except ValueError as e:   # launches of a result with nothing to merge them by
        return job.fail(str(e))
    merged["metrics"].update(launches.cost_fields(done, wall_s))
    if len(done) > 1:
        m = merged["metrics"]
        print(f"[watchdog] {len(done)} launches, samples/s {', '.join(f'{v:.4g}' for v in m['samples_per_s_launches'])}: "
              f"the median launch's {m['samples_per_s']:.4g} recorded", flush=True)
    why = gpustate.policy_failure(merged.get("gpu_state"), job.spec.get("gpu_state"))
    if why:
        merged.update(status="failed", reason=f"gpu_state: {why}")
    if crowd := oversubscribed(job.spec):
        merged["oversubscribed"] = crowd
        print(f"[watchdog] flagged: {crowd['why']}", flush=True)
    save(job.result, merged)
    if why:
        record_failure(job.result, merged["reason"])
        print(f"[watchdog] recorded failed: {merged['reason']}", flush=True)
    return 0


def oversubscribed(spec: dict, cores: int | None = None) -> dict | None:
    """More ranks (times their threads) than CPU cores this job may run on: the ranks
    took turns on the cores, so the number measures the host's scheduler as much as the
    devices and the fabric (a configuration forced past what the machine has, e.g.
    cluster={gpus_per_node: 8} on two cores). None when every rank had a core."""
    cores = cores or len(os.sched_getaffinity(0))
    ranks, threads = specs.processes(spec), int(spec.get("threads_per_rank") or 1)
    if ranks * threads <= cores:
        return None
    return {"ranks": ranks, "threads_per_rank": threads, "cores": cores,
            "why": f"{ranks} rank(s) x {threads} thread(s) shared {cores} CPU core(s): they took turns, so the "
                   "number measures the host's scheduler too"}


def launch_path(job: Job, i: int, n: int) -> Path:
    """Where launch i of n writes: a file of its own beside the result, even for one launch.
    The job's result is written by the watchdog alone, with the launches' cost: a worker
    that wrote the result itself left it there, complete but uncosted, when the watchdog
    was stopped between the worker's exit and its own write (seen on the H200: a
    time-to-accuracy job interrupted by its run's time limit 2 s after its worker wrote)."""
    return job.result.with_name(f".{job.result.stem}.launch{i}.json")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description="Run a measurement (its worker, by the spec's experiment) under a watchdog; "
                    "record skipped, hung and failed runs.")
    ap.add_argument("--spec", required=True, help="the job's spec (JSON) as built by the workflow")
    ap.add_argument("--result", required=True, help="result JSON the job must produce")
    ap.add_argument("--rank-logs", required=True,
                    help="torchrun --log-dir of the job (<log>.ranks); flattened to <log stem>.rank<r>.log")
    ap.add_argument("--lock-dir", default=None,
                    help=f"folder of the per-device locks (config locks.dir; default {devices.DEFAULT_DIR})")
    ap.add_argument("--lock-wait-s", type=float, default=300,
                    help="seconds to wait for a device another process holds (config locks.wait_s)")
    ap.add_argument("--cache-dir", default=None,
                    help="root of the persistent compilation caches (config cache.dir; dpscale.run.caches); "
                         "without it the worker keeps the environment it has")
    ap.add_argument("cmd", nargs=argparse.REMAINDER,
                    help="-- a command to run instead of the spec's worker (tests)")
    return ap


def prepare(job: Job, cmd: list[str], cache_dir: str | None = None) -> tuple[list[str], dict]:
    """The command (multi-node: srun + torchrun c10d / jax.distributed) and its environment,
    with the compilation caches of the job's family under `cache_dir` (dpscale.run.caches)."""
    spec = job.spec
    launch_env = {}
    if spec.get("launch"):
        cmd, launch_env = command.multinode_command(cmd, spec["launch"])   # RuntimeError outside SLURM
    env = {**os.environ, **spec.get("env", {}), **launch_env, "PYTHONUNBUFFERED": "1"}
    changes, note = caches.env_for(cache_dir, registry.get(spec["experiment"]).family, spec.get("fingerprint") or {})
    env = caches.apply(env, changes)
    if note:
        print(f"[watchdog] {note}", flush=True)
    if spec.get("threads_per_rank"):   # before the worker loads torch: its OpenMP pool reads it once
        env["OMP_NUM_THREADS"] = str(spec["threads_per_rank"])
    if job.rank_dir.exists():
        shutil.rmtree(job.rank_dir)
    if spec["backend"] == "nccl":
        job.rank_dir.mkdir(parents=True)
        env.update(flight.env_for(job.rank_dir, env))
        job.trace_prefix = flight.dump_prefix(env)
    return cmd, env


def run_launches(job: Job, cmd: list[str], env: dict, held, ancestry: lifeline.Ancestry) -> int:
    """The job's launches, one after another (dpscale.run.launches), each stamped with its
    start and seconds; the first that does not end ok ends the job with its record."""
    spec = job.spec
    limit, grace = float(spec["limit_s"]), float(spec.get("grace_s", 15))
    pipe = env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE") if job.trace_prefix else None
    n, done, t0 = launches.count(spec), [], time.monotonic()
    for i in range(1, n + 1):
        produced, label = launch_path(job, i, n), (f"launch {i}/{n}: " if n > 1 else "")
        if n > 1:
            print(f"[watchdog] launch {i}/{n}, writing {produced}", flush=True)
        if spec["backend"] == "nccl":   # the flight recorder's dumps go there
            job.rank_dir.mkdir(parents=True, exist_ok=True)
        argv = [a.replace(str(job.result), str(produced)) for a in cmd]
        launch_env = env if i == 1 else caches.later_launch(env)
        if launch_env is not env and i == 2:
            print("[watchdog] launches 2 on: TORCHINDUCTOR_COMPILE_THREADS=1 (launch 1 filled the compile cache)",
                  flush=True)
        if job.single:   # torchrun's variables, a fresh port per launch (the last one's store may hold its own)
            launch_env = {**launch_env, **command.single_rank_env()}
        out = supervise(argv, launch_env, limit, grace, held.fds, ancestry, label=label,
                        before_kill=lambda: flight.request_dumps(pipe),   # NCCL: a dump before the kill
                        tee=job.rank_dir if job.single else None)
        if out.killed and out.killed != "limit":
            print(f"[watchdog] {out.killed}: killed process group; nothing recorded "
                  "(Snakemake marked the job incomplete, the next run redoes it)", flush=True)
            return 1
        if (r := record_outcome(job, out, produced, label)) is None:
            return 0
        done.append(launches.stamp(r, out.spawned_unix, out.elapsed))
        if (start := r["metrics"].get("start_s")) is not None:
            print(f"[watchdog] {label}first timed step {start:.1f} s after the spawn; "
                  f"the launch took {out.elapsed:.1f} s", flush=True)
    return finish(job, done, time.monotonic() - t0)


def run(job: Job, args, cmd: list[str]) -> int:
    spec = job.spec
    ancestry = lifeline.Ancestry.of_this_process()
    if gone := ancestry.orphaned():   # its Snakemake died before this process started
        print(f"[watchdog] no one waits for this job any more: {gone}; nothing run, nothing recorded", flush=True)
        return 1
    try:
        cmd, env = prepare(job, cmd, args.cache_dir)
    except RuntimeError as e:
        return job.fail(str(e))
    try:   # a wait for the locks is given up, too, when no one waits for the job
        held = devices.acquire(devices.device_names(spec, env), args.lock_dir, args.lock_wait_s, job.label,
                               give_up=ancestry.broken)
    except (devices.DevicesBusy, devices.LockError) as e:
        return job.fail(str(e))
    except devices.GaveUp as e:
        print(f"[watchdog] no one waits for this job any more: {e}; gave up waiting for its devices", flush=True)
        return 1
    limit, n = float(spec["limit_s"]), launches.count(spec)
    try:
        with held:
            print(f"[watchdog] limit {limit:g} s per launch (process-group timeout {specs.pg_timeout_s(limit):g} s), "
                  f"{n} launch(es), devices {', '.join(held.names)}, env {spec.get('env', {})}\n"
                  f"[watchdog] watching {ancestry.describe()}\n[watchdog] $ {' '.join(cmd)}", flush=True)
            return run_launches(job, cmd, env, held, ancestry)
    finally:
        for i in range(1, n + 1):
            launch_path(job, i, n).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    spec = json.loads(args.spec)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    job = Job.of(spec, args.result, args.rank_logs)
    if not cmd:
        cmd = command.worker_command(spec, args.result, args.rank_logs, sys.executable)
        job.single = command.single_rank(spec)
    job.result.unlink(missing_ok=True)  # never serve an old number
    job.clear_rank_logs()                # nor an old rank's log as this run's
    if spec.get("skip_reason"):
        print(f"[watchdog] skipped: {spec['skip_reason']}", flush=True)
        job.write("skipped", spec["skip_reason"])
        return 0
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    # Ctrl-C (Snakemake's stop of a local job) is a KeyboardInterrupt here also when this
    # process was started with SIGINT ignored (`cmd &` in a script: POSIX shells start
    # background commands so, and Python then installs no handler)
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return run(job, args, cmd)
    except (KeyboardInterrupt, Stop) as e:
        print(f"[watchdog] stopped ({type(e).__name__} {e}): its processes killed, nothing recorded",
              file=sys.stderr, flush=True)
        return 130 if isinstance(e, KeyboardInterrupt) else 143
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
