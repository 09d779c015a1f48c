"""Release the lock a killed Snakemake run leaves behind.

Snakemake locks the working folder while it runs and removes the lock when it
exits; a run killed with SIGKILL (or a power loss) cannot, and the next run then
refuses to start until someone runs `snakemake --unlock`. Snakemake cannot tell a
stale lock from a live one; on Linux we can: a lock is stale when no other
Snakemake process is running in this folder. A live run's lock is never touched,
so two concurrent runs still get Snakemake's own lock message.
"""
from __future__ import annotations

import os
from pathlib import Path


def live_snakemake_in(workdir: str | os.PathLike, exclude: set[int] | None = None) -> list[int]:
    wd = os.path.realpath(workdir)
    exclude = (exclude or set()) | {os.getpid()}
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            if b"snakemake" in cmd and os.path.realpath(os.readlink(f"/proc/{entry}/cwd")) == wd:
                pids.append(int(entry))
        except OSError:   # gone, or not ours to read
            continue
    return pids


def release_stale(workdir: str | os.PathLike = ".", main_process: bool = True) -> list[str]:
    """Remove .snakemake/locks/* when no live Snakemake runs here; return what was removed.

    Only Snakemake's main process may: a job-mode parse (the SLURM executor's
    Snakemake on a compute node, workflow.is_main_process False) cannot see the
    login node's live run, whose lock sits on the same shared file system."""
    if not main_process:
        return []
    locks = Path(workdir) / ".snakemake" / "locks"
    files = sorted(locks.glob("*.lock")) if locks.is_dir() else []
    if not files or not Path("/proc/self/cwd").exists():
        return []
    if live_snakemake_in(workdir, exclude={os.getppid()} if _parent_is_snakemake() else None):
        return []
    for f in files:
        f.unlink(missing_ok=True)
    return [str(f) for f in files]


def _parent_is_snakemake() -> bool:
    # `python -m snakemake` re-executing itself, or a wrapper: our own parent is not "another run"
    try:
        return b"snakemake" in Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return False
