"""Variants of the tuned DDP step at k=1, run through the pipeline's own code
(dpscale.measure.torch_ddp.train_epochs with GraphedStep, build_ddp), on fixed random
batches already on the GPU. Not part of the pipeline: the measurements behind
the choice of TUNED_OPTIONS (README, "Measured on one NVIDIA H200").

build_ddp compiles the model inside DDP; "outer" is the old torch.compile(DDP(model)).
Each variant: epoch 0 compiles, runs 11 eager steps and captures the graph; then
REPS epochs of STEPS steps are timed (train_epochs syncs before and after each);
printed: the median, min and max samples/s. dynamo is reset between variants.
Usage: python tools/gpu/probe_tuned_ddp.py [budget_s] VARIANT [VARIANT ...]
  variants: base nocompile outer noddp bucketview bucketview_static no_optimize_ddp maxautotune
            maxautotune_bucketview nobn_noddp (every BatchNorm2d replaced by Identity:
            a bound, not the model)"""
import contextlib, json, os, sys, time
sys.path.insert(0, "src")
import torch, torch.distributed as dist
from dpscale.measure import torch_ddp as tr
from dpscale.model.models import torch_resnet18
from dpscale.registry import TORCH_TUNED

TUNED_OPTIONS = dict(TORCH_TUNED.options)

T0 = time.time()
BUDGET = float(sys.argv[1])
VARIANTS = sys.argv[2:]
cuda = torch.cuda.is_available()
B, STEPS, REPS, S = (256, 60, 5, 64) if cuda else (8, 3, 2, 16)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29612", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")


class ProbeCtx(tr.Ctx):
    """train_epochs' log lines, kept."""
    def __init__(self, spec):
        super().__init__(spec)
        self.lines = []

    def log(self, msg):
        self.lines.append(msg)
        print("   ", msg, flush=True)


def spec_for(tuned=None):
    return {"backend": "nccl" if cuda else "gloo", "experiment": "ddp_weak", "variant": "tuned", "k": 1,
            "env": {},
            "config": {"protocol": {"epochs": 1 + REPS, "image_size": S, "per_rank_batch": B},
                       "tuned": {**TUNED_OPTIONS, **(tuned or {})}}}


def run(name, tuned=None, ddp=True, bn=True, optimize_ddp=True, outer=False):
    if time.time() - T0 > BUDGET:
        print("skip", name, flush=True)
        return
    torch._dynamo.reset()
    torch._dynamo.config.optimize_ddp = optimize_ddp
    ctx = ProbeCtx(spec_for(tuned))
    side = tr.graph_side_stream(ctx, True)
    t = time.time()
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        if outer:
            ctx.spec["config"]["tuned"]["compile"] = False
            model = torch.compile(tr.build_ddp(ctx, tuned=True))
        elif ddp:
            model = tr.build_ddp(ctx, tuned=True)
        else:   # build_ddp's model, compiled the same way, without the DDP wrapper
            torch.manual_seed(0)
            model = torch_resnet18().to(ctx.device).to(memory_format=torch.channels_last)
            if not bn:
                for mod in list(model.modules()):
                    for cn, c in list(mod.named_children()):
                        if isinstance(c, torch.nn.BatchNorm2d):
                            setattr(mod, cn, torch.nn.Identity())
            if ctx.spec["config"]["tuned"]["compile"]:
                model = torch.compile(model)
    g = torch.Generator(device=ctx.device).manual_seed(0)
    batches = [(torch.rand(B, 1, S, S, device=ctx.device, generator=g).contiguous(memory_format=torch.channels_last),
                torch.randint(0, 10, (B,), device=ctx.device, generator=g)) for _ in range(STEPS)]
    r = tr.train_epochs(ctx, model, lambda epoch: batches, True, 1, REPS, side=side)
    rates = sorted(B * STEPS / s for s in r["seconds_repeats"])
    print(json.dumps({"name": name, "B": B, "samples_per_s_median": rates[len(rates) // 2],
                      "min": rates[0], "max": rates[-1], "step_ms_median": round(r["steps"]["median_ms"], 2),
                      "cuda_graph": r["cuda_graph"], "cuda_graph_error": r["cuda_graph_error"],
                      "loss_last": round(r["loss_last"], 4), "wall_s": round(time.time() - t)}), flush=True)


dist.init_process_group("nccl" if cuda else "gloo", **({"device_id": torch.device("cuda", 0)} if cuda else {}))
torch.backends.cudnn.benchmark = True
table = {
    "base": {},
    "nocompile": {"tuned": {"compile": False}},
    "outer": {"outer": True},
    "noddp": {"ddp": False},
    "bucketview": {"tuned": {"ddp": ["gradient_as_bucket_view"]}},
    "bucketview_static": {"tuned": {"ddp": ["gradient_as_bucket_view", "static_graph"]}},
    "no_optimize_ddp": {"optimize_ddp": False},
    "maxautotune": {"tuned": {"compile": "max-autotune-no-cudagraphs"}},
    "maxautotune_bucketview": {"tuned": {"compile": "max-autotune-no-cudagraphs", "ddp": ["gradient_as_bucket_view"]}},
    "nobn_noddp": {"ddp": False, "bn": False},
}
try:
    for v in VARIANTS:
        run(v, **table[v])
finally:
    dist.destroy_process_group()
print("probe done in", round(time.time() - T0), "s", flush=True)
