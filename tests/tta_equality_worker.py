"""A real k=2 DDP run of torch_tta's step (torchrun, gloo), for tests/test_tta.py:
rank 0 saves its parameters and buffers after STEPS steps on the shared batches.
In float64: in float32 the two sides' different summation orders, amplified by
BatchNorm over 8-sample shards, already differ by ~1% of a weight after 3 steps
(measured), which would hide a real difference; in float64 they agree to ~1e-12."""
from __future__ import annotations

import sys

import torch

STEPS, BATCH, SIZE, LR = 3, 8, 16, 0.1


def global_batches():
    """STEPS global batches of 2 x BATCH: rank r's shard is [r*BATCH:(r+1)*BATCH]."""
    g = torch.Generator().manual_seed(7)
    return [(torch.rand(2 * BATCH, 1, SIZE, SIZE, generator=g), torch.randint(0, 10, (2 * BATCH,), generator=g))
            for _ in range(STEPS)]


def state(model) -> dict:
    net = getattr(model, "module", model)
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def main(out: str):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dpscale.measure.torch_tta import ShardedStep
    from dpscale.model.models import torch_resnet18
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    dist.init_process_group("gloo")
    r = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch_resnet18())
    step = ShardedStep(model, torch.optim.SGD(model.parameters(), lr=LR))
    for X, y in global_batches():
        step([(X[r * BATCH:(r + 1) * BATCH], y[r * BATCH:(r + 1) * BATCH])], LR)
    if r == 0:
        torch.save(state(model), out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
