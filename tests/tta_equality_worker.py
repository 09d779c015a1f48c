"""Real k=2 DDP runs of torch_tta's step (torchrun, gloo), for tests/test_tta.py; rank 0
saves what it found.

- plain: the book's step (torch_resnet18, SGD), one shard a rank, STEPS steps on the
  shared batches: its parameters and buffers.
- tuned: the step a GPU runs (torch_tta.Trainer with registry.TTA_STEP's options), less
  what only CUDA runs (compile, the CUDA graph; bf16 autocast is a no-op on float64):
  tuned_model's transformations, channels_last, fused SGD with a tensor lr. Real DDP,
  then emulated: both shards in one process (its own one-process group, m = 2), fused
  and plain SGD, and the two mutations the comparison must catch.
- the noise probe on that step: its norms against each shard's gradient computed
  directly (w=2 x m=1: the hooks; w=1 x m=2: the growth of .grad; w=2 x m=2: both),
  and the parameters with and without it, bit for bit (float32; w=2 x m=2 and w=1 x m=2).
Rank 0 saves to the path given, rank 1 to that path + ".rank1" (half the emulated cases).

In float64: in float32 the two sides' different summation orders, amplified by
BatchNorm over 8-sample shards, already differ by ~1% of a weight after 3 steps
(measured), which would hide a real difference; in float64 they agree to ~1e-12."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import torch

STEPS, BATCH, SIZE, LR = 3, 8, 8, 0.1
NOISE_BATCH, NOISE_SIZE, NOISE_STEPS = 4, 8, 2       # the probe's cases: smaller, the same code


def global_batches(k: int = 2, batch: int = BATCH, size: int = SIZE, channels_last: bool = False):
    """STEPS global batches of k x batch: rank r's shard is [r*batch:(r+1)*batch]."""
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(STEPS):
        X = torch.rand(k * batch, 1, size, size, generator=g, dtype=torch.float32).to(torch.get_default_dtype())
        y = torch.randint(0, 10, (k * batch,), generator=g)
        out.append((X.contiguous(memory_format=torch.channels_last) if channels_last else X, y))
    return out


def state(model) -> dict:
    net = getattr(model, "module", model)
    net = getattr(net, "_orig_mod", net)
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def tuned_options(fused: bool = True) -> dict:
    from dpscale import registry
    opts = {k: v for k, v in registry.TTA_STEP.items() if k not in ("compile", "cuda_graph")}
    return opts if fused else {k: v for k, v in opts.items() if k != "optimizer"}


def ctx(rank: int) -> SimpleNamespace:
    """What torch_tta.Trainer and torch_ddp.build_ddp read of a worker's Ctx."""
    return SimpleNamespace(device=torch.device("cpu"), cuda=False, local_rank=0, rank=rank, spec={"config": {}})


def trainer(rank: int, m: int, opts: dict | None, group=None, batch: int = BATCH, probe: int = 0):
    from dpscale.measure.torch_tta import Trainer
    return Trainer(ctx(rank), 0, m, batch, opts, probe_capacity=probe,
                   **({"process_group": group} if group is not None else {}))


def run(tr, batches, shards_of, lr: float = LR):
    for X, y in batches:
        Xs, ys = shards_of(X, y)
        tr.step(Xs, ys, lr)
    return state(tr.model)


def equality(r: int, own) -> dict:
    """The tuned step: real DDP (one shard a rank) and emulated (both shards in one process,
    its own group; the four emulated runs split over the two processes), and mutants."""
    cl = global_batches(channels_last=True)
    mine = lambda X, y: (X[r * BATCH:(r + 1) * BATCH], y[r * BATCH:(r + 1) * BATCH])   # noqa: E731
    both = lambda X, y: (X, y)                                                          # noqa: E731
    real = run(trainer(r, 1, tuned_options()), cl, mine)     # both ranks: a collective
    out = {"tuned_real": real} if r == 0 else {}
    cases = {"tuned_emulated": lambda: run(trainer(r, 2, tuned_options(), own), cl, both),
             "tuned_emulated_unfused": lambda: run(trainer(r, 2, tuned_options(False), own), cl, both),
             "mutant_global_bn": lambda: run(trainer(r, 1, tuned_options(), own, batch=2 * BATCH), cl, both),
             "mutant_summed": lambda: run(trainer(r, 2, tuned_options(), own), cl, both, lr=2 * LR)}
    for i, (name, case) in enumerate(cases.items()):
        if i % 2 == r:
            out[name] = case()
    return out


