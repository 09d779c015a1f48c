#!/usr/bin/env python3
"""Where a k=1 launch's start goes on a GPU, stage by stage (each stage synchronised):
torchrun's agent, the interpreter, `import torch`, CUDA's context, the process group,
the model, DDP's constructor (NCCL's communicator is made at its first collective),
the first fp32 step (cuDNN's libraries load), and the teardown.

    T0=$(date +%s.%N) torchrun --standalone --nproc-per-node=1 tools/lab/start_probe.py [--eager]
    T0=$(date +%s.%N) RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 \
        python3 tools/lab/start_probe.py

--eager passes device_id to init_process_group (NCCL's communicator made there, not
at DDP's first collective). One line per stage: seconds, and since T0.
"""
import os
import sys
import time

T0 = float(os.environ.get("T0", time.time()))
marks = [("agent and interpreter", time.time())]


def mark(stage):
    marks.append((stage, time.time()))


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src"))
import torch  # noqa: E402

mark("import torch")
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from dpscale.model.models import torch_resnet18  # noqa: E402

mark("import dpscale, DDP")
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
torch.cuda.set_device(dev)
torch.empty(1, device=dev)
torch.cuda.synchronize()
mark("CUDA context")
dist.init_process_group("nccl", **({"device_id": dev} if "--eager" in sys.argv else {}))
mark("init_process_group" + (" (eager)" if "--eager" in sys.argv else ""))
torch.manual_seed(0)
model = torch_resnet18()
mark("resnet18 on the CPU")
model = model.to(dev)
torch.cuda.synchronize()
mark("to(cuda)")
ddp = DDP(model, device_ids=[dev.index])
torch.cuda.synchronize()
mark("DDP(model)")
x = torch.randn(256, 1, 64, 64, device=dev)
y = torch.randint(0, 10, (256,), device=dev)
loss = torch.nn.functional.cross_entropy(ddp(x), y)
loss.backward()
torch.cuda.synchronize()
mark("first fp32 step")
for _ in range(3):
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
torch.cuda.synchronize()
mark("3 more steps")
dist.destroy_process_group()
mark("destroy_process_group")
prev = T0
for stage, t in marks:
    print(f"[start_probe pid {os.getpid()}] {stage:<28} {t - prev:7.3f} s   (at {t - T0:7.3f} s)", flush=True)
    prev = t
print(f"[start_probe pid {os.getpid()}] end_unix {time.time():.3f}", flush=True)
