"""One measurement of the pipeline on the two "nodes" of dpscale.standin.netns: across the
shaped link (a spec whose `launch` says 2 nodes), or inside the first namespace (a
one-node spec), as the workflow's watchdog would run it on a cluster.

Across the link, per node i (namespace i):

    ip netns exec <ns i> taskset -c <node i's cores> \
      torchrun --nnodes=2 --nproc-per-node=G --rdzv-backend=c10d \
               --rdzv-endpoint=<ns 0's address>:<port> --rdzv-id=<id> --node-rank=i \
               --local-addr=<ns i's address> --rdzv-conf=is_host=<1 if i == 0 else 0> \
               --log-dir ... torch_worker.py --spec ... --result ...

which is dpscale.run.command.worker_command rewritten by launch.multinode_command (the
SLURM path's own rewriting: its srun prefix is dropped, one agent per namespace takes
its place; three arguments are added: --node-rank, which torchrun reads only with a
static rendezvous (c10d numbers the nodes as they join; it is there for the reader and
the logs), and --local-addr and --rdzv-conf=is_host=1|0, because both namespaces share
the machine's hostname, which resolves to neither of their addresses: on a cluster the
first node's agent sees that the endpoint is its own hostname and hosts the c10d store,
and publishes its hostname to the others; here each is told). Each process has GLOO_SOCKET_IFNAME = its namespace's
veth, OMP_NUM_THREADS (and MKL_NUM_THREADS) = the placement's thread count at every k
(torchrun sets 1 only when it starts several ranks, so it is set here explicitly;
torch's intra-op pool takes its size from it), and its own session and process group,
tied to this process by PR_SET_PDEATHSIG. One rank per node: `taskset` pins the agent
and its rank inherits the core; several: scripts/pin_rank.py binds local rank r to the
node's r-th core before it becomes the worker.

The run is supervised as the watchdog supervises one: it holds the per-core locks
(dpscale.run.devices) of every core it pins; the first agent that exits non-zero has
every other group killed (srun --kill-on-bad-exit's rule); at the spec's limit_s every
group is killed; then dpscale.run.watchdog.record_outcome and finish make the result
exactly as the pipeline does (rank 0's ok result, written atomically by the worker,
or a failed or hung record with its reason, rank logs and log tails).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from dpscale.plan import specs
from dpscale.run import command as launch, devices, launches, lifeline, watchdog
from dpscale.standin import netns
from dpscale.standin.netns import TwoNodes

PIN = launch.SCRIPTS / "pin_rank.py"
WORKER = launch.SCRIPTS / "torch_worker.py"
# Whatever the caller's environment says about ranks, rendezvous, interfaces and threads
# is not this run's: each node's environment is built here.
DROP_PREFIXES = ("SLURM_", "TORCHELASTIC_", "PET_", "GLOO_", "TP_SOCKET_", "NCCL_SOCKET_", "MASTER_")
DROP_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
             "OMP_NUM_THREADS", "MKL_NUM_THREADS", "DPSCALE_COORDINATOR")
RANK_LINE = re.compile(r"^\[\w+?\d+\]:\[rank (\d+)/\d+ ", re.M)   # a rank's line as torchrun --tee shows it


@dataclass(frozen=True)
class Placement:
    """Where the ranks run: per node (namespace), one core per local rank, and the
    threads each rank uses (the same at every k)."""
    cores: tuple[tuple[int, ...], ...]
    threads: int = 1

    def node(self, i: int) -> tuple[int, ...]:
        return self.cores[i]

    def all_cores(self) -> list[int]:
        return sorted({c for node in self.cores for c in node})


@dataclass
class Run:
    """How one measurement ended. `result` is the record written at `result_path`
    (ok, failed or hung), `layout` where its ranks ran."""
    status: str
    result: dict | None
    result_path: Path
    log: Path
    elapsed_s: float
    exit_codes: list[int | None]
    killed: str | None
    stray: bool
    layout: dict
    commands: list[list[str]]
    pids: list[int] = field(default_factory=list)


def torchrun_path(python: str = sys.executable) -> str:
    """The torchrun of the interpreter that runs the workers (a venv's is not on PATH)."""
    beside = Path(python).parent / "torchrun"
    found = str(beside) if beside.exists() else shutil.which("torchrun")
    if not found:
        raise RuntimeError(f"no torchrun beside {python} nor on PATH: install torch in that environment")
    return found


def new_rdzv_id() -> str:
    """A job id for the rendezvous (launch.rdzv_port derives the port from it). The
    port lives in the first namespace, which nothing else uses: it cannot collide."""
    return str(secrets.randbelow(10**9))


def multinode_agent(one_node: list[str], layout: dict, host: str, rdzv_id: str) -> list[str]:
    """launch.multinode_command's torchrun, without its srun prefix: the one torchrun
    agent each node starts. multinode_command takes the job id from a SLURM
    environment, which is passed to it here as an argument (nothing is set in ours)."""
    cmd, extra_env = launch.multinode_command(one_node, layout, env={"SLURM_JOB_ID": rdzv_id}, host=host)
    idx = next((i for i, a in enumerate(cmd) if os.path.basename(a) == "torchrun"), None)
    if idx is None or cmd[0] != "srun" or extra_env:
        raise RuntimeError(f"launch.multinode_command gave no srun + torchrun command: {cmd[:12]}")
    return cmd[idx:]


def _pinned(agent: list[str], cores: tuple[int, ...], ranks: int) -> list[str]:
    cpu_list = ",".join(map(str, cores[:ranks]))
    if ranks > 1:   # one core per local rank: the wrapper binds each before it becomes the worker
        i = agent.index(str(WORKER))
        agent = agent[:i] + [str(PIN), "--cpus", cpu_list, "--", str(WORKER)] + agent[i + 1:]
    return ["taskset", "-c", cpu_list] + agent


def node_commands(spec: dict, result: str, rank_logs: str, nodes: TwoNodes, placement: Placement,
                  python: str = sys.executable, rdzv_id: str | None = None) -> list[list[str]]:
    """The command of each node that takes part: two across the link (spec["launch"]
    = {"nodes": 2, ...}), one in the first namespace otherwise."""
    one = launch.worker_command(spec, result, rank_logs, python, agent=True)
    if os.path.basename(one[0]) != "torchrun":
        raise ValueError(f"{spec['experiment']}: only torchrun measurements run on the stand-in, not {one[0]}")
    one = [torchrun_path(python)] + one[1:]
    multi = spec.get("launch")
    if not multi:
        ranks = specs.processes(spec)
        _check_cores(placement, 0, ranks)
        return [nodes.exec_prefix(0) + _pinned(one, placement.node(0), ranks)]
    if int(multi["nodes"]) != 2:
        raise ValueError(f"the stand-in has 2 nodes; the spec asks for {multi['nodes']}")
    per_node = int(multi["gpus_per_node"])
    agent = multinode_agent(one, multi, nodes.addrs[0], rdzv_id or new_rdzv_id())
    at = next(j for j, a in enumerate(agent) if a.startswith("--rdzv-id=")) + 1
    out = []
    for i in (0, 1):
        _check_cores(placement, i, per_node)
        mine = agent[:at] + [f"--node-rank={i}", f"--local-addr={nodes.addrs[i]}",
                             f"--rdzv-conf=is_host={int(i == 0)}"] + agent[at:]
        out.append(nodes.exec_prefix(i) + _pinned(mine, placement.node(i), per_node))
    return out


def _check_cores(placement: Placement, node: int, ranks: int) -> None:
    if node >= len(placement.cores) or len(placement.node(node)) < ranks:
        raise ValueError(f"node {node} runs {ranks} rank(s) but the placement gives it cores "
                         f"{placement.cores[node] if node < len(placement.cores) else '()'}")


def node_env(spec: dict, veth: str, threads: int, base: dict | None = None) -> dict:
    base = os.environ if base is None else base
    env = {k: v for k, v in base.items() if not k.startswith(DROP_PREFIXES) and k not in DROP_KEYS}
    env.update(spec.get("env", {}))
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               GLOO_SOCKET_IFNAME=veth, TP_SOCKET_IFNAME=veth)
    if spec["backend"] == "nccl":
        env["NCCL_SOCKET_IFNAME"] = veth
    return env


