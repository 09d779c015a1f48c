"""What the measurements ran on, probed cheaply when the workflow is parsed.

No torch or jax import here: the probe runs on every `snakemake` call, so it
reads `nvidia-smi` and package metadata only (a few tens of milliseconds).
"""
from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

from dpscale.layout import FINGERPRINT_PATH
from dpscale.results import write_atomic

PACKAGES = ("torch", "torchvision", "jax", "jaxlib", "flax", "optax", "numpy")
# NCCL ships as a wheel next to torch; its version is the one torch loads.
NCCL_DISTS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")

# What each family of rules depends on. A change outside its keys never reruns it.
# `gpu_count` is deliberately absent: adding a GPU adds jobs for the new k, it does
# not rerun k=1 (whether a k fits is passed separately, per job).
TORCH_KEYS = ("gpu_model", "gpu_memory_MiB", "driver", "cuda", "nccl", "torch",
              "torchvision", "numpy", "cpu_model", "python")
JAX_KEYS = ("gpu_model", "gpu_memory_MiB", "driver", "cuda", "jax", "jaxlib", "flax",
            "optax", "numpy", "cpu_model", "python")
MULTI_DEVICE_KEYS = ("interconnect",)   # only jobs with k >= 2 depend on the fabric


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _run(cmd: list[str], timeout: float = 10.0) -> str | None:
    if not shutil.which(cmd[0]):
        return None
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def summarise_topology(topo: str | None) -> str:
    """Reduce `nvidia-smi topo -m` to the set of GPU-GPU link kinds, e.g.
    'NV18' (every pair over 18 NVLinks) or 'PIX,SYS' (PCIe only)."""
    if not topo:
        return "none"
    links = set()
    for line in topo.splitlines():
        cells = line.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        for cell in cells[1:]:
            if cell == "X":
                continue
            if re.fullmatch(r"NV\d+|PIX|PXB|PHB|NODE|SYS|SOC", cell):
                links.add(cell)
    return ",".join(sorted(links)) or "none"


def probe() -> dict:
    gpus = []
    out = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                "--format=csv,noheader,nounits"])
    for line in (out or "").strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            gpus.append({"name": parts[0], "memory_MiB": int(float(parts[1])), "driver": parts[2]})
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and gpus:
        keep = [int(i) for i in visible.split(",") if i.strip().isdigit()]
        gpus = [g for i, g in enumerate(gpus) if i in keep]
    cuda = None
    header = _run(["nvidia-smi"]) if gpus else None
    if header and (m := re.search(r"CUDA Version:\s*([\d.]+)", header)):
        cuda = m.group(1)
    torch_v = _version("torch")
    nccl = next((v for d in NCCL_DISTS if (v := _version(d))), None)
    fp = {
        "gpu_model": gpus[0]["name"] if gpus else None,
        "gpu_count": len(gpus),
        "gpu_memory_MiB": gpus[0]["memory_MiB"] if gpus else None,
        "driver": gpus[0]["driver"] if gpus else None,
        "cuda": cuda,
        "torch_cuda": (torch_v.split("+cu")[1] if torch_v and "+cu" in torch_v else None),
        "nccl": nccl,
        "interconnect": summarise_topology(_run(["nvidia-smi", "topo", "-m"])) if len(gpus) > 1 else "none",
        "cpu_model": _cpu_model(),
        "cpu_count": _cpu_count(),
        "hostname": platform.node(),
        "python": platform.python_version(),
    }
    for pkg in PACKAGES:
        fp[pkg] = _version(pkg)
    # An optional extra, in no family's keys: only the variants that require it
    # (registry.REQUIREMENTS) read it, and carry it in their own specs.
    fp["cudnn_frontend"] = _version("nvidia-cudnn-frontend")
    return fp


