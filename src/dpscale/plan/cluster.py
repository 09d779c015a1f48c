"""How many nodes and devices a k-device job spans: the `cluster` config with its
defaults from the fingerprint. Planning needs it (which k fit, what to ask SLURM for),
and so does launching (dpscale.run.command), so it lives here, below both.
"""
from __future__ import annotations

import math

from dpscale.plan import fingerprint as fpmod


def effective(cluster: dict | None, fp: dict) -> dict:
    """The config's `cluster` with its defaults filled in from the fingerprint:
    gpus_per_node null = the devices of this (compute) node's fingerprint."""
    cluster = cluster or {}
    return {"nodes": int(cluster.get("nodes") or 1),
            "gpus_per_node": int(cluster.get("gpus_per_node") or fpmod.devices_present(fp))}


def gpus_per_node(cluster: dict) -> int:
    return int(cluster["gpus_per_node"])


def capacity(cluster: dict) -> int:
    """Most devices one job may use: nodes x devices per node."""
    return int(cluster["nodes"]) * gpus_per_node(cluster)


def nodes_for(k: int, cluster: dict) -> int:
    """Nodes a k-device job spans (1 for a k that is skipped: it runs nothing)."""
    if k > capacity(cluster):
        return 1
    return max(1, math.ceil(k / gpus_per_node(cluster)))


def layout(k: int, cluster: dict) -> dict | None:
    """The multi-node layout of a k-device job, or None when it fits one node."""
    n = nodes_for(k, cluster)
    if n == 1:
        return None
    return {"nodes": n, "gpus_per_node": gpus_per_node(cluster)}


SERIAL_RESOURCE = "measure"   # profiles/default: `resources: [measure=1]`, every measurement asks for 1


def serialised_on_cluster(local_exec: bool, global_resources) -> str | None:
    """The line a cluster run prints at its start when its measurements will run one at a
    time: profiles/default's global measure=1 is there because Snakemake loads that folder
    as the workflow profile beside any `--profile` (and its settings win), so `--profile
    profiles/slurm` keeps the limit meant for one workstation. None on a local run, or
    without the limit (`--workflow-profile profiles/slurm`)."""
    if local_exec or SERIAL_RESOURCE not in (global_resources or {}):
        return None
    return (f"the measurements run one at a time: profiles/default's global `{SERIAL_RESOURCE}=1` "
            "applies beside --profile (Snakemake loads it as the workflow profile); for jobs side by side, "
            "each on its own nodes, run with --workflow-profile profiles/slurm (docs/cluster.md)")


def spanning_locally(local_exec: bool, ks, cluster: dict | None, fp: dict) -> str | None:
    """The line a local run prints at its start when a k of the plan spans nodes: only a
    SLURM allocation gives them, so each of those jobs would be recorded failed, one by one
    (dpscale.run.command.multinode_command says why). None on SLURM, or when every k fits
    one node."""
    eff = effective(cluster, fp)
    spans = [k for k in ks if layout(k, eff)]   # the multi-node launch a job spec would carry
    if not local_exec or not spans:
        return None
    g = eff["gpus_per_node"]
    return (f"cluster.nodes={eff['nodes']}: k={', '.join(map(str, spans))} span{'s' * (len(spans) == 1)} "
            f"nodes of {g} device{'s' * (g != 1)}, which only a SLURM allocation gives; this local run "
            "records those jobs failed: run with --workflow-profile profiles/slurm (docs/cluster.md), "
            "or set cluster.nodes=1")
