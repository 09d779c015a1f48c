"""One lock per device, so that two measurements never share a GPU (or a CPU stand-in).

Snakemake's `measure=1` keeps the jobs of one run apart; it knows nothing of an
orphan of a killed run, of a run in another folder or of someone else's job. So each
measurement also takes a file lock per device it uses, in a folder every user of the
host shares (default /tmp/dpscale-locks, mode 1777, lock files 0666):

    gpu-<id>.lock   id = the i-th entry of CUDA_VISIBLE_DEVICES if set, else i (i < k)
    cpu-<i>.lock    a CPU stand-in (gloo processes, JAX host devices)

The lock is fcntl.flock, which the kernel drops when the last descriptor of the open
file goes: a holder that dies leaves no stale lock. The watchdog passes the
descriptors on to the worker it starts (Popen pass_fds), so a SIGKILLed watchdog's
locks last exactly as long as its torchrun. The holder writes who it is into the file
(pid, host, job, folder, since when), which is what a waiting job prints.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import time
from pathlib import Path

from dpscale.plan import specs
from dpscale.plan.config import DEFAULT_LOCK_DIR
from dpscale.results import relative, utc_now

DEFAULT_DIR = DEFAULT_LOCK_DIR
CPU_BACKENDS = ("gloo", "xla-cpu")


class LockError(RuntimeError):
    """The lock folder or a lock file cannot be used (permissions, not a folder)."""


class DevicesBusy(RuntimeError):
    """Another process held a device for longer than the wait allowed."""


class GaveUp(RuntimeError):
    """The wait was given up (no one wants the job any more)."""


def device_names(spec: dict, env: dict | None = None) -> list[str]:
    """The devices a job uses on this node: k of them, or on a multi-node job this
    node's gpus_per_node."""
    env = os.environ if env is None else env
    n = int(spec["launch"]["gpus_per_node"]) if spec.get("launch") else specs.processes(spec)
    if spec["backend"] in CPU_BACKENDS:
        return [f"cpu-{i}" for i in range(n)]
    visible = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    ids = [visible[i] if i < len(visible) else str(i) for i in range(n)]
    return ["gpu-" + re.sub(r"[^A-Za-z0-9._-]", "_", d) for d in ids]   # a UUID stays one name


def _open_dir(lock_dir: str | os.PathLike) -> Path:
    d = Path(lock_dir)
    try:
        d.mkdir(parents=True, exist_ok=True)
        if d.stat().st_uid == os.getuid():
            os.chmod(d, 0o1777)   # every user may add locks, none may remove another's
    except OSError as e:
        raise LockError(f"lock folder {d}: {e.strerror}; set locks.dir to a folder every user "
                        f"of this host can write (default {DEFAULT_DIR})") from e
    return d


def _open_lock(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise LockError(f"device lock {path}: {e.strerror}; set locks.dir to a folder every user "
                        f"of this host can write (default {DEFAULT_DIR})") from e
    if os.fstat(fd).st_uid == os.getuid():
        os.fchmod(fd, 0o666)   # the umask must not lock other users out
    return fd


def holder(path: str | os.PathLike) -> dict | None:
    """What the holder of a lock wrote about itself, or None (not written yet, or never held)."""
    try:
        return json.loads(Path(path).read_text() or "null")
    except (OSError, ValueError):
        return None


def describe(name: str, info: dict | None) -> str:
    """'gpu-0 held by pid 1234 (ddp_weak/tuned/k1 in ../other-run, since ...)': the
    holder's folder as a record names a path (results.relative: "." for this run's
    folder), here rather than by results.portable afterwards, which finds a path in
    text only up to its first space."""
    if not info:
        return f"{name} held by a process that has not said who it is"
    where = f"{info.get('job', '?')} in {relative(info['cwd']) if info.get('cwd') else '?'}"
    if info.get("host") and info["host"] != socket.gethostname():
        where += f" on {info['host']}"
    gone = "" if _alive(info.get("pid")) else "; that pid is gone, its workers still hold the lock"
    return f"{name} held by pid {info.get('pid')} ({where}, since {info.get('since', '?')}){gone}"


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except (ProcessLookupError, TypeError, ValueError):
        return False
    except PermissionError:
        return True


class Held:
    """The locks one measurement holds; release() (or leaving the with-block) drops them."""

    def __init__(self, names: list[str], fds: list[int]):
        self.names, self.fds = names, fds

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)   # closing our last descriptor drops the flock
        self.fds = []

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def try_acquire(names: list[str], lock_dir: str | os.PathLike, job: str) -> Held | tuple[str, dict | None]:
    """All of `names` at once, or none: the Held locks, or (name, holder info) of the
    first one taken. Taken in sorted order and given back on the first refusal, so two
    jobs cannot each hold a part of what the other needs."""
    d = _open_dir(lock_dir)
    fds: list[int] = []
    for name in sorted(names):
        path = d / f"{name}.lock"
        fd = _open_lock(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            Held(names, fds).release()
            return name, holder(path)
        fds.append(fd)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "job": job, "cwd": os.getcwd(),
              "since": utc_now()}
        try:   # who holds it, for the next job that waits: a full disk must not crash the job
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(me).encode(), 0)
        except OSError as e:
            Held(names, fds).release()
            raise LockError(f"device lock {path}: {e.strerror} (the lock folder's disk: {d}); free space there, or "
                            f"set locks.dir to a folder on another disk every user of this host can write "
                            f"(default {DEFAULT_DIR})") from e
    return Held(sorted(names), fds)


def acquire(names: list[str], lock_dir: str | os.PathLike | None, wait_s: float, job: str,
            say=print, poll_s: float = 1.0, give_up=None) -> Held:
    """try_acquire until it succeeds, at most `wait_s` seconds; says once who holds
    what it waits for. give_up() (polled) returns a reason to stop waiting, or None.
    Raises DevicesBusy naming the holder, GaveUp, LockError."""
    lock_dir = lock_dir or DEFAULT_DIR
    deadline = time.monotonic() + wait_s
    told = False
    while True:
        got = try_acquire(names, lock_dir, job)
        if isinstance(got, Held):
            return got
        if give_up and (why := give_up()):
            raise GaveUp(why)
        who = describe(*got)
        if time.monotonic() >= deadline:
            raise DevicesBusy(f"devices busy: {who} for more than {wait_s:g} s; wait for it to end "
                              "(or stop it), then rerun, or raise locks.wait_s")
        if not told:
            say(f"[watchdog] waiting up to {wait_s:g} s for {who}")
            told = True
        time.sleep(poll_s)