def _die_with_parent() -> None:
    lifeline.set_parent_death_signal(signal.SIGTERM)   # torchrun tears its ranks down


def supervise_all(cmds: list[list[str]], envs: list[dict], logs: list[Path], limit: float, grace: float,
                  pass_fds=(), on_start=None) -> tuple[watchdog.Outcome, list[subprocess.Popen]]:
    """Start every command at once (each its own session), until all exit 0, one exits
    non-zero, or `limit` passes; then every group still alive is killed. The Outcome
    is the watchdog's: rc = 0, or the first non-zero exit code; None when killed."""
    t0, spawned = time.monotonic(), time.time()
    procs: list[subprocess.Popen] = []
    killed, rc = None, None
    try:
        for cmd, env, log in zip(cmds, envs, logs):
            with open(log, "ab") as f:
                procs.append(subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                              start_new_session=True, preexec_fn=_die_with_parent,
                                              pass_fds=tuple(pass_fds)))
        if on_start:
            on_start(procs)
        while True:
            codes = [p.poll() for p in procs]
            if bad := [c for c in codes if c not in (None, 0)]:
                rc = bad[0]
                break
            if all(c == 0 for c in codes):
                rc = 0
                break
            if time.monotonic() - t0 >= limit:
                killed = "limit"
                break
            time.sleep(watchdog.POLL_S)
    except BaseException:   # SIGTERM/^C of the runner: take every node down with it
        for p in procs:
            lifeline.kill_group(p.pid, watchdog.ORPHAN_GRACE_S, p)
        raise
    elapsed = time.monotonic() - t0
    for p in procs:   # the other nodes of a failed run, a run past its limit, ranks left behind
        if p.poll() is None or lifeline.group_alive(p.pid):
            lifeline.kill_group(p.pid, grace if killed == "limit" else watchdog.ORPHAN_GRACE_S, p)
        p.wait()
    stray = any(lifeline.group_alive(p.pid) for p in procs)
    return watchdog.Outcome(None if killed else rc, elapsed, killed, stray, spawned), procs


