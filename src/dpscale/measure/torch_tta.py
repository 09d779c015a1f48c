"""Time to accuracy under DDP: from a seeded initialisation, the book's loop (SGD, no
momentum, cross-entropy) until the test accuracy first reaches the scale's target,
under MLPerf's clock (started before the data is touched, never paused, the
evaluations on it), for each of several seeds; scored by dpscale.analysis.tta.

A k above the devices present is *emulated* with DDP's semantics exactly: each
process runs k / processes ranks' shards one after another (ShardedStep): BatchNorm
sees each per-rank shard alone, the gradients are averaged over the global batch
(1/m per shard here, DDP's mean over the processes), and the running statistics are
rank 0's (its first shard's), which DDP broadcasts and evaluation uses.
tests/test_tta.py holds this equal to a real k=2 DDP step.
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dpscale.data import load as dsdata
from dpscale.analysis import tta
from dpscale.measure.timing import sync
from dpscale.measure.torch_job import Ctx
from dpscale.model.models import torch_resnet18

EVAL_BATCH = 1000


class ShardedStep:
    """One training step of k ranks' shards, m = len(shards) of them in this process.
    m = 1 is plain DDP. m > 1 accumulates the shards' gradients, each loss scaled by
    1/m, under no_sync() until the last, whose backward all-reduces (DDP's mean over
    the processes); BatchNorm normalises each shard by its own statistics (one
    forward per shard), and the running statistics after the step are those the
    first shard left (rank 0's: the other ranks' never reach the model DDP keeps)."""

    def __init__(self, model, opt):
        self.model, self.opt = model, opt
        self.loss_fn = nn.CrossEntropyLoss()

    def __call__(self, shards: list[tuple[torch.Tensor, torch.Tensor]], lr: float):
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.zero_grad(set_to_none=True)
        m, kept, loss = len(shards), None, None
        for j, (X, y) in enumerate(shards):
            quiet = self.model.no_sync() if j < m - 1 and isinstance(self.model, DDP) else contextlib.nullcontext()
            with quiet:
                out = self.model(X)
                if j == 0 and m > 1:
                    kept = [b.detach().clone() for b in self.model.buffers()]
                loss = self.loss_fn(out, y)
                (loss / m).backward()
        if kept is not None:
            with torch.no_grad():
                for b, v in zip(self.model.buffers(), kept):
                    b.copy_(v)
        self.opt.step()
        return loss


def layout(ctx: Ctx) -> tuple[int, list[int]]:
    """(k, the ranks this process runs): process p of w runs ranks p*m .. p*m+m-1."""
    k = int(ctx.spec["k"])
    m = k // ctx.world
    return k, list(range(ctx.rank * m, ctx.rank * m + m))


def step_shards(x, y, perm: torch.Tensor, k: int, batch: int, ranks: list[int], step: int):
    """Rank r's batch at `step` is perm[r::k][step*batch:(step+1)*batch] (DistributedSampler's
    interleaving, drop_last), as uint8 -> float /255 (ToTensor)."""
    out = []
    for r in ranks:
        idx = perm[r::k][step * batch:(step + 1) * batch]
        out.append((x[idx].unsqueeze(1).float().div_(255), y[idx]))
    return out


def evaluate(model, x, y) -> float:
    """Top-1 accuracy of the model DDP keeps on rank 0 (rank 0's running statistics)."""
    net = model.module if isinstance(model, DDP) else model
    net.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), EVAL_BATCH):
            xb = x[i:i + EVAL_BATCH].unsqueeze(1).float().div_(255)
            correct += int((net(xb).argmax(1) == y[i:i + EVAL_BATCH]).sum())
    net.train()
    return correct / len(x)


def build(ctx: Ctx, seed: int):
    torch.manual_seed(seed)
    model = torch_resnet18().to(ctx.device)
    model = DDP(model, device_ids=[ctx.local_rank] if ctx.cuda else None)
    return model, torch.optim.SGD(model.parameters(), lr=tta.BASE_LR)


def stage_data(ctx: Ctx):
    """The cache, read from disk onto the device: on the clock (MLPerf)."""
    arrays, _ = dsdata.load_cache(ctx.spec["inputs"]["cache"], ctx.spec["inputs"]["cache_meta"], verify=False)
    n, nt = ctx.proto["tta_train_images"], ctx.proto["tta_test_images"]
    dev = ctx.device
    return (torch.from_numpy(arrays["train_x"][:n]).to(dev), torch.from_numpy(arrays["train_y"][:n]).to(dev),
            torch.from_numpy(arrays["test_x"][:nt]).to(dev), torch.from_numpy(arrays["test_y"][:nt]).to(dev))


