"""The GPU's state around a timing, from NVML (nvidia-ml-py, import name pynvml).

A measurement on a GPU that another process shares, or that slows its clocks to
stay under its power cap or a temperature, gives a plausible, wrong number. So a
worker samples each device it times, before and after each timed repeat:
SM and memory clocks (and the SM clock's maximum), the clock event (throttle)
reasons decoded to names, power draw and limit, temperature, and the processes
on the device (pid, name, used memory). `summarise` turns the samples into the
result's `gpu_state` record and its `flags`:

- "shared": a process other than the job's own holds the device;
- "throttled: <reason>": a slowdown reason (thermal, hardware slowdown, power
  brake, board limit; the power cap when the SM clock was under 95% of its
  maximum) was active at a sample. Idle clocks, application-clock settings and
  sync boost are settings, not slowdowns, and do not flag; every sample's raw
  reasons stay in the record.

`apply_policy` turns flags into a failed status where the config
(gpu_state: {on_shared, on_throttle}) says fail. Without nvidia-ml-py, or with
no NVML library (a CPU box, a container without the driver's libnvidia-ml), the
record says why it is absent; on a CPU job there is no record at all.

NVML counts devices in PCI order and CUDA (by default) fastest first; on a box of
identical GPUs both are PCI order. A device is found by its UUID where the
framework gives one (torch), else by its CUDA ordinal through CUDA_VISIBLE_DEVICES.
Inside a container NVML reports the host's pids: when none of a device's pids
is one of the job's, the job's own processes are assumed to be among them (one
per device) and only processes beyond that count as others.
"""
from __future__ import annotations

import os
import re
import time

# Reasons that mean the device ran slower than it could while busy.
SLOWDOWNS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                       "hw_power_brake_slowdown", "board_limit", "reliability"})
# The power cap is where a busy H200 lives, at full clock or not (near full clock in an
# fp32 run, well under it in the tuned bf16 step: docs/measurements/
# gpu-state-power-cap_h200_2026-12-02.md). Only the second is a slowdown worth a flag,
# so the power cap flags only when the SM clock at that sample was under this fraction
# of its maximum (5% of clock moves a compute-bound number past the launch-to-launch
# spread). The thermal, hardware and power-brake slowdowns always flag.
POWER_CAP_CLOCK_FRACTION = 0.95
CLOCK_CHECKED = frozenset({"sw_power_cap"})


def slowdowns_of(sample: dict) -> set[str]:
    """The slowdown reasons of one sample that cost speed (see POWER_CAP_CLOCK_FRACTION)."""
    sm, top = sample.get("sm_clock_MHz"), sample.get("sm_clock_max_MHz")
    full_clock = bool(sm and top and sm >= POWER_CAP_CLOCK_FRACTION * top)
    return {x for x in (sample.get("clock_event_reasons") or [])
            if x in SLOWDOWNS and not (x in CLOCK_CHECKED and full_clock)}
_PREFIXES = ("nvmlClocksEventReason", "nvmlClocksThrottleReason")   # new names, then the old ones


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()


def reason_names(nvml) -> dict[int, str]:
    """{bit: name} of the clock event reasons this nvidia-ml-py knows (from its
    constants; All and None are masks, not reasons)."""
    out: dict[int, str] = {}
    for prefix in _PREFIXES:
        for attr in sorted(a for a in dir(nvml) if a.startswith(prefix)):
            suffix = attr[len(prefix):]
            if suffix not in ("All", "None"):
                out.setdefault(int(getattr(nvml, attr)), _snake(suffix))
    return out


def decode(mask: int, names: dict[int, str]) -> list[str]:
    """The names of the bits set in `mask`; an unknown bit as bit_0x<hex>."""
    found = [name for bit, name in sorted(names.items()) if mask & bit]
    rest = mask & ~sum(names)
    found += [f"bit_{1 << i:#x}" for i in range(rest.bit_length()) if rest >> i & 1]
    return found


