"""GPU tier: what only a CUDA device can check. Skipped without one (CI has none);
run on a GPU machine with `pytest -m gpu`."""
from __future__ import annotations

import contextlib
import socket

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_graphed_step_trains_like_the_eager_step():
    """torch_runs.GraphedStep (the tuned series' whole-step CUDA graph, DDP inside it)
    must compute the same training run as the plain loop: same losses, same weights."""
    import torch.distributed as dist
    from torch.nn import functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dpscale.models import torch_resnet18
    from dpscale.torch_runs import GraphedStep

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
                            device_id=dev)
    try:
        def train(graphed: bool):
            torch.manual_seed(0)
            side = torch.cuda.Stream(dev) if graphed else None
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                model = DDP(torch_resnet18().to(dev), device_ids=[0])
            opt = torch.optim.SGD(model.parameters(), lr=0.1)

            def step(X, y):
                loss = F.cross_entropy(model(X), y)
                loss.backward()
                opt.step()
                return loss

            g = GraphedStep(step, opt, side) if graphed else None
            gen = torch.Generator().manual_seed(1)
            losses = []
            for _ in range(GraphedStep.EAGER_STEPS + 6):   # eager warm-up, capture, replays
                X = torch.randn(8, 1, 16, 16, generator=gen).to(dev)
                y = torch.randint(0, 10, (8,), generator=gen).to(dev)
                if g is not None:
                    loss = g(X, y)
                else:
                    opt.zero_grad(set_to_none=True)
                    loss = step(X, y)
                losses.append(float(loss.detach()))
            return model, g, losses

        eager, _, eager_losses = train(False)
        graphed, g, graphed_losses = train(True)
        assert g.graph is not None and g.error is None and g.calls == GraphedStep.EAGER_STEPS + 6
        assert graphed_losses == pytest.approx(eager_losses, rel=1e-4, abs=1e-5)
        # the replays moved the weights: the last loss differs from the first steps'
        assert len(set(round(v, 6) for v in graphed_losses[GraphedStep.EAGER_STEPS:])) > 1
        for (name, a), b in zip(eager.named_parameters(), graphed.parameters()):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    finally:
        dist.destroy_process_group()



def test_tuned_ddp_model_graphed_trains_like_uncaptured(monkeypatch):
    """The tuned series' model as build_ddp makes it (channels_last, compiled inside
    DDP, DDPOptimizer's bucket-split graph) replayed by GraphedStep must train like
    the same model stepped without the graph: same losses, same weights. (Against the
    eager model a short run drifts apart from rounding alone: the compiled kernels
    sum in another order, and a few steps amplify that.)"""
    import torch.distributed as dist
    from torch.nn import functional as F

    from dpscale import torch_runs as tr

    for key, val in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, val)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
                            device_id=dev)
    spec = {"backend": "nccl", "config": {"protocol": {}, "tuned": {"compile": True, "cuda_graph": True, "ddp": []}}}
    try:
        def train(graphed: bool):
            ctx = tr.Ctx(spec)
            side = tr.graph_side_stream(ctx, True) if graphed else None
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                model = tr.build_ddp(ctx, tuned=True)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)

            def step(X, y):
                loss = F.cross_entropy(model(X), y)
                loss.backward()
                opt.step()
                return loss

            g = tr.GraphedStep(step, opt, side) if graphed else None
            gen = torch.Generator().manual_seed(1)
            losses = []
            for _ in range(tr.GraphedStep.EAGER_STEPS + 6):
                X = torch.randn(8, 1, 16, 16, generator=gen).to(dev).contiguous(memory_format=torch.channels_last)
                y = torch.randint(0, 10, (8,), generator=gen).to(dev)
                if g is not None:
                    loss = g(X, y)
                else:
                    opt.zero_grad(set_to_none=True)
                    loss = step(X, y)
                losses.append(float(loss.detach()))
            return model, g, losses

        plain, _, plain_losses = train(False)
        graphed, g, graphed_losses = train(True)
        assert g.graph is not None and g.error is None
        assert graphed_losses == pytest.approx(plain_losses, rel=1e-4, abs=1e-5)
        assert len(set(round(v, 6) for v in graphed_losses[tr.GraphedStep.EAGER_STEPS:])) > 1
        for (name, a), b in zip(plain.named_parameters(), graphed.parameters()):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    finally:
        torch._dynamo.reset()
        dist.destroy_process_group()
