"""The step model of one series at one k, built only from what a rule allows, with
the list of what it used; and its band.

Rules (what a model of k may read besides k=1's compute and spread):
  at_k     the fabric at k: the bare all-reduce sweep at k (across nodes: the measured
           link), the part nccl-tests gives for a cluster never trained on; the overlap
           from the probe (or the weak step) at the largest k' < k
  below_k  only sweeps and probes at k' < k: nothing measured at k
  any      everything measured, one model for the forecast's grid: the sweep and the
           probe at the largest k each ran at
Under at_k and below_k the straggler term and the band's spread come from below k too
(the probe's ranks at the largest k' < k; the replicate spread of the largest measured k' < k).
A machine given a fabric from a file (a user's nccl-tests output) uses it where its
own sweeps say nothing, and lists it.

The band is where a measurement at k should fall: the percentile interval, over
bootstrap draws, of the model refitted to resampled inputs (k=1's replicates, each
sweep's payloads jittered by their calls' spread, the probe's pairs), with one
replicate's spread at k=1 put on each drawn prediction, since the value it is held
against is itself one measurement. With nothing measured twice there is no band.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpscale.analysis.forecast import model as fc
from dpscale.analysis.forecast.inputs import Series, Sweep

RULES = ("at_k", "below_k", "any")


@dataclass(frozen=True)
class Used:
    """One input of a model: what kind of measurement, at which k."""
    kind: str                   # throughput | sweep | internode sweep | probe | fabric file
    k: int | None
    what: str = ""

    def text(self) -> str:
        return f"{self.kind}{f' k={self.k}' if self.k is not None else ''}{f' ({self.what})' if self.what else ''}"


@dataclass(frozen=True)
class Given:
    """Fabric tiers from outside the machine's own results (a fabric file), or None."""
    intra: fc.Fabric | None = None
    inter: fc.Fabric | None = None
    per_node: int | None = None
    source: str = ""


def compute_line(s: Series, rng=None) -> tuple[float, float, str, list[Used]] | None:
    """t_c(B) = a + b B through k=1's step time at the weak and strong batches."""
    pts, used = {}, []
    for scaling in ("weak", "strong"):
        r, batch = s.rates(scaling).get(1), s.batch(scaling, 1)
        if r is not None and batch:
            pts[batch] = batch / r.estimate(rng)
            used.append(Used("throughput", 1, scaling))
    if not pts:
        return None
    a, b, how = fc.fit_compute(pts)
    return a, b, how, used


def _pick(ks, k: int, rule: str) -> int | None:
    if rule == "at_k":
        return k if k in ks else None
    if rule == "below_k":
        return max((x for x in ks if x < k), default=None)
    return max(ks, default=None)


def fit_sweep(sw: Sweep, rng=None) -> fc.Fabric:
    b, t = sw.window().draw(rng)
    return fc.fit_fabric(b, t, sw.k, f"all-reduce sweep at k={sw.k}")


def fabric(s: Series, k: int, nodes: int, per_node: int, rule: str, given: Given,
           rng=None) -> tuple[fc.Fabric | None, list[Used]]:
    """The in-node ring for a model of k on `nodes` nodes of per_node devices: a one-node
    sweep (at k, or at per_node across nodes) as the rule allows, else a given file's."""
    ks = [x for x, sw in s.sweeps.items() if sw.nodes == 1]
    if nodes > 1 and rule != "any":   # the ring inside each node: a sweep of at most per_node
        pick = max((x for x in ks if x <= per_node), default=None)
    else:
        pick = _pick(ks, k, rule)
    if pick is not None:
        return fit_sweep(s.sweeps[pick], rng), [Used("sweep", pick)]
    if given.intra is not None and rule == "any":   # another GPU's ring never checks this machine's
        return given.intra, [Used("fabric file", None, given.source)]
    return None, []


