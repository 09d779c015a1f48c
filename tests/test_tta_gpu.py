"""GPU tier of time to accuracy (torch_tta): the tuned step as a GPU runs it (bf16,
channels_last, torch.compile, fused SGD with a tensor lr, one CUDA graph per step),
emulated shards and the noise probe inside the graph, the warm-up before the clock, and
whole jobs on one GPU (k=1 real, k=4 emulated) and on two (k=2 real: the probe's hooks
under capture). Skipped without CUDA; on a GPU machine:

    python -m pytest -q -m gpu tests/test_tta_gpu.py

(On the lent image, `source tools/offline-gpu/site.sh` first: a job's result is checked against
its schema as it is written, and the image has no jsonschema.)
"""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from conftest import CPU_FP, make_spec, run_job

torch = pytest.importorskip("torch")
from test_gpu import nccl_rank0  # noqa: E402,F401  (the fixture: one NCCL rank on GPU 0)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

STEPS, BATCH, SIZE = 20, 32, 32


def _options(graph: bool) -> dict:
    from dpscale import registry
    return {**registry.TTA_STEP, "cuda_graph": graph}


def _trainer(dev, m: int, graph: bool, probe: int = 0):
    from dpscale.measure.torch_tta import Trainer
    ctx = SimpleNamespace(device=dev, cuda=True, local_rank=0, rank=0, spec={"config": {}})
    return Trainer(ctx, 3, m, BATCH, _options(graph), probe_capacity=probe)


def _run(dev, m: int, graph: bool):
    """STEPS steps on fixed random batches, the lr changing every step (the linear rule's
    warm-up: the graph must read the refilled lr tensor); the state and the probe's rows."""
    tr = _trainer(dev, m, graph, probe=STEPS + 1 if m > 1 else 0)
    g = torch.Generator(device=dev).manual_seed(0)
    for i in range(STEPS):
        X = torch.randint(0, 256, (m * BATCH, SIZE, SIZE), generator=g, device=dev, dtype=torch.uint8)
        y = torch.randint(0, 10, (m * BATCH,), generator=g, device=dev)
        tr.step(tr.inputs(X), y, 0.05 + 0.01 * i)
    state = {k: v.detach().float().clone() for k, v in tr.net().state_dict().items()}
    rows = tr.probe.flush() if tr.probe is not None else None
    return tr, state, rows


@pytest.mark.parametrize("m", [1, 2, 4])
def test_the_graphed_tta_step_trains_as_the_same_step_uncaptured(nccl_rank0, m):
    """m shards a process (1: k=1; 2, 4: emulated k on one GPU): the CUDA-graphed step
    (captured after GraphedStep.EAGER_STEPS eager calls) against the same compiled step
    without the graph, the lr refilled every step: the same weights, running statistics
    (rank 0's shard's) and noise-probe rows."""
    graphed, sg, rg = _run(nccl_rank0, m, graph=True)
    assert graphed.graphed is not None and graphed.graphed.graph is not None, graphed.graphed.error
    _, se, re_ = _run(nccl_rank0, m, graph=False)
    for k in se:
        assert torch.allclose(sg[k], se[k], rtol=2e-2, atol=2e-3), k
    if m > 1:
        assert rg["steps"] == re_["steps"] == STEPS
        assert rg["g_small_sq"] == pytest.approx(re_["g_small_sq"], rel=2e-2)
        assert rg["g_big_sq"] == pytest.approx(re_["g_big_sq"], rel=2e-2)


def test_the_warm_up_before_the_clock_puts_the_seeded_weights_back(nccl_rank0):
    """Trainer.warm_up compiles and captures on random data, then the seeded weights and
    statistics are back, bit for bit, in the tensors the graph reads; the probe forgot."""
    tr = _trainer(nccl_rank0, 2, graph=True, probe=4)
    before = {k: v.detach().clone() for k, v in tr.net().state_dict().items()}
    ptrs = {k: v.data_ptr() for k, v in tr.net().state_dict().items()}
    tr.warm_up(SimpleNamespace(cuda=True, device=nccl_rank0, rank=0), SIZE, BATCH, 1000)
    after = tr.net().state_dict()
    assert all(torch.equal(before[k], after[k]) and after[k].data_ptr() == ptrs[k] for k in before)
    assert tr.graphed.graph is not None and tr.warmup_s > 0 and tr.probe.pending == 0


