"""The JAX half of section 13.6: one process sees all k devices (GPUs, or k host
devices on a CPU-only box), the batch is laid out across them with a Mesh and a
NamedSharding, and the unchanged single-device step is jit-compiled; XLA's GSPMD
pass inserts the all-reduce that DDP performs by hand.

Three experiments, one function each:
  jax_weak      weak scaling (per-device batch fixed): samples/s per k, three input paths
  jax_hlo       the all-reduce census of the compiled step, and the sharding pictures
  jax_equality  one step at k=1 against one step at k=2, and a deliberately broken step

scripts/jax_worker.py sets XLA_FLAGS / JAX_PLATFORMS before this module imports jax.
A raised exception fails the job (the watchdog keeps the log, no result is left).
"""
from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import io
import json
import math
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from . import costmodel, data as dsdata, registry, roofline
from .models import count_flax, flax_resnet18
from .results import utc_now, write_result
from .timing import spread_fields, summary

P = jax.sharding.PartitionSpec
NamedSharding = jax.sharding.NamedSharding

# Relative tolerance of the equality check. The book saw 1.5e-4 against updates near
# 1e-2 on GPUs (two differently compiled programs, tf32 convolutions: ~1.5e-2 of
# rounding); the bug the check exists for, gradients summed over k devices instead
# of averaged, shows up as (k-1) times the update, i.e. >= 1.0. 0.05 sits between.
REL_THRESHOLD = 0.05
LR = 0.1


class Ctx:
    def __init__(self, spec: dict):
        self.spec = spec
        self.k = int(spec["k"])
        self.proto = spec["config"]["protocol"]

    def log(self, msg: str):
        print(f"[jax {self.spec['experiment']}/{self.spec['variant']} k={self.k} "
              f"{time.strftime('%H:%M:%S')}] {msg}", flush=True)


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


def summed_grads_step(k: int):
    """The bug the equality check exists to catch: each device's mean loss, summed over
    the k devices, which is what a psum (instead of a pmean) of per-device gradients
    computes. Row j of reshape(k, -1) is exactly device j's shard of the batch."""
    @nnx.jit
    def step(model, opt, X, y):
        def loss_fn(m):
            per_example = optax.softmax_cross_entropy_with_integer_labels(m(X), y)
            return per_example.reshape(k, -1).mean(axis=1).sum()
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, grads)
        return loss
    return step


def pure_resident_step(graphdef, treedef):
    """resident_step for the tuned series: jax.jit over a flat list of the state's
    arrays instead of nnx.jit over the objects. nnx.jit walks the model graph in
    Python at every call: on an H200 host a call took 10.6 ms at k=1 and 17.9 ms at
    k=2, against 3.6 and 7.7 ms here. That hides behind a 23 ms float32 step while the
    host runs ahead, but not behind an 11 ms bf16 one (k=2 scaled 63% with nnx.jit,
    93% with this). The old parameter buffers are donated to the new ones."""
    @functools.partial(jax.jit, donate_argnums=0)
    def step(leaves, xs, ys, i):
        model, opt = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
        loss = step_body(model, opt, to_images(xs[i]), ys[i])
        new_leaves, new_treedef = jax.tree.flatten(nnx.state((model, opt)))
        assert new_treedef == treedef, "the step changed the state's structure"
        return loss, new_leaves
    return step


def block(*trees):
    """A sync point: JAX dispatches asynchronously, so every clock read waits here,
    on the new parameters as well as the loss (the update is what must have landed)."""
    jax.block_until_ready(trees)


# ---------------------------------------------------------------- inputs

def load_train(ctx: Ctx):
    arrays, meta = dsdata.load_cache(ctx.spec["inputs"]["cache"], ctx.spec["inputs"]["cache_meta"])
    n = ctx.proto.get("train_images")   # jax_hlo/jax_equality only need the first batch
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
    block(out)           # cudaMalloc (no preallocation) and read 405-536 TFLOP/s on an H200
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
    with open(path) as f:
        rec = json.load(f)
    if rec["image_size"] != ctx.proto["image_size"]:
        raise ValueError(f"{path} counts {rec['image_size']}px images, the protocol asks for "
                         f"{ctx.proto['image_size']}px")
    return costmodel.mfu_fields(rec["flops_per_sample"], samples_per_s_per_device, peak)


