"""Two "nodes" on one machine: two network namespaces joined by a rate-limited veth pair.

    with two_nodes("1gbit") as nodes:        # NetnsUnavailable where it cannot be made
        nodes.names    -> ("dpsn-<pid>-<start>-<tag>-0", "...-1")
        nodes.veths    -> ("dpsn<tag>a", "dpsn<tag>b")     (each inside its namespace)
        nodes.addrs    -> ("10.x.y.1", "10.x.y.2")          (one private /30)
        nodes.exec_prefix(i) -> ["ip", "netns", "exec", names[i]]

Each end's egress goes through `tc qdisc add dev <veth> root tbf rate R burst B
latency L` (the kernel here has tbf and htb, no netem): every byte that crosses
from one namespace to the other is shaped to R, in each direction independently
(a full-duplex link of R per direction, as a NIC's). Traffic between processes of
one namespace goes over its loopback and is not shaped: that is the "node"'s
inside.

The veth is created with both ends directly inside their namespaces (`ip link add
A netns N0 type veth peer name B netns N1`): no interface ever appears in the
machine's own namespace, and nothing of the machine's own interfaces, addresses or
routes is touched. Deleting the namespaces deletes the veth.

Names carry a prefix, the creating process's pid and start time (clock ticks since
boot, so a reused pid is not mistaken for the creator), and a random tag: two runs
never collide, and cleanup_stale() can tell the namespaces of a run that died
(SIGKILL skips every `finally`) from those of one still running. two_nodes() calls
it before it creates its own.

No torch here: tests and the scripts import this cheaply.
"""
from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "dpsn"
# The private block the /30 is drawn from; a /30 overlapping any address or route
# seen on this machine (its own namespace or any other) is never used.
POOL = ipaddress.ip_network("10.213.0.0/16")
CMD_TIMEOUT_S = 20
NAME = re.compile(r"^(?P<prefix>[A-Za-z][\w]*)-(?P<pid>\d+)-(?P<start>\d+)-(?P<tag>[0-9a-f]+)-(?P<i>[01])$")


