"""Two nodes on one machine: the multi-node launch must train exactly like one node.

PyTorch: two torchrun agents on loopback, each acting as one node
(--nnodes 2 --nproc-per-node 1, c10d rendezvous on 127.0.0.1, gloo), against
torchrun --standalone --nproc-per-node 2. JAX: two processes joined by
jax.distributed.initialize (one CPU device each, one global 2-device mesh), against
one process with two host devices. Each run takes one SGD step of the repo's
ResNet-18 on the same fixed global batch (8 images of 16x16, 4 per rank/device);
the updated parameters must agree to 1e-5.

The processes are tests/multinode_worker.py. Every process runs in its own process
group and is killed (group and all) on timeout or failure.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import free_port

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "multinode_worker.py"
TIMEOUT_S = 150
TOL = 1e-5

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]


def env_for(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "TORCHELASTIC_", "PET_", "XLA_FLAGS"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", JAX_PLATFORMS="cpu")
    env.update(extra)
    return env


def kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def run_together(cmds: list[list[str]], envs: list[dict], logdir: Path, name: str) -> str:
    """Start every command at once (each in its own session), wait for all; on a
    failure or timeout kill every process group. Returns the combined output."""
    logdir.mkdir(parents=True, exist_ok=True)
    procs, logs = [], []
    try:
        for i, (cmd, env) in enumerate(zip(cmds, envs)):
            log = logdir / f"{name}.{i}.log"
            logs.append(log)
            with open(log, "w") as f:
                procs.append(subprocess.Popen(cmd, env=env, cwd=logdir, stdout=f,
                                              stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes) or all(c == 0 for c in codes):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                kill_group(p)
    text = "".join(f"----- {log.name} -----\n{log.read_text(errors='replace')}\n" for log in logs)
    codes = [p.returncode for p in procs]
    if codes != [0] * len(procs):
        tail = text[-6000:]
        how = "timed out and was killed" if any(c is None or c < 0 for c in codes) else "failed"
        pytest.fail(f"{name} {how}: exit codes {codes}\n{tail}")
    return text


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


@pytest.mark.slow
def test_torch_two_nodes_match_one_node(tmp_path):
    torch = pytest.importorskip("torch")
    one = tmp_path / "one_node.pt"
    two = tmp_path / "two_nodes.pt"
    run_together([torchrun("--standalone", "--nproc-per-node=2", str(WORKER), "torch", str(one))],
                 [env_for()], tmp_path, "standalone")
    port, rdzv = free_port(), f"test-{uuid.uuid4().hex[:8]}"
    agent = torchrun("--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                     f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={rdzv}",
                     str(WORKER), "torch", str(two))
    out = run_together([agent, agent], [env_for(), env_for()], tmp_path, "two_nodes")
    # two agents, two node ranks: the c10d rendezvous made one job of them
    assert "group_rank=0" in out and "group_rank=1" in out, out[-3000:]

    a, b = torch.load(one), torch.load(two)
    assert a["world"] == b["world"] == 2
    assert a["max_update"] > 1e-4, "the SGD step changed nothing: the comparison would be vacuous"
    assert a["state"].keys() == b["state"].keys()
    diffs = {k: (a["state"][k].double() - b["state"][k].double()).abs().max().item() for k in a["state"]}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] < TOL, f"two nodes differ from one node: {worst} by {diffs[worst]:.3g}"


@pytest.mark.slow
def test_jax_two_processes_match_one_process(tmp_path):
    np = pytest.importorskip("numpy")
    pytest.importorskip("jax")
    pytest.importorskip("flax")
    one = tmp_path / "one_process.npz"
    two = tmp_path / "two_processes.npz"
    run_together([[sys.executable, str(WORKER), "jax", str(one)]],
                 [env_for(XLA_FLAGS="--xla_force_host_platform_device_count=2")], tmp_path, "jax_single")
    addr = f"127.0.0.1:{free_port()}"
    cmds = [[sys.executable, str(WORKER), "jax", str(two), "--coordinator", addr,
             "--num-processes", "2", "--process-id", str(i)] for i in (0, 1)]
    out = run_together(cmds, [env_for(), env_for()], tmp_path, "jax_distributed")
    assert "[jax process 0/2] devices=2 local=1" in out and "[jax process 1/2] devices=2 local=1" in out, out[-3000:]

    a, b = np.load(one), np.load(two)
    assert int(a["_devices"]) == int(b["_devices"]) == 2
    assert int(a["_processes"]) == 1 and int(b["_processes"]) == 2
    assert float(a["_max_update"]) > 1e-4, "the SGD step changed nothing: the comparison would be vacuous"
    keys = [k for k in a.files if not k.startswith("_")]
    assert keys and sorted(keys) == sorted(k for k in b.files if not k.startswith("_"))
    diffs = {k: float(np.abs(a[k].astype("float64") - b[k].astype("float64")).max()) for k in keys}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] < TOL, f"two processes differ from one: {worst} by {diffs[worst]:.3g}"


def test_launch_rewrites_torchrun_for_several_nodes():
    """dpscale.run.command: the watchdog's multi-node rewrite."""
    from dpscale.run import command
    from dpscale.plan import cluster as dscluster
    cluster = {"nodes": 2, "gpus_per_node": 8}
    assert [dscluster.nodes_for(k, cluster) for k in (1, 8, 16, 32)] == [1, 1, 2, 1]   # 32: skipped
    assert dscluster.layout(8, cluster) is None
    assert dscluster.layout(16, cluster) == {"nodes": 2, "gpus_per_node": 8}
    cmd = ["torchrun", "--standalone", "--nproc-per-node=16", "--log-dir", "L", "--redirects", "3",
           "w.py", "--spec", "{}"]
    new, env = command.multinode_command(cmd, {"nodes": 2, "gpus_per_node": 8},
                                        env={"SLURM_JOB_ID": "4242"}, host="gpu017")
    assert env == {}
    assert new[:new.index("torchrun")] == ["srun", "--whole", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                                           "--kill-on-bad-exit=1", "--label"]
    tr = new[new.index("torchrun") + 1:]
    assert "--standalone" not in tr and "--nproc-per-node=16" not in tr
    assert tr[:5] == ["--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d",
                      f"--rdzv-endpoint=gpu017:{command.rdzv_port('4242')}", "--rdzv-id=4242"]
    assert tr[5:] == ["--log-dir", "L", "--redirects", "3", "w.py", "--spec", "{}"]
    jax_cmd, jax_env = command.multinode_command(["python", "jax_worker.py"], {"nodes": 2, "gpus_per_node": 8},
                                                env={"SLURM_JOB_ID": "7"}, host="gpu017")
    assert jax_cmd[-2:] == ["python", "jax_worker.py"] and jax_cmd[0] == "srun"
    assert jax_env["DPSCALE_COORDINATOR"] == f"gpu017:{command.rdzv_port('7')}"
    assert jax_env["DPSCALE_NUM_PROCESSES"] == "2" and jax_env["DPSCALE_LOCAL_DEVICES"] == "8"
    with pytest.raises(RuntimeError, match="SLURM"):
        command.multinode_command(cmd, {"nodes": 2, "gpus_per_node": 8}, env={})
