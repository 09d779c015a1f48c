"""The tuned step against its roofline on one GPU, in one call (not part of the pipeline).

  1. rates: the bf16 matmul peak and the device copy bandwidth (dpscale.measure.torch_ddp's helpers)
  2. the step's roofline at batch 256 under each fusion assumption (dpscale.analysis.roofline)
  3. a per-layer table: torch.profiler over eager bf16 channels_last steps, each layer's
     forward and backward time beside its bound, the fraction reached and what binds
     (dpscale.lab.layer_profile); the seed model, then the model with all the cheap wins
  4. the tuned DDP step as the pipeline builds it (build_ddp: channels_last, compiled
     inside DDP; GraphedStep; fused SGD; bf16) as it is, with all the cheap wins, and
     with each alone: median, min and max samples/s over REPS repeats of STEPS steps
     after 20 warm-up steps (compile, 11 eager steps, the capture), and each variant's
     first 20 losses against the base variant's (same weights, same batches)
  5. for the variants named by --kernels: the kernel table of 10 more graphed steps (each
     kernel's kind and time, dpscale.lab.kernel_table) and the wall those measured
     convolutions allow under the variant's fusion and under the ideal one
Every result is printed as a JSON line when it is known, and $OUT/probe_roofline.json
(or --out DIR) is rewritten after every stage, so a run stopped by its budget or killed
keeps what it had; readable tables come last. Variants run in order of worth and are
skipped once the budget cannot hold another (the first one's time sets the estimate).
Usage: timeout -s INT 250 python tools/lab/probe_roofline.py [--budget-s 200] [--variants base,all,...]
         [--layers base,all] [--kernels fp16_genstats,...] [--smoke]
  --smoke: 16x16 images, batch 4, gloo on the CPU, no compile, no graph (a typo check).
  A SIGINT (timeout -s INT) stops the stage under way and still prints the tables."""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from dpscale.lab import kernel_table, layer_profile, tuned_probe as tp  # noqa: E402

T0 = time.time()


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=210.0)
    ap.add_argument("--variants", default=",".join(tp.VARIANTS))
    ap.add_argument("--layers", default="base,all", help="variants whose eager per-layer table is taken")
    ap.add_argument("--kernels", default="", help="variants whose kernel table (dpscale.lab.kernel_table) is taken")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    return ap.parse_args()


class Report:
    def __init__(self, path):
        self.path, self.data = path, {"stages": {}}

    def emit(self, stage, **fields):
        print(json.dumps({"stage": stage, "t_s": round(time.time() - T0, 1), **fields}, default=str), flush=True)
        self.data["stages"].setdefault(stage, []).append(fields)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, default=str)
        os.replace(tmp, self.path)


def layer_stage(rep, ctx, name, overrides, batch, side, rates, steps):
    try:
        got = tp.eager_layer_profile(ctx, overrides, batch, steps)
    except Exception as e:   # the timed variants still run
        rep.emit("layers_error", model=name, error=f"{type(e).__name__}: {e}"[:600])
        return
    rows = layer_profile.table(got, batch[0].shape[0], side, rates["peak_flops"], rates["copy_Bps"])
    rep.emit("layers", model=name, rows=rows, by_kind=layer_profile.by_kind(rows), total_ms=1e3 * got["_total_s"],
             unattributed_ms=1e3 * got["_unattributed_s"], time="kernel time" if ctx.cuda else "op CPU time")


def variant_stage(rep, ctx, args, batches, steps, reps, roof, copy_Bps):
    base_losses, last_wall = None, None
    for name in args.variants.split(","):
        left = args.budget_s - (time.time() - T0)
        if last_wall is not None and left < 1.2 * last_wall:
            rep.emit("variant", name=name, skipped=f"budget: {left:.0f} s left, the last one took {last_wall:.0f} s")
            continue
        t = time.time()
        try:
            r = tp.time_variant(ctx, tp.VARIANTS[name], batches, steps, reps, args.smoke,
                                lr=0.01 if args.smoke else 0.1,
                                profile_steps=10 if ctx.cuda and name in args.kernels.split(",") else 0)
        except Exception as e:   # one variant that fails to compile or capture: the rest still run
            rep.emit("variant", name=name, error=f"{type(e).__name__}: {e}"[:600])
            continue
        last_wall = time.time() - t
        if base_losses is None and name == "base":
            base_losses = r["losses"]
        if base_losses is not None:
            r.update(tp.loss_check(base_losses, r["losses"]))
        if roof.get("samples_per_s"):
            r["roofline_fraction"] = r["samples_per_s_median"] / roof["samples_per_s"]
        kernels = r.pop("kernels")
        rep.emit("variant", name=name, wall_s=last_wall, **r)
        if kernels:
            fusion = "stats_epilogue" if tp.VARIANTS[name].get("convbn", "none") != "none" else "compiler"
            B, _, S, _ = batches[0][0].shape
            walls = [kernel_table.wall(kernels, B, S, copy_Bps, f) for f in (fusion, "ideal")]
            rep.emit("kernels", model=name, walls=walls, **kernels)


