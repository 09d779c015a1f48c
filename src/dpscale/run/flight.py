"""NCCL's flight recorder, read back: which collective hung, and which ranks never
reached it.

With TORCH_NCCL_TRACE_BUFFER_SIZE > 0 every ProcessGroupNCCL keeps a ring buffer of
its last collectives; with TORCH_NCCL_DUMP_ON_TIMEOUT=1 a rank whose collective times
out writes it, and has the other ranks write theirs, to TORCH_FR_DUMP_TEMP_FILE<rank>
(TORCH_NCCL_DEBUG_INFO_TEMP_FILE before torch 2.7 renamed it). Writing to the FIFO
TORCH_NCCL_DEBUG_INFO_PIPE_FILE<rank>.pipe asks a live rank for the same dump, which
is how the watchdog gets one when its outer limit comes first.

A dump is a pickled dict (torch/csrc/distributed/c10d/FlightRecorderDetail.hpp):
    {"version": "2.10", "pg_config": {name: {"name", "desc", "ranks": "[0, 1]"}},
     "pg_status": {...}, "entries": [{"record_id", "pg_id", "process_group": (name, desc),
     "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name": "nccl:all_reduce",
     "time_created_ns", "input_sizes", "output_sizes", "state": "scheduled" | "started"
     | "completed", "retired", "timeout_ms", "is_p2p", ...}, ...]}
torch ships an analyzer (torch.distributed.flight_recorder.fr_trace) for whole
traces; what the `hung` record needs is one answer, read here without torch.
"""
from __future__ import annotations

import os
import pickle
import re
import time
from pathlib import Path

PREFIX = "nccl_trace_rank_"


def env_for(trace_dir: str | os.PathLike, env: dict) -> dict:
    """The variables that turn the flight recorder on for a job whose dumps belong in
    trace_dir; a value the user set (in `env`) wins."""
    prefix = str(Path(trace_dir).resolve() / PREFIX)
    wanted = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
              "TORCH_FR_DUMP_TEMP_FILE": prefix, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
              "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": prefix}
    return {k: v for k, v in wanted.items() if k not in env}


def dump_prefix(env: dict) -> str | None:
    return env.get("TORCH_FR_DUMP_TEMP_FILE") or env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


def dump_files(prefix: str) -> dict[int, Path]:
    """rank -> dump file, for the files named <prefix><rank> (not the .pipe FIFOs)."""
    folder, stem = Path(prefix).parent, Path(prefix).name
    pattern = re.compile(re.escape(stem) + r"(\d+)$")
    if not folder.is_dir():
        return {}
    return {int(m.group(1)): p for p in folder.iterdir() if (m := pattern.match(p.name)) and p.is_file()}


def load_dumps(prefix: str) -> dict[int, dict]:
    out = {}
    for rank, path in dump_files(prefix).items():
        try:
            with open(path, "rb") as f:
                out[rank] = pickle.load(f)   # torch's own dump, from our own job's folder
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError):
            continue   # half-written when the rank died
    return out


def request_dumps(pipe_prefix: str | None, wait_s: float = 5.0) -> int:
    """Ask every live rank for a dump through its FIFO; wait up to wait_s for the
    files. Returns how many ranks were asked."""
    if not pipe_prefix:
        return 0
    folder, stem = Path(pipe_prefix).parent, Path(pipe_prefix).name
    asked = 0
    for pipe in folder.glob(f"{stem}*.pipe") if folder.is_dir() else ():
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue   # no reader: that rank is gone
        try:
            os.write(fd, b"1")
            asked += 1
        finally:
            os.close(fd)
    deadline = time.monotonic() + wait_s
    while asked and time.monotonic() < deadline and len(dump_files(pipe_prefix)) < asked:
        time.sleep(0.2)
    return asked


def _ranks(text) -> list[int]:
    if isinstance(text, (list, tuple)):
        return [int(r) for r in text]
    return [int(r) for r in re.findall(r"\d+", str(text))]


def _pg_name(entry: dict) -> str:
    pg = entry.get("process_group")
    return str(pg[0]) if isinstance(pg, (list, tuple)) and pg else str(entry.get("pg_id", "?"))


def hung_collective(dumps: dict[int, dict]) -> dict | None:
    """From each rank's dump: the oldest collective that some rank started and never
    completed, and the ranks of its process group with no record of it (they never
    arrived; a rank that left no dump counts among them, and is named in no_dump).
    None when no rank has an unfinished collective."""
    reached: dict[tuple[str, int], set[int]] = {}
    pending = []
    for rank, dump in dumps.items():
        for e in dump.get("entries") or []:
            if e.get("is_p2p"):
                continue
            key = (_pg_name(e), int(e["collective_seq_id"]))
            reached.setdefault(key, set()).add(rank)
            if e.get("state") != "completed":
                pending.append((e.get("time_created_ns", 0), key, e))
    if not pending:
        return None
    _, (pg, seq), entry = min(pending, key=lambda p: (p[0], p[1][1]))
    config = next((d["pg_config"][pg] for d in dumps.values() if pg in (d.get("pg_config") or {})), {})
    ranks = _ranks(config.get("ranks")) if config.get("ranks") else sorted(dumps)
    arrived = reached[(pg, seq)]
    return {"collective": entry.get("profiling_name", "?"), "process_group": pg, "seq": seq,
            "state": entry.get("state"), "ranks": ranks, "arrived": sorted(arrived),
            "missing_ranks": [r for r in ranks if r not in arrived],
            "no_dump": [r for r in ranks if r not in dumps]}


def summary(hung: dict) -> str:
    """'nccl:all_reduce #12 of process group 0, never reached by rank(s) 1'."""
    missing = ", ".join(map(str, hung["missing_ranks"])) or "none (every rank is inside it)"
    return (f"{hung['collective']} #{hung['seq']} of process group {hung['process_group']}, "
            f"never reached by rank(s) {missing}")
