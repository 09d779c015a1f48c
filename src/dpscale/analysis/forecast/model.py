"""A model of one data-parallel step at k devices, to forecast past the machine.

    t(B, k) = t_c(B) + f * T_ar(buckets, k) + sigma * E[max of k standard normals]

- compute t_c(B) = a + b B, the per-rank batch B in samples, fitted to k=1's step time
  (B / samples_per_s) at the batches measured there: weak scaling's per-rank batch and
  strong scaling's global batch (k=1 runs it on one device). With one batch only,
  a = 0 (the step proportional to the batch), stated in `compute_source`.
- communication: DDP all-reduces its gradient buckets; each bucket of S bytes costs
  ring   T = 2(k-1)/k * S / beta + 2(k-1) alpha      (Thakur, Rabenseifner, Gropp 2005)
  tree   T = 2 S / beta + 2 ceil(log2 k) alpha        (pipelined reduce + broadcast; stated
                                                      beside the ring, not used for e(k))
  alpha (s) and beta (bytes/s per link, nccl-tests' busbw) fitted by least squares
  to the all-reduce payload sweep at a measured k, on relative error (the sweep spans
  1 MiB to 1 GiB: absolute error would leave alpha to the largest payload's noise).
- overlap: f, the exposed fraction, measured where the training ran below the k
  predicted: the paired no_sync() probe at k', f = (synced - no_sync step time) /
  T_ar(DDP's buckets, k') with T_ar at k' from the fabric measured at k' (JAX, which has
  no probe: the weak step measured at k' less its compute and straggler terms). Chosen
  over DDP's hook timeline because the probe runs the same model, buckets and k as the
  training, and because it charges what NCCL's sharing of the SMs costs the backward
  pass (Echo, 2024) as well as what overlap hides (Li et al., VLDB 2020); f > 1 means
  the synced step costs more than the bare all-reduce of its buckets (the book's box:
  about 2). Anchored at k', the fabric's level cancels between T_ar(k') and T_ar(k);
  what it carries to k is its growth, 2(k-1)/k and the latency, and where it was
  measured at k itself, what it measured there.
  Where nothing ran below k (k=2) in one host and the ranks have nothing to run an
  all-reduce beside the backward (a CPU stand-in's rank pinned to its own cores: gloo's
  threads share them, dpscale.measure.torch_job.pin, and over loopback its transport is
  those cores' copies and sums), nothing is hidden: f = 1 (the 16-core stand-in's k=2
  probe, two rounds: 1.64 and 1.27). Across a link the core waits on the wire, and that
  can overlap (the two-node stand-in at 500 Mbit/s: f = 1 would say 37.9% where 46.7%
  was measured).
  f is a fraction of the tier it was measured against (the ring inside one node: every
  probe runs in one host) and multiplies that tier only. The tier between nodes is
  charged in full (exposed_inter = 1): nothing measured what of it hides, and an f fitted
  inside one node would carry the in-node fabric's level into it (f = C / T_node(k'):
  a 10x slower in-node sweep made f 10x smaller and raised a 4-nodes-of-8 forecast from
  92.4% to 94.0% in the audit of issue #44). So a slower tier, either one, never raises a
  forecast: the in-node level cancels (C T(k) / T(k')), the across-node one adds.
  Where nothing ran below k otherwise, the overlap is simulated (overlap="simulated"): bucket
  i is ready once the backward has produced the gradient bytes up to its end (DDP's
  bucket order; the backward taken as backward_share of t_c, producing bytes at an even
  rate), the buckets' all-reduces run one after another, and what runs past the
  backward's end is exposed.
- straggler: each step waits for the slowest of k ranks. With per-rank step times
  N(mu, sigma^2), E[max of k] = mu + sigma e_k, e_k = the expected maximum of k
  standard normals (order statistics, integrated exactly: e_1 = 0, e_2 = 0.564,
  e_4 = 1.03, e_8 = 1.42). Where the probe ran below k, sigma = c t_c(B), c from its
  no_sync() trials at k': each trial's (slowest - mean) / mean over the k' ranks is
  c e_k' (ranks computing side by side, no byte exchanged: what one lone rank's steps
  cannot show, ranks on cores that run at different speeds). Else sigma from k=1's
  step distribution: (p90 - p10) / (2 z_0.9).
- nodes: N nodes of G devices, hierarchical all-reduce (reduce-scatter in the node,
  all-reduce across nodes on 1/G of the data per device, all-gather in the node):
  T = 2(G-1)/G S / beta + 2(G-1) alpha  +  2(N-1)/N S / beta_node + 2(N-1) alpha_node,
  where beta_node is the node's injection bandwidth (all its NICs), shared by its G
  devices' shards of S/G each: G x S/G = S crosses it.
  A tier between nodes measured as a whole (a multi-node all-reduce's own times: a
  machine's own link, a cluster's nccl-tests output) is fitted whole (fit_whole),
  W(N) = 2(N-1)/N S / beta_whole + 2(N-1) alpha_whole, nothing of an in-node ring
  subtracted from it: subtracting the in-node file's ring (fit_internode) carried that
  file's level into the tier between nodes (a 1.5x slower in-node file left less of the
  measured time to the tier between nodes, whose growth with N then shrank: 104
  multi-node rows rose by up to 1.2 points, issue #54). Past one node such a tier runs
  beside the ring in each node, chunk by chunk (NCCL's ring keeps every link busy at
  once), and the slower of the two sets the time (pipelined_time):
  T = max(2(G-1)/G S / beta + 2(G-1) alpha, W(N)); the in-node part is hidden to f and
  the whole is charged in full (nothing measured what of it hides): exposed =
  max(f T_node, W(N)). At the file's own layout, its in-node ring inside its times,
  T = W(2): what it measured. A slower tier, either one, raises its term and never
  lowers the other, so it never raises a forecast. A whole tier read from NCCL's output
  (fabric_file) grows with the nodes as NCCL's flat ring over every rank, with its busbw
  after a 2-node tree taken at ring_scale_after_tree of the tree's (nccl_algorithm,
  across_time: why busbw falls from 2 nodes to 4 and then stays). Where the in-node ring alone is
  slower per byte than the whole that holds it (node_over_whole > 1), the two files
  cannot be one cluster's: a forecast that reads both is refused (fit.inconsistent).

Efficiency: weak e(k) = t(B, 1) / t(B, k); strong e(k) = t(G, 1) / (k t(G/k, k)).
Units: seconds, bytes, bytes/s; GB = 1e9 bytes (nccl-tests), never bits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np
from scipy import integrate, special, stats as sps

GB = 1e9                      # bytes per GB: bandwidths are in bytes/s
DDP_BUCKET_BYTES = 25 * 2**20   # torch DDP's bucket_cap_mb default
DDP_FIRST_BUCKET_BYTES = 2**20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


def bytes_per_s(GBps: float) -> float:
    return GBps * GB


# ---------------------------------------------------------------- fabric

@dataclass(frozen=True)
class Fabric:
    alpha_s: float            # latency per message step
    beta_Bps: float           # per-link bandwidth (busbw), bytes/s
    k: int                    # where it was measured
    source: str = ""
    whole: bool = False       # a tier between nodes fitted whole (fit_whole): its in-node part inside it
    # NCCL's algorithm at the whole tier's measured scale (nccl_algorithm): "ring", "tree", or "" (none read:
    # the two-tier growth 2(N-1)/N); nodes, per_node: the layout measured; ring_scale: NCCL's flat ring past
    # that scale runs at ring_scale x the measured busbw (1 for a ring; a tree at 2 nodes: ring_scale_after_tree)
    algo: str = ""
    nodes: int = 0
    per_node: int = 0
    ring_scale: float = 1.0


def ring_time(size_bytes: float, k: int, fab: Fabric) -> float:
    if k <= 1 or size_bytes <= 0:
        return 0.0
    return 2 * (k - 1) / k * size_bytes / fab.beta_Bps + 2 * (k - 1) * fab.alpha_s


def tree_time(size_bytes: float, k: int, fab: Fabric) -> float:
    if k <= 1 or size_bytes <= 0:
        return 0.0
    return 2 * size_bytes / fab.beta_Bps + 2 * math.ceil(math.log2(k)) * fab.alpha_s


def hierarchical_time(size_bytes: float, nodes: int, per_node: int, intra: Fabric, inter: Fabric) -> float:
    """Reduce-scatter + all-gather in the node (a ring all-reduce's two halves) and a
    ring all-reduce across the nodes of each device's 1/G shard, the G shards sharing
    the node's injection bandwidth inter.beta_Bps (a whole tier read as NCCL's: across_time)."""
    in_node = ring_time(size_bytes, per_node, intra)
    if nodes <= 1:
        return in_node
    return in_node + across_time(size_bytes, nodes, inter, per_node)


def fit_fabric(sizes: list[float], times_s: list[float], k: int, source: str = "") -> Fabric:
    """alpha, beta of the ring formula at k, least squares on relative error.
    One payload: alpha = 0 and beta from it (stated in `source`)."""
    S, t = np.asarray(sizes, float), np.asarray(times_s, float)
    steps, share = 2 * (k - 1), 2 * (k - 1) / k
    if len(S) < 2 or len(set(S)) < 2:
        return Fabric(0.0, float(share * S[0] / t[0]), k, f"{source} (one payload: alpha = 0)")
    A = np.column_stack([share * S, np.full_like(S, steps)]) / t[:, None]
    (inv_beta, alpha), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    if alpha < 0:   # latency below resolution: refit bandwidth alone
        inv_beta, alpha = float(np.sum(A[:, 0]) / np.sum(A[:, 0] ** 2)), 0.0
    return Fabric(float(alpha), float(1 / inv_beta), k, source)


def fit_internode(sizes, times_s, nodes: int, per_node: int, intra: Fabric, source: str = "") -> Fabric:
    """alpha, beta of the across-node tier of hierarchical_time, least squares on the
    relative error of what the measured times leave after the in-node ring of `intra`
    (per_node 1: nothing in the node). Raises ValueError where no bandwidth fits."""
    S, t = np.asarray(sizes, float), np.asarray(times_s, float)
    in_node = np.array([ring_time(x, per_node, intra) for x in S])
    share, steps = 2 * (nodes - 1) / nodes, 2 * (nodes - 1)
    A = np.column_stack([share * S, np.full_like(S, steps)]) / t[:, None]
    y = (t - in_node) / t
    (inv_beta, alpha), *_ = np.linalg.lstsq(A, y, rcond=None)
    if alpha < 0:   # latency below resolution: bandwidth alone, as fit_fabric
        inv_beta, alpha = float(A[:, 0] @ y / (A[:, 0] @ A[:, 0])), 0.0
    if not inv_beta > 0:
        raise ValueError(f"{source}: the intra-node tier alone takes longer than the measured times; "
                         "no across-node bandwidth fits")
    return Fabric(float(alpha), float(1 / inv_beta), nodes * per_node, source)


def fit_whole(sizes, times_s, nodes: int, per_node: int, source: str = "", algo: str = "") -> Fabric:
    """alpha, beta of a multi-node all-reduce measured as a whole, 2(N-1)/N S / beta +
    2(N-1) alpha over N nodes of per_node devices (its in-node part inside its times):
    fit_internode with nothing in the node subtracted, least squares on relative error.
    algo: NCCL's algorithm at this scale (nccl_algorithm), where the times are NCCL's: the
    tier then grows with the nodes as NCCL's flat ring (across_time), not as 2(N-1)/N."""
    free = Fabric(0.0, math.inf, per_node, "inside the whole")
    fab = replace(fit_internode(sizes, times_s, nodes, per_node, free, source), whole=True)
    if not algo:
        return fab
    return replace(fab, algo=algo, nodes=nodes, per_node=per_node,
                   ring_scale=ring_scale_after_tree(nodes * per_node) if algo == "tree" else 1.0)


