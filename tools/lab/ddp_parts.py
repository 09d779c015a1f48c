#!/usr/bin/env python3
"""Where a gloo DDP step's time goes on the CPU stand-in, by part: one rank per core
(rank r on core CORE0 + r), one thread each, the stand-in's step (ResNet-18, 16 px,
batch 8, SGD with momentum). Run under torchrun at each world size:

    for w in 1 2 4 8; do CORE0=2 torchrun --standalone --nproc-per-node $w tools/lab/ddp_parts.py; done

Prints, rank 0, medians over PAIRS interleaved trials, each from a barrier (the slowest
rank's time is the trial's): the training step (zero_grad, forward, synced backward,
optimizer step), the synced and the no_sync() forward+backward and their difference
(the probe's comm), the bare all-reduce of DDP's own buckets (recorded by a comm hook)
one after another, and DDP's work around them without communication (each bucket
divided by the world size, copied out and back). Issue #30: weak k=2's overhead on the
H200 box's vCPUs was 59-65 ms where the bare all-reduce priced 33-47. PIN=before (the
default, the pipeline's placement) or after (gloo's threads on any core)."""
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from dpscale.model.models import torch_resnet18

# Trap: sched_setaffinity binds the calling thread and the threads it starts later. The
# pipeline pins before init_process_group (dpscale.measure.torch_job.pin), so gloo's
# threads share the rank's one core; PIN=after pins once they exist, and they float.
core = int(os.environ.get("CORE0", "0")) + int(os.environ["RANK"])
if os.environ.get("PIN", "before") == "before":
    os.sched_setaffinity(0, {core})
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
os.sched_setaffinity(0, {core})
torch.set_num_threads(1)
torch.manual_seed(0)
batch, size, pairs = int(os.environ.get("BATCH", 8)), int(os.environ.get("SIZE", 16)), int(os.environ.get("PAIRS", 15))
model = DDP(torch_resnet18())
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
X, y = torch.randn(batch, 1, size, size), torch.randint(0, 10, (batch,))
loss = nn.CrossEntropyLoss()
seen: list[int] = []


def record(state, bucket):
    seen.append(bucket.buffer().numel())
    return allreduce_hook(state, bucket)


model.register_comm_hook(None, record)


def fwd_bwd():
    model.zero_grad(set_to_none=True)
    loss(model(X), y).backward()


def silent():
    with model.no_sync():
        fwd_bwd()


def train():
    fwd_bwd()
    opt.step()


def timed(fn) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    t = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return 1e3 * t.item()


for _ in range(3):
    train()
    silent()
seen.clear()
fwd_bwd()
buckets = [torch.randn(n) for n in seen]
sizes = [4 * n for n in seen]


def bare():
    for b in buckets:
        dist.all_reduce(b)


def around():   # the reducer's passes over each bucket, no communication
    for b in buckets:
        b.div_(world)
        b.copy_(b.clone())


arms = {"train": train, "synced": fwd_bwd, "no_sync": silent, "bare all-reduce": bare, "div+copy": around}
ms = {name: [] for name in arms}
for i in range(pairs):
    for name in (list(arms) if i % 2 == 0 else list(arms)[::-1]):
        ms[name].append(timed(arms[name]))
med = {name: statistics.median(v) for name, v in ms.items()}
diff = statistics.median(a - b for a, b in zip(ms["synced"], ms["no_sync"]))
if rank == 0:
    print(f"world {world} (PIN={os.environ.get('PIN', 'before')}, torch {torch.__version__}, buckets {sizes} B): train {med['train']:.1f} ms; "
          f"synced {med['synced']:.1f}, no_sync {med['no_sync']:.1f}, difference {diff:.1f}; bare all-reduce "
          f"{med['bare all-reduce']:.1f}; div+copy {med['div+copy']:.1f}", flush=True)
dist.destroy_process_group()
