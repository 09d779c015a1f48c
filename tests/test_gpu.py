"""GPU tier: what only a CUDA device can check. Skipped without one (CI has none);
run on a GPU machine with `pytest -m gpu`."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

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

    from dpscale.measure.torch_ddp import GraphedStep
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
    from dpscale.measure.torch_ddp import GraphedStep
    (plain_model, _, plain_losses), (graphed_model, g, graphed_losses) = plain, graphed
    assert g.graph is not None and g.error is None and g.calls == GraphedStep.EAGER_STEPS + 6
    assert graphed_losses == pytest.approx(plain_losses, rel=1e-4, abs=1e-5)
    # the replays moved the weights: the last loss differs from the first steps'
    assert len(set(round(v, 6) for v in graphed_losses[GraphedStep.EAGER_STEPS:])) > 1
    for (name, a), b in zip(plain_model.named_parameters(), graphed_model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_graphed_step_trains_like_the_eager_step(nccl_rank0):
    """torch_ddp.GraphedStep (the tuned series' whole-step CUDA graph, DDP inside it)
    must compute the same training run as the plain loop: same losses, same weights."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dpscale.model.models import torch_resnet18

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
    from dpscale.measure import torch_ddp as tr
    ctx = tr.Ctx({"backend": "nccl",
                  "config": {"protocol": {}, "tuned": {"compile": True, "cuda_graph": True, "ddp": []}}})

    def build():
        return tr.build_ddp(ctx, tuned=True)
    _assert_same_run(_train(nccl_rank0, build, False, lr=0.01, channels_last=True),
                     _train(nccl_rank0, build, True, lr=0.01, channels_last=True))


def _train_tuned_variant(dev, overrides: dict, steps: int = 24, lr: float = 0.01, transform=None):
    """torch_resnet18 with some of tuned_model's cheap wins, channels_last, in float64,
    DDP over NCCL, `steps` SGD steps on fixed batches; returns the model and the losses.
    float64 because this small run is chaotic: in float32 the seed model itself drifts
    from its float64 twin by 1e-2 within 8 steps (ReLUs near zero flip between two
    roundings), which would hide a transform's error in the noise."""
    from torch.nn import functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dpscale.lab import model_options as mo
    from dpscale.model.models import torch_resnet18
    torch.manual_seed(0)
    net = mo.apply(torch_resnet18(), overrides)
    net = (transform(net) if transform else net).to(dev, torch.float64).to(memory_format=torch.channels_last)
    model = DDP(net, device_ids=[dev.index])
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(32, 1, 32, 32, generator=gen, dtype=torch.float64).to(dev)
             .contiguous(memory_format=torch.channels_last), torch.randint(0, 10, (32,), generator=gen).to(dev))
            for _ in range(4)]
    losses = []
    for i in range(steps):
        X, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(X), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return net, losses, data[0][0]


def _same_training(base, base_losses, X, model, losses) -> bool:
    """Same losses, same weights (those both have) and the same eval-mode output, to
    float64 rounding amplified by the run (< 1e-9); a wrong model is off by > 1e-3."""
    if losses != pytest.approx(base_losses, rel=1e-7, abs=1e-9):
        return False
    params = dict(model.named_parameters())
    shared = [(params[n], p) for n, p in base.named_parameters() if n in params]
    if not all(torch.allclose(mine, theirs, rtol=1e-6, atol=1e-9) for mine, theirs in shared):
        return False
    base.eval(), model.eval()
    with torch.no_grad():
        same = torch.allclose(model(X), base(X), rtol=1e-6, atol=1e-9)
    base.train()
    return same