def ranks_by_node(agent_logs: list[str]) -> dict[str, list[int]]:
    """{"0": [the global ranks node 0's agent ran], ...}, from the ranks' own lines
    ("[default0]:[rank 1/2 12:00:00] ...") in each agent's output."""
    return {str(i): sorted({int(r) for r in RANK_LINE.findall(text)}) for i, text in enumerate(agent_logs)}


def sweep_namespaces(names) -> list[int]:
    """Kill whatever still runs in the namespaces once a launch is over: the runner owns
    them for the run, so anything left is this launch's (a rank torchrun lost, a
    wrapper between its fork and the worker's parent-death signal). Returns the pids."""
    left = [pid for ns in names for pid in netns.pids_in(ns)]
    if left:
        netns.kill_all(left, grace_s=watchdog.ORPHAN_GRACE_S)
    return left


def order_rank_dirs(rank_dir: Path, by_node: dict[str, list[int]]) -> None:
    """watchdog.collect_rank_logs numbers the nodes by their torchrun log folders'
    mtimes (the order the agents started, on a cluster); here the agents start at once.
    Give the folder of namespace i the i-th mtime, so that <log>.node<i>.rank<r>.log is
    namespace i's local rank r. A folder whose ranks printed nothing stays as it is."""
    runs = [p for p in rank_dir.glob("*") if p.is_dir()] if rank_dir.is_dir() else []
    base = time.time() - 60
    for run in runs:
        text = "".join(f.read_text(errors="replace") for f in run.glob("attempt_*/*/stdout.log"))
        ranks = {int(r) for r in re.findall(r"^\[rank (\d+)/\d+ ", text, re.M)}
        node = next((int(i) for i, rs in by_node.items() if ranks & set(rs)), None)
        if node is not None:
            os.utime(run, (base + node, base + node))


def _say(log: Path, text: str, echo=None) -> None:
    with open(log, "a") as f:
        f.write(f"[watchdog] {text}\n")
    if echo:
        echo(text)


def _launches(job, spec, cmds, envs, agent_logs, nodes, held, layout, echo, on_start):
    """Every launch of the job across the nodes, merged as the watchdog merges them
    (stamped with what each cost); (the last Outcome, its exit codes, every pid)."""
    limit, grace = float(spec["limit_s"]), float(spec.get("grace_s", 15))
    n, done, pids, t0 = launches.count(spec), [], [], time.monotonic()
    out, codes = None, []
    _say(job.log, f"{job.label} on the two-node stand-in ({nodes.tbf.rate_bps / 1e9:g} Gbit/s link), "
                  f"limit {limit:g} s per launch, {n} launch(es), cores {held.names}", echo)
    for i, c in enumerate(cmds):
        _say(job.log, f"node {i} $ {' '.join(c)}")
    for li in range(1, n + 1):
        produced, label = watchdog.launch_path(job, li, n), (f"launch {li}/{n}: " if n > 1 else "")
        argv = [[a.replace(str(job.result), str(produced)) for a in c] for c in cmds]
        for p in agent_logs:
            p.write_text("")
        out, procs = supervise_all(argv, envs, agent_logs, limit, grace, held.fds, on_start)
        pids += [p.pid for p in procs]
        codes = [p.returncode for p in procs]
        out = _after_launch(job, out, nodes, agent_logs, layout, len(cmds), echo)
        if (r := watchdog.record_outcome(job, out, produced, label)) is None:
            return out, codes, pids
        done.append(launches.stamp(r, out.spawned_unix, out.elapsed))
    watchdog.finish(job, done, time.monotonic() - t0)
    return out, codes, pids


