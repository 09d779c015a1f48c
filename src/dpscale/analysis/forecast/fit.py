"""The step model of one series at one k, built only from what a rule allows, with
the list of what it used; and its band.

Rules (what a model of k may read besides k=1's compute and spread):
  at_k     the fabric at k: the bare all-reduce sweep at k (across nodes: the measured
           link), the part nccl-tests gives for a cluster never trained on; the overlap
           from the probe at the largest k' < k, else simulated
  below_k  only sweeps and probes at k' < k: nothing measured at k
  any      everything measured (the forecast's grid): the sweep and probe at k where
           they ran, else the largest k below, else the largest
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
from dpscale.analysis.forecast.inputs import ONCE, Series, Sweep

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
    return k if k in ks else max((x for x in ks if x <= k), default=max(ks, default=None))


def fit_sweep(sw: Sweep, rng=None) -> fc.Fabric:
    b, t = sw.draw(rng)
    return fc.fit_fabric(b, t, sw.k, f"all-reduce sweep at k={sw.k}")


def fabric(s: Series, k: int, nodes: int, per_node: int, rule: str, given: Given,
           rng=None) -> tuple[fc.Fabric | None, list[Used]]:
    """The in-node ring for a model of k on `nodes` nodes of per_node devices: a one-node
    sweep (at k, or at per_node across nodes) as the rule allows, else a given file's."""
    ks = [x for x, sw in s.sweeps.items() if sw.nodes == 1]
    pick = _pick(ks, per_node, "any") if nodes > 1 else _pick(ks, k, rule)
    if pick is not None:
        return fit_sweep(s.sweeps[pick], rng), [Used("sweep", pick)]
    if given.intra is not None:
        return given.intra, [Used("fabric file", None, given.source)]
    return None, []


def internode(s: Series, k: int, rule: str, given: Given, intra: fc.Fabric | None,
              rng=None) -> tuple[fc.Fabric | None, list[Used]]:
    """The across-node tier: the machine's own measured link, else a given file's."""
    sw = s.internode
    if sw is not None and not (rule == "below_k" and sw.k >= k):
        g = max(1, sw.k // sw.nodes)
        b, t = sw.draw(rng)
        inner = intra or fc.Fabric(0.0, float("inf"), g, "none")
        fab = fc.fit_internode(b, t, sw.nodes, g, inner, f"the measured link: {sw.nodes} nodes x {g}")
        return fab, [Used("internode sweep", sw.k, f"{sw.nodes} nodes")]
    if given.inter is not None:
        return given.inter, [Used("fabric file", None, given.source)]
    return None, []


def overlap(s: Series, k: int, nodes: int, rule: str, m: fc.StepModel, rng=None) -> tuple[fc.StepModel, list[Used]]:
    """The exposed fraction from the paired probe at the largest k' below k (at k too,
    for the grid), else the simulated overlap. Across nodes always simulated: a probe's
    fraction belongs to the fabric it ran on."""
    one_node = [x for x in s.probes if s.nodes_at(x) == 1]
    kp = _pick(one_node, k, "any") if rule == "any" else max((x for x in one_node if x < k), default=None)
    if kp is None or nodes > 1:
        return m.with_(overlap="simulated", notes=m.notes + ("overlap simulated: buckets ready evenly over the "
                                                             f"backward ({m.backward_share:.2f} of t_c)",)), []
    pairs = list(s.probes[kp])
    if rng is not None and len(pairs) > 1:
        pairs = list(rng.choice(pairs, size=len(pairs), replace=True))
    f = fc.exposed_fraction(float(np.median(pairs)), m, kp)
    return m.with_(exposed=f, notes=m.notes + (f"exposed fraction {f:.2f} from the no_sync() probe at k={kp}",)), \
        [Used("probe", kp)]


NO_FABRIC = fc.Fabric(0.0, float("inf"), 1, "one device per node: nothing in the node")


def build(s: Series, k: int, rule: str = "any", given: Given = Given(), rng=None, *, nodes: int = 1,
          per_node: int = 8) -> tuple[fc.StepModel, list[Used]] | None:
    """The model of series s for a prediction at k on `nodes` nodes of per_node devices
    under `rule`, and every input it used; None without k=1 throughput."""
    line = compute_line(s, rng)
    if line is None:
        return None
    a, b, how, used = line
    intra, u_intra = fabric(s, k, nodes, per_node, rule, given, rng)
    inter, u_inter = internode(s, k, rule, given, intra, rng) if nodes > 1 else (None, [])
    if nodes > 1 and per_node == 1:
        intra = NO_FABRIC
    m = fc.StepModel(a, b, intra if nodes == 1 or inter is not None else None, s.buckets, 1.0, s.sigma_s, inter,
                     per_node, notes=(how, s.buckets_how, intra.source if intra else "no in-node fabric",
                                      *(x.source for x in [inter] if x), s.sigma_how))
    if m.fabric is None or not s.buckets:
        return m, used + u_intra + u_inter
    m, u_probe = overlap(s, k, nodes, rule, m, rng)
    return m, used + u_intra + u_inter + u_probe


def spread(s: Series) -> float | None:
    """One replicate's relative spread at k=1 (the weak point's, else the strong's)."""
    for scaling in ("weak", "strong"):
        r = s.rates(scaling).get(1)
        if r is not None and r.cv() is not None:
            return r.cv()
    return None


def measured_once(s: Series) -> bool:
    """Nothing of the series was measured twice: no spread to make a band of."""
    rates = [r for sc in ("weak", "strong") for r in [s.rates(sc).get(1)] if r is not None]
    return (all(r.units()[0] == ONCE for r in rates) and not any(len(p) > 1 for p in s.probes.values())
            and not any(len(sw.bytes) > 2 for sw in s.sweeps.values()))
