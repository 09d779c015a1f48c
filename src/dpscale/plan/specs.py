"""Which jobs the workflow asks for, and the spec each job receives.

A spec is what a measurement depends on and nothing else: it is passed to the
rule as a plain `params:` value, so Snakemake reruns a job exactly when its spec
changes (a new GPU model, a new torch, a changed protocol number), and never for
an unrelated change (another rule's settings, more GPUs for another k).
Everything here derives from dpscale.registry.
"""
from __future__ import annotations

import json

from dpscale.plan import cluster as dscluster, fingerprint as fpmod
from dpscale import layout, registry

PG_MARGIN_S = 10


def pg_timeout_s(limit_s: float) -> float:
    """The process-group timeout of a job the watchdog kills at `limit_s`.

    It must fire first, by PG_MARGIN_S or 10 % of the limit, whichever is more: then
    a collective that never returns ends in the rank that waits for it, with its
    traceback (and on NCCL the flight recorder's dump), not in a SIGKILL that leaves
    no trace. E.g. limit 120 s -> 108 s, 900 s -> 810 s. A limit under 20 s cannot
    keep 10 s and still leave the job time to start: half the limit, then.
    The watchdog's clock starts with the job, a collective's with the collective:
    only a hang within the first (limit - timeout) seconds is caught by the timeout;
    the watchdog asks NCCL ranks for a dump before it kills a later one."""
    return max(limit_s - max(PG_MARGIN_S, 0.1 * limit_s), limit_s / 2)


def planned(resolved: dict) -> list[tuple[str, str, int]]:
    """(experiment, variant, k) of every measurement the configuration asks for."""
    out = []
    for name in resolved["experiments"]:
        exp = registry.get(name)
        ks = exp.ks(resolved["ks"])
        if exp.extra_ks_key:   # k's beyond `ks` it runs emulated (dpscale.measure.torch_tta)
            ks = sorted(set(ks) | set(resolved["protocol"].get(exp.extra_ks_key) or ()))
        for variant in exp.variant_names(resolved["tuned"], resolved.get("extended", True)):
            out += [(name, variant, k) for k in ks if exp.variant(variant).runs_at(k)]
    return out


def targets(resolved: dict, root: str = layout.RUNS) -> list[str]:
    return [layout.result_path(e, v, k, root) for e, v, k in planned(resolved)]


LAUNCHES_KEY = "launches"   # the protocol key: independent launches of one job (dpscale.run.launches)


def launch_count(spec: dict) -> int:
    """How many launches the spec asks for (1 where its protocol has no such key)."""
    return int(spec.get("config", {}).get("protocol", {}).get(LAUNCHES_KEY, 1))


LONE_K1 = "a lone k=1 gives no ratio"   # how the summary finds these skips (report.summary)


def answer_rates(resolved: dict) -> set[tuple[str, str]]:
    """The k=1 throughput points a planned time-to-accuracy variant reads its samples/s
    from: of its rate_from, the first series the configuration plans (registry.Variant)."""
    planned_k1 = {(e, v) for e, v, k in planned(resolved) if k == 1}
    out = set()
    for e, v, _k in planned(resolved):
        rate_from = registry.get(e).variant(v).rate_from
        weak = registry.scaling_of(registry.get(e).family, "weak")
        first = next((r for r in rate_from if (weak, r) in planned_k1), None)
        if first:
            out.add((weak, first))
    return out


def lone_k1(resolved: dict, fp: dict, experiment: str, variant: str, k: int) -> str | None:
    """Why a series' k=1 is skipped: on a machine where none of its k >= 2 can run, a
    k=1 point is a number with no ratio, unless another result reads it (config lone_k1)."""
    if k != 1 or resolved.get("lone_k1") or registry.get(experiment).emulates:
        return None
    eff = dscluster.effective(resolved.get("cluster"), fp)
    if dscluster.capacity(eff) >= 2 or (experiment, variant) in answer_rates(resolved):
        return None
    return (f"{LONE_K1}: no k >= 2 can run on this machine ({dscluster.capacity(eff)} device), and no other "
            "result reads this k=1; lone_k1=true measures it")


def short_of_devices(experiment: str, k: int, fp: dict, cluster: dict | None = None) -> bool:
    """k is above the devices the plan may use and the experiment does not emulate it."""
    return (k > dscluster.capacity(dscluster.effective(cluster, fp))
            and not emulated_processes(experiment, k, fp, cluster))


def skip_reason(experiment: str, variant: str, k: int, fp: dict,
                cluster: dict | None = None) -> str | None:
    gpus = fp.get("gpu_count") or 0
    eff = dscluster.effective(cluster, fp)
    nodes, per_node = eff["nodes"], eff["gpus_per_node"]
    if short_of_devices(experiment, k, fp, cluster):
        if nodes > 1:
            return (f"k={k} needs {k} devices; cluster.nodes={nodes} x {per_node} per node "
                    f"give {nodes * per_node}")
        what = (f"{per_node} GPU(s)" if gpus else
                f"{per_node} CPU core(s), and a CPU stand-in runs one process or host device per core")
        return f"k={k} needs {k} devices; this machine has {what}"
    var = registry.get(experiment).variant(variant)
    for need in var.requires:
        key, reason = registry.REQUIREMENTS[need]
        if not fp.get(key):
            return f"{variant} {reason}"
    if var.nccl_only and not gpus:
        return ("NCCL_SHM_USE_CUDA_MEMCPY is a setting of NCCL's shared-memory transport; "
                "the gloo backend used without GPUs has no equivalent")
    return None