def internode(s: Series, k: int, rule: str, given: Given, intra: fc.Fabric | None,
              rng=None) -> tuple[fc.Fabric | None, list[Used]]:
    """The across-node tier: the machine's own measured link, else a given file's."""
    sw = s.internode
    if sw is not None and not (rule == "below_k" and sw.k >= k):
        g = max(1, sw.k // sw.nodes)
        inner = intra or fc.Fabric(0.0, float("inf"), g, "none")
        what = f"the measured link: {sw.nodes} nodes x {g}"
        try:
            fab = fc.fit_internode(*sw.window().draw(rng), sw.nodes, g, inner, what)
        except ValueError:   # a bootstrap draw with no bandwidth in it: the sweep as measured
            fab = fc.fit_internode(*sw.window().draw(), sw.nodes, g, inner, what)
        return fab, [Used("internode sweep", sw.k, f"{sw.nodes} nodes")]
    if given.inter is not None and rule == "any":   # another cluster's link never checks this machine's
        return given.inter, [Used("fabric file", None, given.source)]
    return None, []


def anchor(s: Series, k: int, rule: str, m: fc.StepModel, rng=None) -> tuple[fc.StepModel, list[Used]]:
    """The exposed fraction f (model.py): from the paired probe at the largest k' below k
    (the largest of all, for the grid); without a probe (JAX), from the series' own weak
    step at the largest such k'; T_ar at k' from the sweep measured at k' where there is
    one. With neither, the simulated overlap."""
    how = "any" if rule == "any" else "below_k"
    kp = _pick([x for x in s.probes if s.nodes_at(x) == 1], k, how)
    kc = _pick([x for x in s.weak if x >= 2 and s.nodes_at(x) == 1], k, how) if kp is None else None
    if kp is None and s.no_overlap and m.internode is None:   # in one host: the copies are the transport
        return m.with_(exposed=1.0, notes=m.notes + (f"nothing ran below k and {s.no_overlap}: f = 1",)), []
    if kp is None and (kc is None or 1 not in s.weak or not s.per_rank_batch):
        return m.with_(overlap="simulated", notes=m.notes + ("nothing ran below k: overlap simulated, buckets ready "
                                                             f"evenly over the backward ({m.backward_share:.2f} of t_c)",)), []
    at = kp or kc
    there = m.with_(fabric=fit_sweep(s.sweeps[at], rng)) if at in s.sweeps and s.sweeps[at].nodes == 1 else m
    if kp is not None:
        pairs = list(s.probes[kp])
        if rng is not None and len(pairs) > 1:
            pairs = list(rng.choice(pairs, size=len(pairs), replace=True))
        comm, used = float(np.median(pairs)), [Used("probe", kp)]
    else:
        b = s.per_rank_batch
        comm = b / (s.weak[kc].estimate(rng) / kc) - fc.compute_time(m, b) - fc.straggler_time(m, kc, b)
        used = [Used("throughput", kc, "weak: the overlap calibrated")]
    f = fc.exposed_fraction(comm, there, at)
    used += [Used("sweep", at)] if there is not m else []
    return m.with_(exposed=f, notes=m.notes + (f"exposed fraction {f:.2f} from {used[0].text()}",)), used


def straggler(s: Series, k: int, rule: str, m: fc.StepModel, rng=None) -> tuple[fc.StepModel, list[Used]]:
    """The straggler term from the probe's no_sync() trials at the largest k' below k
    (the largest of all, for the grid), where it recorded its ranks apart; else k=1's
    step spread, as the series came (model.py)."""
    kp = _pick([x for x in s.stragglers if s.nodes_at(x) == 1 and s.stragglers[x]], k,
               "any" if rule == "any" else "below_k")
    if kp is None:
        return m, []
    shares = list(s.stragglers[kp])
    if rng is not None and len(shares) > 1:
        shares = list(rng.choice(shares, size=len(shares), replace=True))
    c = fc.straggler_cv(shares, kp)
    return m.with_(sigma_s=0.0, straggler_cv=c, notes=tuple(x for x in m.notes if x != s.sigma_how) + (
        f"straggler sigma {100 * c:.1f}% of t_c, from the probe's no_sync() trials at k={kp}",)), \
        [Used("probe", kp, "its ranks' no_sync() spread")]


NO_FABRIC = fc.Fabric(0.0, float("inf"), 1, "one device per node: nothing in the node")


def build(s: Series, k: int, rule: str = "any", given: Given = Given(), rng=None, *, nodes: int = 1,
          per_node: int = 8) -> tuple[fc.StepModel, list[Used]] | None:
    """The model of series s for a prediction at k on `nodes` nodes of per_node devices
    under `rule` (rule "any": one model for every k; nodes > 1 adds the tier between
    nodes where one is known), and every input it used; None without k=1 throughput."""
    line = compute_line(s, rng)
    if line is None:
        return None
    a, b, how, used = line
    intra, u_intra = fabric(s, k, nodes, per_node, rule, given, rng)
    inter, u_inter = internode(s, k, rule, given, intra, rng) if nodes > 1 else (None, [])
    if per_node == 1 and inter is not None:
        intra = NO_FABRIC
    m = fc.StepModel(a, b, intra, s.buckets, sigma_s=s.sigma_s, internode=inter, per_node=per_node,
                     notes=(how, s.buckets_how, intra.source if intra else "no in-node fabric",
                            *(x.source for x in [inter] if x), s.sigma_how))
    m, u_strag = straggler(s, k, rule, m, rng)
    used = used + u_strag
    if m.fabric is None or not s.buckets:
        return m, used + u_intra + u_inter
    m, u_probe = anchor(s, k, rule, m, rng)
    return m, used + u_intra + u_inter + u_probe


def spread(s: Series, scaling: str | None = None, below: int | None = None) -> float | None:
    """One replicate's relative spread: with `below`, of the point of `scaling` at the
    largest k' < below that has one (a measurement at k is noisier than k=1's where ranks
    side by side meet more of the host's neighbours: the 16-core stand-in's launches had
    a cv of 1.1-6.1% at k=1 and 2.1-17.7% at k = 2, 4, 8 in session 41), else at k=1
    (the weak point's, else the strong's), else the one the series was given (borrowed
    from a machine with the same GPU)."""
    if below is not None and scaling is not None:
        near = [x for x, r in s.rates(scaling).items() if x < below and r.cv() is not None]
        if near:
            return s.rates(scaling)[max(near)].cv()
    for scaling in ("weak", "strong"):
        r = s.rates(scaling).get(1)
        if r is not None and r.cv() is not None:
            return r.cv()
    return s.noise_cv


def measured_once(s: Series) -> bool:
    """No spread of one measurement is known: no band, rather than one of zero width."""
    return spread(s) is None
