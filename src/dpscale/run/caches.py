"""Compile once per machine: the persistent compilation caches every measurement runs with.

torch.compile (inductor's FX graph and AOTAutograd caches, its autotuning results and the
Triton kernels it builds) and XLA (JAX's persistent compilation cache) can keep what they
compiled on disk; a later process that compiles the same program loads it instead. The
watchdog sets their folders in every measurement's environment (`env_for`), under the
config's `cache.dir`:

    <cache.dir>/torch-<hash>/inductor    TORCHINDUCTOR_CACHE_DIR (FX graph, AOTAutograd and
                                         autotune caches on: TORCHINDUCTOR_FX_GRAPH_CACHE=1,
                                         TORCHINDUCTOR_AUTOGRAD_CACHE=1)
    <cache.dir>/torch-<hash>/triton      TRITON_CACHE_DIR
    <cache.dir>/torch-<hash>.json        what the key holds
    <cache.dir>/jax-<hash>/xla           JAX_COMPILATION_CACHE_DIR, every program kept
                                         (min compile time 0 s, no minimum size)
    <cache.dir>/jax-<hash>.json

<hash> is a short sha256 of the family and exactly the fingerprint fields a compiled
program depends on (KEY_FIELDS: the framework's versions, the CUDA driver, the GPU model;
on a CPU stand-in, which has neither, the CPU model stands where the GPU model would), so
a new torch, JAX/jaxlib, driver or GPU misses the old folder and fills a new one. The
compilers key their own entries further (graph, shapes, compile options).

A cache that cannot be used never fails a measurement: a folder that cannot be created
or written, or a key file that is unreadable or names another key, turns the caches off
for that job (the compilers' own caches too), and the job's log says why.

Python's own bytecode is the first compile of every process: an image that sets
PYTHONDONTWRITEBYTECODE over a site-packages without __pycache__ (the lent H200 image)
compiles torch, dynamo and sympy from source in every job, 8.4-9.1 s for `import torch,
torch.distributed.fsdp, torch._dynamo` there against 2.7-2.8 s from a bytecode cache
(docs/measurements/, the launch-imports report). `bytecode_env` keeps that bytecode under
<cache.dir>/python-bytecode (PYTHONPYCACHEPREFIX; Python checks each file against its
source's mtime and size, so one folder serves every install); the workflow sets it for
every job it starts, where the environment forbids writing bytecode beside the sources.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from dpscale.results import utc_now, write_atomic

KEY_FIELDS = {"torch": ("torch", "driver", "gpu_model"), "jax": ("jax", "jaxlib", "driver", "gpu_model")}
FOLDERS = {"torch": ("inductor", "triton"), "jax": ("xla",)}


def key(family: str, fp: dict) -> dict:
    """What the family's compiled programs depend on, from a fingerprint (or a spec's subset)."""
    out = {"family": family, **{f: fp.get(f) for f in KEY_FIELDS[family]}}
    if out["gpu_model"] is None:   # a CPU stand-in: the host's CPU is the device code is built for
        out["cpu_model"] = fp.get("cpu_model")
    return out


def folder_name(k: dict) -> str:
    digest = hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()[:12]
    return f"{k['family']}-{digest}"


def variables(family: str, folder: Path) -> dict:
    """The environment that points the family's compilers at `folder`."""
    if family == "torch":
        return {"TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"), "TRITON_CACHE_DIR": str(folder / "triton"),
                "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
    return {"JAX_COMPILATION_CACHE_DIR": str(folder / "xla"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}


def uncached(family: str) -> dict:
    """The environment of a job that must not use a cache (None: remove the variable)."""
    if family == "torch":
        return {"TORCHINDUCTOR_CACHE_DIR": None, "TRITON_CACHE_DIR": None,
                "TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
    return {"JAX_COMPILATION_CACHE_DIR": None}


def later_launch(env: dict) -> dict:
    """The environment of a throughput point's second and later launches: the first filled
    the cache with every graph the point compiles, so inductor starts no pool of compile
    workers (TORCHINDUCTOR_COMPILE_THREADS=1). On a 16-core H200 box that pool's start and
    shutdown were seconds of a launch whose compiles all hit the cache (tools/lab/
    profile_launch.sh; docs/measurements/launch-cost_h200_2026-12-03.md). Unchanged where
    torch's cache is off (every launch compiles) or the variable is set already (the
    user's choice)."""
    if env.get("TORCHINDUCTOR_FX_GRAPH_CACHE") != "1" or "TORCHINDUCTOR_COMPILE_THREADS" in env:
        return env
    return {**env, "TORCHINDUCTOR_COMPILE_THREADS": "1"}


class Unusable(Exception):
    """The cache folder cannot serve this job."""


def check_key_file(path: Path, k: dict, folder: Path) -> None:
    """The key file beside the folder: written when missing, else it must name this key."""
    if not path.exists():
        write_atomic(path, json.dumps({"key": k, "folder": folder.name, "holds": list(FOLDERS[k["family"]]),
                                       "created_utc": utc_now(), "by": "dpscale.run.caches"}, indent=2) + "\n")
        return
    try:
        held = json.loads(path.read_text()).get("key")
    except (ValueError, AttributeError) as e:
        raise Unusable(f"{path} is corrupt ({type(e).__name__})") from e
    if held != k:
        raise Unusable(f"{path} names another key ({held!r})")


def open_cache(root: Path, family: str, fp: dict) -> tuple[Path, bool, int]:
    """The key's folder under `root`, created and checked writable; whether it holds
    entries (files with content); how many empty JAX entries were removed."""
    k = key(family, fp)
    folder = root / folder_name(k)
    try:
        for sub in FOLDERS[family]:
            (folder / sub).mkdir(parents=True, exist_ok=True)
        check_key_file(root / f"{folder.name}.json", k, folder)
        for sub in FOLDERS[family]:   # a probe: a read-only mount passes mkdir of existing folders
            with tempfile.NamedTemporaryFile(dir=folder / sub, prefix=".probe."):
                pass
        dropped = drop_empty_entries(folder, family)
        warm = any(_entries(folder / sub) for sub in FOLDERS[family])
    except OSError as e:
        raise Unusable(f"cannot use {e.filename or folder}: {e.strerror or e}") from e
    return folder, warm, dropped


def _entries(folder: Path) -> int:
    """Files that hold something, anywhere under folder (a lock file holds nothing)."""
    return sum(1 for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".probe.")
               and p.stat().st_size > 0)


def drop_empty_entries(folder: Path, family: str) -> int:
    """Remove JAX's empty cache entries, and say how many. A disk that filled while JAX
    wrote an entry leaves it empty; JAX then fails to read it in every later process and
    compiles again, but never rewrites it (it skips a key that exists), so the cache stays
    broken for that program. Removed, the next compile writes it whole. torch's folders
    are left as they are: inductor and Triton keep empty lock files there on purpose."""
    if family != "jax":
        return 0
    empty = [p for p in (folder / "xla").rglob("*") if p.is_file() and p.stat().st_size == 0
             and not p.name.startswith(".probe.")]
    for p in empty:
        p.unlink(missing_ok=True)
    return len(empty)


def env_for(root: str | os.PathLike | None, family: str, fp: dict) -> tuple[dict, str | None]:
    """(variables to set, None to remove; one line for the job's log). No root: nothing
    changes (a job run by hand keeps the environment it has)."""
    if not root:
        return {}, None
    if family not in FOLDERS:
        return {}, None
    try:
        folder, warm, dropped = open_cache(Path(root).expanduser(), family, fp)
    except Unusable as e:
        return uncached(family), (f"compile cache off: {e}; this job compiles uncached "
                                  f"(clear it with rm -rf {Path(root) / folder_name(key(family, fp))}*)")
    k = key(family, fp)
    what = ", ".join(f"{f} {v}" for f, v in k.items() if f != "family")
    fixed = (f"; removed {dropped} empty entr{'y' if dropped == 1 else 'ies'} a full disk had left, which JAX never "
             "rewrites" if dropped else "")
    return variables(family, folder), f"compile cache {folder} ({'warm' if warm else 'empty'}; key {what}{fixed})"


BYTECODE = "python-bytecode"


def bytecode_env(root: str | os.PathLike | None, env: dict) -> dict:
    """The variables that give the processes a workflow starts a bytecode cache under
    `root` (see the module's docstring); {} where Python may already write its bytecode,
    a prefix is set (the user's choice), or the folder cannot be made."""
    if not root or not env.get("PYTHONDONTWRITEBYTECODE") or env.get("PYTHONPYCACHEPREFIX"):
        return {}
    folder = Path(root).expanduser() / BYTECODE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe."):
            pass
    except OSError:
        return {}
    return {"PYTHONPYCACHEPREFIX": str(folder), "PYTHONDONTWRITEBYTECODE": ""}


def apply(env: dict, changes: dict) -> dict:
    """`env` with the changes of env_for: a None value removes the variable."""
    out = {k: v for k, v in env.items() if changes.get(k, v) is not None}
    out.update({k: v for k, v in changes.items() if v is not None})
    return out