def peak_mem_MiB(devices) -> float | None:
    # this process's devices only: another node's cannot be asked (multi-node runs)
    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in devices
             if d.process_index == jax.process_index()]
    peaks = [p for p in peaks if p is not None]
    return max(peaks) / 2**20 if peaks else None


# ---------------------------------------------------------------- jax_weak

def run_epochs(ctx: Ctx, step, live, steps: int, B: int, warmup: int, repeats: int):
    """`warmup` epochs (the first traces and compiles), then `repeats` timed epochs,
    each without any sync inside it. Returns (per-epoch history, the last loss, the
    first step's seconds: trace + compile + run)."""
    every = max(1, steps // 5)
    history, loss, first_step_s = [], None, None
    for epoch in range(warmup + repeats):
        rep = epoch - warmup if epoch >= warmup else None
        block(live())
        t0 = time.perf_counter()
        for i in range(steps):
            loss = step(i)
            if epoch == 0 and i == 0:
                block(loss, live())
                first_step_s = time.perf_counter() - t0
                ctx.log(f"first step (trace + compile + run): {first_step_s:.2f} s")
            elif (i + 1) % every == 0:   # the loss syncs: printed in warm-up epochs only
                ctx.log(f"epoch {epoch} step {i + 1}/{steps} "
                        + ("dispatched" if rep is not None else f"loss {float(loss):.3f}"))
        block(loss, live())
        dt = time.perf_counter() - t0
        history.append({"epoch": epoch, "repeat": rep, "samples": steps * B, "seconds": dt,
                        "samples_per_s": steps * B / dt})
        ctx.log(f"epoch {epoch}: {steps * B} samples in {dt:.2f} s = {steps * B / dt:.0f} samples/s"
                + (" (warm-up)" if rep is None else f" (timed, repeat {rep + 1}/{repeats})"))
    return history, loss, first_step_s


def weak_step(variant: str, model, opt, mesh, x_u8, y_all, steps: int, B: int):
    """The variant's step(i) -> loss on batch i, live() -> what a sync waits for (the
    newest parameters: the tuned step donates the old ones), and write_back(), which
    puts the tuned step's flat state back into model and opt."""
    def state():
        return nnx.state((model, opt))

    if variant == "host":
        X_all = (x_u8.astype(np.float32) / 255)[..., None]   # the book keeps float32 NHWC on the host

        def host_step(i):
            X, y = X_all[i * B:(i + 1) * B], y_all[i * B:(i + 1) * B]
            return train_step(model, opt, *shard_batch(X, y, mesh))
        return host_step, state, lambda: None
    n = steps * B
    # [steps, B, H, W] with the batch axis sharded: batch i is rows i*B..(i+1)*B as in
    # the host loop, and each device already holds its b rows of every batch.
    sh = NamedSharding(mesh, P(None, "data"))
    xs = jax.device_put(x_u8[:n].reshape(steps, B, *x_u8.shape[1:]), sh)
    ys = jax.device_put(y_all[:n].reshape(steps, B), sh)
    # Step indices go up once too: a Python int would be a host-to-device copy per step.
    idx = [jax.device_put(np.int32(i), NamedSharding(mesh, P())) for i in range(steps)]
    block(xs, ys, idx)
    if variant == "device":
        return (lambda i: resident_step(model, opt, xs, ys, idx[i])), state, lambda: None
    graphdef, flat = nnx.split((model, opt))
    leaves, treedef = jax.tree.flatten(flat)
    fast = pure_resident_step(graphdef, treedef)

    def tuned_step(i):
        nonlocal leaves
        loss, leaves = fast(leaves, xs, ys, idx[i])
        return loss
    return tuned_step, lambda: leaves, lambda: nnx.update((model, opt), jax.tree.unflatten(treedef, leaves))


def per_step_pass(step, live, steps: int, n: int = 20) -> tuple[dict, dict]:
    """Summaries of the per-step ms and of the host call's ms, from a short pass that
    blocks after every step. Not inside the timed epochs: blocking there would stop the
    host from running ahead of the devices and change what samples_per_s measures. The
    host call (dispatch; for host, also the batch copy) is timed while the devices are
    idle: dispatch_ms x steps close to epoch_s = host-bound."""
    per_step, dispatch = [], []
    for i in range(min(steps, n)):
        t = time.perf_counter()
        loss = step(i)
        dispatch.append(1e3 * (time.perf_counter() - t))
        block(loss, live())
        per_step.append(1e3 * (time.perf_counter() - t))
    return summary(per_step), summary(dispatch)


def exp_weak(ctx: Ctx) -> dict:
    """The book's jax_throughput: per-device batch fixed, global batch k times it;
    epochs-1 epochs warm up (the first compiles), then `repeats` epochs are timed
    without any sync inside them; the first timed one is the book's figure.

    host    the book's loop: float32 batches staged in host memory, device_put each step
    device  the whole uint8 set put on the devices once, batches sliced on the device
    tuned   device-resident, bf16 compute (float32 parameters and loss), and the
            low-overhead jax.jit dispatch of pure_resident_step
    """
    k, variant = ctx.k, ctx.spec["variant"]
    b = ctx.proto["per_rank_batch"]
    B = b * k
    x_u8, y_all, _ = load_train(ctx)
    steps = len(x_u8) // B
    if steps < 1:
        raise ValueError(f"train_images={len(x_u8)} gives no full global batch of {k} x {b} = {B}")
    mesh = make_mesh(k)
    gpu = mesh.devices.flat[0].platform == "gpu"
    peak = measure_matmul_peak(mesh.devices.flat[0]) if gpu else None
    copy_Bps = measure_copy_bandwidth(mesh.devices.flat[0]) if gpu and variant == "tuned" else None
    model, opt = build(mesh, jnp.bfloat16 if variant == "tuned" else None)

    step, live, write_back = weak_step(variant, model, opt, mesh, x_u8, y_all, steps, B)
    history, loss, first_step_s = run_epochs(ctx, step, live, steps, B, ctx.proto["epochs"] - 1, ctx.proto["repeats"])
    loss_last = float(loss)
    timed = [e for e in history if e["repeat"] is not None]
    first = timed[0]   # the book's timed epoch
    st, ds = per_step_pass(step, live, steps)
    ctx.log(f"per-step pass: median {st['median_ms']:.1f} ms over {st['n']} steps, of which the host "
            f"call {ds['median_ms']:.1f} ms; first timed epoch {1e3 * first['seconds'] / steps:.1f} ms/step")
    write_back()

    m = {"samples_per_s": first["samples_per_s"], "repeats": len(timed),
         **spread_fields("samples_per_s", [e["samples_per_s"] for e in timed]),
         "samples_per_s_per_device": first["samples_per_s"] / k,
         "per_rank_batch": b, "global_batch": B, "steps_per_epoch": steps, "epoch_s": first["seconds"],
         "epoch_s_repeats": [e["seconds"] for e in timed], "epoch_ms_per_step": 1e3 * first["seconds"] / steps,
         "step_ms_median": st["median_ms"], "step_ms_p10": st["p10_ms"], "step_ms_p90": st["p90_ms"],
         "step_ms_n": st["n"], "dispatch_ms_median": ds["median_ms"],
         # >= 1: the host cannot issue steps as fast as the devices run them
         "dispatch_share_of_epoch": ds["median_ms"] * steps / (1e3 * first["seconds"]),
         "first_step_s": first_step_s, "loss_last": loss_last,
         "timed_epoch_includes_compile": ctx.proto["epochs"] < 2, "epochs": history,
         "peak_mem_MiB": peak_mem_MiB(mesh.devices.flat),
         "input_path": {"host": "host float32 batches, device_put per step",
                        "device": "device-resident uint8 set, sliced per step",
                        "tuned": "device-resident uint8 set, sliced per step"}[variant]}
    m.update(mfu_metrics(ctx, m["samples_per_s_per_device"], peak))
    if variant == "tuned":   # the bf16 roofline, defined once for both frameworks
        m.update(roofline.roofline_fields(b, ctx.proto["image_size"], m["samples_per_s_per_device"],
                                          peak, copy_Bps))
        m["tuned_options"] = {"compute_dtype": "bfloat16 (convolutions, batch norm)",
                              "param_dtype": "float32", "loss_dtype": "float32",
                              "data": "device-resident cache",
                              "dispatch": "jax.jit over the flat nnx.split state, donated (not nnx.jit)"}
    return m


# ---------------------------------------------------------------- jax_hlo

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
                "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_SHAPE = re.compile(r"\b(pred|bf16|[suf]\d+|c64|c128|f8e\w+)\[([\d,]*)\]")
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")


def parse_allreduces(hlo: str) -> list[dict]:
    """Every all-reduce of a compiled HLO module: element count and bytes per op,
    summed over its operands (XLA combines many small all-reduces into one op with
    a tuple of operands), read from the op's result type.

    Trap: an async all-reduce-start is typed (operands, results) on recent XLA, e.g.
    ((f32[6447680]{0}), f32[6447680]{0}), and plain results on older ones: read it
    from its all-reduce-done, else from the second half of that pair, never both."""
    lines = [line.strip() for line in hlo.splitlines()]
    done = {}
    for line in lines:
        m = re.search(r" all-reduce-done\([^%)]*(%[\w.\-]+)", line)
        if m:
            done[m.group(1)] = _result_type(line, "all-reduce-done")
    ops = []
    for line in lines:
        name = line.partition(" = ")[0]
        if " all-reduce(" in line:
            rtype = _result_type(line, "all-reduce")
        elif " all-reduce-start(" in line:
            rtype = done.get(name) or _result_type(line, "all-reduce-start")
            parts = _tuple_parts(rtype)
            if name not in done and len(parts) == 2 and parts[0].startswith("("):
                rtype = parts[1]
        else:
            continue
        elements, by_dtype = 0, {}
        shapes = _SHAPE.findall(rtype)
        for dtype, dims in shapes:
            n = math.prod(int(d) for d in dims.split(",") if d)
            elements += n
            size = _DTYPE_BYTES.get(dtype) or _DTYPE_BYTES.get(dtype[:2], 4)   # f8e4m3fn -> f8
            by_dtype[dtype] = by_dtype.get(dtype, 0) + n * size
        ops.append({"name": name, "operands": len(shapes), "elements": elements,
                    "bytes": sum(by_dtype.values()), "bytes_by_dtype": by_dtype,
                    "async": " all-reduce-start(" in line, "text": line})
    return ops


def _result_type(line: str, op: str) -> str:
    return re.split(rf" {op}\(", line.partition(" = ")[2], maxsplit=1)[0].strip()


def _tuple_parts(t: str) -> list[str]:
    """Top-level elements of an HLO tuple type ('(a, (b, c))' -> ['a', '(b, c)'])."""
    if not t.startswith("("):
        return [t]
    parts, depth, cur = [], 0, ""
    for ch in t[1:-1]:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return parts + [cur.strip()]


def other_collectives(hlo: str) -> dict:
    """Collectives other than all-reduce: data parallelism should need none."""
    out = {}
    for op in _COLLECTIVES[1:]:
        n = sum(1 for line in hlo.splitlines() if f" {op}(" in line or f" {op}-start(" in line)
        if n:
            out[op] = n
    return out


def capture_sharding(arr) -> str:
    """jax.debug.visualize_array_sharding as plain text. It prints through a rich
    Console it makes itself (no console argument), so redirect stdout and drop colour."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        jax.debug.visualize_array_sharding(arr, use_color=False)
    return re.sub(r"\x1b\[[0-9;]*m", "", buf.getvalue()).rstrip() + "\n"


def exp_hlo(ctx: Ctx) -> dict:
    k, b = ctx.k, ctx.proto["per_rank_batch"]
    if k < 2:
        raise ValueError("jax_hlo needs k >= 2: a one-device program has no collectives")
    x_u8, y_all, _ = load_train(ctx)
    if len(x_u8) < b * k:
        raise ValueError(f"train_images={len(x_u8)} < one global batch of {k} x {b}")
    mesh = make_mesh(k)
    model, opt = build(mesh)
    Xs, ys = shard_batch((x_u8[:b * k].astype(np.float32) / 255)[..., None], y_all[:b * k], mesh)
    t0 = time.perf_counter()
    hlo = train_step.lower(model, opt, Xs, ys).compile().as_text()
    compile_s = time.perf_counter() - t0
    ctx.log(f"lowered and compiled the step in {compile_s:.2f} s ({len(hlo)} characters of HLO)")

    ops = parse_allreduces(hlo)
    if not ops:
        raise RuntimeError("no all-reduce in the compiled k>=2 step: the batch was not sharded, "
                           "or XLA lowered the gradient sum to another collective "
                           f"(others found: {other_collectives(hlo)})")
    sizes = sorted((op["elements"] for op in ops), reverse=True)
    largest = max(ops, key=lambda op: op["elements"])
    grad_floats = count_flax(model)
    by_dtype = {}
    for op in ops:
        for dt, nbytes in op["bytes_by_dtype"].items():
            by_dtype[dt] = by_dtype.get(dt, 0) + nbytes
    ctx.log(f"{len(ops)} all-reduce ops; the largest sums {sizes[0] / 1e6:.2f}M elements, the two "
            f"largest {sum(sizes[:2]) / 1e6:.2f}M (gradient: {grad_floats / 1e6:.2f}M floats)")
    ctx.log(largest["text"][:100] + " ...")

    # One real step (it reuses the executable just compiled), then the pictures: the batch
    # split along its leading axis, and a weight after the step still replicated (the
    # all-reduce kept the copies identical).
    loss = train_step(model, opt, Xs, ys)
    block(loss, nnx.state(model))
    batch_txt = capture_sharding(Xs.reshape(len(Xs), -1))
    weight = model.net.layers[-1].kernel[...]
    weight_txt = capture_sharding(weight)
    print("the batch, split along its leading axis:\n" + batch_txt
          + "a weight after the step, still replicated:\n" + weight_txt, flush=True)
    return {"n_allreduce": len(ops), "allreduce_elements": sizes,
            "largest_two_elements": sizes[:2], "largest_two_sum_elements": sum(sizes[:2]),
            "total_elements": sum(sizes), "total_bytes": sum(by_dtype.values()),
            "bytes_by_dtype": by_dtype, "grad_floats": grad_floats,
            "largest_two_over_grad": sum(sizes[:2]) / grad_floats,
            "largest_op_txt": largest["text"][:240],
            "ops": [{key: op[key] for key in ("name", "operands", "elements", "bytes", "async")} for op in ops],
            "other_collectives": other_collectives(hlo), "compile_s": compile_s,
            "hlo_chars": len(hlo), "global_batch": b * k, "loss_one_step": float(loss),
            "sharding_batch_txt": batch_txt, "sharding_weight_txt": weight_txt,
            "weight_sharding": str(weight.sharding.spec), "weight_name": "net.layers[-1].kernel"}


# ---------------------------------------------------------------- jax_equality

def param_arrays(model) -> dict[str, np.ndarray]:
    flat, _ = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))
    return {_dotted(path): np.asarray(leaf, np.float64) for path, leaf in flat}


def _dotted(path) -> str:
    """['net']['layers'][0]['kernel'].value -> net.layers.0.kernel"""
    return ".".join(str(getattr(p, "key", getattr(p, "idx", getattr(p, "name", p)))) for p in path
                    ).removesuffix(".value")


def one_step_delta(k: int, X, y, step=None) -> tuple[dict, float]:
    """The book's one_step_delta: fresh model, one step on k devices, the update per Param."""
    mesh = make_mesh(k)
    model, opt = build(mesh)
    before = param_arrays(model)
    loss = (step or train_step)(model, opt, *shard_batch(X, y, mesh))
    after = param_arrays(model)
    return {name: after[name] - before[name] for name in before}, float(loss)


def compare_updates(ref: dict, other: dict, threshold: float = REL_THRESHOLD) -> dict:
    """Largest |difference| between two updates, relative to the largest |update| of
    the reference: small for rounding, about (k-1) for a k-times gradient."""
    if ref.keys() != other.keys():
        raise ValueError(f"different parameters: {sorted(ref.keys() ^ other.keys())[:5]}")
    max_update = max(float(np.abs(v).max()) for v in ref.values())
    diffs = {name: float(np.abs(ref[name] - other[name]).max()) for name in ref}
    worst = max(diffs, key=diffs.get)
    rel = diffs[worst] / max_update if max_update > 0 else math.inf
    return {"max_abs_update": max_update, "max_abs_diff": diffs[worst], "rel_diff": rel,
            "worst_param": worst, "threshold": threshold, "passed": rel <= threshold}


def exp_equality(ctx: Ctx) -> dict:
    k, b = ctx.k, ctx.proto["per_rank_batch"]
    if k < 2:
        raise ValueError("jax_equality compares k=1 against k >= 2; the job's k is 1")
    # The book uses one 256-example batch for both runs; per_rank_batch is 256 at paper
    # scale, so the batch is per_rank_batch examples in total (b/k per device at k).
    x_u8, y_all, _ = load_train(ctx)
    if b % k or len(x_u8) < b:
        raise ValueError(f"per_rank_batch={b} must be a multiple of k={k} and <= train_images")
    X, y = (x_u8[:b].astype(np.float32) / 255)[..., None], y_all[:b]

    d1, loss1 = one_step_delta(1, X, y)
    ctx.log(f"k=1: loss {loss1:.4f}")
    dk, lossk = one_step_delta(k, X, y)
    ok = compare_updates(d1, dk)
    ctx.log(f"k={k}: loss {lossk:.4f}; max |update| {ok['max_abs_update']:.2e}, max |difference| "
            f"{ok['max_abs_diff']:.2e}, relative {ok['rel_diff']:.2e} "
            f"({'PASS' if ok['passed'] else 'FAIL'} at {REL_THRESHOLD})")
    db, lossb = one_step_delta(k, X, y, step=summed_grads_step(k))
    bad = compare_updates(d1, db)
    flagged = not bad["passed"]
    ctx.log(f"broken step (gradients summed over {k} devices): relative difference "
            f"{bad['rel_diff']:.2e}: {'flagged' if flagged else 'NOT FLAGGED'}")

    m = {**ok, "batch": b, "loss_k1": loss1, f"loss_k{k}": lossk,
         "matmul_precision": str(jax.config.jax_default_matmul_precision),
         "broken": {**bad, "loss": lossb,
                    "what": f"per-device mean losses summed over k={k} devices "
                            "(a psum of gradients where a pmean belongs)"},
         "broken_flagged": flagged}
    problems = []
    if not ok["passed"]:
        problems.append(f"k=1 and k={k} updates differ by {ok['rel_diff']:.2e} of the update "
                        f"(threshold {REL_THRESHOLD}), worst in {ok['worst_param']}")
    if not flagged:
        problems.append(f"the broken (summed-gradient) step was not flagged: relative difference "
                        f"{bad['rel_diff']:.2e} <= {REL_THRESHOLD}, so the check cannot catch "
                        "a k-times update")
    if problems:
        m["_status"] = ("failed", "; ".join(problems))
    return m


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
    ctx = Ctx(spec)
    devices = check_devices(spec)
    ctx.log(f"backend={spec['backend']} jax {jax.__version__}, {len(devices)} device(s): "
            f"{', '.join(map(str, devices[:8]))}{' ...' if len(devices) > 8 else ''}")
    metrics = registry.entry_point(spec["experiment"])(ctx)
    if jax.process_index() != 0:   # multi-node: process 0 writes the one result
        return
    result = write_result(spec, result_path, metrics, started, runtime_versions(devices[:ctx.k]))
    ctx.log(f"wrote {result_path} (status {result['status']})")
