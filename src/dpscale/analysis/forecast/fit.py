"""The step model of one series at one k, built only from what a rule allows. The model
reads the series through inputs.Reading, so what it used is what it read (the log), not
a list it declares.

Rules (what a model of k may read besides k=1's compute and spread):
  at_k     the fabric at k: the bare all-reduce sweep at k (across nodes: the measured
           link), the part nccl-tests gives for a cluster never trained on; the overlap
           from the probe (or the weak step) at the largest k' < k
  below_k  only sweeps and probes at k' < k: nothing measured at k
  any      everything measured, one model for the forecast's grid: the sweep and the
           probe at the largest k each ran at
Under at_k and below_k the straggler term and the band's spread come from below k too
(the probe's ranks at the largest k' < k; the replicate spread of the largest measured k' < k).

Fabric tiers for the grid (rule "any"), per tier (in one node; between nodes), in order:
a file the user gave (`dpscale forecast --fabric`, a configured forecast.fabric_files),
the machine's own measurement, the default files (the schema's forecast.fabric_files).
Each model says which source each tier took (StepModel.notes, `tier_sources`). A file
never checks this machine: the at_k and below_k rules read the machine's own only.

The band (predict.band, misfit.py) is where a measurement at k should fall: the
percentile interval over bootstrap draws of the model refitted to resampled inputs (k=1's
replicates, each sweep's payloads jittered by their calls' spread, the probe's pairs), the
spread of the measured mean on top where it is known (cv / sqrt(n) of the largest measured
k' below), and the model's own misfit, estimated out of sample (misfit.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpscale.analysis.forecast import model as fc
from dpscale.analysis.forecast.inputs import Reading, Sweep, Used

RULES = ("at_k", "below_k", "any")
IN_NODE, ACROSS = "in one node", "between nodes"


@dataclass(frozen=True)
class ChosenRule:
    """A rule of the model chosen after its author saw measured rows: a row scores it only
    if it was measured after `chosen_utc` (check.eligibility says so per row)."""
    name: str
    chosen_utc: str
    evidence: str


PINNED_F1 = ChosenRule(
    "f = 1 where nothing ran below k, in one host, for gloo ranks pinned to their own cores (not across a link)",
    "2026-12-04T14:26:21+00:00",
    "the 16-core stand-in's k=2 probe (1.64, 1.27; reference/h200/logs/gpu/cpu_standin16/two-rounds-in-a-row/README.md) and "
    "the two-node stand-in's k=2 row (f = 1 would say 37.9% where 46.7% was measured), which chose 'not across a link'")
CHOSEN = {r.name: r for r in (PINNED_F1,)}


@dataclass(frozen=True)
class Given:
    """Fabric tiers from outside the machine's own results (fabric files), or None.
    explicit: the user's files (used for the tiers they cover, over the machine's own);
    else the schema's default files (used only for a tier the machine did not measure)."""
    intra: fc.Fabric | None = None
    inter: fc.Fabric | None = None
    per_node: int | None = None      # the layout the tier between nodes was measured on
    source: str = ""
    explicit: bool = False
    intra_source: str = ""
    inter_source: str = ""
    mixed: str = ""                  # the files' two GPU models, said in one line ("": one model)
    intra_neglected: bool = False    # intra is the free link a multi-host file alone implies: no file
    #                                  covers the in-node tier, so a machine's own sweep goes first


def compute_line(s: Reading, rng=None) -> tuple[float, float, str] | None:
    """t_c(B) = a + b B through k=1's step time at the weak and strong batches."""
    pts = {}
    for scaling in ("weak", "strong"):
        batch = s.batch(scaling, 1)
        if 1 in s.rates(scaling) and batch:
            pts[batch] = batch / s.rates(scaling)[1].estimate(rng)
    if not pts:
        return None
    return fc.fit_compute(pts)


def _pick(ks, k: int, rule: str) -> int | None:
    if rule == "at_k":
        return k if k in ks else None
    if rule == "below_k":
        return max((x for x in ks if x < k), default=None)
    return max(ks, default=None)


def fit_sweep(sw: Sweep, rng=None) -> fc.Fabric:
    b, t = sw.window().draw(rng)
    return fc.fit_fabric(b, t, sw.k, f"all-reduce sweep at k={sw.k}")


def _given_tier(given: Given, which: str, log: list) -> tuple[fc.Fabric, str]:
    fab, name = (given.intra, given.intra_source) if which == IN_NODE else (given.inter, given.inter_source)
    how = "given" if given.explicit else "default file, forecast.fabric_files"
    log.append(Used("fabric file", None, f"{which}: {name}"))
    return fab, f"{name} ({how})"


