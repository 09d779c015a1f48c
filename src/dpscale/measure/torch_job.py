"""One rank of a PyTorch measurement under torchrun (one process per GPU; gloo
processes on a CPU-only box): its context, its inputs, the timing and gathering every
experiment shares, and the entry that dispatches to the experiment's function
(dpscale.registry) and has rank 0 write the one result JSON. A rank that raises takes
the job down (torchrun reports it; the watchdog records it, with this rank's log).
"""
from __future__ import annotations

import datetime as _dt
import os
import time

import torch
import torch.distributed as dist

from dpscale import registry
from dpscale.data import load as dsdata
from dpscale.measure import gpustate
from dpscale.results import job_label, utc_now, write_result
from dpscale.measure import timing
from dpscale.measure.timing import StepTimer, sync


# ---------------------------------------------------------------- context

class Ctx:
    def __init__(self, spec: dict):
        self.spec = spec
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.cuda = spec["backend"] == "nccl"
        self.device = torch.device("cuda", self.local_rank) if self.cuda else torch.device("cpu")
        self.proto = spec["config"]["protocol"]
        self.fault = _parse_fault(os.environ.get("DPSCALE_FAULT", ""))
        self.gpu: gpustate.Recorder | None = None   # this rank's device under NVML (CUDA only)

    def log(self, msg: str):
        print(f"[rank {self.rank}/{self.world} {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def maybe_fault(self, where: str):
        """Test hook (DPSCALE_FAULT=crash|hang[:rank=R][:at=WHERE][:job=EXP/VARIANT/kK]):
        make one rank crash or stop calling collectives, so tests can see the job fail
        or hang; with job=, only in that one job of a workflow run."""
        f = self.fault
        job = job_label(self.spec["experiment"], self.spec["variant"], self.spec["k"])
        if (f and f.get("rank", 1) == self.rank and f.get("at", "step") == where
                and f.get("job", job) == job):
            if f["kind"] == "crash":
                raise RuntimeError(f"injected fault: rank {self.rank} crashes at {where}")
            if f["kind"] == "hang":
                self.log(f"injected fault: rank {self.rank} hangs at {where}")
                while True:
                    time.sleep(3600)

    def corrupts(self, placement: str) -> bool:
        """Test hook (DPSCALE_FAULT=wrong_sum[:rank=R][:at=in_place|out_of_place]): one
        element of rank R's all-reduce input is off, in one placement or (no at=) both."""
        f = self.fault
        return (bool(f) and f["kind"] == "wrong_sum" and f.get("rank", 1) == self.rank
                and f.get("at", placement) == placement)


def _parse_fault(text: str) -> dict | None:
    if not text:
        return None
    kind, *opts = text.split(":")
    out = {"kind": kind}
    for o in opts:
        key, _, val = o.partition("=")
        out[key] = int(val) if val.isdigit() else val
    return out


# ---------------------------------------------------------------- inputs

def load_cached(ctx: Ctx):
    arrays, meta = dsdata.load_cache(ctx.spec["inputs"]["cache"], ctx.spec["inputs"]["cache_meta"])
    n = ctx.proto["train_images"]
    x = torch.from_numpy(arrays["train_x"][:n]).to(ctx.device)   # uint8, resident on the device
    y = torch.from_numpy(arrays["train_y"][:n]).to(ctx.device)
    return x, y, meta


def cached_batches(ctx: Ctx, x, y, batch: int, epoch: int, channels_last=False):
    """Rank-sharded batches from the device-resident cache, reshuffled per epoch
    with one seed on every rank (DistributedSampler's scheme, drop_last)."""
    g = torch.Generator().manual_seed(1000 + epoch)
    perm = torch.randperm(len(x), generator=g)[ctx.rank::ctx.world].to(ctx.device)
    for i in range(len(perm) // batch):
        idx = perm[i * batch:(i + 1) * batch]
        xb = x[idx].unsqueeze(1).float().div_(255)   # == ToTensor() of the PIL image
        if channels_last:
            xb = xb.contiguous(memory_format=torch.channels_last)
        yield xb, y[idx]


def seed_loader(ctx: Ctx, batch: int):
    """The book's input path: torchvision dataset, PIL Resize, DataLoader workers,
    DistributedSampler (set_epoch per epoch)."""
    from torchvision import datasets, transforms
    dsdata.verify_raw(ctx.spec["inputs"]["data_root"])
    tf = transforms.Compose([transforms.Resize(ctx.proto["image_size"]), transforms.ToTensor()])
    ds = datasets.FashionMNIST(ctx.spec["inputs"]["data_root"], train=True, transform=tf)
    if ctx.proto["train_images"] < len(ds):
        ds = torch.utils.data.Subset(ds, range(ctx.proto["train_images"]))
    sampler = torch.utils.data.distributed.DistributedSampler(ds, ctx.world, ctx.rank)
    loader = torch.utils.data.DataLoader(ds, batch, sampler=sampler,
                                         num_workers=ctx.proto["loader_workers"])
    return sampler, loader


def synthetic_batch(ctx: Ctx, batch: int):
    g = torch.Generator(device="cpu").manual_seed(ctx.rank)
    s = ctx.proto["image_size"]
    X = torch.randn(batch, 1, s, s, generator=g).to(ctx.device)
    y = torch.randint(0, 10, (batch,), generator=g).to(ctx.device)
    return X, y


def timed_steps(ctx: Ctx, fn, warmup: int, steps: int):
    for _ in range(warmup):
        fn()
    sync(ctx.device)
    dist.barrier()
    timer = StepTimer(ctx.device)
    t0 = time.perf_counter()
    for i in range(steps):
        timer.mark()
        fn()
        if i == 0:
            ctx.maybe_fault("step")
    timer.mark()
    sync(ctx.device)
    return (time.perf_counter() - t0) / steps, timer.step_ms()


def sample_gpu(ctx: Ctx, when: str) -> None:
    """Read this rank's device state (clocks, reasons, power, processes) now; a no-op on CPU."""
    if getattr(ctx, "gpu", None) is not None:
        ctx.gpu.take(when)


def gpu_state(ctx: Ctx) -> dict | None:
    """Every rank's device samples and pid, gathered: the result's gpu_state (None on CPU)."""
    if ctx.gpu is None:
        return None
    rows = [None] * ctx.world
    dist.all_gather_object(rows, {"pid": os.getpid(), **ctx.gpu.record()})
    return gpustate.summarise(rows, [r["pid"] for r in rows])


def per_rank_merge(ctx: Ctx, mine: dict) -> list[dict] | None:
    rows = [None] * ctx.world
    dist.all_gather_object(rows, {"rank": ctx.rank, **mine})
    return rows


def pin(ctx: Ctx) -> dict:
    """The rank's threads (the spec's threads_per_rank, at every k) and, on a CPU stand-in,
    its cores: rank r of a node on the r-th run of that many cores this process may use."""
    threads = int(ctx.spec.get("threads_per_rank") or torch.get_num_threads())
    torch.set_num_threads(threads)
    out = {"threads_per_rank": threads}
    if not ctx.cuda and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        mine = cores[ctx.local_rank * threads:(ctx.local_rank + 1) * threads]
        if len(mine) == threads:   # more ranks than cores (an emulation, a busy box): left unpinned
            os.sched_setaffinity(0, mine)
            out["cpu_affinity"] = mine
    return out


def runtime_versions(ctx: Ctx) -> dict:
    v = {"torch": torch.__version__, "device": torch.cuda.get_device_name(ctx.device) if ctx.cuda else "cpu",
         "nccl": ".".join(map(str, torch.cuda.nccl.version())) if ctx.cuda else None,
         "cuda_runtime": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if ctx.cuda else None,
         "world_size": ctx.world, "hostname": os.uname().nodename}
    v.update(threads_per_rank=torch.get_num_threads(), cpu_affinity=sorted(os.sched_getaffinity(0))
             if hasattr(os, "sched_getaffinity") else None)
    v["env"] = {k: val for k, val in os.environ.items()
                if k.startswith(("NCCL_", "TORCH_NCCL_", "TORCH_SYMM", "NVSHMEM_", "OMP_NUM"))}
    return v


def compile_cache_counts() -> dict | None:
    """This process's lookups in torch.compile's persistent caches (inductor's FX graph
    cache, AOTAutograd's), whose folder the watchdog sets (dpscale.run.caches): a warm
    cache shows as hits. None when nothing was compiled."""
    from torch._dynamo.utils import counters
    keys = {"fx_graph_hits": ("inductor", "fxgraph_cache_hit"), "fx_graph_misses": ("inductor", "fxgraph_cache_miss"),
            "fx_graph_bypasses": ("inductor", "fxgraph_cache_bypass"),   # a graph the cache cannot key (why: debug log)
            "autograd_hits": ("aot_autograd", "autograd_cache_hit"),
            "autograd_misses": ("aot_autograd", "autograd_cache_miss"),
            "autograd_bypasses": ("aot_autograd", "autograd_cache_bypass")}
    out = {name: counters[group][count] for name, (group, count) in keys.items()}
    return out if any(out.values()) else None


def run(spec: dict, result_path: str) -> None:
    ctx = Ctx(spec)
    started = utc_now()
    if ctx.cuda:
        torch.cuda.set_device(ctx.device)
        ctx.gpu = gpustate.Recorder([str(torch.cuda.get_device_properties(ctx.device).uuid)])
    pin(ctx)
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.benchmark = True
    # before the watchdog's outer kill, so the rank that waits reports the hang
    timeout = _dt.timedelta(seconds=float(spec["pg_timeout_s"]))
    kwargs = {"device_id": ctx.device} if ctx.cuda else {}
    dist.init_process_group(spec["backend"], timeout=timeout, **kwargs)
    timing.mark("process group")
    try:
        ctx.log(f"{spec['experiment']}/{spec['variant']} k={ctx.world} backend={spec['backend']} "
                f"device={ctx.device}")
        ctx.maybe_fault("init")
        sample_gpu(ctx, "before the measurement")
        metrics = registry.entry_point(spec["experiment"])(ctx)
        sample_gpu(ctx, "after the measurement")
        state = gpu_state(ctx)
        if ctx.rank == 0 and (cc := compile_cache_counts()):
            metrics["compile_cache"] = cc
        timing.mark("metrics and GPU state")
        metrics["stage_marks_unix"] = dict(timing.STAGES)   # stamp() makes them seconds
        if ctx.rank == 0:   # rank 0 gates I/O: one writer, after every rank reported
            write_result(spec, result_path, metrics, started, runtime_versions(ctx), gpu_state=state)
            ctx.log(f"wrote {result_path}")
        dist.barrier()
    finally:
        dist.destroy_process_group()
