"""Where does a bf16 ResNet-18 @64px training step spend its time on one GPU?
Not part of the pipeline: the measurements behind the tuned series' design
(README, "Measured on one NVIDIA H200"). Each variant: 6 warm-up steps, then 5
repeats of N steps between synchronisations; the median, min and max samples/s;
the host time of one step with the GPU idle; for some, a kernel-time breakdown
from torch.profiler. Variants built in one process share dynamo's cache, so a
second batch size may be compiled with dynamic shapes: compare batch sizes in
separate runs. Its DDP variants compile around DDP, torch.compile(DDP(model)): the
wrapping the pipeline used until build_ddp moved the compile inside (probe_tuned_ddp.py
times both). Usage: python tools/gpu/profile_torch_step.py [budget_s]"""
import os, sys, time, json, torch, torch.distributed as dist
sys.path.insert(0, "src")
from torch.nn.parallel import DistributedDataParallel as DDP
from dpscale.model.models import torch_resnet18
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29611", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
cuda = torch.cuda.is_available()
dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
if cuda: torch.cuda.set_device(dev)
dist.init_process_group("nccl" if cuda else "gloo", **({"device_id": dev} if cuda else {}))
torch.backends.cudnn.benchmark = True; torch.set_float32_matmul_precision("high")
T0 = time.time(); BUDGET = float(sys.argv[1]) if len(sys.argv) > 1 else 240
S = 64 if cuda else 16
def sync():
    if cuda: torch.cuda.synchronize()

def make(B, ddp=True, mode="default", compile_=True, flags=(), bn=True):
    torch.manual_seed(0)
    m = torch_resnet18()
    if not bn:
        for name, mod in list(m.named_modules()):
            for cn, c in list(mod.named_children()):
                if isinstance(c, torch.nn.BatchNorm2d): setattr(mod, cn, torch.nn.Identity())
    m = m.to(dev).to(memory_format=torch.channels_last)
    if ddp: m = DDP(m, device_ids=[0] if cuda else None, **{f: True for f in flags})
    opt = torch.optim.SGD(m.parameters(), lr=0.1, **({"fused": True} if cuda else {}))
    f = torch.compile(m, mode=mode) if compile_ else m
    X = torch.randn(B, 1, S, S, device=dev).contiguous(memory_format=torch.channels_last); y = torch.randint(0, 10, (B,), device=dev)
    lf = torch.nn.CrossEntropyLoss()
    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = lf(f(X), y)
        loss.backward(); opt.step()
    return step

def bench(name, B=256, steps=40, prof=False, **kw):
    if time.time() - T0 > BUDGET: print("skip", name, flush=True); return
    step = make(B, **kw)
    t = time.time()
    for _ in range(6): step()
    sync(); ct = time.time() - t
    ts = []
    for rep in range(5):
        sync(); t = time.perf_counter()
        for _ in range(steps): step()
        sync(); ts.append(B * steps / (time.perf_counter() - t))
    ts.sort()
    # host time per step with the GPU idle (dispatch cost)
    sync(); t = time.perf_counter(); step(); host_ms = 1e3 * (time.perf_counter() - t); sync()
    print(json.dumps({"name": name, "B": B, "samples_per_s_median": round(ts[2]), "min": round(ts[0]), "max": round(ts[-1]),
                      "step_ms": round(1e3 * B / ts[2], 2), "host_ms_one_step": round(host_ms, 2), "warm_s": round(ct, 1)}), flush=True)
    if prof and cuda:
      try:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(10): step()
            sync()
        evs = [e for e in p.key_averages() if e.device_type.name == "CUDA"]
        tot = sum(e.self_device_time_total for e in evs) / 10 / 1e3
        print(f"  profile {name}: GPU kernel time {tot:.2f} ms/step (wall {1e3 * B / ts[2]:.2f})")
        cats = {}
        for e in evs:
            n = e.key.lower()
            c = ("conv-wgrad" if "wgrad" in n or "dgrad" not in n and "conv" in n and "bwd" in n else
                 "conv-dgrad" if "dgrad" in n else
                 "conv/gemm" if any(s in n for s in ("conv", "xmma", "gemm", "cutlass", "sm90", "implicit", "cudnn")) else
                 "triton" if "triton" in n else "nccl" if "nccl" in n else "other")
            cats[c] = cats.get(c, 0) + e.self_device_time_total / 10 / 1e3
        print("  by category ms/step:", json.dumps({k: round(v, 2) for k, v in sorted(cats.items(), key=lambda x: -x[1])}))
        for e in sorted(evs, key=lambda e: -e.self_device_time_total)[:28]:
            print(f"   {e.self_device_time_total / 10 / 1e3:7.3f} ms  x{e.count // 10:3d}  {e.key[:150]}")
        sys.stdout.flush()
      except Exception as ex:
        print("  profile failed:", repr(ex), flush=True)

bench("compile_ddp_B256", prof=True)
bench("compile_ddp_B512", B=512, steps=20)
bench("reduce_overhead_noddp_B256", mode="reduce-overhead", ddp=False)
bench("compile_noddp_B256", ddp=False)
bench("compile_noBN_noddp_B256", ddp=False, bn=False, prof=True)
bench("compile_ddp_B1024", B=1024, steps=10)
bench("maxauto_nocg_noddp_B256", mode="max-autotune-no-cudagraphs", ddp=False, prof=True)
dist.destroy_process_group()
print("texplore done in", round(time.time() - T0), "s")