def _after_launch(job, out, nodes, agent_logs, layout, n_nodes: int, echo):
    """Clear the namespaces, number and keep the nodes' logs; the Outcome, stray if any was left."""
    left = sweep_namespaces(nodes.names[:n_nodes])
    if left:
        _say(job.log, f"killed {len(left)} process(es) still inside the namespaces: {left}", echo)
        out = dataclasses.replace(out, stray=True)
    texts = [p.read_text(errors="replace") for p in agent_logs]
    layout["global_ranks_by_node"] = ranks_by_node(texts)
    order_rank_dirs(job.rank_dir, layout["global_ranks_by_node"])
    with open(job.log, "a") as f:
        for i, t in enumerate(texts):
            f.write(f"===== node {i} ({nodes.names[i]}): torchrun agent and its ranks =====\n{t}")
    for p in agent_logs:
        p.unlink(missing_ok=True)
    if out.killed:
        _say(job.log, f"no result after {out.elapsed:.0f} s: killed every node's process group", echo)
    return out


def run_measurement(spec: dict, result: str | os.PathLike, rank_logs: str | os.PathLike, nodes: TwoNodes,
                    placement: Placement, *, python: str = sys.executable, lock_dir: str | None = None,
                    lock_wait_s: float = 300, echo=None, on_start=None) -> Run:
    """Run one measurement (its spec as plan.specs.job_spec builds it) on the stand-in.

    result: the result JSON, written as the pipeline writes it; rank_logs: torchrun's
    --log-dir (<log>.ranks; the job log is <log>, the rank logs <log stem>[.node<i>].rank<r>.log).
    A skipped spec writes its skipped record and runs nothing. Raises ValueError for a
    spec the stand-in cannot run (not torchrun, more than 2 nodes, too few cores);
    a measurement that fails or hangs is not an exception: its record says so."""
    job = watchdog.Job.of(spec, str(result), str(rank_logs))
    job.result.unlink(missing_ok=True)   # never serve an old number
    job.log.parent.mkdir(parents=True, exist_ok=True)
    job.log.write_text("")
    layout = {"nodes": 2 if spec.get("launch") else 1,
              "ranks_per_node": int(spec["launch"]["gpus_per_node"]) if spec.get("launch") else specs.processes(spec),
              "namespaces": list(nodes.names[:2 if spec.get("launch") else 1]),
              "cores": [list(placement.node(i)) for i in range(2 if spec.get("launch") else 1)],
              "threads_per_rank": placement.threads}
    if spec.get("skip_reason"):
        _say(job.log, f"skipped: {spec['skip_reason']}", echo)
        job.write("skipped", spec["skip_reason"])
        return Run("skipped", json.loads(job.result.read_text()), job.result, job.log, 0.0, [], None,
                   False, layout, [])
    rdzv_id = new_rdzv_id()
    cmds = node_commands(spec, str(job.result), str(job.rank_dir), nodes, placement, python, rdzv_id)
    envs = [node_env(spec, nodes.veths[i], placement.threads) for i in range(len(cmds))]
    agent_logs = [Path(f"{job.prefix}.node{i}.agent.log") for i in range(len(cmds))]
    if job.rank_dir.exists():
        shutil.rmtree(job.rank_dir)
    names = [f"cpu-{c}" for c in sorted({c for i in range(len(cmds)) for c in placement.node(i)[
        :layout["ranks_per_node"]]})]
    try:
        held = devices.acquire(names, lock_dir, lock_wait_s, job.label, say=lambda t: _say(job.log, t, echo))
    except (devices.DevicesBusy, devices.LockError) as e:
        job.fail(str(e))
        return Run("failed", json.loads(job.result.read_text()), job.result, job.log, 0.0, [], None,
                   False, layout, cmds)
    t0 = time.monotonic()
    try:
        with held:
            out, codes, pids = _launches(job, spec, cmds, envs, agent_logs, nodes, held, layout, echo, on_start)
    finally:
        n = launches.count(spec)
        for li in range(1, n + 1):
            watchdog.launch_path(job, li, n).unlink(missing_ok=True)
    rec = json.loads(job.result.read_text()) if job.result.exists() else None
    status = rec["status"] if rec else "failed"
    return Run(status, rec, job.result, job.log, time.monotonic() - t0,
               codes, out.killed if out else None, out.stray if out else False,
               layout, cmds, pids)