def direct(net, shards, group, k: int):
    """Each shard's gradient by its own backward on a copy of the module: the local sum of
    |g_j|^2 and of g_j, summed over the group, give mean |G_small|^2 and |G_big|^2."""
    import copy

    import torch.distributed as dist
    from torch import nn
    ref = copy.deepcopy(net)
    loss_fn = nn.CrossEntropyLoss()
    sq, total = torch.zeros((), dtype=torch.float64), None
    for X, y in shards:
        g = torch.autograd.grad(loss_fn(ref(X), y), list(ref.parameters()))
        flat = torch.cat([t.reshape(-1) for t in g])
        sq += flat.double().pow(2).sum()
        total = flat.clone() if total is None else total + flat
    dist.all_reduce(sq, group=group)
    dist.all_reduce(total, group=group)
    return float(sq) / k, float((total / k).double().pow(2).sum())


def probe_norms(r: int, w: int, m: int, group) -> dict:
    """The probe's per-step numbers on the tuned step against direct() (each shard's
    gradient by its own backward on a copy), relative difference."""
    k = w * m
    tr = trainer(r, m, tuned_options(), group, batch=NOISE_BATCH, probe=NOISE_STEPS + 1)
    want = []
    ranks = range(r * m, r * m + m) if w > 1 else range(m)
    for X, y in global_batches(k, NOISE_BATCH, NOISE_SIZE, channels_last=True)[:NOISE_STEPS]:
        shards = [(X[i * NOISE_BATCH:(i + 1) * NOISE_BATCH], y[i * NOISE_BATCH:(i + 1) * NOISE_BATCH]) for i in ranks]
        want.append(direct(tr.net(), shards, group, k))
        tr.step(torch.cat([s for s, _ in shards]), torch.cat([t for _, t in shards]), LR)
    got = tr.probe.flush()
    rel = max(max(abs(a - b) / abs(b) for a, b in zip((s, g), wv))
              for s, g, wv in zip(got["g_small_sq"], got["g_big_sq"], want))
    return {"rel": rel, "got": got, "want": want}


def probe_bits(r: int, w: int, m: int, group) -> float:
    """float32: the parameters after STEPS steps with the probe and without; 0.0 is bit for bit."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        states = []
        ranks = range(r * m, r * m + m) if w > 1 else range(m)
        for probe in (STEPS + 1, 0):
            tr = trainer(r, m, tuned_options(), group, batch=NOISE_BATCH, probe=probe)
            for X, y in global_batches(w * m, NOISE_BATCH, NOISE_SIZE, channels_last=True)[:NOISE_STEPS]:
                idx = torch.cat([torch.arange(i * NOISE_BATCH, (i + 1) * NOISE_BATCH) for i in ranks])
                tr.step(X[idx], y[idx], LR)
            states.append(state(tr.model))
        return max((states[0][n].double() - states[1][n].double()).abs().max().item() for n in states[0])
    finally:
        torch.set_default_dtype(old)


def main(out: str):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dpscale.measure.torch_tta import ShardedStep
    from dpscale.model.models import torch_resnet18
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    dist.init_process_group("gloo")
    r, w = dist.get_rank(), dist.get_world_size()
    own = [dist.new_group([i]) for i in range(w)][r]      # this process alone: an emulation's group
    torch.manual_seed(0)
    model = DDP(torch_resnet18())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    step = ShardedStep(model, opt, 1)
    for X, y in global_batches():
        opt.zero_grad(set_to_none=True)
        step(X[r * BATCH:(r + 1) * BATCH], y[r * BATCH:(r + 1) * BATCH])
    found = {"plain": state(model), **equality(r, own)}
    found["noise"] = {"w2m1": probe_norms(r, 2, 1, None), "w2m2": probe_norms(r, 2, 2, None),
                      "w1m2": probe_norms(r, 1, 2, own)}
    found["bits"] = {"w2m2": probe_bits(r, 2, 2, None), "w1m2": probe_bits(r, 1, 2, own)}   # hooks and growth
    torch.save(found, out if r == 0 else f"{out}.rank1")     # rank 1 ran half of the emulated cases
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
