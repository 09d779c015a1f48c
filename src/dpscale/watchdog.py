"""Run a torchrun job under a watchdog.

torchrun restarts and tears down ranks, but nothing in it bounds a job whose
collective never returns (the memcpy switch is known to wedge DDP): the
process-group timeout covers a collective that times out cleanly, not a rank
stuck in a kernel or a launcher waiting on it. So this wrapper puts the whole
job in its own process group, kills the group at the limit (SIGTERM, then
SIGKILL after a grace period), and records the run as `hung`; a rank that
crashes fails the job with its log kept and no result file left.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import launch
from .results import make_result, write_json_atomic

TIMEOUT_MARKERS = re.compile(
    r"Watchdog caught collective operation timeout|Timed out waiting|timed out after|"
    r"operation timed out|DistBackendError.*[Tt]imeout|Socket Timeout", re.S)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the watchdog dies, even by SIGKILL.
    The job runs in its own session (so a hang can be killed as a group), which
    also means killing Snakemake's group would not reach it; torchrun turns the
    SIGTERM into an orderly teardown of its ranks."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass   # not Linux: no parent-death signal, the group kill still works


def kill_group(pgid: int, grace_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 10)
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.1)


def collect_rank_logs(torchrun_dir: Path, dest_prefix: Path) -> list[Path]:
    """torchrun writes <dir>/<run_id>_<rand>/attempt_<n>/<local rank>/{stdout,stderr}.log,
    one <run_id>_<rand> folder per node. Flatten each node's last attempt into
    <prefix>.rank<r>.log (one node), or <prefix>.node<i>.rank<r>.log (several: i in
    the order the agents started; the global rank is in each line's [rank r/k])."""
    out = []
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
            out.append(target)
    shutil.rmtree(torchrun_dir, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Run a measurement (its worker, by the spec's experiment) under a watchdog; "
                    "record skipped and hung runs, fail crashed ones.")
    ap.add_argument("--spec", required=True, help="the job's spec (JSON) as built by the workflow")
    ap.add_argument("--result", required=True, help="result JSON the job must produce")
    ap.add_argument("--rank-logs", required=True,
                    help="torchrun --log-dir of the job; flattened to <prefix>.rank<r>.log")
    ap.add_argument("cmd", nargs=argparse.REMAINDER,
                    help="-- a command to run instead of the spec's worker (tests)")
    args = ap.parse_args(argv)
    spec = json.loads(args.spec)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    cmd = cmd or launch.worker_command(spec, args.result, args.rank_logs, sys.executable)
    result = Path(args.result)
    result.unlink(missing_ok=True)  # never serve an old number
    common = dict(experiment=spec["experiment"], variant=spec["variant"], k=spec["k"],
                  backend=spec["backend"], config=spec.get("config"),
                  fingerprint=spec.get("fingerprint"), env=spec.get("env", {}))
    if spec.get("skip_reason"):
        print(f"[watchdog] skipped: {spec['skip_reason']}", flush=True)
        write_json_atomic(result, make_result(status="skipped", reason=spec["skip_reason"], **common))
        return 0
    limit, grace = float(spec["limit_s"]), float(spec.get("grace_s", 15))
    launch_env = {}
    if spec.get("launch"):   # k spans several nodes: srun + torchrun c10d / jax.distributed
        try:
            cmd, launch_env = launch.multinode_command(cmd, spec["launch"])
        except RuntimeError as e:
            print(f"[watchdog] {e}", file=sys.stderr, flush=True)
            return 1
    env = {**os.environ, **spec.get("env", {}), **launch_env, "PYTHONUNBUFFERED": "1"}
    rank_dir = Path(args.rank_logs)
    if rank_dir.exists():
        shutil.rmtree(rank_dir)
    print(f"[watchdog] limit {limit:g} s, env {spec.get('env', {})}\n[watchdog] $ {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_die_with_parent)
    try:
        rc = proc.wait(timeout=limit)
        hung = False
    except subprocess.TimeoutExpired:
        hung = True
    except KeyboardInterrupt:  # Snakemake was interrupted: take the ranks down with us
        kill_group(proc.pid, grace)
        raise
    elapsed = time.monotonic() - t0
    if hung:
        print(f"[watchdog] no result after {elapsed:.0f} s: killing process group {proc.pid}", flush=True)
        kill_group(proc.pid, grace)
        proc.wait()
    stray = _group_alive(proc.pid)
    logs = collect_rank_logs(rank_dir, Path(str(rank_dir).removesuffix(".ranks").removesuffix(".log")))
    text = "".join(p.read_text(errors="replace") for p in logs)
    if not hung and rc != 0 and TIMEOUT_MARKERS.search(text):
        hung = True  # the process-group timeout fired inside a rank before our limit
    if hung:
        result.unlink(missing_ok=True)
        how = ("killed by the outer watchdog" if elapsed >= limit
               else "a rank's process-group timeout fired")
        reason = f"no progress: {how} after {elapsed:.1f} s (limit {limit:g} s)"
        write_json_atomic(result, make_result(
            status="hung", reason=reason, metrics={"hung_after_s": round(elapsed, 1)},
            rank_logs=[str(p) for p in logs], stray_processes=stray, **common))
        print(f"[watchdog] recorded hung: {reason}; stray processes left: {stray}", flush=True)
        return 0
    if rc != 0:
        result.unlink(missing_ok=True)
        print(f"[watchdog] torchrun exited {rc}; no result written. Rank logs:\n  "
              + "\n  ".join(map(str, logs)), file=sys.stderr, flush=True)
        return rc or 1
    if not result.exists():
        print("[watchdog] torchrun exited 0 but wrote no result", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
