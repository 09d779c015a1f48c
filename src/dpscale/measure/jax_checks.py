"""The JAX checks of section 13.6.4: the census of the all-reduces XLA inserted into the
compiled step (jax_hlo), and one step on one device against one step sharded over two,
beside a deliberately broken step the check must flag (jax_equality).
"""
from __future__ import annotations

import contextlib
import io
import math
import re
import time

import jax
import numpy as np
import optax
from flax import nnx

from dpscale.measure.jax_job import Ctx, block, build, load_train, make_mesh, shard_batch, train_step
from dpscale.model.models import count_flax

# Relative tolerance of the equality check. The book saw 1.5e-4 against updates near
# 1e-2 on GPUs (two differently compiled programs, tf32 convolutions: ~1.5e-2 of
# rounding); the bug the check exists for, gradients summed over k devices instead
# of averaged, shows up as (k-1) times the update, i.e. >= 1.0. 0.05 sits between.
REL_THRESHOLD = 0.05


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