# ---------------------------------------------------------------- NCCL's algorithm and the node count
#
# Why busbw changes with the node count (issue #54). NCCL builds flat rings over every rank, no
# 2-D ring (NVIDIA/nccl#471); a ring of n ranks moves 2(n-1)/n S through each node's NICs, so its
# busbw (nccl-tests' normalisation 2(n-1)/n) stays flat with n at large payloads (NVIDIA/nccl#1712:
# the largest payloads' busbw "basically the same" over node counts; the smaller ones fall with the
# ring's latency, 2(n-1) steps). "On 3+ nodes we should use rings for large enough sizes ... reflecting
# the total NIC bandwidth" (nccl-tests#160). On 2 nodes NCCL takes its tree (NVLSTree on NVSwitch
# nodes) for large payloads: "with Tree, on 2 nodes ... we have 2x less traffic on the network"
# and its busbw "can go up to ~2x the network speed" (NVIDIA/nccl#946; #812: "fewer inter-node data
# transmissions for that particular case. As you scale out beyond two nodes, the same effect will not be
# present"; NCCL's own tuning doubles NVLSTree's network bandwidth at nNodes <= 2, NVIDIA/nccl src/graph/tuning.cc).
# So a 2-node tree output overstates the ring that runs at 3+ nodes, by up to the traffic ratio
# 2(n-1)/n (the tree moves S per node, the ring 2(n-1)/n S), and by nothing where the tree was held
# by the node's inside instead. The ring's busbw past 2 nodes lies in [busbw_2 n/(2(n-1)), busbw_2]
# (below: at least the rate the tree drove the NICs at; above: NCCL chose the tree as the faster, and
# a node's NICs, where known, bound it too); the model takes the middle of that interval on the log
# scale, sqrt(n/(2(n-1))), for nothing in the outputs places it elsewhere.