# What `ip`/`tc` say where the machine, not our arguments, is the problem.
UNAVAILABLE = re.compile(r"Operation not permitted|Permission denied|EPERM|not supported|No such file|"
                         r"Unknown qdisc|qdisc kind is unknown|Cannot find device|mount.*failed|"
                         r"Read-only file system", re.I)


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no `ip`, EPERM in a
    container, no tbf). The message is one line saying why; callers skip."""


# ---------------------------------------------------------------- the link's numbers

RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit)?\s*$", re.I)
UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}   # tc's: SI, bits


def parse_rate(text: str | int | float) -> int:
    """'1gbit' -> 1_000_000_000 bits/s (tc's units: bit, kbit, mbit, gbit, tbit, powers
    of 1000; a bare number is bits/s). Bytes-per-second units (tc's 'mbps') are
    refused: they are a classic factor-8 mistake."""
    if isinstance(text, (int, float)):
        bps = float(text)
    else:
        m = RATE.match(text)
        if not m:
            raise ValueError(f"rate {text!r}: write a number of bits/s with a unit of "
                             f"{', '.join(UNITS)} (e.g. 1gbit, 250mbit)")
        bps = float(m.group(1)) * UNITS[(m.group(2) or "bit").lower()]
    if bps < 1e5:
        raise ValueError(f"rate {text!r}: {bps:g} bit/s is below 100kbit; tbf and TCP would not hold it")
    return int(bps)


def tcp_output_limit_bytes() -> int:
    """TCP small queues: how many bytes one socket may have queued below it (in the
    qdisc) at once; 4 MiB on current kernels."""
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_limit_output_bytes").read_text())
    except (OSError, ValueError):
        return 4 << 20


@dataclass(frozen=True)
class Tbf:
    """One direction's shaper: `tc qdisc add dev <veth> root tbf rate R burst B latency L`."""
    rate_bps: int
    burst_bytes: int
    latency_ms: float
    mtu: int = 1500

    @classmethod
    def for_rate(cls, rate_bps: int, mtu: int = 1500) -> "Tbf":
        """The bucket and the queue for a rate.

        burst: the bucket's depth, i.e. what may leave at line speed after an idle
        gap. It must hold the largest packet the qdisc sees whole (veth does GSO:
        up to 64 KiB per skb; tbf would otherwise cut every one into MTU segments),
        and enough tokens to ride out a late dequeue without losing rate (tokens
        past a full bucket are lost). The old rule burst >= rate/HZ (HZ=250: 500 KB
        at 1 Gbit/s) dates from jiffy timers; tbf's watchdog is an hrtimer now, so
        1 ms at the rate is plenty. Small matters: every payload gets up to `burst`
        free, so a 250 KiB all-reduce at 1 Gbit/s with a 500 KB bucket would read
        at twice the link's rate. So: max(96 KiB, 1 ms at the rate) -> 125 kB at
        1 Gbit/s (0.3% of ResNet-18's 44.7 MB gradient, 12% of a 1 MiB payload).

        latency: how long a packet may wait in the queue; it sets the queue's size
        (limit = rate x latency + burst). A queue that overflows drops, and TCP
        halves its window: the link would read slower than its rate. One socket
        keeps at most tcp_limit_output_bytes (4 MiB) below it, so the queue holds
        two sockets' worth, at least 50 ms -> 67 ms at 1 Gbit/s. A bulk transfer's
        throughput does not depend on it (the queue drains at the rate)."""
        rate_Bps = rate_bps / 8
        burst = int(max(96 * 1024, rate_Bps * 1e-3))
        latency_ms = max(50.0, 1e3 * 2 * tcp_output_limit_bytes() / rate_Bps)
        return cls(int(rate_bps), burst, round(latency_ms, 1), mtu)

    def tc_args(self, dev: str) -> list[str]:
        return ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{self.rate_bps}bit",
                "burst", str(self.burst_bytes), "latency", f"{self.latency_ms:g}ms"]

    def record(self) -> dict:
        return {"rate_bps": self.rate_bps, "rate_GBps": self.rate_bps / 8 / 1e9, "burst_bytes": self.burst_bytes,
                "latency_ms": self.latency_ms, "queue_limit_bytes": int(self.rate_bps / 8 * self.latency_ms / 1e3
                                                                        + self.burst_bytes),
                "mtu": self.mtu}


# ---------------------------------------------------------------- commands

def _ip_binary() -> str:
    ip = shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip") if os.path.exists(p)),
                                    None)
    if not ip:
        raise NetnsUnavailable("network namespaces unavailable: no `ip` binary (iproute2) on PATH")
    return ip


