"""The two-node stand-in: two network namespaces joined by a tbf-shaped veth
(dpscale.standin.netns) and a measurement run across them (dpscale.standin.twonode).

- the namespaces are made and always removed, also when the body raises, and a
  process left inside goes with them; a SIGKILLed creator's are found and removed;
- tbf holds the rate: one TCP stream across measures within 25% of it, at two rates
  4x apart;
- the pipeline's all-reduce sweep across the link (one rank per namespace, c10d
  rendezvous, gloo on the veths) sums correctly and its bus bandwidth is the link's;
- a rank SIGKILLed mid-run leaves a failed record, and no process, once the runner
  returns, and no namespace once the block ends.

Needs root, `ip` and `tc`; where namespaces cannot be made every test skips, saying why.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT

from dpscale.standin import netns, twonode

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

SRC = str(ROOT / "src")


def nodes_or_skip(rate: str, **kw):
    """netns.two_nodes, or a skip with its one-line reason."""
    try:
        netns.check_available()
    except netns.NetnsUnavailable as e:
        pytest.skip(str(e))
    return _SkipUnavailable(netns.two_nodes(rate, **kw))


class _SkipUnavailable:
    def __init__(self, cm):
        self.cm = cm

    def __enter__(self):
        try:
            return self.cm.__enter__()
        except netns.NetnsUnavailable as e:
            pytest.skip(str(e))

    def __exit__(self, *exc):
        return self.cm.__exit__(*exc)


def links_in(ns: str) -> str:
    return subprocess.run(["ip", "-n", ns, "-o", "link", "show"], capture_output=True, text=True).stdout


def test_rate_and_tbf_numbers():
    assert netns.parse_rate("1gbit") == 10**9 and netns.parse_rate("250mbit") == 250 * 10**6
    assert netns.parse_rate("1.5gbit") == 1_500_000_000 and netns.parse_rate(2_000_000) == 2_000_000
    for bad in ("1gbps", "fast", "10kbit"):
        with pytest.raises(ValueError):
            netns.parse_rate(bad)
    t = netns.Tbf.for_rate(10**9)
    assert t.burst_bytes == 125_000   # 1 ms at 125 MB/s, above one 64 KiB GSO packet
    assert netns.Tbf.for_rate(10**8).burst_bytes == 96 * 1024
    assert t.latency_ms >= 50 and t.record()["queue_limit_bytes"] >= 2 * netns.tcp_output_limit_bytes()
    assert t.tc_args("v0") == ["tc", "qdisc", "add", "dev", "v0", "root", "tbf", "rate", "1000000000bit",
                               "burst", "125000", "latency", f"{t.latency_ms:g}ms"]


def test_the_stand_in_plans_the_link_tier_and_the_machine():
    from dpscale.standin import standin
    two = [(j.experiment, j.k, j.per_node, j.folder) for j in standin.plan([1, 2], 1)]
    assert two == [("allreduce", 2, 1, ""), ("ddp_weak", 1, 1, ""), ("ddp_weak", 2, 1, ""),
                   ("ddp_comm_probe", 2, 1, "")]
    four = standin.plan([1, 2, 4], 2)
    assert [(j.experiment, j.k, j.across) for j in four if j.folder == "internode"] == [
        ("allreduce", 2, True), ("ddp_weak", 2, True), ("ddp_comm_probe", 2, True)]
    assert {(j.experiment, j.k, j.across) for j in four if j.folder == ""} == {
        ("allreduce", 2, False), ("allreduce", 4, True), ("ddp_weak", 1, False), ("ddp_weak", 2, False),
        ("ddp_weak", 4, True), ("ddp_comm_probe", 2, False), ("ddp_comm_probe", 4, True)}
    assert str(four[0].path(Path("out"))) == "out/internode/runs/allreduce/default/k2.json"
    with pytest.raises(ValueError, match="cannot be placed"):
        standin.plan([3], 2)


def test_namespaces_are_made_and_always_removed():
    with nodes_or_skip("100mbit") as n:
        names = n.names
        assert set(names) <= set(netns.list_namespaces())
        assert names[0] != names[1] and all(nm.startswith(f"{netns.PREFIX}-{os.getpid()}-") for nm in names)
        for ns, veth, addr in zip(n.names, n.veths, n.addrs):
            assert veth in links_in(ns) and "lo:" in links_in(ns)
            addrs = subprocess.run(["ip", "-n", ns, "-o", "-4", "addr"], capture_output=True, text=True).stdout
            assert f"{addr}/30" in addrs
            qd = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", veth],
                                capture_output=True, text=True).stdout
            assert "tbf" in qd and "100Mbit" in qd, qd
        # nothing of it in the machine's own namespace
        assert subprocess.run(["ip", "link", "show", n.veths[0]], capture_output=True).returncode != 0
        left = subprocess.Popen([*n.exec_prefix(1), "sleep", "60"], start_new_session=True)
        time.sleep(0.3)
    assert not set(names) & set(netns.list_namespaces())
    assert left.wait(timeout=10) is not None   # the process left inside went with its namespace

    with pytest.raises(RuntimeError, match="boom"):
        with nodes_or_skip("100mbit") as n:
            names = n.names
            raise RuntimeError("boom")
    assert not set(names) & set(netns.list_namespaces())


def test_stale_namespaces_of_a_killed_run_are_removed():
    code = ("import sys, time; from dpscale.standin import netns\n"
            "with netns.two_nodes('100mbit') as n:\n"
            "    print(' '.join(n.names), flush=True); time.sleep(120)\n")
    with nodes_or_skip("100mbit") as mine:   # a live run's: must stay
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": SRC})
        try:
            theirs = p.stdout.readline().split()
        finally:
            p.kill()   # SIGKILL: its finally never runs
            p.wait()
        assert len(theirs) == 2 and set(theirs) <= set(netns.list_namespaces())
        removed = netns.cleanup_stale()
        assert sorted(removed) == sorted(theirs)
        now = set(netns.list_namespaces())
        assert not set(theirs) & now and set(mine.names) <= now


def test_tbf_holds_the_rate_at_two_rates():
    got = {}
    for rate, seconds in (("100mbit", 1.5), ("400mbit", 1.5)):
        with nodes_or_skip(rate) as n:
            r = netns.tcp_throughput(n, int(netns.parse_rate(rate) / 8 * seconds))
        assert 0.75 <= r["of_rate"] <= 1.25, (rate, r)
        got[rate] = r["Bps"]
    assert 3.2 <= got["400mbit"] / got["100mbit"] <= 4.8, got


def two_node_spec(tiny_data, experiment="allreduce", proto=None, limit_s=90):
    """The spec the workflow builds for k=2 on 2 nodes of 1 rank (spec['launch'])."""
    from conftest import CPU_FP, TINY
    from dpscale.plan import specs
    resolved = {"scale": "smoke", "protocol": {**TINY, **(proto or {})}, "ks": [1, 2], "tuned": False,
                "watchdog": {"hang_timeout_s": limit_s, "grace_s": 3}, "experiments": [experiment],
                "cluster": {"nodes": 2, "gpus_per_node": 1}}
    inputs = {"cache": str(tiny_data / "fmnist_16px.npz"), "cache_meta": str(tiny_data / "fmnist_16px.json"),
              "data_root": str(tiny_data)}
    spec = specs.job_spec(resolved, CPU_FP, experiment, "default", 2, inputs)
    assert spec["launch"] == {"nodes": 2, "gpus_per_node": 1} and not spec["skip_reason"]
    return spec


ONE_EACH = twonode.Placement(((0,), (1,)), threads=1)


def test_node_commands_are_the_multinode_launch_per_namespace(tiny_data):
    spec = two_node_spec(tiny_data)
    nodes = netns.TwoNodes(("nsA", "nsB"), ("vA", "vB"), ("10.213.0.1", "10.213.0.2"), "10.213.0.0/30",
                           netns.Tbf.for_rate(10**9))
    try:
        cmds = twonode.node_commands(spec, "r.json", "r.log.ranks", nodes, ONE_EACH, rdzv_id="4242")
    except netns.NetnsUnavailable as e:
        pytest.skip(str(e))
    from dpscale.run import command as launch
    port = launch.rdzv_port("4242")
    for i, cmd in enumerate(cmds):
        at = cmd.index("taskset")
        assert cmd[:at][-3:] == ["netns", "exec", nodes.names[i]] and cmd[at:at + 3] == ["taskset", "-c", str(i)]
        tr = cmd[at + 3:]
        assert os.path.basename(tr[0]) == "torchrun" and "--standalone" not in tr
        assert tr[1:9] == ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                           f"--rdzv-endpoint=10.213.0.1:{port}", "--rdzv-id=4242", f"--node-rank={i}",
                           f"--local-addr={nodes.addrs[i]}", f"--rdzv-conf=is_host={int(i == 0)}"]
        tail = launch.worker_command(spec, "r.json", "r.log.ranks")
        assert tr[9:] == tail[tail.index("--log-dir"):]
    two_per_side = twonode.Placement(((0, 1), (2, 3)), threads=1)
    spec4 = {**spec, "k": 4, "launch": {"nodes": 2, "gpus_per_node": 2}}
    cmd = twonode.node_commands(spec4, "r.json", "r.log.ranks", nodes, two_per_side, rdzv_id="1")[1]
    assert cmd[cmd.index("taskset"):][:3] == ["taskset", "-c", "2,3"]
    assert cmd[cmd.index(str(twonode.PIN)):][:5] == [str(twonode.PIN), "--cpus", "2,3", "--", str(twonode.WORKER)]
    env = twonode.node_env(spec, "vB", 1, base={"OMP_NUM_THREADS": "8", "RANK": "3", "SLURM_JOB_ID": "9", "X": "1"})
    assert env["GLOO_SOCKET_IFNAME"] == "vB" and env["OMP_NUM_THREADS"] == "1" and env["X"] == "1"
    assert "RANK" not in env and "SLURM_JOB_ID" not in env


@pytest.mark.slow
def test_allreduce_sweep_across_the_link_is_right_and_runs_at_the_link_rate(tiny_data, tmp_path):
    spec = two_node_spec(tiny_data, proto={"allreduce_MiB": [0.25, 2], "allreduce_iters": 5})
    with nodes_or_skip("200mbit") as n:
        run = twonode.run_measurement(spec, tmp_path / "k2.json", tmp_path / "k2.log.ranks", n, ONE_EACH,
                                      lock_dir=str(tmp_path / "locks"))
        assert not netns.pids_in(n.names[0]) and not netns.pids_in(n.names[1])
    log = run.log.read_text()
    assert run.status == "ok", log[-4000:]
    m = run.result["metrics"]
    assert m["wrong_total"] == 0 and m["correct"], m
    assert sorted(sum(run.layout["global_ranks_by_node"].values(), [])) == [0, 1]
    assert all(len(r) == 1 for r in run.layout["global_ranks_by_node"].values())   # one rank each side
    assert log.count("--rdzv-backend=c10d") == 2 and "--standalone" not in log   # one agent per namespace
    link_Bps = 200e6 / 8
    big = max(m["table"]["in_place"], key=lambda r: r["bytes"])
    # k=2: the ring moves S each way, busbw = S / t; TCP/IP headers leave ~95% of the rate
    assert 0.7 <= big["busbw_GBps"] * 1e9 / link_Bps <= 1.1, big
    assert (tmp_path / "k2.node0.rank0.log").exists() and (tmp_path / "k2.node1.rank0.log").exists()


def _rank_pid(nodes: netns.TwoNodes, rank: int, deadline: float) -> tuple[int, list[int]]:
    """The pid of the worker process with RANK=rank, and every pid in both namespaces."""
    while time.monotonic() < deadline:
        every = netns.pids_in(nodes.names[0]) + netns.pids_in(nodes.names[1])
        for pid in every:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"torch_worker.py" in cmd and f"RANK={rank}".encode() in environ:
                return pid, every
        time.sleep(0.2)
    raise AssertionError(f"no rank {rank} process appeared")


@pytest.mark.slow
def test_a_sigkilled_rank_leaves_no_process_and_no_namespace(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setenv("DPSCALE_FAULT", "hang:rank=1:at=init")   # both ranks up, then rank 1 waits forever
    spec = two_node_spec(tiny_data, limit_s=90)
    box: dict = {}
    with nodes_or_skip("200mbit") as n:
        t = threading.Thread(target=lambda: box.update(run=twonode.run_measurement(
            spec, tmp_path / "k2.json", tmp_path / "k2.log.ranks", n, ONE_EACH, lock_dir=str(tmp_path / "locks"))))
        t0 = time.monotonic()
        t.start()
        victim, seen = _rank_pid(n, 1, time.monotonic() + 60)
        time.sleep(1.0)   # past its init: rank 0 now waits on it in a collective
        cpus = Path(f"/proc/{victim}/status").read_text().split("Cpus_allowed_list:")[1].split()[0]
        os.kill(victim, signal.SIGKILL)
        t.join(timeout=120)
        assert not t.is_alive(), "the runner did not return"
        seen += netns.pids_in(n.names[0]) + netns.pids_in(n.names[1])
        assert not netns.pids_in(n.names[0]) and not netns.pids_in(n.names[1])
        names = n.names
    assert not set(names) & set(netns.list_namespaces())
    alive = [p for p in seen if netns.alive(p)]
    assert not alive, alive
    run = box["run"]
    assert run.status == "failed" and run.result["status"] == "failed", run.result
    assert "SIGKILL" in run.result["reason"], run.result["reason"]
    assert time.monotonic() - t0 < 60, "ended by the kill, not by the limit"
    assert cpus in ("0", "1")   # the rank was pinned to its node's one core
