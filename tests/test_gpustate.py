"""The GPU's state from NVML (dpscale.measure.gpustate), with a fake NVML: no GPU needed."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from dpscale.measure import gpustate

# the bits of nvidia-ml-py's clock event reason constants
REASONS = {"GpuIdle": 0x1, "ApplicationsClocksSetting": 0x2, "SwPowerCap": 0x4, "HwSlowdown": 0x8,
           "SyncBoost": 0x10, "SwThermalSlowdown": 0x20, "HwThermalSlowdown": 0x40, "UserDefinedClocks": 0x2}


class FakeNVML:
    """What gpustate calls of pynvml, over a dict of devices by UUID."""
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    class NVMLError(Exception):
        pass

    def __init__(self, devices: dict[str, dict]):
        self.devices = devices
        for name, bit in REASONS.items():
            setattr(self, f"nvmlClocksEventReason{name}", bit)
        setattr(self, "nvmlClocksEventReasonAll", 0x7f)
        setattr(self, "nvmlClocksEventReasonNone", 0)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.devices:
            raise self.NVMLError("Not Found")
        return uuid

    def nvmlDeviceGetHandleByIndex(self, i):
        return list(self.devices)[i]

    def nvmlDeviceGetClockInfo(self, h, kind):
        return {1: 1980, 2: 3201}[kind] if self.devices[h].get("busy", True) else {1: 345, 2: 3201}[kind]

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1980

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.devices[h]["reasons"]

    def nvmlDeviceGetPowerUsage(self, h):
        return 612_345

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetTemperature(self, h, sensor):
        raise self.NVMLError("Not Supported")   # a field the device lacks: None, not a crash

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=p, usedGpuMemory=mib * 2**20) for p, mib in self.devices[h]["procs"]]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return []

    def nvmlSystemGetProcessName(self, pid):
        return f"proc{pid}".encode()


def recorder(devices, ids=None):
    fake = FakeNVML(devices)
    return gpustate.Recorder(ids or list(devices), nvml_loader=lambda: (fake, None))


def test_decode_names_the_bits_and_keeps_an_unknown_one():
    names = gpustate.reason_names(FakeNVML({}))
    assert names[0x4] == "sw_power_cap" and names[0x40] == "hw_thermal_slowdown" and names[0x1] == "gpu_idle"
    assert 0 not in names and 0x7f not in names          # None and All are masks, not reasons
    assert gpustate.decode(0x4 | 0x20, names) == ["sw_power_cap", "sw_thermal_slowdown"]
    assert gpustate.decode(0x1 | 0x400, names) == ["gpu_idle", "bit_0x400"]
    assert gpustate.decode(0, names) == []


def test_reason_names_from_the_real_nvidia_ml_py():
    pynvml = pytest.importorskip("pynvml")
    names = set(gpustate.reason_names(pynvml).values())
    assert {"sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "gpu_idle"} <= names
    assert gpustate.SLOWDOWNS & names == gpustate.SLOWDOWNS   # every slowdown we flag is one NVML names


def test_a_sample_reads_every_field_and_a_missing_one_is_none():
    rec = recorder({"GPU-a": {"reasons": 0x4, "procs": [(101, 2048)]}})
    rec.take("before timed repeat 1")
    s = rec.record()["devices"][0]["samples"][0]
    assert s["when"] == "before timed repeat 1" and s["sm_clock_MHz"] == 1980 and s["mem_clock_MHz"] == 3201
    assert s["power_W"] == pytest.approx(612.345) and s["power_limit_W"] == 700.0
    assert s["clock_event_reasons"] == ["sw_power_cap"] and s["temperature_C"] is None
    assert s["processes"] == [{"pid": 101, "name": "proc101", "used_MiB": 2048.0}]


def test_another_process_flags_shared_and_a_slowdown_flags_throttled():
    rec = recorder({"GPU-a": {"reasons": 0x8 | 0x1, "procs": [(101, 2048), (555, 900)]}})
    rec.take("before")
    st = gpustate.summarise([rec.record()], own_pids=[101])
    assert st["flags"] == ["shared", "throttled: hw_slowdown"]
    assert [p["pid"] for p in st["devices"][0]["other_processes"]] == [555]


def test_the_power_cap_flags_only_when_it_cost_clock():
    """An H200 at full load sits at its power cap at 1965 of 1980 MHz: recorded, not
    flagged. The same reason at 80% of the maximum clock flags."""
    rec = recorder({"GPU-a": {"reasons": 0x4, "procs": [(101, 10)]}})
    rec.take("after")
    st = gpustate.summarise([rec.record()], own_pids=[101])
    assert st["flags"] == [] and st["devices"][0]["samples"][0]["clock_event_reasons"] == ["sw_power_cap"]
    capped = {"sm_clock_MHz": 1584, "sm_clock_max_MHz": 1980, "clock_event_reasons": ["sw_power_cap", "gpu_idle"]}
    assert gpustate.slowdowns_of(capped) == {"sw_power_cap"}
    assert gpustate.slowdowns_of({**capped, "sm_clock_MHz": 1965}) == set()
    assert gpustate.slowdowns_of({**capped, "clock_event_reasons": ["hw_thermal_slowdown"], "sm_clock_MHz": 1965}) \
        == {"hw_thermal_slowdown"}


def test_idle_and_application_clocks_are_settings_not_throttling():
    rec = recorder({"GPU-a": {"reasons": 0x1 | 0x2 | 0x10, "procs": [(101, 10)]}})
    rec.take("after")
    st = gpustate.summarise([rec.record()], own_pids=[101])
    assert st["flags"] == [] and st["devices"][0]["slowdowns"] == []


def test_pids_of_another_namespace_count_one_process_as_the_jobs():
    """In a container NVML reports host pids: one foreign pid is the job, two mean shared."""
    alone = recorder({"GPU-a": {"reasons": 0, "procs": [(90001, 10)]}})
    alone.take("t")
    st = gpustate.summarise([alone.record()], own_pids=[7])
    assert st["flags"] == [] and st["devices"][0]["pids_by_count"] is True
    two = recorder({"GPU-a": {"reasons": 0, "procs": [(90001, 10), (90002, 10)]}})
    two.take("t")
    assert gpustate.summarise([two.record()], own_pids=[7])["flags"] == ["shared"]


def test_ranks_of_the_job_are_not_others():
    """Two ranks, two devices; rank 1's pid on device 0 (a stray context) is still the job's."""
    r0 = recorder({"GPU-a": {"reasons": 0, "procs": [(101, 10), (102, 1)]}, "GPU-b": {"reasons": 0, "procs": []}},
                  ids=["GPU-a"])
    r1 = recorder({"GPU-a": {}, "GPU-b": {"reasons": 0, "procs": [(102, 10)]}}, ids=["GPU-b"])
    r0.take("t")
    r1.take("t")
    st = gpustate.summarise([r0.record(), r1.record()], own_pids=[101, 102])
    assert st["flags"] == [] and [d["id"] for d in st["devices"]] == ["GPU-a", "GPU-b"]


def test_without_nvidia_ml_py_the_record_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)   # import pynvml raises ImportError
    rec = gpustate.Recorder(["0"])
    rec.take("before")   # a no-op, not an error
    st = gpustate.summarise([rec.record()], own_pids=[1])
    assert "nvidia-ml-py is not installed" in st["absent"] and "flags" not in st


def test_without_a_driver_nvml_init_fails_and_the_record_says_why():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        pytest.skip("NVML starts here: this box has a driver")
    except pynvml.NVMLError:
        pass
    assert gpustate.Recorder(["0"]).record()["absent"].startswith("NVML could not start")


def test_an_unknown_device_is_absent_not_a_crash():
    rec = recorder({"GPU-a": {"reasons": 0, "procs": []}}, ids=["GPU-zzz"])
    assert "GPU-zzz" in rec.record()["absent"]


def test_device_ids_follow_cuda_visible_devices():
    assert gpustate.device_ids([0, 1], {"CUDA_VISIBLE_DEVICES": "3,5"}) == ["3", "5"]
    assert gpustate.device_ids([1], {}) == ["1"]


def test_launches_combine_and_the_policy_fails_what_it_is_told_to():
    shared = {"source": "nvml", "flags": ["shared"],
              "devices": [{"id": "GPU-a", "samples": [], "slowdowns": [],
                           "other_processes": [{"pid": 555, "name": "python", "used_MiB": 1.0}]}]}
    clean = {"source": "nvml", "flags": [], "devices": [{"id": "GPU-a", "samples": [], "slowdowns": [],
                                                         "other_processes": []}]}
    both = gpustate.combine([clean, shared])
    assert both["flags"] == ["shared"] and [d["launch"] for d in both["devices"]] == [1, 2]
    assert gpustate.combine([None, None]) is None   # CPU: no key
    assert gpustate.policy_failure(both, {"on_shared": "warn", "on_throttle": "fail"}) is None
    why = gpustate.policy_failure(both, {"on_shared": "fail", "on_throttle": "warn"})
    assert "555 (python)" in why and "on_shared: fail" in why
    hot = {**clean, "flags": ["throttled: hw_thermal_slowdown"]}
    assert "hw_thermal_slowdown" in gpustate.policy_failure(hot, {"on_shared": "warn", "on_throttle": "fail"})
