"""What a measurement's logs say about how it ended: the exception that failed it,
the rank that failed first, each rank's last lines, and whether a process-group
timeout fired. Pure functions of the log texts (the watchdog reads the files)."""
from __future__ import annotations

import re
from pathlib import Path

TIMEOUT_MARKERS = re.compile(
    r"Watchdog caught collective operation timeout|Timed out waiting|timed out after|"
    r"operation timed out|DistBackendError.*[Tt]imeout|Socket Timeout", re.S)
# "RuntimeError: ...", "torch.distributed.DistBackendError: ...", "[default1]:ValueError: ..."
EXCEPTION = re.compile(r"^(?:\[[\w-]+\]:)?\s*((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*"
                       r"(?:Error|Exception|Interrupt|Exit|Failure|Timeout)\b(?::.*)?)$")
# torchrun's summary of a failed job: "Root Cause (first observed failure): ... rank : 1 (local_rank: 1)",
# and how that rank ended: "exitcode  : -11 (pid: 9)", "traceback : Signal 11 (SIGSEGV) received by PID 9"
ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?\brank\s*:\s*(\d+)"
                        r"(?:.*?\bexitcode\s*:\s*(-?\d+))?(?:.*?\btraceback\s*:\s*([^\n]*))?", re.S)
# What a rank raises because another one failed: not the cause.
PEER_FAILURE = re.compile(r"Connection (closed|reset) by peer|Read error|remote worker|Broken pipe|"
                          r"communicator was aborted|Signal 15|SIGTERM", re.I)
NOISE = ("=====", "[watchdog]")


def lines(text: str) -> list[str]:
    """The non-empty lines, without the watchdog's own and the stream separators."""
    return [ln.rstrip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith(NOISE)]


def tail(text: str, n: int) -> list[str]:
    return lines(text)[-n:]


def exception_line(text: str) -> str | None:
    """The last line that names an exception (the one a traceback ends with)."""
    found = [m.group(1).strip() for ln in lines(text) if (m := EXCEPTION.match(ln.strip()))]
    return found[-1] if found else None


def rank_label(log: Path, prefix: Path) -> str:
    """'rank 1' for <prefix>.rank1.log, 'node 1 rank 0' for <prefix>.node1.rank0.log."""
    tag = log.name[len(prefix.name):].strip(".").removesuffix(".log")
    return " ".join(re.sub(r"([a-z]+)(\d+)", r"\1 \2", part) for part in tag.split("."))


def failure_reason(job_log: str, rank_logs: dict[str, str], exit_code: int | None) -> str:
    """One line: the exception that failed the job, and where. When one rank fails,
    the others fail after it of a broken connection (PEER_FAILURE): the first rank
    whose exception is not of that kind, torchrun's "first observed failure" first
    (which is a race: it may be a rank that failed second); else any rank's; else the
    exception of the job's output."""
    code = f"exit code {exit_code}" if exit_code is not None else "no exit code"
    root = ROOT_CAUSE.search(job_log)
    order = list(rank_logs)
    if root and f"rank {root.group(1)}" in rank_logs:
        order.insert(0, order.pop(order.index(f"rank {root.group(1)}")))
    found = [(label, line) for label in order if (line := exception_line(rank_logs[label]))]
    causes = [f for f in found if not PEER_FAILURE.search(f[1])] or found
    if causes:
        label, line = causes[0]
        return f"{line} ({label}; {code})"
    if died := root_cause_exit(job_log):   # a rank that ended without a Python traceback
        return f"{died} ({code})"
    if line := exception_line(job_log):
        return f"{line} ({code})"
    last = tail(job_log, 1)
    return f"the worker exited with {code}" + (f"; its last line: {last[0]}" if last else "")


def root_cause_exit(job_log: str) -> str | None:
    """torchrun's words for the first rank that failed, when no rank printed an exception:
    a signal (a crash in C++, the OOM killer) or a bare exit code."""
    m = ROOT_CAUSE.search(job_log)
    if not m or m.group(2) is None:
        return None
    rank, exitcode, how = m.group(1), int(m.group(2)), (m.group(3) or "").strip()
    if how.startswith("Signal"):
        return f"rank {rank} was killed: {how}"
    return f"rank {rank} exited with code {exitcode} and printed no traceback"


def timed_out(rank_logs: dict[str, str]) -> bool:
    return any(TIMEOUT_MARKERS.search(t) for t in rank_logs.values())


def stuck_lines(rank_logs: dict[str, str], most: int = 3) -> str:
    """'last lines of rank 1: ...' for the ranks whose log shows no timeout: they did
    not wait in the collective that timed out, so they are where the job stuck. All
    ranks when every one of them timed out."""
    stuck = [lb for lb, t in rank_logs.items() if not TIMEOUT_MARKERS.search(t)] or list(rank_logs)
    parts = [f"last line of {lb}: {tail(rank_logs[lb], 1)[0][:200]}" for lb in stuck[:most]
             if tail(rank_logs[lb], 1)]
    return "; ".join(parts)