def ring_scale_after_tree(ranks: int) -> float:
    """NCCL's ring busbw past 2 nodes over a 2-node tree's: the middle (log scale) of
    [n/(2(n-1)), 1], n the tree's ranks (see above)."""
    return math.sqrt(ranks / (2 * (ranks - 1))) if ranks > 1 else 1.0


def ring_after_tree_bounds(ranks: int) -> tuple[float, float]:
    """The interval ring_scale_after_tree is the middle of: (n/(2(n-1)), 1)."""
    return (ranks / (2 * (ranks - 1)) if ranks > 1 else 1.0), 1.0


def nccl_algorithm(nodes: int, per_node: int, stated: str | None = None) -> tuple[str, str]:
    """(algorithm, why) NCCL runs a large all-reduce with, on nodes x per_node ranks: the
    one the output states (NCCL_ALGO=...), else a ring on 3+ nodes or one rank per node
    (two ranks: tree and ring are one exchange), else the tree on 2 nodes (module notes)."""
    if stated:
        low = stated.lower()
        algo = "ring" if low.startswith("ring") else "tree" if "tree" in low else ""
        if algo:
            return algo, f"NCCL_ALGO={stated} stated in the output"
    if per_node <= 1:
        return "ring", "one rank per node: the ring over the nodes"
    if nodes >= 3:
        return "ring", "3+ nodes: NCCL's ring at large payloads (nccl-tests#160)"
    return "tree", "2 nodes: NCCL's tree at large payloads by default (NVIDIA/nccl#946, nccl-tests#309)"