def print_tables(data):
    st = data["stages"]
    for r in st.get("roofline", []):
        print(f"roofline {r['fusion']:>8}: {r['GB_per_step']:6.2f} GB/step "
              + (f"{r['step_ms']:6.2f} ms  {r['samples_per_s']:8.0f} samples/s" if "step_ms" in r else ""))
    for t in st.get("layers", []):
        print(f"\nper layer, eager, {t['model']}: {t['total_ms']:.2f} ms/step measured "
              f"({t['unattributed_ms']:.2f} unattributed)")
        print(f"{'layer':28} {'fwd ms':>8} {'bwd ms':>8} {'bound ms':>9} {'ideal ms':>9} {'fraction':>8}  binds")
        for r in t["rows"]:
            print(f"{r['layer']:28} {r.get('forward_ms', 0):8.3f} {r.get('backward_ms', 0):8.3f} "
                  f"{r.get('bound_none_ms', 0):9.3f} {r.get('bound_ideal_ms', 0):9.3f} "
                  f"{r.get('fraction_of_bound', 0):8.2f}  {r.get('binds', '')}")
        for k, v in layer_profile.by_kind(t["rows"]).items():
            print(f"  {k:10} {v['time_ms']:8.3f} ms measured, bound {v['bound_none_ms']:.3f} unfused, "
                  f"{v['bound_ideal_ms']:.3f} ideal")
    for t in st.get("kernels", []):
        print(f"\nkernels, {t['model']}: {t['kernel_ms_per_step']:.2f} ms/step in kernels, "
              f"{t.get('wall_ms_per_step', 0):.2f} wall")
        for k, v in t["kinds"].items():
            print(f"  {k:18} {v['ms']:7.3f} ms  {v['launches']:6.1f} launches")
        for w in t.get("walls", []):
            print(f"  wall ({w['fusion']}): convs+GEMMs {w['conv_and_gemm_ms']:.2f} ms measured + "
                  f"{w['other_passes_GB']:.2f} GB other passes at copy bandwidth {w['other_passes_ms']:.2f} ms"
                  f" = {w['step_ms']:.2f} ms: at most {w['samples_per_s']:.0f} samples/s")
        for r in t["top"]:
            print(f"   {r['ms']:7.3f} ms x{r['launches']:4.1f} {r['kind']:17} {r['name'][:110]}")
    print(f"\n{'variant':12} {'median':>8} {'min':>8} {'max':>8} {'of roofline':>11} {'loss ok':>8}  graph")
    for r in st.get("variant", []):
        if "samples_per_s_median" in r:
            print(f"{r['name']:12} {r['samples_per_s_median']:8.0f} {r['samples_per_s_min']:8.0f} "
                  f"{r['samples_per_s_max']:8.0f} {r.get('roofline_fraction', 0):11.3f} "
                  f"{str(r.get('loss_ok', '-')):>8}  {r['cuda_graph']}")
        else:
            print(f"{r['name']:12} {r.get('skipped') or r.get('error')}")


def main():
    args = parse()
    os.makedirs(args.out, exist_ok=True)
    rep = Report(os.path.join(args.out, "probe_roofline.json"))
    B, S, steps, reps, nb, prof_steps = (4, 16, 3, 2, 2, 1) if args.smoke else (256, 64, 40, 5, 8, 5)
    ctx = tp.init_single_rank(args.smoke)
    rep.emit("setup", torch=torch.__version__, device=torch.cuda.get_device_name(0) if ctx.cuda else "cpu",
             cudnn=torch.backends.cudnn.version() if ctx.cuda else None, batch=B, image_size=S, smoke=args.smoke)
    try:
        rates = tp.measure_rates(ctx)
        rep.emit("rates", **rates)
        for row in tp.roofline_rows(B, S, rates["peak_flops"], rates["copy_Bps"]):
            rep.emit("roofline", **row)
        roof = rep.data["stages"]["roofline"][-1]   # ideal
        batches = tp.fixed_batches(ctx, nb, B, S)
        for name in filter(None, args.layers.split(",")):
            layer_stage(rep, ctx, name, tp.VARIANTS[name], batches[0], S, rates, prof_steps)
        variant_stage(rep, ctx, args, batches, steps, reps, roof, rates["copy_Bps"])
    except KeyboardInterrupt:   # timeout -s INT: keep what was measured, print it
        rep.emit("interrupted", after_s=time.time() - T0)
    finally:
        dist.destroy_process_group()
    print_tables(rep.data)
    print(f"probe done in {time.time() - T0:.0f} s; wrote {rep.path}", flush=True)


if __name__ == "__main__":
    main()