def broadcast_float(ctx: Ctx, value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.broadcast(t, 0)
    return float(t.item())


def one_launch(ctx: Ctx, seed: int) -> dict:
    """One seeded launch: until the first evaluation at or above the target, or the
    epoch budget. The clock starts before the data is staged and never stops; every
    evaluation is on it (its share recorded as eval_s)."""
    p, scaling = ctx.proto, ctx.spec["config"]["variant"]["lr_scaling"]
    k, ranks = layout(ctx)
    batch, target = p["tta_per_rank_batch"], p["tta_target"]
    model, opt = build(ctx, seed)
    step_fn = ShardedStep(model, opt)
    warmup = int(p.get("tta_warmup_epochs", 0) * p["tta_train_images"])
    budget = p["tta_max_epochs"] * p["tta_train_images"]
    sync(ctx.device)
    dist.barrier()
    t0 = time.perf_counter()                       # MLPerf's run_start: before the data is touched
    x, y, xt, yt = stage_data(ctx)
    seen, next_eval, curve, eval_s, epoch, reached = 0, p["tta_eval_every_samples"], [], 0.0, 0, None
    while reached is None and seen < budget:
        g = torch.Generator().manual_seed(seed * 100_003 + epoch)   # the same order on every rank
        perm = torch.randperm(len(x), generator=g).to(ctx.device)
        for s in range(len(x) // (k * batch)):
            step_fn(step_shards(x, y, perm, k, batch, ranks, s), tta.lr_at(scaling, k, seen, warmup))
            seen += k * batch
            if seen >= next_eval or seen >= budget:
                e0 = time.perf_counter()
                acc = broadcast_float(ctx, evaluate(model, xt, yt) if ctx.rank == 0 else 0.0)
                sync(ctx.device)
                eval_s += time.perf_counter() - e0
                curve.append({"samples": seen, "epochs": seen / len(x), "seconds": time.perf_counter() - t0,
                              "accuracy": acc})
                next_eval += p["tta_eval_every_samples"]
                if acc >= target:
                    reached = curve[-1]
                    break
                if seen >= budget:
                    break
        epoch += 1
    ctx.log(f"seed {seed}: " + (f"{target:.0%} at {reached['samples']} samples ({reached['epochs']:.2f} epochs, "
                                f"{reached['seconds']:.1f} s)" if reached else
                                f"not converged in {seen} samples; best {max(c['accuracy'] for c in curve):.1%}"))
    return {"seed": seed, "converged": reached is not None,
            "seconds_to_target": reached["seconds"] if reached else None,
            "samples_to_target": reached["samples"] if reached else None,
            "epochs_to_target": reached["epochs"] if reached else None,
            "eval_s": eval_s, "evaluations": len(curve), "samples_trained": seen,
            "best_accuracy": max(c["accuracy"] for c in curve), "curve": curve}


def exp_tta(ctx: Ctx) -> dict:
    """Every seed of the protocol, one launch after another, scored as MLPerf does."""
    p = ctx.proto
    k, ranks = layout(ctx)
    runs, not_launched = [], []
    for seed in p["tta_seeds"]:
        if tta.settled(runs):     # two launches did not converge: no score whatever the rest give
            not_launched.append(seed)
            continue
        runs.append(one_launch(ctx, seed))
    scored = tta.score_fields(runs)
    if not_launched:
        scored["no_result_reason"] += f"; seeds {', '.join(map(str, not_launched))} not launched (the score was settled)"
    conv = [r for r in runs if r["converged"]]
    scaling = ctx.spec["config"]["variant"]["lr_scaling"]
    return {"lr_rule": ctx.spec["variant"], "lr_scaling": scaling, "lr_base": tta.BASE_LR,
            "lr_peak": tta.lr_at(scaling, k, 1 << 62, 0), "warmup_epochs": p.get("tta_warmup_epochs", 0),
            "target_accuracy": p["tta_target"], "seeds": list(p["tta_seeds"]),
            "eval_every_samples": p["tta_eval_every_samples"], "max_epochs": p["tta_max_epochs"],
            "train_images": p["tta_train_images"], "test_images": p["tta_test_images"],
            "image_size": p["tta_image_size"], "per_rank_batch": p["tta_per_rank_batch"],
            "global_batch": k * p["tta_per_rank_batch"],
            "not_launched_seeds": not_launched, "emulated": len(ranks) > 1, "processes": ctx.world, "ranks_per_process": len(ranks),
            "eval_s_mean": sum(r["eval_s"] for r in conv) / len(conv) if conv else None,
            **scored, "runs": runs}
