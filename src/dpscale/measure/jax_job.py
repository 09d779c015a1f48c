"""One JAX measurement process: it sees all k devices (GPUs, or k host devices on a
CPU-only box); the batch is laid out across them with a Mesh and a NamedSharding, and
the unchanged single-device step is jit-compiled, so XLA's GSPMD pass inserts the
all-reduce that DDP performs by hand. The model, the step, the inputs and rates every
JAX experiment shares, and the entry that dispatches to the experiment's function
(dpscale.registry) and writes its result.

scripts/jax_worker.py sets XLA_FLAGS / JAX_PLATFORMS before this module imports jax.
A raised exception fails the job (the watchdog records it with the log).
"""
from __future__ import annotations

import functools
import importlib.metadata
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dpscale.analysis import costmodel
from dpscale import registry
from dpscale.data import load as dsdata
from dpscale.model.models import flax_resnet18, read_flops
from dpscale.results import utc_now, write_result
from dpscale.measure import gpustate, timing

P = jax.sharding.PartitionSpec
NamedSharding = jax.sharding.NamedSharding
LR = 0.1


class Ctx:
    def __init__(self, spec: dict):
        self.spec = spec
        self.k = int(spec["k"])
        self.proto = spec["config"]["protocol"]
        self.gpu: gpustate.Recorder | None = None   # this process's GPUs under NVML (GPU only)

    def sample_gpu(self, when: str) -> None:
        """Read the devices' state (clocks, reasons, power, processes) now; a no-op on CPU."""
        if self.gpu is not None:
            self.gpu.take(when)

    def log(self, msg: str):
        print(f"[jax {self.spec['experiment']}/{self.spec['variant']} k={self.k} "
              f"{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class CompileCache:
    """JAX's persistent compilation cache as this process used it (the watchdog sets its
    folder: dpscale.run.caches): programs loaded from it, programs written to it (JAX's
    `cache_misses`), and the compile seconds the loaded ones saved."""
    EVENT = "/jax/compilation_cache/"

    def __init__(self):
        self.loaded, self.written, self.saved_s = 0, 0, 0.0
        jax.monitoring.register_event_listener(self.event)
        jax.monitoring.register_event_duration_secs_listener(self.duration)

    def event(self, event: str, **kwargs) -> None:
        if event == self.EVENT + "cache_hits":
            self.loaded += 1
        elif event == self.EVENT + "cache_misses":
            self.written += 1

    def duration(self, event: str, duration_secs: float, **kwargs) -> None:
        if event == self.EVENT + "compile_time_saved_sec":
            self.saved_s += duration_secs

    def record(self) -> dict | None:
        if not (self.loaded or self.written):
            return None
        return {"loaded": self.loaded, "written": self.written, "compile_s_saved": round(self.saved_s, 3)}


# ---------------------------------------------------------------- layout

def make_mesh(k: int):
    # jax >= 0.9 makes mesh axes Explicit by default, and the seed's step (written
    # for one device, no out_sharding annotations) then raises ShardingTypeError.
    # Auto axes are the book's model on purpose: we say where the data lives and
    # GSPMD propagates the layout through the step and inserts the collectives.
    return jax.make_mesh((k,), ("data",), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=jax.devices()[:k])


def shard_batch(X, y, mesh):
    sh = NamedSharding(mesh, P("data"))   # leading (batch) axis across the devices
    return jax.device_put(X, sh), jax.device_put(y, sh)


def replicate(module, mesh):
    """Give every device of the mesh a full copy of a module's state. Always a copy
    (may_alias=False): on one device device_put would hand back the same buffers, shared
    with the cached initial model, and the tuned step donates (deletes) its inputs."""
    sh = NamedSharding(mesh, P())
    nnx.update(module, jax.device_put(nnx.state(module), sh, may_alias=False))


@functools.cache
def _initial_model():
    return flax_resnet18(seed=0)   # eager init is ~60 small programs (4 s on a CPU): once


def build(mesh, compute_dtype=None):
    """The seed's model (nnx.Rngs(0)) and SGD(0.1), replicated over the mesh."""
    model = nnx.clone(_initial_model())   # every run starts from the same weights
    if compute_dtype is not None:
        set_compute_dtype(model, compute_dtype)
    opt = nnx.Optimizer(model, optax.sgd(LR), wrt=nnx.Param)
    replicate(model, mesh)
    replicate(opt, mesh)
    return model, opt


def set_compute_dtype(model, dtype):
    """Mixed precision the Flax way: parameters stay float32 (param_dtype), convolutions
    and batch norm compute in `dtype` (BatchNorm still reduces its statistics in
    float32). The final Linear is left alone so the logits and the loss stay float32.
    Done by setting the modules' static `dtype` attribute, so models.py keeps one
    definition of the network."""
    for _, node in nnx.iter_graph(model):
        if isinstance(node, (nnx.Conv, nnx.BatchNorm)):
            node.dtype = dtype


def to_images(x_uint8):
    """uint8 [B,H,W] -> float32 [B,H,W,1] in [0,1] (ToTensor's scaling, NHWC)."""
    return (x_uint8.astype(jnp.float32) / 255.0)[..., None]


# ---------------------------------------------------------------- the step

def step_body(model, opt, X, y):
    """The seed's training step, written for one device."""
    def loss_fn(m):
        return optax.softmax_cross_entropy_with_integer_labels(m(X), y).mean()
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    opt.update(model, grads)   # XLA inserts the all-reduce of the gradients here
    return loss


# jit + sharded inputs make it data-parallel with no change to the body.
train_step = nnx.jit(step_body)


@nnx.jit
def resident_step(model, opt, xs, ys, i):
    """The same step on batch i of a device-resident set xs [steps, B, H, W] uint8
    (batch axis sharded): each device slices its own rows, nothing crosses the host."""
    return step_body(model, opt, to_images(xs[i]), ys[i])


def block(*trees):
    """A sync point: JAX dispatches asynchronously, so every clock read waits here,
    on the new parameters as well as the loss (the update is what must have landed)."""
    jax.block_until_ready(trees)


# ---------------------------------------------------------------- inputs

def load_train(ctx: Ctx):
    arrays, meta = dsdata.load_cache(ctx.spec["inputs"]["cache"], ctx.spec["inputs"]["cache_meta"])
    n = ctx.proto.get("train_images")   # the checks (jax_checks) only need the first batch
    if meta["image_size"] != ctx.proto["image_size"]:
        raise ValueError(f"cache {ctx.spec['inputs']['cache']} holds {meta['image_size']}px images, "
                         f"the protocol asks for {ctx.proto['image_size']}px")
    return arrays["train_x"][:n], arrays["train_y"][:n].astype(np.int32), meta


def measure_matmul_peak(device, n: int = 8192, iters: int = 20) -> float:
    """bf16 dense matmul FLOP/s on one device, measured now: the MFU denominator
    (the PyTorch side measures the same product with torch)."""
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.device_put(jax.random.normal(ka, (n, n), jnp.bfloat16), device)
    b = jax.device_put(jax.random.normal(kb, (n, n), jnp.bfloat16), device)
    mm = jax.jit(jnp.matmul)
    for _ in range(3):
        out = mm(a, b)
    block(out)
    t0 = time.perf_counter()
    for _ in range(iters):
        out = mm(a, b)   # one live output, as in torch: keeping all 20 made every call a fresh
    block(out)           # cudaMalloc (no preallocation), and the rate read low
    return 2 * n ** 3 * iters / (time.perf_counter() - t0)


def measure_copy_bandwidth(device, n_bytes: int = 1 << 30, iters: int = 20) -> float:
    """On-device copy bandwidth, bytes read + written per second: the roofline's memory
    rate (torch_ddp measures the same with a device-to-device copy). x + 1, not a bare
    copy, which XLA may turn into an alias; one live output, as in measure_matmul_peak."""
    x = jax.device_put(jnp.zeros(n_bytes // 4, jnp.float32), device)
    add_one = jax.jit(lambda a: a + 1)
    for _ in range(3):
        out = add_one(x)
    block(out)
    t0 = time.perf_counter()
    for _ in range(iters):
        out = add_one(x)
    block(out)
    return 2 * n_bytes * iters / (time.perf_counter() - t0)


def mfu_metrics(ctx: Ctx, samples_per_s_per_device: float, peak: float | None) -> dict:
    """MFU = counted model FLOP/s over the measured bf16 matmul peak, as torch_ddp does.
    The count comes from results/model/flops_<size>px.json (torch.utils.flop_counter)."""
    path = ctx.spec["inputs"].get("flops")
    if not path:
        return {}
    return costmodel.mfu_fields(read_flops(path, ctx.proto["image_size"]), samples_per_s_per_device, peak)


def peak_mem_MiB(devices) -> float | None:
    # this process's devices only: another node's cannot be asked (multi-node runs)
    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in devices
             if d.process_index == jax.process_index()]
    peaks = [p for p in peaks if p is not None]
    return max(peaks) / 2**20 if peaks else None


# ---------------------------------------------------------------- entry

def runtime_versions(devices) -> dict:
    return {"jax": jax.__version__, "jaxlib": importlib.metadata.version("jaxlib"),
            "flax": importlib.metadata.version("flax"), "optax": optax.__version__,
            "platform": devices[0].platform, "device_kind": devices[0].device_kind,
            "devices": [str(d) for d in devices], "hostname": os.uname().nodename,
            "env": {key: val for key, val in os.environ.items()
                    if key.startswith(("XLA_", "JAX_", "TF_CPP", "NCCL_", "CUDA_VISIBLE"))}}


CUDA_INSTALL = ("pip install -e '.[cuda]' (JAX's CUDA 13 build, jax[cuda13]; for a CUDA 12 driver: "
                f"pip install 'jax[cuda12]=={jax.__version__}')")


def check_devices(spec: dict) -> list:
    """The devices the job's backend promises, or one line saying why not and what to install."""
    k, want = int(spec["k"]), "gpu" if spec["backend"] == "xla-gpu" else "cpu"
    devices = jax.devices()
    if devices[0].platform != want:
        plugins = [d for d in ("jax-cuda13-plugin", "jax-cuda12-plugin") if _installed(d)]
        raise RuntimeError(f"backend {spec['backend']} needs {want} devices, JAX {jax.__version__} sees "
                           f"{devices[0].platform} ({', '.join(plugins) or 'no CUDA plugin installed'}); "
                           + (f"install it with {CUDA_INSTALL}, and check nvidia-smi sees the GPUs"
                              if want == "gpu" else "unset JAX_PLATFORMS"))
    if len(devices) < k:
        raise RuntimeError(f"k={k} needs {k} devices, JAX sees {len(devices)}: {devices}"
                           + (" (run through scripts/jax_worker.py, which sets XLA_FLAGS)"
                              if want == "cpu" else ""))
    return devices


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def run(spec: dict, result_path: str) -> None:
    started = utc_now()
    cache = CompileCache()   # before the first compile
    ctx = Ctx(spec)
    devices = check_devices(spec)
    ctx.log(f"backend={spec['backend']} jax {jax.__version__}, {len(devices)} device(s): "
            f"{', '.join(map(str, devices[:8]))}{' ...' if len(devices) > 8 else ''}")
    mine = [d for d in devices[:ctx.k] if d.process_index == jax.process_index()]
    if devices[0].platform == "gpu":   # by CUDA ordinal (multi-node: process 0's devices only)
        ctx.gpu = gpustate.Recorder(gpustate.device_ids([getattr(d, "local_hardware_id", d.id) for d in mine]))
    ctx.sample_gpu("before the measurement")
    metrics = registry.entry_point(spec["experiment"])(ctx)
    ctx.sample_gpu("after the measurement")
    if jax.process_index() != 0:   # multi-node: process 0 writes the one result
        return
    state = gpustate.summarise([ctx.gpu.record()], [os.getpid()]) if ctx.gpu else None
    if cc := cache.record():
        metrics["compile_cache"] = cc
    timing.mark("metrics and GPU state")
    metrics["stage_marks_unix"] = dict(timing.STAGES)   # stamp() makes them seconds
    result = write_result(spec, result_path, metrics, started, runtime_versions(devices[:ctx.k]), gpu_state=state)
    ctx.log(f"wrote {result_path} (status {result['status']})")