def load(path: str | os.PathLike) -> dict:
    """A fingerprint from a file (cluster login nodes, tests). Same format as probe()."""
    path = Path(path)
    try:
        text = path.read_text()
        fp = json.loads(text)
    except OSError as e:
        where = "" if path.is_absolute() else f" (relative to the working folder {Path.cwd()}, as `-d` sets it)"
        raise ValueError(f"hardware_file: cannot read {path}{where}: {e.strerror}. "
                         f"Point hardware_file at a fingerprint JSON ({FINGERPRINT_PATH} "
                         "from the target machine) or set it to null to probe this machine.") from e
    except json.JSONDecodeError as e:
        if not text.strip():   # a probe redirected into it that failed (docs/cluster.md, step 1)
            raise ValueError(f"hardware_file: {path} is empty: the probe that wrote it failed (its "
                             "error is where it ran); probe the node again (docs/cluster.md, step 1)") from e
        raise ValueError(f"hardware_file: {path} is not valid JSON ({e})") from e
    if not isinstance(fp, dict) or "gpu_count" not in fp:
        raise ValueError(f"hardware_file: {path} has no 'gpu_count'; it must hold a fingerprint "
                         f"as written to {FINGERPRINT_PATH}")
    for key, least in COUNTS.items():
        v = fp.get(key)
        if (key == "gpu_count" or v is not None) and (isinstance(v, bool) or not isinstance(v, int) or v < least):
            raise ValueError(f"hardware_file: {path}: '{key}' is {json.dumps(v)}; it must be a whole number "
                             f">= {least} (e.g. \"{key}\": {max(least, 2)})")
    return fp


def unstated(fp: dict) -> list[str]:
    """The keys some family's jobs depend on that a fingerprint file leaves out (a file
    written by hand, not by probe(), which writes every key, null where absent): a change
    of those on the machine would rerun nothing."""
    wanted = dict.fromkeys(TORCH_KEYS + JAX_KEYS + MULTI_DEVICE_KEYS)
    return [key for key in wanted if key not in fp]


def unstated_warning(path, fp: dict) -> str | None:
    """One line for a hardware_file that leaves out keys the jobs depend on, or None."""
    if not (missing := unstated(fp)):
        return None
    return (f"hardware_file {path} leaves out {', '.join(missing)}: a change of "
            f"{'that' if len(missing) == 1 else 'those'} on the machine will rerun nothing that "
            "depends on it; write the file with the probe (docs/cluster.md, step 1)")


# The counts a fingerprint file must hold as whole numbers: the plan does arithmetic on them.
COUNTS = {"gpu_count": 0, "cpu_count": 1}


def dumps(fp: dict) -> str:
    """The fingerprint as results/fingerprint.json holds it (canonical: a params value)."""
    return json.dumps(fp, indent=2, sort_keys=True) + "\n"


def digest(fp: dict) -> str:
    """12 hex digits of dumps(fp): the name of the machine's stamp (layout.machine_stamp)."""
    return hashlib.sha256(dumps(fp).encode()).hexdigest()[:12]


def save_if_changed(fp: dict, path: str | os.PathLike) -> bool:
    """Write the fingerprint only when it differs, so its mtime means 'the machine changed'."""
    path = Path(path)
    text = dumps(fp)
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    write_atomic(path, text)
    return True


def backend_for(fp: dict, framework: str) -> str:
    gpu = (fp.get("gpu_count") or 0) > 0
    if framework == "torch":
        return "nccl" if gpu else "gloo"
    return "xla-gpu" if gpu else "xla-cpu"


def devices_present(fp: dict) -> int:
    """Devices a k can use: GPUs, or on a CPU-only machine one process per core."""
    return fp.get("gpu_count") or fp.get("cpu_count") or 1


def subset(fp: dict, family: str, k: int) -> dict:
    keys = TORCH_KEYS if family == "torch" else JAX_KEYS
    if k >= 2:
        keys = keys + MULTI_DEVICE_KEYS
    out = {key: fp.get(key) for key in keys}
    out["backend"] = backend_for(fp, family)
    return out
