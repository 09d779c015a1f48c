"""GPU tier: what only a CUDA device can check. Skipped without one (CI has none);
run on a GPU machine with `pytest -m gpu`."""
from __future__ import annotations

import contextlib

import pytest
from conftest import free_port

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture
def nccl_rank0(monkeypatch):
    """One NCCL rank on GPU 0, with the environment torchrun would set, and cuDNN
    deterministic so that two runs of the same kernels agree."""
    import torch.distributed as dist
    for key, val in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, val)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            device_id=dev)
    try:
        yield dev
    finally:
        torch._dynamo.reset()
        dist.destroy_process_group()


def _train(dev, build, graphed: bool, lr: float, channels_last: bool = False):
    """GraphedStep's eager warm-up, the capture and 6 replays when graphed; as many
    steps of the plain loop otherwise. build() makes the model (on the side stream
    when graphed, as DDP must be). Returns the model, the GraphedStep, the losses."""
    from torch.nn import functional as F

    from dpscale.torch_runs import GraphedStep
    side = torch.cuda.Stream(dev) if graphed else None
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        model = build()
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def step(X, y):
        loss = F.cross_entropy(model(X), y)
        loss.backward()
        opt.step()
        return loss

    g = GraphedStep(step, opt, side) if graphed else None
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(GraphedStep.EAGER_STEPS + 6):
        X = torch.randn(8, 1, 16, 16, generator=gen).to(dev)
        if channels_last:
            X = X.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (8,), generator=gen).to(dev)
        if g is not None:
            loss = g(X, y)
        else:
            opt.zero_grad(set_to_none=True)
            loss = step(X, y)
        losses.append(float(loss.detach()))
    return model, g, losses


def _assert_same_run(plain, graphed):
    from dpscale.torch_runs import GraphedStep
    (plain_model, _, plain_losses), (graphed_model, g, graphed_losses) = plain, graphed
    assert g.graph is not None and g.error is None and g.calls == GraphedStep.EAGER_STEPS + 6
    assert graphed_losses == pytest.approx(plain_losses, rel=1e-4, abs=1e-5)
    # the replays moved the weights: the last loss differs from the first steps'
    assert len(set(round(v, 6) for v in graphed_losses[GraphedStep.EAGER_STEPS:])) > 1
    for (name, a), b in zip(plain_model.named_parameters(), graphed_model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_graphed_step_trains_like_the_eager_step(nccl_rank0):
    """torch_runs.GraphedStep (the tuned series' whole-step CUDA graph, DDP inside it)
    must compute the same training run as the plain loop: same losses, same weights."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dpscale.models import torch_resnet18

    def build():
        torch.manual_seed(0)
        return DDP(torch_resnet18().to(nccl_rank0), device_ids=[0])
    _assert_same_run(_train(nccl_rank0, build, False, lr=0.1), _train(nccl_rank0, build, True, lr=0.1))


def test_tuned_ddp_model_graphed_trains_like_uncaptured(nccl_rank0):
    """The tuned series' model as build_ddp makes it (channels_last, compiled inside
    DDP, DDPOptimizer's bucket-split graph) replayed by GraphedStep must train like
    the same model stepped without the graph: same losses, same weights. (Against the
    eager model a short run drifts apart from rounding alone: the compiled kernels
    sum in another order, and a few steps amplify that. At lr=0.1 this tiny run also
    diverges, loss 2.4 -> 16 in 5 steps, so it trains at 0.01.)"""
    from dpscale import torch_runs as tr
    ctx = tr.Ctx({"backend": "nccl",
                  "config": {"protocol": {}, "tuned": {"compile": True, "cuda_graph": True, "ddp": []}}})

    def build():
        return tr.build_ddp(ctx, tuned=True)
    _assert_same_run(_train(nccl_rank0, build, False, lr=0.01, channels_last=True),
                     _train(nccl_rank0, build, True, lr=0.01, channels_last=True))
