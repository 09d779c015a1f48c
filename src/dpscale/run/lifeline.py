"""What ties a measurement's processes to the Snakemake run that started them.

The chain of one local measurement job, and who ends whom when a link dies:

    snakemake (main process, or the SLURM job step's)
      bash -c (the job's shell)
        scripts/watchdog.py          watches the two above (Ancestry): if either dies, or
                                     the chain changes, it kills the job's process group
          torchrun | jax_worker.py   own session and group; PR_SET_PDEATHSIG(SIGTERM):
                                     the watchdog's death, even by SIGKILL, ends it
            ranks (torch_worker.py)  PR_SET_PDEATHSIG(SIGKILL) on themselves: torchrun's
                                     death, even by SIGKILL, ends them

Nothing in the kernel tells a process that a grandparent died (PDEATHSIG is about the
parent only, and SIGKILL of Snakemake's main process alone re-parents its job shells to
init, where they used to keep running, with their GPUs). Hence the polling Ancestry.
Linux only (/proc, prctl); elsewhere every function here is a no-op.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1
# Set by the Snakefile in every Snakemake process ("<pid>@<host>") and inherited by its
# jobs: a job that starts after the Snakemake that wanted it died (killed between
# spawning the job's shell and the job's first line) finds no Snakemake above it, and
# without this would take itself for a job started by hand.
SNAKEMAKE_VAR = "DPSCALE_SNAKEMAKE"


def mark_snakemake() -> None:
    """In the Snakefile: tell this Snakemake's jobs which process they belong to."""
    import socket
    os.environ[SNAKEMAKE_VAR] = f"{os.getpid()}@{socket.gethostname()}"


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies. Returns
    whether it did. Trap: the signal comes when the parent *thread* that forked us
    exits, and a parent that died before this call is missed: die_with_parent closes
    that race."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return False   # not Linux (or no glibc): the watchdog's group kill still works
    return libc.prctl(PR_SET_PDEATHSIG, int(sig)) == 0


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """At the top of a worker: die (by `sig`) with the parent that started it. If the
    parent is already gone (re-parented between fork and here), exit at once."""
    parent = os.getppid()
    if set_parent_death_signal(sig) and (os.getppid() != parent or parent == 1):
        os._exit(128 + int(sig))


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def kill_group(pgid: int, grace_s: float, leader=None) -> None:
    """SIGTERM the process group, SIGKILL whatever is left after `grace_s`, wait up
    to 10 s more for it to go. `leader` (our Popen of the group's leader) is reaped
    meanwhile: a zombie still counts as a member of its group."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 10)
        while time.monotonic() < deadline:
            if leader is not None:
                leader.poll()
            if not group_alive(pgid):
                return
            time.sleep(0.1)


@dataclass(frozen=True)
class Proc:
    """One process as /proc shows it: its parent, state and start time (in clock
    ticks since boot), which tell a process from a later one that reuses its pid."""
    pid: int
    ppid: int
    state: str
    start: int

    @classmethod
    def read(cls, pid: int) -> Proc | None:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        # pid (comm) state ppid ... : comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2:].split()
        return cls(pid, int(fields[1]), fields[0], int(fields[19]))

    @property
    def dead(self) -> bool:
        return self.state in ("Z", "X")   # a zombie is dead; its parent has not reaped it yet


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def is_snakemake(argv: list[str]) -> bool:
    """`snakemake ...`, `python /venv/bin/snakemake ...` or `python -m snakemake ...`.
    Not any cmdline that merely contains the word: a job shell's command may hold a
    path like /work/snakemake-workflows/..., and stopping the watch there would miss
    the death of the real Snakemake above it."""
    if not argv:
        return False
    if os.path.basename(argv[0]) == "snakemake":
        return True
    if not os.path.basename(argv[0]).startswith("python"):
        return False
    args = argv[1:]
    if "-m" in args:
        i = args.index("-m")
        return args[i + 1:i + 2] == ["snakemake"]
    first = next((a for a in args if not a.startswith("-")), "")
    return os.path.basename(first) == "snakemake"


class Ancestry:
    """The processes above this one that must stay alive for the job to make sense:
    its parent up to and including the nearest Snakemake (main process, or the SLURM
    job step). Started outside Snakemake (tests, by hand), only the parent."""

    def __init__(self, chain: list[Proc], names: list[str]):
        self.chain, self.names = chain, names

    @classmethod
    def of_this_process(cls) -> Ancestry:
        chain, names, pid = [], [], os.getppid()
        while pid > 1 and (proc := Proc.read(pid)) is not None:
            argv = cmdline(pid)
            chain.append(proc)
            names.append(os.path.basename(argv[0]) if argv else "?")
            if is_snakemake(argv):
                return cls(chain, names)
            pid = proc.ppid
        return cls(chain[:1], names[:1])

    def broken(self, from_child: bool = False) -> str | None:
        """None while the chain is as it was; else what changed, in words.
        from_child: asked by a process forked from the one whose ancestry this is."""
        if self.chain and not from_child and os.getppid() != self.chain[0].pid:
            return f"the parent {self.names[0]} (pid {self.chain[0].pid}) is gone: re-parented to pid {os.getppid()}"
        for i, was in enumerate(self.chain):
            now = Proc.read(was.pid)
            who = f"{self.names[i]} (pid {was.pid})"
            if now is None or now.start != was.start or now.dead:
                return f"{who} died"
            if i + 1 < len(self.chain) and now.ppid != self.chain[i + 1].pid:
                return f"{who} was re-parented: its parent {self.names[i + 1]} (pid {self.chain[i + 1].pid}) died"
        return None

    def orphaned(self) -> str | None:
        """Why this job was orphaned before it started (the Snakemake named by SNAKEMAKE_VAR,
        on this host, is not in the chain), or None."""
        import socket
        pid, _, host = os.environ.get(SNAKEMAKE_VAR, "").partition("@")
        if not pid.isdigit() or host != socket.gethostname():
            return None
        if int(pid) in [p.pid for p in self.chain]:
            return None
        return f"the Snakemake that started it (pid {pid}) is gone"

    def describe(self) -> str:
        return " <- ".join(f"{n} ({p.pid})" for n, p in zip(self.names, self.chain)) or "nothing (no /proc)"



def descendants(pid: int) -> list[int]:
    """Every process below `pid`, children first, from /proc's parent links."""
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (proc := Proc.read(int(entry.name))) is not None:
            kids.setdefault(proc.ppid, []).append(int(entry.name))
    out, todo = [], list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def guard(interval_s: float = 0.5, say=None) -> None:
    """For a job that does its work in its own process (the report): a forked watcher
    that kills this process and everything below it once the Ancestry breaks, so a
    report whose Snakemake was killed never writes report.html after the run is gone.
    A process and not a thread: the report forks its figure workers only from a process
    with no other thread (report.figures.alone). Call it first, before any thread starts."""
    ancestry, me = Ancestry.of_this_process(), os.getpid()
    if gone := ancestry.orphaned():
        if say:
            say(f"no one waits for this job any more: {gone}; stopping it without writing")
        os._exit(1)
    if not ancestry.chain or os.fork() != 0:
        return
    try:   # the watcher: dies with the report (PDEATHSIG), or ends it
        set_parent_death_signal(signal.SIGKILL)
        while os.getppid() == me and (broken := ancestry.broken(from_child=True)) is None:
            time.sleep(interval_s)
        if os.getppid() == me:
            if say:
                say(f"no one waits for this job any more: {broken}; stopping it without writing")
            for pid in [me] + descendants(me):
                if pid != os.getpid():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
    finally:
        os._exit(0)