def _run(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(args, capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    if check and p.returncode != 0:
        raise subprocess.CalledProcessError(p.returncode, args, p.stdout, p.stderr)
    return p


def _one_line(e: Exception) -> str:
    if isinstance(e, subprocess.CalledProcessError):
        err = " ".join((e.stderr or e.stdout or "").split()) or f"exit code {e.returncode}"
        return f"`{' '.join(e.cmd[:5])}` failed: {err}"
    return " ".join(str(e).split())


def check_available() -> None:
    """Raise NetnsUnavailable (one line) where namespaces cannot be made at all;
    the real test is making them (two_nodes), which raises the same."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        raise NetnsUnavailable("network namespaces unavailable: creating them needs root (euid 0)")
    _ip_binary()
    if not shutil.which("tc") and not os.path.exists("/usr/sbin/tc"):
        raise NetnsUnavailable("network namespaces unavailable: no `tc` binary (iproute2) to shape the link")


def list_namespaces() -> list[str]:
    p = _run([_ip_binary(), "netns", "list"], check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def pids_in(ns: str) -> list[int]:
    p = _run([_ip_binary(), "netns", "pids", ns], check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit()]


def _proc_start(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie does not)."""
    return _proc_start(pid) is not None


def kill_all(pids: list[int], grace_s: float = 2.0) -> None:
    """SIGTERM, then SIGKILL what is left after grace_s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                left.append(pid)
            except ProcessLookupError:
                pass
        if not left:
            return
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5)
        while time.monotonic() < deadline and any(_proc_start(p) is not None for p in left):
            time.sleep(0.05)
        pids = [p for p in left if _proc_start(p) is not None]


def delete_namespace(ns: str) -> None:
    """Kill what still runs inside (a namespace lives on while a process holds it,
    and so does its veth), then delete it. Never raises: teardown must finish."""
    try:
        kill_all(pids_in(ns))
        _run([_ip_binary(), "netns", "del", ns], check=False)
    except (OSError, subprocess.SubprocessError, NetnsUnavailable):
        pass


def cleanup_stale(prefix: str = PREFIX) -> list[str]:
    """Delete every namespace named by this module with `prefix` whose creating
    process is gone (or its pid now belongs to a later process): what a SIGKILLed
    run left. Namespaces of live creators, and every other namespace, are left
    alone. Returns the names deleted."""
    gone = []
    for ns in list_namespaces():
        m = NAME.match(ns)
        if not m or m["prefix"] != prefix:
            continue
        if _proc_start(int(m["pid"])) == int(m["start"]):
            continue   # its creator is alive
        delete_namespace(ns)
        gone.append(ns)
    return gone


# ---------------------------------------------------------------- addresses

def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 address and route this machine shows, in its own namespace and in
    every named one: the /30 must not overlap any of them."""
    ip = _ip_binary()
    texts = [_run([ip, "-o", "-4", "addr", "show"], check=False).stdout,
             _run([ip, "-4", "route", "show", "table", "all"], check=False).stdout]
    for ns in list_namespaces():
        texts.append(_run([ip, "-n", ns, "-o", "-4", "addr", "show"], check=False).stdout)
    nets = []
    for tok in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)\b", "\n".join(texts)):
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.ip_network(tok, strict=False))
    return nets


def pick_subnet(used: list | None = None, rng: random.Random | None = None) -> ipaddress.IPv4Network:
    used = _used_networks() if used is None else used
    rng = rng or random.Random(secrets.randbits(32))
    candidates = list(POOL.subnets(new_prefix=30))
    for _ in range(256):
        net = rng.choice(candidates)
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise NetnsUnavailable(f"network namespaces unavailable: no free /30 in {POOL} (every one tried overlaps "
                           "an address or route of this machine)")


# ---------------------------------------------------------------- the two nodes

@dataclass
class TwoNodes:
    names: tuple[str, str]
    veths: tuple[str, str]
    addrs: tuple[str, str]
    subnet: str
    tbf: Tbf
    created: list[str] = field(default_factory=list)

    def exec_prefix(self, i: int) -> list[str]:
        return [_ip_binary(), "netns", "exec", self.names[i]]

    def record(self) -> dict:
        """What a result's sidecar says about the link."""
        return {"namespaces": list(self.names), "veths": list(self.veths), "addrs": list(self.addrs),
                "subnet": self.subnet, "tbf": self.tbf.record(),
                "tc": [" ".join(self.tbf.tc_args(v)) for v in self.veths],
                "shaped": "each veth's egress: both directions, independently (full duplex)"}


def _names(prefix: str) -> tuple[tuple[str, str], tuple[str, str]]:
    pid = os.getpid()
    tag = secrets.token_hex(3)
    start = _proc_start(pid) or 0
    ns = tuple(f"{prefix}-{pid}-{start}-{tag}-{i}" for i in (0, 1))
    veth = (f"{prefix[:6]}{tag}a", f"{prefix[:6]}{tag}b")   # <= 15 characters (IFNAMSIZ)
    return ns, veth