def ring_of(whole: Fabric) -> tuple[float, float]:
    """(alpha, beta) of NCCL's flat ring over the whole tier's measured ranks that gives
    the same times as fit_whole's 2(N-1)/N S / beta + 2(N-1) alpha at its measured layout
    (beta in busbw units, per byte of 2(n-1)/n S)."""
    n, N = whole.nodes * whole.per_node, whole.nodes
    beta = whole.beta_Bps * (2 * (n - 1) / n) / (2 * (N - 1) / N)
    alpha = whole.alpha_s * (N - 1) / (n - 1)
    return alpha, beta


def pipelined_time(size_bytes: float, nodes: int, per_node: int, intra: Fabric, whole: Fabric) -> float:
    """A multi-node all-reduce whose tier between nodes was measured whole (fit_whole): the
    ring in each node and the whole across nodes run at once, the slower setting the time,
    max(2(G-1)/G S / beta + 2(G-1) alpha, 2(N-1)/N S / beta_whole + 2(N-1) alpha_whole)."""
    return max(ring_time(size_bytes, per_node, intra), across_time(size_bytes, nodes, whole, per_node))


def across_time(size_bytes: float, nodes: int, whole: Fabric, per_node: int | None = None) -> float:
    """The whole multi-node all-reduce over N nodes: 2(N-1)/N S / beta_whole + 2(N-1) alpha_whole.
    A tier read as NCCL's (whole.algo) on nodes of its measured size (per_node None or
    whole.per_node): at its measured node count what it measured; at any other, NCCL's
    flat ring over the n = N x G ranks, 2(n-1)/n S / (ring_scale beta_ring) + 2(n-1)
    alpha_ring (ring_of; ring_scale: 1 after a ring, ring_scale_after_tree after a tree)."""
    if nodes <= 1 or size_bytes <= 0:
        return 0.0
    if whole.algo and whole.nodes > 1 and whole.per_node and per_node in (None, whole.per_node) \
            and nodes != whole.nodes:
        alpha, beta = ring_of(whole)
        n = nodes * whole.per_node
        return 2 * (n - 1) / n * size_bytes / (whole.ring_scale * beta) + 2 * (n - 1) * alpha
    return 2 * (nodes - 1) / nodes * size_bytes / whole.beta_Bps + 2 * (nodes - 1) * whole.alpha_s


