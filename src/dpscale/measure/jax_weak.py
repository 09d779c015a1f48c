"""JAX weak scaling (the book's jax_throughput): per-device batch fixed, global batch k
times it; three input paths (host-staged, device-resident, and the tuned bf16 step
with jax.jit over the flat state); repeats timed epochs with their spread.
"""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dpscale.analysis import roofline
from dpscale.measure.jax_job import (Ctx, NamedSharding, P, block, build, load_train, make_mesh, measure_copy_bandwidth,
                      measure_matmul_peak, mfu_metrics, peak_mem_MiB, resident_step, shard_batch, step_body,
                      to_images, train_step)
from dpscale.measure.timing import mark, spread_fields, summary, warmup_plan


def pure_resident_step(graphdef, treedef):
    """resident_step for the tuned series: jax.jit over a flat list of the state's
    arrays instead of nnx.jit over the objects. nnx.jit walks the model graph in
    Python at every call: that hides behind the float32 step while the host runs ahead,
    but not behind the bf16 one (docs/measurements/tuned-step_h200_2026-11-29.md). The old
    parameter buffers are donated to the new ones."""
    @functools.partial(jax.jit, donate_argnums=0)
    def step(leaves, xs, ys, i):
        model, opt = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
        loss = step_body(model, opt, to_images(xs[i]), ys[i])
        new_leaves, new_treedef = jax.tree.flatten(nnx.state((model, opt)))
        assert new_treedef == treedef, "the step changed the state's structure"
        return loss, new_leaves
    return step


# ---------------------------------------------------------------- jax_weak

def run_epochs(ctx: Ctx, step, live, steps: int, B: int, warmup: list[int | None], repeats: int):
    """The warm-up passes (timing.warmup_plan; the first step traces and compiles), then
    `repeats` timed epochs, each without any sync inside it. Returns (per-pass history,
    the last loss, the first step's seconds: trace + compile + run). The first timed
    epoch's entry carries the wall-clock time of its first step (t0_unix: the end of the
    launch's start)."""
    mark("devices, data and model")   # everything before the warm-up (timing.STAGES)
    every = max(1, steps // 5)
    history, loss, first_step_s = [], None, None
    passes = [(n or steps, None) for n in warmup] + [(steps, rep) for rep in range(repeats)]
    for epoch, (n, rep) in enumerate(passes):
        block(live())
        if rep is not None:
            ctx.sample_gpu(f"before timed repeat {rep + 1}")
        t0, t0_unix = time.perf_counter(), time.time()
        for i in range(n):
            loss = step(i % steps)   # a warm-up longer than an epoch goes round it again
            if epoch == 0 and i == 0:
                block(loss, live())
                first_step_s = time.perf_counter() - t0
                ctx.log(f"first step (trace + compile + run): {first_step_s:.2f} s")
            elif (i + 1) % every == 0:   # the loss syncs: printed in warm-up passes only
                ctx.log(f"epoch {epoch} step {i + 1}/{n} "
                        + ("dispatched" if rep is not None else f"loss {float(loss):.3f}"))
        block(loss, live())
        dt = time.perf_counter() - t0
        if rep is not None:
            ctx.sample_gpu(f"after timed repeat {rep + 1}")
        history.append({"epoch": epoch, "repeat": rep, "samples": n * B, "seconds": dt,
                        "samples_per_s": n * B / dt, **({"t0_unix": t0_unix} if rep == 0 else {})})
        ctx.log(f"epoch {epoch}: {n * B} samples in {dt:.2f} s = {n * B / dt:.0f} samples/s"
                + (f" (warm-up {n} steps)" if rep is None and warmup[epoch] is not None else
                   " (warm-up)" if rep is None else f" (timed, repeat {rep + 1}/{repeats})"))
    mark("timed epochs")
    return history, loss, first_step_s


def warmup_fields(ctx: Ctx, history: list[dict]) -> dict:
    """What ran before the timed epochs: the plan's passes and their seconds."""
    warm = [e for e in history if e["repeat"] is None]
    return {"warmup_steps": warmup_plan(ctx.proto), "warmup_s": sum(e["seconds"] for e in warm),
            "timed_epoch_includes_compile": not warm}


def weak_step(path: str, model, opt, mesh, x_u8, y_all, steps: int, B: int):
    """The variant's step(i) -> loss on batch i, live() -> what a sync waits for (the
    newest parameters: the tuned step donates the old ones), and write_back(), which
    puts the tuned step's flat state back into model and opt. path: "host" (the book's
    loop), "device" (nnx.jit over the resident set), "flat_jit" (jax.jit over the flat state)."""
    def state():
        return nnx.state((model, opt))

    if path == "host":
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
    if path == "device":
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
    k = ctx.k
    tuned = ctx.spec["config"].get("tuned", {})
    bf16 = tuned.get("precision") == "bf16"
    path = tuned.get("dispatch") or ctx.spec["config"]["variant"]["input"]   # host | device | flat_jit
    b = ctx.proto["per_rank_batch"]
    B = b * k
    x_u8, y_all, _ = load_train(ctx)
    steps = len(x_u8) // B
    if steps < 1:
        raise ValueError(f"train_images={len(x_u8)} gives no full global batch of {k} x {b} = {B}")
    mesh = make_mesh(k)
    gpu = mesh.devices.flat[0].platform == "gpu"
    peak = measure_matmul_peak(mesh.devices.flat[0]) if gpu else None
    copy_Bps = measure_copy_bandwidth(mesh.devices.flat[0]) if gpu and bf16 else None
    model, opt = build(mesh, jnp.bfloat16 if bf16 else None)

    step, live, write_back = weak_step(path, model, opt, mesh, x_u8, y_all, steps, B)
    history, loss, first_step_s = run_epochs(ctx, step, live, steps, B, warmup_plan(ctx.proto), ctx.proto["repeats"])
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
         **warmup_fields(ctx, history),
         "epochs": [{k: v for k, v in e.items() if k != "t0_unix"} for e in history],
         "first_timed_step_unix": first["t0_unix"],   # the watchdog makes it start_s (dpscale.run.launches)
         "peak_mem_MiB": peak_mem_MiB(mesh.devices.flat),
         "input_path": ctx.spec["config"]["variant"]["input"]}
    m.update(mfu_metrics(ctx, m["samples_per_s_per_device"], peak))
    if bf16:   # the bf16 roofline, defined once for both frameworks
        m.update(roofline.roofline_fields(b, ctx.proto["image_size"], m["samples_per_s_per_device"],
                                          peak, copy_Bps))
        m["tuned_options"] = {"compute_dtype": "bfloat16 (convolutions, batch norm)",
                              "param_dtype": "float32", "loss_dtype": "float32",
                              "data": "device-resident cache",
                              "dispatch": "jax.jit over the flat nnx.split state, donated (not nnx.jit)"}
    return m