def plan_line(resolved: dict, fp: dict) -> str:
    """One line, said when the workflow is parsed (a dry run too): the plan's size, scale
    and backend, and how many planned results will be recorded as skipped without running,
    and why, grouped. A dry run otherwise lists them as jobs like any other (k=8 on a
    two-core box), and names neither the scale nor the backend."""
    cluster = resolved.get("cluster")
    planned_ = planned(resolved)
    devices = dscluster.capacity(dscluster.effective(cluster, fp))
    k_short, n_short, lone, other = set(), 0, 0, {}
    for e, v, k in planned_:
        if short_of_devices(e, k, fp, cluster):
            k_short.add(k)
            n_short += 1
        elif why := skip_reason(e, v, k, fp, cluster):
            other[why] = other.get(why, 0) + 1
        elif lone_k1(resolved, fp, e, v, k):
            lone += 1
    kind = "GPU" if fp.get("gpu_count") else "CPU device"
    head = (f"Plan: {len(planned_)} results at {resolved['scale']} scale, {fpmod.backend_for(fp, 'torch')} "
            f"on {devices} {kind}{'s' * (devices != 1)}")
    if not (n := n_short + lone + sum(other.values())):
        return head + ", none skipped"
    parts = []
    if k_short:
        ks = [f"k={k}" for k in sorted(k_short)]
        ks = " and ".join(ks) if len(ks) <= 2 else ", ".join(ks[:-1]) + f" and {ks[-1]}"
        parts.append(f"{n_short} at {ks}, which need{'s' * (len(k_short) == 1)} more devices than the {devices} here")
    if lone:
        parts.append(f"{lone} lone k=1 (no k >= 2 to divide by; lone_k1=true measures them)")
    parts += [f"{c} because {why}" for why, c in other.items()]
    return head + f"; {n} of them recorded as skipped without running: " + "; ".join(parts)


def no_base_warning(resolved: dict) -> str | None:
    """A plan without k=1 measures, but every speed-up, efficiency and time-to-accuracy
    verdict is over this machine's own k=1: said at parse time, not found in the report."""
    ks = resolved["ks"]
    if 1 in ks:
        return None
    return (f"ks: {ks} has no k=1, and every speed-up, scaling efficiency and time-to-accuracy "
            f"verdict is over k=1, so none can be computed; add it, e.g. 'ks={[1, *ks]}'")


# CPU threads each rank computes with, the same at every k and on every machine. Set
# explicitly: torchrun sets OMP_NUM_THREADS=1 only when it starts more than one process,
# so k=1 computed with every core and k >= 2 with one (a CPU stand-in's k=1 was up to
# cores-times faster than a rank at k=8). One: a stand-in runs one rank per core, and a
# GPU rank's intra-op threads only launch kernels (the book's DataLoader decodes in
# worker processes). A constant, not cores / devices: more devices must not rerun k=1.
THREADS_PER_RANK = 1


def emulated_processes(experiment: str, k: int, fp: dict, cluster: dict | None = None) -> int | None:
    """The processes that emulate k ranks of an experiment that emulates a k above the
    devices present (the most devices of one node that divide k); None when k runs for real."""
    eff = dscluster.effective(cluster, fp)
    if not registry.get(experiment).emulates or k <= dscluster.capacity(eff):
        return None
    return max(w for w in range(1, eff["gpus_per_node"] + 1) if k % w == 0)


def job_spec(resolved: dict, fp: dict, experiment: str, variant: str, k: int, inputs: dict) -> dict:
    exp = registry.get(experiment)
    var = exp.variant(variant)
    proto = {key: resolved["protocol"][key] for key in exp.protocol_for(variant)}
    limit = resolved["protocol"][exp.limit_key] if exp.limit_key else resolved["watchdog"]["hang_timeout_s"]
    spec = {
        "experiment": experiment, "variant": variant, "k": k,
        "backend": fpmod.backend_for(fp, exp.family),
        "config": {"scale": resolved["scale"], "protocol": proto},
        "fingerprint": fpmod.subset(fp, exp.family, k),
        "env": dict(var.env),
        "limit_s": limit, "pg_timeout_s": pg_timeout_s(float(limit)), "grace_s": resolved["watchdog"]["grace_s"],
        "inputs": inputs, "skip_reason": (skip_reason(experiment, variant, k, fp, resolved.get("cluster"))
                                          or lone_k1(resolved, fp, experiment, variant, k)),
    }
    if exp.family == "torch":
        spec["threads_per_rank"] = THREADS_PER_RANK
    if procs := emulated_processes(experiment, k, fp, resolved.get("cluster")):
        spec["processes"] = procs   # only emulated specs carry it: the others stay as they were
    multi = dscluster.layout(k, dscluster.effective(resolved.get("cluster"), fp))
    if multi and not spec["skip_reason"] and not procs:
        spec["launch"] = multi   # only multi-node specs carry it: one-node specs stay as they were
    if (fp.get("gpu_count") or 0) > 0 and "gpu_state" in resolved:   # CPU specs stay as they were
        spec["gpu_state"] = dict(resolved["gpu_state"])   # dpscale.measure.gpustate.policy_failure reads it
    if var.options is not None:
        spec["config"]["tuned"] = json.loads(json.dumps(dict(var.options)))
    if meaning := var.meaning():
        spec["config"]["variant"] = meaning
    for need in var.requires:   # what it needs is part of what it measured (only these specs carry it)
        key = registry.REQUIREMENTS[need][0]
        spec["fingerprint"].setdefault(key, fp.get(key))
    return spec


def processes(spec: dict) -> int:
    """The processes (devices) a job starts: k, or fewer where k is emulated."""
    return int(spec.get("processes") or spec["k"])


def dumps(spec: dict) -> str:
    """Canonical JSON: the same spec always gives the same params string."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))