def test_cheap_wins_train_like_the_seed_model(nccl_rank0, monkeypatch):
    """tuned_model's cheap wins, all at once and the direct stem alone, on the GPU's
    kernels (cuBLAS GEMMs where the seed model runs cuDNN convolutions), DDP over NCCL,
    channels_last: over 24 SGD steps the same losses and weights as the model without
    them, and the same eval-mode output (the dropped biases live on in running_mean).
    The mutation, conv3's bias dropped too (it is added without BatchNorm), must fail."""
    from dpscale.model import tuned_model as tm
    base, base_losses, X = _train_tuned_variant(nccl_rank0, {})
    wins = {"stem": "im2col", "projection": "slice_matmul", "cancelled_bias": "drop"}
    model, losses, _ = _train_tuned_variant(nccl_rank0, wins)
    assert tm.describe(model)["parameters"] == tm.describe(base)["parameters"] - 3904
    assert _same_training(base, base_losses, X, model, losses)
    assert _same_training(base, base_losses, X, *_train_tuned_variant(nccl_rank0, {"stem": "direct"})[:2])
    pairs = tm.cancelled_bias_pairs
    monkeypatch.setattr(tm, "cancelled_bias_pairs", lambda m: pairs(m) + [
        (b.conv3, None) for b in tm.residual_blocks(m) if b.conv3 is not None])
    assert not _same_training(base, base_losses, X, *_train_tuned_variant(nccl_rank0, wins)[:2])


def test_triton_statistics_batchnorm_trains_like_torch_batchnorm(nccl_rank0, monkeypatch):
    """Every BatchNorm with its statistics from the Triton kernel (compiled for this GPU;
    float64 accumulation for float64 input): 24 steps like torch's BatchNorm. The
    mutation, a tile merge that forgets the spread of the tiles' means, must fail."""
    from dpscale.lab import triton_bn
    base, base_losses, X = _train_tuned_variant(nccl_rank0, {})
    swap = triton_bn.use_triton_stats   # a lab module: no tuned option switches it on any more
    assert _same_training(base, base_losses, X, *_train_tuned_variant(nccl_rank0, {}, transform=swap)[:2])
    def naive(mean_t, m2_t, M):
        return mean_t.mean(0), (m2_t / triton_bn.BLOCK_M).mean(0)
    monkeypatch.setattr(triton_bn, "_merge", naive)
    assert not _same_training(base, base_losses, X, *_train_tuned_variant(nccl_rank0, {}, transform=swap)[:2])


# keeps GPU 0 busy until killed: a second process on the device a measurement uses
BUSY = ("import time, torch\nx = torch.randn(4096, 4096, device='cuda:0')\nprint('busy', flush=True)\n"
        "t0 = time.time()\nwhile time.time() - t0 < 300:\n    x = x @ x\n    x = x / x.norm()\n"
        "    torch.cuda.synchronize()\n")


def _state_of_gpu0(gpustate) -> dict:
    dev = torch.device("cuda", 0)
    rec = gpustate.Recorder([str(torch.cuda.get_device_properties(dev).uuid)])
    assert rec.absent is None, rec.absent
    rec.take("before timed repeat 1")
    time.sleep(0.5)
    rec.take("after timed repeat 1")
    return gpustate.summarise([rec.record()], [os.getpid()])


def test_a_second_process_on_the_gpu_flags_shared():
    """The sampler a rank runs (this process holds a context on GPU 0, as a rank does)
    sees another process keeping the same GPU busy, and flags `shared`; alone, it does not."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed: pip install nvidia-ml-py")
    from dpscale.measure import gpustate
    torch.ones(1, device="cuda:0")
    torch.cuda.synchronize()
    other = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "busy"
        st = _state_of_gpu0(gpustate)
    finally:
        other.kill()
        other.wait()
    assert "shared" in st["flags"], st
    dev0 = st["devices"][0]
    assert dev0["samples"][0]["sm_clock_MHz"] and dev0["samples"][0]["power_W"] is not None
    assert other.pid in {p["pid"] for p in dev0["other_processes"]} or dev0.get("pids_by_count"), dev0
    deadline = time.monotonic() + 20   # the killed process's context takes a moment to go
    while "shared" in (alone := _state_of_gpu0(gpustate))["flags"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "shared" not in alone["flags"], alone