def node_over_whole(per_node: int, intra: Fabric, inter: Fabric) -> float:
    """Seconds per byte of the in-node ring over per_node devices, over those of the whole
    multi-node all-reduce at its measured layout (inter.k devices, nodes of per_node):
    (2(G-1)/G / beta) / (2(N-1)/N / beta_whole), the bandwidth terms (large payloads).
    Above 1 the ring of one node alone takes longer than the all-reduce that holds it."""
    nodes = max(2, inter.k // max(1, per_node))
    if per_node < 2 or intra.beta_Bps == math.inf:
        return 0.0
    return (2 * (per_node - 1) / per_node / intra.beta_Bps) / (2 * (nodes - 1) / nodes / inter.beta_Bps)


def ddp_buckets(grad_bytes: float) -> list[float]:
    """DDP's default buckets when they were not recorded: 1 MiB first, then 25 MiB."""
    out, left = [], float(grad_bytes)
    cap = DDP_FIRST_BUCKET_BYTES
    while left > 0:
        out.append(min(cap, left))
        left -= out[-1]
        cap = DDP_BUCKET_BYTES
    return out


# ---------------------------------------------------------------- straggler

_SQRT_2PI = np.sqrt(2 * np.pi)
Z_90 = sps.norm.ppf(0.9)   # once: scipy's distribution objects cost ~0.1 ms a call


def _phi(x: float) -> float:
    """The standard normal density, as scipy.stats.norm.pdf computes it (bit for bit),
    without its per-call argument handling: quad calls it ~200 times per k."""
    return np.exp(-x**2 / 2.0) / _SQRT_2PI


@lru_cache(maxsize=None)
def expected_max_normal(k: int) -> float:
    """E[max of k iid N(0, 1)] = int x k phi(x) Phi(x)^(k-1) dx."""
    if k <= 1:
        return 0.0
    val, _ = integrate.quad(lambda x: x * k * _phi(x) * special.ndtr(x) ** (k - 1), -12, 12)
    return float(val)


def sigma_from_steps(steps: dict | None) -> float | None:
    """Step-time standard deviation (s) from a rank's p10/p90 (ms), read as normal."""
    if not steps or steps.get("p10_ms") is None or steps.get("p90_ms") is None:
        return None
    return (steps["p90_ms"] - steps["p10_ms"]) / 1e3 / (2 * Z_90)


# ---------------------------------------------------------------- the step

@dataclass(frozen=True)
class StepModel:
    compute_a_s: float           # t_c(B) = a + b B
    compute_b_s: float
    fabric: Fabric | None        # None: no communication measured anywhere
    buckets: tuple = ()          # bytes per all-reduce, in DDP's launch order
    exposed: float = 1.0         # f
    sigma_s: float = 0.0         # per-rank step-time standard deviation (s)
    straggler_cv: float = 0.0    # c: per-rank standard deviation as a share of t_c(B)
    internode: Fabric | None = None
    per_node: int = 8
    overlap: str = "fraction"    # "fraction": f * T_ar; "simulated": the buckets against the backward
    backward_share: float = 2 / 3   # of t_c, for the simulation: backward ~ 2 x forward FLOPs
    exposed_inter: float = 1.0   # the across-node tier's paid fraction: in full, where nothing measured it
    notes: tuple = field(default=(), compare=False)
    rules: tuple = field(default=(), compare=False)   # the rules chosen after seeing data that this model used
    refused: str = ""            # why no k > 1 is forecast from these tiers ("": none refused)

    def with_(self, **kw) -> "StepModel":
        return replace(self, **kw)


def compute_time(m: StepModel, batch: float) -> float:
    return m.compute_a_s + m.compute_b_s * batch


def allreduce_time(m: StepModel, k: int, algo=None) -> float:
    """All of DDP's buckets at k: one node up to per_node devices, hierarchical past it;
    algo: ring_time (read when called) or tree_time."""
    if k <= 1 or m.fabric is None or not m.buckets:
        return 0.0
    return _buckets_time(float(sum(m.buckets)), len(m.buckets), *_fabric_at(m, k), algo or ring_time)


def allreduce_parts(m: StepModel, k: int) -> tuple[float, float]:
    """(in-node seconds, across-node seconds) of allreduce_time at k: past one node the
    in-node part is the ring over per_node devices (hierarchical_time's first term; of a
    tier fitted whole, what pipelined_time adds beyond it)."""
    total = allreduce_time(m, k)
    if m.internode is None or k <= m.per_node:
        return total, 0.0
    inside = allreduce_time(m, m.per_node)
    return inside, total - inside


def _fabric_at(m: StepModel, k: int) -> tuple:
    """_buckets_time's arguments after the buckets: (k, per_node, alpha, beta, inter),
    inter = (alpha, beta, whole) of the tier between nodes past one node, else None."""
    w = m.internode
    inter = (w.alpha_s, w.beta_Bps, w.whole, w.algo, w.nodes, w.per_node, w.ring_scale) \
        if w and k > m.per_node else None
    return k, m.per_node, m.fabric.alpha_s, m.fabric.beta_Bps, inter


@lru_cache(maxsize=65536)
def _buckets_time(total, n, k, per_node, alpha, beta, inter, algo) -> float:
    """Every formula is affine in S: n buckets cost the total bytes plus n latencies
    (pipelined_time, a max of two such, on the total: its n buckets taken as one)."""
    intra = Fabric(n * alpha, beta, k)
    if inter is None:
        return algo(total, k, intra)
    across = Fabric(n * inter[0], inter[1], 0, whole=inter[2], algo=inter[3], nodes=inter[4], per_node=inter[5],
                    ring_scale=inter[6])
    if inter[2]:
        return pipelined_time(total, math.ceil(k / per_node), per_node, intra, across)
    return hierarchical_time(total, math.ceil(k / per_node), per_node, intra, across)


def bucket_times(m: StepModel, k: int) -> list[float]:
    """Seconds of each of DDP's buckets' all-reduces at k, in DDP's launch order: what
    allreduce_time gives a model of that one bucket (built here without copying the
    model per bucket: the report's bootstrap bands call this some 10^5 times)."""
    if k <= 1 or m.fabric is None:
        return [0.0] * len(m.buckets)
    at = _fabric_at(m, k)
    return [_buckets_time(float(b), 1, *at, ring_time) for b in m.buckets]


def simulated_exposed(m: StepModel, k: int, batch: float) -> float:
    """Exposed seconds of the buckets' all-reduces behind a backward of backward_share x
    t_c(batch): bucket i ready when the backward has produced the bytes up to its end,
    each all-reduce starting when its bucket is ready and the one before it is done."""
    if k <= 1 or not m.buckets or m.fabric is None:
        return 0.0
    backward, total = m.backward_share * compute_time(m, batch), float(sum(m.buckets))
    done, end = 0.0, 0.0
    for size, t in zip(m.buckets, bucket_times(m, k)):
        done += size
        end = max(end, backward * done / total) + t
    return max(0.0, end - backward)


def exposed_comm_time(m: StepModel, k: int, batch: float) -> float:
    """What communication adds to a step at k."""
    if m.overlap == "simulated":
        return simulated_exposed(m, k, batch)
    if m.internode is not None and m.internode.whole and k > m.per_node and m.fabric is not None:
        return max(m.exposed * allreduce_time(m, m.per_node), m.exposed_inter * whole_time(m, k))
    inside, across = allreduce_parts(m, k)
    return m.exposed * inside + m.exposed_inter * across


def whole_time(m: StepModel, k: int) -> float:
    """The whole tier between nodes on all of DDP's buckets at k (pipelined_time's second
    term): the total bytes plus a latency per bucket."""
    n, whole = len(m.buckets), m.internode
    return across_time(float(sum(m.buckets)), math.ceil(k / m.per_node), replace(whole, alpha_s=n * whole.alpha_s),
                       m.per_node)


def straggler_time(m: StepModel, k: int, batch: float) -> float:
    return (m.sigma_s + m.straggler_cv * compute_time(m, batch)) * expected_max_normal(k)


def straggler_cv(shares, k: int) -> float:
    """c from a k-rank probe's per-trial straggler shares, (slowest - mean) / mean: their
    mean over e_k (the shares' expectation is c e_k; a step pays the mean, a slow
    trial included, so not the median, which a right-skewed max puts below it)."""
    return float(np.mean(shares)) / expected_max_normal(k) if k > 1 and len(shares) else 0.0


def step_time(m: StepModel, batch: float, k: int) -> float:
    return compute_time(m, batch) + exposed_comm_time(m, k, batch) + straggler_time(m, k, batch)


def weak_efficiency(m: StepModel, batch: float, k: int) -> float:
    return step_time(m, batch, 1) / step_time(m, batch, k)


def strong_efficiency(m: StepModel, global_batch: float, k: int) -> float:
    return step_time(m, global_batch, 1) / (k * step_time(m, global_batch / k, k))


def exposed_fraction(comm_s: float, m: StepModel, k: int) -> float:
    """f from a synced step's measured communication cost at k (clipped at 0: a negative
    difference is noise, not communication that saves time)."""
    t = allreduce_time(m.with_(exposed=1.0), k)
    return max(0.0, comm_s / t) if t > 0 else 0.0


def fit_compute(points: dict[float, float]) -> tuple[float, float, str]:
    """(a, b, how) of t_c(B) = a + b B from {per-rank batch: step seconds at k=1}."""
    bs = sorted(points)
    if len(bs) == 1:
        return 0.0, points[bs[0]] / bs[0], f"one batch ({bs[0]:g}): t_c proportional to B"
    b, a = np.polyfit(bs, [points[x] for x in bs], 1)
    return float(a), float(b), f"line through batches {', '.join(f'{x:g}' for x in bs)}"


def knee(ks: list[int], effs: list[float], threshold: float) -> int | None:
    """The last k before efficiency first falls below threshold (None: it never does)."""
    prev = None
    for k, e in sorted(zip(ks, effs)):
        if e < threshold:
            return prev
        prev = k
    return None