def _build(nodes: TwoNodes) -> None:
    ip = _ip_binary()
    n0, n1 = nodes.names
    v0, v1 = nodes.veths
    for ns in nodes.names:
        _run([ip, "netns", "add", ns])
        nodes.created.append(ns)
        _run([ip, "-n", ns, "link", "set", "lo", "up"])
    _run([ip, "link", "add", v0, "netns", n0, "type", "veth", "peer", "name", v1, "netns", n1])
    net = ipaddress.ip_network(nodes.subnet)
    for ns, dev, addr in zip(nodes.names, nodes.veths, nodes.addrs):
        _run([ip, "-n", ns, "addr", "add", f"{addr}/{net.prefixlen}", "dev", dev])
        _run([ip, "-n", ns, "link", "set", dev, "mtu", str(nodes.tbf.mtu), "up"])
        _run([ip, "netns", "exec", ns, *nodes.tbf.tc_args(dev)])


@contextlib.contextmanager
def two_nodes(rate: str | int = "1gbit", prefix: str = PREFIX, clean_stale: bool = True):
    """Two namespaces joined by a veth shaped to `rate` each way (see the module doc);
    yields a TwoNodes. Teardown always runs: both namespaces (and with them the
    veth, and any process left inside) are gone when the block exits, whether it
    returns or raises. Raises NetnsUnavailable (one line) where they cannot be made."""
    check_available()
    tbf = Tbf.for_rate(parse_rate(rate))
    if clean_stale:
        cleanup_stale(prefix)
    names, veths = _names(prefix)
    net = pick_subnet()
    hosts = [str(h) for h in net.hosts()]
    nodes = TwoNodes(names, veths, (hosts[0], hosts[1]), str(net), tbf)
    try:
        try:
            _build(nodes)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
            if UNAVAILABLE.search(_one_line(e)):   # the machine's limits: callers skip
                raise NetnsUnavailable(f"network namespaces unavailable: {_one_line(e)}") from e
            raise RuntimeError(f"making the two namespaces failed: {_one_line(e)}") from e
        yield nodes
    finally:
        for ns in nodes.created:
            delete_namespace(ns)


# ---------------------------------------------------------------- a bulk transfer across

_RECEIVER = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0)); s.listen(1); print(s.getsockname()[1], flush=True)
c, _ = s.accept(); buf = bytearray(1 << 20); n = 0; t0 = t1 = None
while True:
    r = c.recv_into(buf)
    if not r:
        break
    t1 = time.perf_counter(); t0 = t0 or t1; n += r
print(n, (t1 or 0) - (t0 or 0), flush=True)
"""
_SENDER = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); chunk = b"x" * (1 << 20); left = int(sys.argv[3])
while left > 0:
    left -= c.send(chunk[:min(left, len(chunk))])
c.close()
"""


def tcp_throughput(nodes: TwoNodes, n_bytes: int, src: int = 0, python: str | None = None,
                   timeout_s: float = 120) -> dict:
    """One TCP stream of n_bytes from namespace `src` to the other, measured by the
    receiver from its first byte to its last (the first `burst` bytes cross at line
    speed: n_bytes should be many bursts). Returns {"bytes", "seconds", "Bps",
    "bps", "of_rate"} (of_rate: the payload's rate over the configured one; TCP/IP
    headers take ~4% of each 1500-byte frame, so ~0.95 is the ceiling)."""
    import sys
    python = python or sys.executable
    dst = 1 - src
    recv = subprocess.Popen([*nodes.exec_prefix(dst), python, "-c", _RECEIVER, nodes.addrs[dst]],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        port = int(recv.stdout.readline())
        subprocess.run([*nodes.exec_prefix(src), python, "-c", _SENDER, nodes.addrs[dst], str(port), str(n_bytes)],
                       check=True, timeout=timeout_s, capture_output=True)
        out, _ = recv.communicate(timeout=timeout_s)
        got, secs = out.split()
        got, secs = int(got), float(secs)
    finally:
        if recv.poll() is None:
            os.killpg(recv.pid, signal.SIGKILL)
            recv.wait()
    Bps = got / secs if secs > 0 else float("inf")
    return {"bytes": got, "seconds": secs, "Bps": Bps, "bps": 8 * Bps, "of_rate": 8 * Bps / nodes.tbf.rate_bps}
