"""Where a measurement's processes run: on one node, or across the nodes of a
SLURM allocation.

One node (every k up to `cluster.gpus_per_node`): the rules' commands run as
written: `torchrun --standalone --nproc-per-node=K`, or one JAX process that
sees K devices. One process on one node (k=1; an emulated k on one device) runs
the worker itself, with the variables torchrun would give its one rank
(`single_rank_env`): torchrun's agent only starts, watches and tears down the
ranks, which the watchdog does already, and it cost each launch seconds (its
interpreter, `import torch`, the rendezvous; the exit) with no effect on the numbers
(docs/measurements/: launch-cost_h200_2026-12-03.md, launcher-ab_h200_2026-12-03.md).

Several nodes (k > gpus_per_node, up to cluster.nodes x gpus_per_node): the job
spec carries `launch = {"nodes": N, "gpus_per_node": G}` and the watchdog, which
runs in the job's batch step on the allocation's first node, rewrites the
command before starting it:

    srun --whole --nodes=N --ntasks=N --ntasks-per-node=1 --kill-on-bad-exit=1 --label \
      torchrun --nnodes=N --nproc-per-node=G --rdzv-backend=c10d \
               --rdzv-endpoint=<this host>:<port> --rdzv-id=<SLURM_JOB_ID> ...

one torchrun agent per node; the agents meet at the c10d store on the first
node and number the ranks 0..k-1. A JAX job becomes `srun ... python
jax_worker.py ...`, one process per node, and `jax_initialize()` joins them
with jax.distributed (coordinator on the first node, process id SLURM_PROCID).
The port is derived from the job id (20000-29999), so two jobs sharing a node
do not collide.
"""
from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

from dpscale import registry
from dpscale.plan import specs

TORCHRUN_SINGLE = re.compile(r"--nproc[-_]per[-_]node(=.*)?$")
SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"


def single_rank(spec: dict) -> bool:
    """A torch job of one process on one node: its worker runs without torchrun."""
    return (registry.get(spec["experiment"]).family == "torch" and specs.processes(spec) == 1
            and not spec.get("launch"))


def worker_command(spec: dict, result: str, rank_logs: str, python: str = "python", agent: bool = False) -> list[str]:
    """The one-node command of a measurement, by its family (dpscale.registry):
    torchrun with one process per device (its rank logs under `rank_logs`), the torch
    worker alone where that is one process (single_rank), or one JAX process that sees
    k devices. The spec and the result path go to the worker. agent: torchrun even for
    one process (the two-node stand-in's runner reads torchrun's output)."""
    family = registry.get(spec["experiment"]).family
    tail = ["--spec", json.dumps(spec, sort_keys=True, separators=(",", ":")), "--result", str(result)]
    if single_rank(spec) and not agent:
        return [python, str(SCRIPTS / "torch_worker.py"), *tail]
    if family == "torch":
        return ["torchrun", "--standalone", f"--nproc-per-node={specs.processes(spec)}", "--log-dir", str(rank_logs),
                "--redirects", "3", "--tee", "3", str(SCRIPTS / "torch_worker.py"), *tail]
    return [python, str(SCRIPTS / "jax_worker.py"), *tail]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS's pick; the worker's store binds it
    a moment later, as torchrun --standalone's own pick does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def single_rank_env() -> dict:
    """What torchrun --standalone --nproc-per-node=1 sets for its rank that the worker
    reads (torch.distributed's env:// rendezvous; rank 0 hosts the store)."""
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
            "ROLE_RANK": "0", "ROLE_WORLD_SIZE": "1", "GROUP_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}


def rdzv_port(job_id: str | int) -> int:
    return 20000 + int(job_id) % 10000


def _srun(nodes: int) -> list[str]:
    # --whole: each task gets all of the job's CPUs, memory and GPUs on its node
    # (a step gets 1 CPU by default); --kill-on-bad-exit: one node's failure ends all.
    return ["srun", "--whole", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=1", "--label"]


def multinode_command(cmd: list[str], launch: dict, env: dict | None = None,
                      host: str | None = None) -> tuple[list[str], dict]:
    """Turn a one-node command into its multi-node form (see the module doc).
    Returns the new command and the variables to add to its environment."""
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        raise RuntimeError(
            f"this job spans {launch['nodes']} nodes (k > cluster.gpus_per_node="
            f"{launch['gpus_per_node']}) but runs outside a SLURM allocation (no SLURM_JOB_ID): "
            "run the workflow with --workflow-profile profiles/slurm, or lower the k")
    host = host or socket.gethostname()   # the batch step runs on the allocation's first node
    port = rdzv_port(job_id)
    n, g = int(launch["nodes"]), int(launch["gpus_per_node"])
    idx = next((i for i, a in enumerate(cmd) if os.path.basename(a) == "torchrun"), None)
    if idx is not None:
        rest, i = [], idx + 1
        while i < len(cmd):
            a = cmd[i]
            if a == "--standalone":
                pass
            elif TORCHRUN_SINGLE.match(a):
                if "=" not in a:
                    i += 1   # "--nproc-per-node K": drop the value too
            else:
                rest.append(a)
            i += 1
        new = (cmd[:idx] + _srun(n) + [cmd[idx], f"--nnodes={n}", f"--nproc-per-node={g}",
               "--rdzv-backend=c10d", f"--rdzv-endpoint={host}:{port}", f"--rdzv-id={job_id}"] + rest)
        return new, {}
    # a JAX process (python jax_worker.py ...): one per node, joined by jax.distributed
    return _srun(n) + list(cmd), {"DPSCALE_COORDINATOR": f"{host}:{port}",
                                  "DPSCALE_NUM_PROCESSES": str(n),
                                  "DPSCALE_LOCAL_DEVICES": str(g)}


def jax_initialize(gpu: bool) -> bool:
    """In a JAX worker, before any other JAX call: join the other nodes' processes
    when the watchdog started this one as part of a multi-node job. Returns whether
    it did. jax.devices() then lists every node's devices; process 0 writes results."""
    addr = os.environ.get("DPSCALE_COORDINATOR")
    if not addr:
        return False
    import jax
    local = int(os.environ["DPSCALE_LOCAL_DEVICES"])
    kwargs = {"local_device_ids": list(range(local))} if gpu else {}
    jax.distributed.initialize(coordinator_address=addr,
                               num_processes=int(os.environ["DPSCALE_NUM_PROCESSES"]),
                               process_id=int(os.environ["SLURM_PROCID"]), **kwargs)
    return True
