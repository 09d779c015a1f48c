"""Where the fixed costs of a GPU job go, on one GPU (issue #43: the README command on one
H200 within ten minutes): two questions the jobs' own cost records leave open.

  1. DDP's constructor at world size 1 took 4-5.8 s on the H200 (start_probe.py), for a
     ResNet-18 whose NCCL init takes 0.29 s: cProfile of DDP(model), the functions by
     cumulative time.
  2. One evaluation of the 10,000 test images took 0.17 s in time to accuracy, beside a
     training step of 2,048 samples at 24k samples/s: the same eval (the tuned model,
     bf16 autocast, channels_last, eager) at several batch sizes, under inference_mode,
     and replayed as a CUDA graph, each the median of 20 after 3 warm-ups.

    python3 tools/lab/cost_probe.py            (on the GPU machine; prints a table)
"""
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from dpscale.model import tuned_model  # noqa: E402
from dpscale.model.models import torch_resnet18  # noqa: E402
from dpscale.registry import TTA_STEP  # noqa: E402


def ddp_constructor() -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    t0 = time.perf_counter()
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    t1 = time.perf_counter()
    model = torch_resnet18().cuda()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    t2 = time.perf_counter()
    prof.enable()
    ddp = DDP(model, device_ids=[0])
    torch.cuda.synchronize()
    prof.disable()
    t3 = time.perf_counter()
    print(f"init_process_group {t1 - t0:.3f} s, DDP(model) {t3 - t2:.3f} s")
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
    print(s.getvalue())
    t4 = time.perf_counter()
    DDP(torch_resnet18().cuda(), device_ids=[0])
    torch.cuda.synchronize()
    print(f"a second DDP(model) in the same process {time.perf_counter() - t4:.3f} s")
    del ddp
    dist.destroy_process_group()


def median_s(fn, n=20, warm=3) -> float:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def evaluation() -> None:
    net = tuned_model.apply(torch_resnet18().cuda(), dict(TTA_STEP)).to(memory_format=torch.channels_last).eval()
    x = torch.randint(0, 256, (10_000, 64, 64), device="cuda", dtype=torch.uint8)
    y = torch.randint(0, 10, (10_000,), device="cuda")

    def inputs(xb):
        return xb.unsqueeze(1).float().div_(255).contiguous(memory_format=torch.channels_last)

    def run(batch, ctx):
        def f():
            correct = torch.zeros((), dtype=torch.int64, device="cuda")
            with ctx(), torch.autocast("cuda", dtype=torch.bfloat16):
                for i in range(0, len(x), batch):
                    correct += (net(inputs(x[i:i + batch])).argmax(1) == y[i:i + batch]).sum()
            return int(correct)
        return f
    rows = [(f"eager no_grad batch {b}", median_s(run(b, torch.no_grad))) for b in (1000, 2500, 5000, 10000)]
    rows += [(f"eager inference_mode batch {b}", median_s(run(b, torch.inference_mode))) for b in (1000, 2500)]
    static = x[:2500].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for _ in range(3):
            net(inputs(static))
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        logits = net(inputs(static))

    def graphed():
        correct = torch.zeros((), dtype=torch.int64, device="cuda")
        for i in range(0, len(x), 2500):
            static.copy_(x[i:i + 2500])
            g.replay()
            correct += (logits.argmax(1) == y[i:i + 2500]).sum()
        return int(correct)
    rows.append(("CUDA graph, batch 2500", median_s(graphed)))
    flop = 10_000 * 13.30e9 / 3   # forward ~ a third of the training step's 13.30 GFLOP a sample
    print(f"{'evaluation of 10,000 images':<36} {'ms':>8} {'TFLOP/s (forward ~ 1/3 of 13.30 GFLOP)':>40}")
    for name, s in rows:
        print(f"{name:<36} {1e3 * s:8.1f} {flop / s / 1e12:40.0f}")


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(0))
    ddp_constructor()
    evaluation()
