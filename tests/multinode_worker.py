#!/usr/bin/env python3
"""One data-parallel SGD step of the repo's ResNet-18, for tests/test_multinode.py.

    torchrun ... multinode_worker.py torch OUT.pt
        one rank of a gloo DDP job (torchrun sets RANK/WORLD_SIZE/...); each rank
        trains on its slice of one fixed global batch; rank 0 saves the updated
        state_dict (parameters and BatchNorm buffers) to OUT.pt.

    multinode_worker.py jax OUT.npz [--coordinator HOST:PORT --num-processes N --process-id I]
        one JAX process. With --coordinator, jax.distributed joins N processes
        (each seeing its own CPU device) into one global mesh; without it, one
        process uses all its local devices (XLA_FLAGS=--xla_force_host_platform_device_count).
        The batch is sharded over a 1-D "data" mesh, parameters replicated; process 0
        saves the updated parameters and batch statistics to OUT.npz.

Both runs of a comparison see the same global batch and the same initial model,
so a multi-node run must reproduce the single-node numbers.
"""
import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

GLOBAL_BATCH = 8
IMAGE = 16
LR = 0.1


def global_batch():
    import numpy as np
    rng = np.random.default_rng(0)
    x = rng.standard_normal((GLOBAL_BATCH, 1, IMAGE, IMAGE)).astype("float32")   # NCHW
    y = rng.integers(0, 10, GLOBAL_BATCH).astype("int32")
    return x, y


def torch_step(out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dpscale.model.models import torch_resnet18

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        torch.manual_seed(0)
        model = DDP(torch_resnet18())
        before = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        x, y = global_batch()
        per = GLOBAL_BATCH // world
        xb = torch.from_numpy(x[rank * per:(rank + 1) * per])
        yb = torch.from_numpy(y[rank * per:(rank + 1) * per]).long()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()   # DDP all-reduces (averages) the gradients across ranks
        opt.step()
        print(f"[torch rank {rank}/{world} on {os.uname().nodename}] "
              f"group_rank={os.environ.get('GROUP_RANK')} loss={loss.item():.6f}", flush=True)
        if rank == 0:
            state = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
            moved = max((p.detach() - b).abs().max().item() for p, b in zip(model.parameters(), before))
            torch.save({"state": state, "world": world, "loss": loss.item(), "max_update": moved}, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def jax_step(out: str, coordinator: str | None, num_processes: int, process_id: int) -> None:
    import jax

    if coordinator:
        jax.distributed.initialize(coordinator_address=coordinator,
                                   num_processes=num_processes, process_id=process_id)
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from dpscale.model.models import flax_resnet18

    devices = jax.devices()   # every process's devices, in one global order
    mesh = Mesh(np.array(devices), ("data",))
    data = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())

    def put(a, sharding):   # a global array from a value every process holds in full
        a = np.asarray(a)
        return jax.make_array_from_callback(a.shape, sharding, lambda idx: a[idx])

    model = flax_resnet18(seed=0)
    before = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
    nnx.update(model, jax.tree.map(lambda a: put(a, replicated), nnx.state(model)))

    x, y = global_batch()
    xg = put(x.transpose(0, 2, 3, 1), data)   # NHWC for Flax; each process fills its own shards
    yg = put(y, data)

    @nnx.jit
    def step(model, xb, yb):
        def loss_fn(model):
            logits = model(xb)   # train mode: BatchNorm uses (and updates) the global batch's stats
            return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        params = nnx.state(model, nnx.Param)
        nnx.update(model, jax.tree.map(lambda p, g: p - LR * g, params, grads))
        return loss

    model.train()
    loss = step(model, xg, yg)
    params, stats = nnx.state(model, nnx.Param), nnx.state(model, nnx.BatchStat)
    leaves = {}
    for prefix, tree in (("param", params), ("batch_stat", stats)):
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
            # replicated: every process holds the whole value on its own device
            leaves[f"{prefix}{jax.tree_util.keystr(path)}"] = np.asarray(leaf.addressable_data(0))
    print(f"[jax process {jax.process_index()}/{jax.process_count()}] devices={len(devices)} "
          f"local={jax.local_device_count()} loss={float(np.asarray(loss.addressable_data(0))):.6f}",
          flush=True)
    moved = max(float(np.abs(np.asarray(a.addressable_data(0)) - b).max())
                for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(before)))
    if jax.process_index() == 0:
        np.savez(out, _max_update=np.float64(moved), _processes=np.int64(jax.process_count()),
                 _devices=np.int64(len(devices)), **leaves)
    if coordinator:
        jax.distributed.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("framework", choices=["torch", "jax"])
    ap.add_argument("out")
    ap.add_argument("--coordinator", default=None, help="jax: HOST:PORT of process 0")
    ap.add_argument("--num-processes", type=int, default=1)
    ap.add_argument("--process-id", type=int, default=0)
    a = ap.parse_args()
    if a.framework == "torch":
        torch_step(a.out)
    else:
        jax_step(a.out, a.coordinator, a.num_processes, a.process_id)


if __name__ == "__main__":
    main()