def load_nvml():
    """(pynvml, None) initialised, or (None, why not)."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install nvidia-ml-py, or the [cuda] extra)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return None, f"NVML could not start: {e}"
    return pynvml, None


def _process_name(nvml, pid: int) -> str | None:
    try:
        name = nvml.nvmlSystemGetProcessName(pid)
        return name.decode() if isinstance(name, bytes) else name
    except nvml.NVMLError:
        try:
            with open(f"/proc/{pid}/comm") as f:
                return f.read().strip()
        except OSError:
            return None


def processes(nvml, handle) -> list[dict]:
    """Compute and graphics processes on the device: pid, name, used memory (MiB;
    None where NVML cannot see it, as in some containers)."""
    seen = {}
    for get in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
        try:
            procs = get(handle)
        except nvml.NVMLError:
            continue
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            seen.setdefault(int(p.pid), {"pid": int(p.pid), "name": _process_name(nvml, int(p.pid)),
                                         "used_MiB": used / 2**20 if used is not None else None})
    return sorted(seen.values(), key=lambda p: p["pid"])


def _read(fn, *args):
    try:
        return fn(*args)
    except Exception:   # noqa: BLE001 -- pynvml raises NVMLError subclasses per field; a field NVML lacks stays None
        return None


def sample(nvml, handle, names: dict[int, str]) -> dict:
    """One reading of one device; a field this device or driver does not report is None."""
    mw = _read(nvml.nvmlDeviceGetPowerUsage, handle)
    limit = _read(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    get_reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons",
                          getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
    mask = _read(get_reasons, handle)
    return {"t_unix_s": time.time(),
            "sm_clock_MHz": _read(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
            "sm_clock_max_MHz": _read(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM),
            "mem_clock_MHz": _read(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM),
            "clock_event_reasons": decode(mask, names) if mask is not None else None,
            "power_W": mw / 1e3 if mw is not None else None,
            "power_limit_W": limit / 1e3 if limit is not None else None,
            "temperature_C": _read(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
            "processes": processes(nvml, handle)}


def device_ids(ordinals: list[int], env: dict | None = None) -> list[str]:
    """The NVML identity of CUDA ordinals: the CUDA_VISIBLE_DEVICES entry (an index or
    a UUID), or the ordinal itself when the variable is unset."""
    env = os.environ if env is None else env
    visible = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return [visible[i] if i < len(visible) else str(i) for i in ordinals]


def _handle(nvml, ident: str):
    if ident.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(ident))
    return nvml.nvmlDeviceGetHandleByUUID(ident if ident.startswith(("GPU-", "MIG-")) else f"GPU-{ident}")


class Recorder:
    """Samples a job's devices at labelled moments. Without NVML, `absent` says why
    and sampling does nothing. ids: UUIDs or NVML indices (device_ids)."""

    def __init__(self, ids: list[str], nvml_loader=load_nvml):
        self.ids, self.samples, self.absent = list(ids), {i: [] for i in ids}, None
        self.nvml, why = nvml_loader()
        if self.nvml is None:
            self.absent = why
            return
        self.names = reason_names(self.nvml)
        try:
            self.handles = {i: _handle(self.nvml, i) for i in self.ids}
        except self.nvml.NVMLError as e:
            self.nvml, self.absent = None, f"NVML does not know device(s) {self.ids}: {e}"

    def take(self, when: str) -> None:
        if self.nvml is None:
            return
        for i, h in self.handles.items():
            self.samples[i].append({"when": when, **sample(self.nvml, h, self.names)})

    def record(self) -> dict:
        """What a rank contributes: its devices' samples, or why there are none."""
        if self.absent:
            return {"absent": self.absent}
        return {"devices": [{"id": i, "samples": s} for i, s in self.samples.items()]}


def _others(samples: list[dict], own_pids: set[int]) -> tuple[list[dict], bool]:
    """Processes on the device that are not the job's, over all samples (by pid), and
    whether that was decided by count (NVML's pids are not the job's namespace's)."""
    others, by_count = {}, False
    for s in samples:
        procs = s.get("processes") or []
        if procs and not any(p["pid"] in own_pids for p in procs):
            by_count = True
            extra = procs if len(procs) > 1 else []   # one of them is the job's; which one NVML cannot say
        else:
            extra = [p for p in procs if p["pid"] not in own_pids]
        for p in extra:
            others.setdefault(p["pid"], p)
    return sorted(others.values(), key=lambda p: p["pid"]), by_count


def summarise(records: list[dict], own_pids) -> dict:
    """The result's gpu_state from every rank's Recorder.record() and the job's pids:
    per device its samples, the other processes and the slowdown reasons seen; and the
    flags. A record without NVML gives {"absent": why}."""
    absent = [r["absent"] for r in records if "absent" in r]
    if absent:
        return {"absent": absent[0]}
    own = {int(p) for p in own_pids}
    devices, shared, slow = [], False, set()
    for d in (d for r in records for d in r["devices"]):
        others, by_count = _others(d["samples"], own)
        reasons = sorted({x for s in d["samples"] for x in slowdowns_of(s)})
        devices.append({**d, "other_processes": others, "slowdowns": reasons,
                        **({"pids_by_count": True} if by_count else {})})
        shared |= bool(others)
        slow |= set(reasons)
    return {"source": "nvml", "devices": devices, "flags": flags_of(shared, slow)}


def flags_of(shared: bool, slowdowns) -> list[str]:
    return (["shared"] if shared else []) + [f"throttled: {r}" for r in sorted(slowdowns)]


def combine(states: list[dict | None]) -> dict | None:
    """One gpu_state from several launches' (each launch's devices kept, tagged with
    its launch number; flags the union). None when no launch had one (CPU)."""
    present = [(i, s) for i, s in enumerate(states, 1) if s is not None]
    if not present:
        return None
    if len(present) == 1 and len(states) == 1:
        return present[0][1]
    absent = [s["absent"] for _, s in present if "absent" in s]
    if absent:
        return {"absent": absent[0]}
    devices = [{**d, "launch": i} for i, s in present for d in s["devices"]]
    shared = any(f == "shared" for _, s in present for f in s["flags"])
    slow = {r for d in devices for r in d["slowdowns"]}
    return {"source": "nvml", "devices": devices, "flags": flags_of(shared, slow)}


def policy_failure(gpu_state: dict | None, policy: dict | None) -> str | None:
    """The reason a result fails under the config's gpu_state policy, or None."""
    if not gpu_state or not policy:
        return None
    flags = gpu_state.get("flags") or []
    why = []
    if "shared" in flags and policy.get("on_shared") == "fail":
        who = sorted({f"{p['pid']} ({p['name']})" for d in gpu_state["devices"] for p in d["other_processes"]})
        why.append(f"the device was shared with process(es) {', '.join(who)} (gpu_state.on_shared: fail)")
    slow = [f.partition(": ")[2] for f in flags if f.startswith("throttled: ")]
    if slow and policy.get("on_throttle") == "fail":
        why.append(f"the device slowed its clocks ({', '.join(slow)}) during the timing (gpu_state.on_throttle: fail)")
    return "; ".join(why) or None