def fabric(s: Reading, k: int, nodes: int, per_node: int, rule: str, given: Given,
           rng=None) -> tuple[fc.Fabric | None, str]:
    """The in-node ring for a model of k on `nodes` nodes of per_node devices, and its
    source: a given file first (rule "any" only), else the machine's one-node sweep (at k,
    or at most per_node across nodes, as the rule allows), else a default file."""
    if rule == "any" and given.explicit and given.intra is not None and not given.intra_neglected:
        return _given_tier(given, IN_NODE, s.log)
    ks = list(s.sweeps)
    pick = max((x for x in ks if x <= per_node), default=None) if nodes > 1 and rule != "any" else _pick(ks, k, rule)
    if pick is not None:
        return fit_sweep(s.sweeps[pick], rng), f"this machine's all-reduce sweep at k={pick}"
    if rule == "any" and given.intra is not None:   # another GPU's ring never checks this machine's
        return _given_tier(given, IN_NODE, s.log)
    return None, "none measured"


def internode(s: Reading, k: int, rule: str, given: Given, intra: fc.Fabric | None, rng=None, *,
              per_node: int | None = None) -> tuple[fc.Fabric | None, str]:
    """The across-node tier and its source: a given file first (rule "any"), else the
    machine's own measured link (below k under below_k), else a default file measured
    on nodes of per_node devices (one of another layout is not used, and says why)."""
    if rule == "any" and given.explicit and given.inter is not None:
        return _given_tier(given, ACROSS, s.log)
    at = internode_k(s)
    if at is not None and not (rule == "below_k" and at >= k):
        sw = s.internode
        g = max(1, sw.k // sw.nodes)
        what = f"the measured link: {sw.nodes} nodes x {g}"
        try:   # whole: nothing of the in-node tier subtracted (model.py, fit_whole)
            fab = fc.fit_whole(*sw.window().draw(rng), sw.nodes, g, what)
        except ValueError:   # a bootstrap draw with no bandwidth in it: the sweep as measured
            fab = fc.fit_whole(*sw.window().draw(), sw.nodes, g, what)
        return fab, f"this machine's all-reduce across {sw.nodes} nodes of {g} (k={sw.k})"
    if rule == "any" and given.inter is not None:   # another cluster's link never checks this machine's
        if per_node is not None and given.per_node != per_node:
            return None, (f"none: the default file {given.inter_source} measures nodes of {given.per_node}, "
                          f"the forecast's hold {per_node}")
        return _given_tier(given, ACROSS, s.log)
    return None, "none measured"


def internode_k(s: Reading) -> int | None:
    """k of the machine's own across-node sweep, without reading it (the protocol)."""
    return s.internode_at()


def layout(s: Reading, given: Given, default: int) -> tuple[int, str]:
    """Devices per node of the grid: the layout the tier between nodes was measured on
    (the user's file's, else this machine's own link's), else the configured gpus_per_node
    (a default file of another layout is then not used: internode). A tier measured with G
    devices sharing a node's links says nothing of nodes of another G."""
    if given.explicit and given.inter is not None and given.per_node:
        return given.per_node, f"the layout of {given.inter_source}"
    own = s.internode_layout()
    if own:
        return own, "the layout of this machine's own link between nodes"
    return default, "forecast.gpus_per_node"


def anchor(s: Reading, k: int, rule: str, m: fc.StepModel, own_intra: bool, rng=None) -> fc.StepModel:
    """The exposed fraction f (model.py): from the paired probe at the largest k' below k
    (the largest of all, for the grid); without a probe (JAX), from the series' own weak
    step at the largest such k'; T_ar at k' from the same tier the model uses at k (its own
    sweep at k' where the tier is this machine's and one ran there), so the tier's level
    cancels. With neither, the simulated overlap, or f = 1 (PINNED_F1)."""
    how = "any" if rule == "any" else "below_k"
    kp = _pick([x for x in s.probes if s.nodes_at(x) == 1], k, how)
    kc = _pick([x for x in s.weak if x >= 2 and s.nodes_at(x) == 1], k, how) if kp is None else None
    if kp is None and (kc is None or 1 not in s.weak or not s.per_rank_batch):
        if s.no_overlap:   # the rule and its exception were chosen together (PINNED_F1)
            if m.internode is None:   # in one host: the copies are the transport
                return m.with_(exposed=1.0, rules=m.rules + (PINNED_F1.name,),
                               notes=m.notes + (f"nothing ran below k and {s.no_overlap}: f = 1",))
            m = m.with_(rules=m.rules + (PINNED_F1.name,))
        return m.with_(overlap="simulated", notes=m.notes + ("nothing ran below k: overlap simulated, buckets ready "
                                                             f"evenly over the backward ({m.backward_share:.2f} of t_c)",))
    at = kp or kc
    there = m.with_(fabric=fit_sweep(s.sweeps[at], rng)) if own_intra and at in s.sweeps else m
    if kp is not None:
        pairs = list(s.probes[kp])
        if rng is not None and len(pairs) > 1:
            pairs = list(rng.choice(pairs, size=len(pairs), replace=True))
        comm, src = float(np.median(pairs)), f"the probe at k={kp}"
    else:
        b = s.per_rank_batch
        comm = b / (s.weak[kc].estimate(rng) / kc) - fc.compute_time(m, b) - fc.straggler_time(m, kc, b)
        src = f"the weak step at k={kc}"
    f = fc.exposed_fraction(comm, there, at)
    return m.with_(exposed=f, notes=m.notes + (f"exposed fraction {f:.2f} of the in-node tier, from {src}",))


def straggler(s: Reading, k: int, rule: str, m: fc.StepModel, rng=None) -> fc.StepModel:
    """The straggler term from the probe's no_sync() trials at the largest k' below k
    (the largest of all, for the grid), where it recorded its ranks apart; else k=1's
    step spread (model.py)."""
    kp = _pick([x for x in s.stragglers if s.nodes_at(x) == 1], k, "any" if rule == "any" else "below_k")
    shares = list(s.stragglers[kp]) if kp is not None else []
    if not shares:
        return m.with_(sigma_s=s.sigma_s, notes=m.notes + (s.sigma_how,))
    if rng is not None and len(shares) > 1:
        shares = list(rng.choice(shares, size=len(shares), replace=True))
    c = fc.straggler_cv(shares, kp)
    return m.with_(sigma_s=0.0, straggler_cv=c, notes=m.notes + (
        f"straggler sigma {100 * c:.1f}% of t_c, from the probe's no_sync() trials at k={kp}",))


NO_FABRIC = fc.Fabric(0.0, float("inf"), 1, "one device per node: nothing in the node")


def build(s: Reading, k: int, rule: str = "any", given: Given = Given(), rng=None, *, nodes: int = 1,
          per_node: int = 8) -> fc.StepModel | None:
    """The model of series s (read through s.log) for a prediction at k on `nodes` nodes
    of per_node devices under `rule` (rule "any": one model for every k; nodes > 1 adds
    the tier between nodes where one is known); None without k=1 throughput."""
    line = compute_line(s, rng)
    if line is None:
        return None
    a, b, how = line
    if per_node == 1 and nodes > 1:
        intra, intra_src = NO_FABRIC, "none: one device per node"
    else:
        intra, intra_src = fabric(s, k, nodes, per_node, rule, given, rng)
    inter, inter_src = internode(s, k, rule, given, intra, rng, per_node=per_node) if nodes > 1 else (None, "")
    m = fc.StepModel(a, b, intra, (), internode=inter, per_node=per_node,
                     notes=(how, f"{IN_NODE}: {intra_src}", *([f"{ACROSS}: {inter_src}"] if nodes > 1 else [])))
    m = straggler(s, k, rule, m, rng)
    if m.fabric is None:
        return m
    m = m.with_(buckets=tuple(s.buckets), notes=m.notes + (s.buckets_how,))
    if not m.buckets:
        return m
    m = anchor(s, k, rule, m, intra_src.startswith("this machine's"), rng)
    reads_both = given.intra is not None and m.fabric is given.intra and m.internode is given.inter
    return m.with_(refused=inconsistent(m)) if rule == "any" and reads_both else m


def inconsistent(m: fc.StepModel) -> str:
    """Why the model's two tiers, two fabric files read together, cannot be one cluster's
    ("": they can): per byte, the ring of one node alone takes longer than the whole
    multi-node all-reduce of the tier between nodes, at its measured layout, that holds it
    (model.node_over_whole > 1). Only a model that reads both files is refused (build)."""
    if m.internode is None or not m.internode.whole or m.fabric is None:
        return ""
    ratio = fc.node_over_whole(m.per_node, m.fabric, m.internode)
    if ratio <= 1:
        return ""
    src, nodes = tier_sources(m), max(2, m.internode.k // m.per_node)
    return (f"the tier between nodes, {src.get(ACROSS)}, is faster than the tier in one node, {src.get(IN_NODE)}: "
            f"per byte, the ring of one node of {m.per_node} takes {ratio:.1f}x as long as the whole all-reduce over "
            f"{nodes} nodes of {m.per_node} that holds it, so the two are not one cluster's and nothing past k=1 is "
            "forecast from them")


def tier_sources(m: fc.StepModel) -> dict:
    """{tier: where it came from} as build noted it."""
    return {t: n.split(": ", 1)[1] for n in m.notes for t in (IN_NODE, ACROSS) if n.startswith(f"{t}: ")}


def spread(s: Reading, scaling: str | None = None, below: int | None = None) -> float | None:
    """The spread of one measured point's estimate (Rate.mean_cv: a mean over n replicates,
    cv / sqrt(n)): with `below`, of the point of `scaling` at the largest k' < below that
    has one (a measurement at k is noisier than k=1's where ranks side by side meet more of
    the host's neighbours: the 16-core stand-in's launch spread grew with k; docs/measurements/,
    the standin16-forecast reports), else at k=1 (the weak point's, else the strong's). Only
    the points it returns from are read (and logged)."""
    if below is not None and scaling is not None:
        for x in sorted((x for x in s.rates(scaling) if x < below), reverse=True):
            cv = s.rates(scaling)[x].mean_cv()
            if cv is not None:
                return cv
    for scaling in ("weak", "strong"):
        if 1 in s.rates(scaling):
            cv = s.rates(scaling)[1].mean_cv()
            if cv is not None:
                return cv
    return None