def test_a_reseeded_graphed_trainer_replays_the_new_seed(nccl_rank0):
    """One capture for a job's seeds: a graphed Trainer warmed up and trained at seed 3,
    reseeded to 4, holds seed 4's initial state bit for bit in the same tensors, keeps its
    graph, and trains as a fresh seed-4 Trainer (the same compiled step uncaptured: the
    tolerance of the test above)."""
    from dpscale.measure import torch_tta
    dev, ctx = nccl_rank0, SimpleNamespace(cuda=True, device=nccl_rank0, rank=0)
    tr = _trainer(dev, 2, graph=True)
    tr.warm_up(ctx, SIZE, BATCH, 1000)
    graph, ptrs = tr.graphed.graph, {k: v.data_ptr() for k, v in tr.net().state_dict().items()}
    g = torch.Generator(device=dev).manual_seed(0)
    batches = [(torch.randint(0, 256, (2 * BATCH, SIZE, SIZE), generator=g, device=dev, dtype=torch.uint8),
                torch.randint(0, 10, (2 * BATCH,), generator=g, device=dev)) for _ in range(STEPS)]
    for X, y in batches[:5]:
        tr.step(tr.inputs(X), y, 0.1)
    tr.reseed(4)
    fresh = torch_tta.Trainer(SimpleNamespace(device=dev, cuda=True, local_rank=0, rank=0, spec={"config": {}}),
                              4, 2, BATCH, _options(False))
    start = {k: v.float() for k, v in torch_tta.seeded_net(4, _options(False), dev).state_dict().items()}
    now = tr.net().state_dict()
    assert all(torch.equal(now[k].float(), start[k]) and now[k].data_ptr() == ptrs[k] for k in start)
    assert tr.graphed.graph is graph
    for X, y in batches:
        tr.step(tr.inputs(X), y, 0.1)
        fresh.step(fresh.inputs(X), y, 0.1)
    a, b = tr.net().state_dict(), fresh.net().state_dict()
    for k in b:
        assert torch.allclose(a[k].float(), b[k].float(), rtol=2e-2, atol=2e-3), k


TINY_GPU = {"tta_image_size": 16, "tta_train_images": 256, "tta_test_images": 64, "tta_per_rank_batch": 16,
            "tta_target": 0.01, "tta_eval_every_epochs": 0.5, "tta_eval_every_samples": 64, "tta_eval_near_every_samples": 32,
            "tta_eval_near_margin": 0.05, "tta_max_epochs": 1, "tta_seeds": [1, 2, 3],
            "tta_warmup_epochs": 0.5, "tta_ks_emulated": [], "tta_timeout_s": 600}


def _gpu_fp(n: int) -> dict:
    return {**CPU_FP, "gpu_count": n, "gpu_model": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
            "driver": "test", "gpu_memory_MiB": 1}


@pytest.mark.parametrize("k,gpus", [(1, 1), (4, 1), (2, 2)])
def test_a_gpu_tta_job_runs_the_tuned_step_and_reads_the_gpu_at_each_evaluation(tiny_data, tmp_path, k, gpus):
    """A whole job: the step that ran is the tuned one, captured; the GPU's state sampled
    at every evaluation; the heartbeat; the noise scale at k >= 2 (k=2 on two GPUs: the
    probe's post-accumulate-grad hooks inside the captured synchronising backward)."""
    if torch.cuda.device_count() < gpus:
        pytest.skip(f"needs {gpus} GPUs")
    spec = make_spec(tiny_data, "ddp_tta", k, "linear" if k == 2 else "book", proto=TINY_GPU, fp=_gpu_fp(gpus))
    assert spec["backend"] == "nccl"
    rc, res, log = run_job(spec, tmp_path, timeout=900)
    assert rc == 0 and res["status"] == "ok", log[-4000:]
    m = res["metrics"]
    assert m["step"]["compile"] and m["step"]["cuda_graph"] and m["step"]["precision"] == "bf16", m["step"]
    assert m["cuda_graph"] is True and m["cuda_graph_error"] is None and m["warmup_s_mean"] > 0
    assert m["step_txt"].startswith("bf16 autocast, channels_last, torch.compile, fused SGD, one CUDA graph")
    assert "devices" in res["gpu_state"], f"NVML is needed here (pip install -e '.[cuda]'): {res['gpu_state']}"
    labels = [s["when"] for d in res["gpu_state"]["devices"] for s in d["samples"]]
    assert sum("evaluation" in w for w in labels) == m["evaluations_total"] * gpus
    assert len(re.findall(r"\[tta seed \d\] epoch", log)) == m["evaluations_total"]
    assert m["eval_s_per_evaluation"] < 1.0 and m["noise_probe"] is (k >= 2)
    if k >= 2:
        assert m["noise_steps"] > 0 and all(r["noise_steps"] > 0 for r in m["runs"])
