"""The tuned JAX step (bf16 compute, device-resident data, jax.jit over the flat
state: dpscale.measure.jax_weak.pure_resident_step) at several batch sizes, XLA's cost
analysis of it, and a GPU kernel-time breakdown from a jax.profiler trace.
Not part of the pipeline (see profile_torch_step.py).
Usage: [JEX_NOBN=1] JEX_BATCHES=256,512,1024 python tools/gpu/profile_jax_step.py [budget_s] [tag]"""
import glob, gzip, json, os, sys, time
sys.path.insert(0, "src")
import numpy as np, jax, jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
from dpscale.measure import jax_job as jr, jax_weak as jw
T0 = time.time(); BUDGET = float(sys.argv[1]) if len(sys.argv) > 1 else 200
TAG = sys.argv[2] if len(sys.argv) > 2 else "default"
gpu = jax.devices()[0].platform == "gpu"
S = 64 if gpu else 16
mesh = jr.make_mesh(1)
if os.environ.get("JEX_NOBN"):   # a bound, not the model: every BatchNorm passes its input through
    nnx.BatchNorm.__call__ = lambda self, x, *a, **kw: x
    TAG += "_nobn"

def bench(B, prof=False, steps_n=40, dtype=jnp.bfloat16):
    if time.time() - T0 > BUDGET: print("skip", B, flush=True); return
    model, opt = jr.build(mesh, dtype)
    rng = np.random.default_rng(0)
    steps = 8
    sh = NamedSharding(mesh, P(None, "data"))
    xs = jax.device_put(rng.integers(0, 255, (steps, B, S, S), dtype=np.uint8), sh)
    ys = jax.device_put(rng.integers(0, 10, (steps, B), dtype=np.int32), sh)
    idx = [jax.device_put(np.int32(i), NamedSharding(mesh, P())) for i in range(steps)]
    graphdef, state = nnx.split((model, opt))
    leaves, treedef = jax.tree.flatten(state)
    fast = jw.pure_resident_step(graphdef, treedef)
    t = time.time()
    comp = fast.lower(leaves, xs, ys, idx[0]).compile()
    ca = comp.cost_analysis()
    ca = ca[0] if isinstance(ca, list) else ca
    hlo = comp.as_text()
    conv = hlo.count("cudnn$conv") if gpu else hlo.count(" convolution(")
    print(json.dumps({"B": B, "tag": TAG, "compile_s": round(time.time() - t, 1), "xla_flops_per_sample": ca.get("flops", 0) / B,
                      "xla_bytes_per_sample_MB": ca.get("bytes accessed", 0) / B / 1e6, "conv_calls": conv,
                      "fusions": hlo.count("fusion("), "custom_calls": hlo.count("custom-call(")}), flush=True)
    for i in range(6):
        loss, leaves = fast(leaves, xs, ys, idx[i % steps])
    jax.block_until_ready((loss, leaves))
    ts = []
    for rep in range(5):
        t = time.perf_counter()
        for i in range(steps_n):
            loss, leaves = fast(leaves, xs, ys, idx[i % steps])
        jax.block_until_ready((loss, leaves)); ts.append(B * steps_n / (time.perf_counter() - t))
    ts.sort()
    t = time.perf_counter(); loss, leaves = fast(leaves, xs, ys, idx[0]); host = 1e3 * (time.perf_counter() - t)
    jax.block_until_ready((loss, leaves))
    print(json.dumps({"name": f"jax_tuned_{TAG}", "B": B, "samples_per_s_median": round(ts[2]), "min": round(ts[0]), "max": round(ts[-1]),
                      "step_ms": round(1e3 * B / ts[2], 2), "host_ms_one_step": round(host, 2)}), flush=True)
    if prof:
        d = f"/tmp/jprof_{TAG}_{B}"
        with jax.profiler.trace(d, create_perfetto_trace=True):
            for i in range(10):
                loss, leaves = fast(leaves, xs, ys, idx[i % steps])
            jax.block_until_ready((loss, leaves))
        files = glob.glob(f"{d}/**/*perfetto_trace.json.gz", recursive=True)
        if not files: print("  no perfetto trace in", d, os.listdir(d)); return
        tr = json.load(gzip.open(files[0]))
        evs = tr["traceEvents"] if isinstance(tr, dict) else tr
        pnames = {e["pid"]: e["args"].get("name", "") for e in evs if e.get("ph") == "M" and e.get("name") == "process_name"}
        tnames = {(e["pid"], e.get("tid")): e["args"].get("name", "") for e in evs if e.get("ph") == "M" and e.get("name") == "thread_name"}
        per_thread = {}
        for e in evs:
            if e.get("ph") == "X":
                key = (pnames.get(e["pid"], ""), tnames.get((e["pid"], e.get("tid")), ""))
                per_thread[key] = per_thread.get(key, 0) + e.get("dur", 0) / 10 / 1e3
        print("  per process/thread ms/step:", {f"{a}|{b}": round(v, 2) for (a, b), v in sorted(per_thread.items(), key=lambda x: -x[1])[:12]})
        streams = any("stream" in b.lower() for (a, b) in per_thread if "gpu" in a.lower())
        agg = {}
        for e in evs:
            if e.get("ph") != "X": continue
            pn = pnames.get(e["pid"], "")
            if gpu and "GPU" not in pn and "gpu" not in pn: continue
            if gpu and streams and "stream" not in tnames.get((e["pid"], e.get("tid")), "").lower(): continue
            a = agg.setdefault(e["name"], [0.0, 0]); a[0] += e.get("dur", 0); a[1] += 1
        tot = sum(v[0] for v in agg.values()) / 10 / 1e3
        print(f"  profile B={B}: device events {tot:.2f} ms/step (wall {1e3 * B / ts[2]:.2f}); pids {sorted(set(pnames.values()))[:6]}")
        cats = {}
        for n, (dur, c) in agg.items():
            ln = n.lower()
            k = ("conv/gemm" if any(s in ln for s in ("conv", "xmma", "gemm", "cutlass", "sm90", "implicit", "cudnn")) else
                 "fusion" if "fusion" in ln or "triton" in ln else "other")
            cats[k] = cats.get(k, 0) + dur / 10 / 1e3
        print("  by category ms/step:", json.dumps({k: round(v, 2) for k, v in cats.items()}))
        for n, (dur, c) in sorted(agg.items(), key=lambda x: -x[1][0])[:28]:
            print(f"   {dur / 10 / 1e3:7.3f} ms  x{c // 10:3d}  {n[:150]}")
        sys.stdout.flush()

Bs = [int(b) for b in os.environ.get("JEX_BATCHES", "256,512,1024").split(",")]
for j, b in enumerate(Bs):
    bench(b, prof=j == 0, steps_n=max(2, 40 * 256 // b) if gpu else 2)
print("jexplore", TAG, "done in", round(time.time() - T0), "s", flush=True)
