"""The two-node stand-in: the pipeline's measurements on two "nodes" of one machine
(dpscale.standin.netns: two network namespaces joined by a veth shaped to a rate), kept
in the layout of a kept machine, so that the forecast's inter-node tier can be read
from, and validated against, something measured.

What it measures, for one link rate (scripts/two_node_standin.py is the entry):

- the inter-node tier: the all-reduce sweep (allreduce/default) at k=2 with one rank
  per namespace, every byte across the link; the paired no_sync() probe
  (ddp_comm_probe/default) the same way;
- DDP weak scaling (ddp_weak/cached) at k=1 in one namespace and at k=2 across the
  link, one rank per side;
- with 4 cores or more (G = 2 ranks per node): k=4 across the link, 2 ranks per side,
  and the one-node k=2 measurements (all-reduce sweep, probe, weak scaling) inside
  one namespace.

Layout of <out> (a kept machine's, dpscale.layout.kept; dpscale.report.machines.load_reference reads it):

    fingerprint.json                 this machine's (dpscale.plan.fingerprint.probe)
    plan.json                        the targets below, and the command that made them
    runs/<experiment>/<variant>/k<k>.json   the machine "2 nodes x G ranks", as the
                                     workflow would measure it with cluster={nodes: 2,
                                     gpus_per_node: G}: k <= G in one node, k = 2G across
    internode/runs/...               (G > 1 only) the one-rank-per-node k=2 measurements;
                                     with G = 1 they are runs/'s k=2
    logs/<experiment>/<variant>/k<k>.log (+ .node<i>.rank<r>.log)   job and rank logs
    link.json                        the link (rate, tbf, namespaces), a TCP transfer's
                                     throughput across it, the placement of every run
                                     (nodes, ranks per node, cores, threads), a summary

Every result is the pipeline's own: specs from dpscale.plan.specs.job_spec (the
config's resolution at the chosen scale, this machine's fingerprint, the resize cache
the data stage builds), run by dpscale.standin.twonode, written by rank 0 of
scripts/torch_worker.py.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from dpscale import layout, results
from dpscale.data import fetch as dsfetch, load as dsload, resize as dsresize
from dpscale.plan import config as dsconfig, fingerprint as fpmod, specs
from dpscale.results import utc_now, write_json_atomic
from dpscale.standin import netns, twonode

ROOT = Path(__file__).resolve().parents[3]
DDP = ("ddp_weak", "cached")
SWEEP = ("allreduce", "default")
PROBE = ("ddp_comm_probe", "default")
# The default link: communication must be a good part of the k=2 step for the link to be
# tested, at least 30% on the 2-core box at smoke scale. ResNet-18's gradient is 44.7 MB
# (fp32); a ring all-reduce at k=2 sends S = 44.7 MB each way, 0.37 s at 1 Gbit/s (0.956
# of it carries TCP payload), 0.75 s at 500 Mbit/s. DDP overlaps its buckets with the
# backward, so at 1 Gbit/s little of it is exposed and the share stays under 30%; at
# 500 Mbit/s it stays above, with room for noise (the rates tried and the shares
# measured: docs/measurements/twonode-standin_cpu2_2026-12-02.md; reference/cpu2-twonode).
DEFAULT_RATE = "500mbit"
LINK = "link.json"   # beside the kept machine's own files: the link, and what ran where
MIN_CORES_FOR_TWO_PER_NODE = 4


@dataclass(frozen=True)
class Options:
    """How the jobs run. busy_retries: a job during which other processes' CPU time and the
    hypervisor's steal (cpu_share's cpu_s_disturbed) took more than busy_fraction of its wall
    time is measured again, up to that many times (a shared box: the least disturbed ok
    attempt is kept, every attempt is in link.json)."""
    threads: int = 1
    python: str = sys.executable
    lock_dir: str | None = None
    transfer_bytes: int | None = None
    busy_retries: int = 0
    busy_fraction: float = 0.05
    quiet_wait_s: float = 0   # before each attempt, wait up to this long for others' CPU use to stop


@dataclass(frozen=True)
class Planned:
    experiment: str
    variant: str
    k: int
    per_node: int      # G of the cluster this job belongs to: 1 = one rank per namespace
    folder: str        # "" (the machine: runs/, logs/) or "internode" (internode/runs/, ...)

    @property
    def across(self) -> bool:
        return self.k > self.per_node

    def target(self) -> str:
        return layout.result_path(self.experiment, self.variant, self.k, root=layout.RUNS_DIR)

    def path(self, out: Path) -> Path:
        return out / self.folder / self.target()

    def log(self, out: Path) -> Path:
        return out / self.folder / layout.log_path(self.experiment, self.variant, self.k, root=layout.LOGS_DIR)


def per_node_for(cores: int) -> int:
    """Ranks per namespace: 2 where the cores allow 2 + 2 ranks a core each, else 1."""
    return 2 if cores >= MIN_CORES_FOR_TWO_PER_NODE else 1


def plan(ks: list[int], per_node: int) -> list[Planned]:
    """The jobs, in the order they run: the link's sweep first (the probes price their
    buckets with it), then weak scaling, then the probes."""
    bad = [k for k in ks if k < 1 or (k > per_node and k != 2 * per_node)]
    if bad:
        raise ValueError(f"k={bad} cannot be placed on 2 nodes of {per_node} rank(s): use k <= {per_node} "
                         f"(one namespace) or k = {2 * per_node} (across the link)")
    jobs: list[Planned] = []
    multi = sorted(k for k in set(ks) if k >= 2)
    if per_node > 1:   # the inter-node tier: one rank per namespace, k=2, kept beside the machine
        jobs += [Planned(*SWEEP, 2, 1, "internode")]
    jobs += [Planned(*SWEEP, k, per_node, "") for k in multi]
    jobs += [Planned(*DDP, k, per_node, "") for k in sorted(set(ks))]
    if per_node > 1:
        jobs += [Planned(*DDP, 2, 1, "internode"), Planned(*PROBE, 2, 1, "internode")]
    jobs += [Planned(*PROBE, k, per_node, "") for k in multi]
    return jobs


def resolve(scale: str, ks: list[int], per_node: int, fp: dict, timeout_s: float | None) -> dict:
    """The repository's config.yaml, resolved as the workflow resolves it, with the
    stand-in's scale, ks, cluster (2 nodes of per_node) and, if given, hang limit."""
    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    cfg.update(scale=scale, ks=sorted(set(ks)), cluster={"nodes": 2, "gpus_per_node": per_node},
               experiments=[DDP[0], SWEEP[0], PROBE[0]])
    if timeout_s:
        cfg["watchdog"] = {**cfg["watchdog"], "hang_timeout_s": int(timeout_s)}
    return dsconfig.resolve(cfg, fp)


def prepare_data(data_dir: Path, size: int, source: str = "auto", say=print) -> dict:
    """The resize cache the data stage makes (scripts/download.py, scripts/resize.py:
    the same functions), built once in data_dir and reused while its checksum holds.
    Returns the spec's `inputs`."""
    npz, meta = data_dir / f"fmnist_{size}px.npz", data_dir / f"fmnist_{size}px.json"
    inputs = {"cache": str(npz), "cache_meta": str(meta), "data_root": str(data_dir)}
    try:
        dsload.load_cache(npz, meta)
        return inputs
    except (OSError, ValueError, dsload.DataError):
        pass
    if not (data_dir / "source.json").exists():
        prov = dsfetch.fetch(data_dir, source, [])
        say(f"data: Fashion-MNIST from {prov.get('origin')} (source={prov['source']})")
    t0 = time.monotonic()
    m = dsresize.build_cache(data_dir, size, npz, meta)
    say(f"data: resize cache {npz} ({m['n_train']} + {m['n_test']} images at {size} px) "
        f"in {time.monotonic() - t0:.0f} s")
    return inputs


def probe_threads(nodes: netns.TwoNodes, core: int, threads: int, python: str) -> int:
    """torch.get_num_threads() of a process started as the ranks are (in a namespace,
    pinned, OMP_NUM_THREADS set): what the workers' intra-op pool really has."""
    env = twonode.node_env({"env": {}, "backend": "gloo"}, nodes.veths[0], threads)
    p = subprocess.run([*nodes.exec_prefix(0), "taskset", "-c", str(core), python, "-c",
                        "import torch; print(torch.get_num_threads())"],
                       env=env, capture_output=True, text=True, timeout=120, check=True)
    return int(p.stdout.split()[-1])


def _cpu_now() -> dict:
    """The machine's CPU seconds so far (/proc/stat) and this process's and its reaped
    children's (every agent and rank of a finished job rolls up into them)."""
    hz = os.sysconf("SC_CLK_TCK")
    f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    t = os.times()
    return {"user": (f[0] + f[1]) / hz, "system": f[2] / hz, "irq": (f[4] + f[5]) / hz, "steal": f[7] / hz,
            "ours_user": t.user + t.children_user, "ours_system": t.system + t.children_system,
            "loadavg": Path("/proc/loadavg").read_text().split()[:3]}


def cpu_share(before: dict, after: dict, wall_s: float) -> dict:
    """Who used the machine's CPUs during one job: its own processes, the kernel's
    interrupt work (the link's TCP traffic among it), everyone else's user time, and
    the hypervisor's steal (a VM's CPUs given to other guests). The last two are the
    interference to look for (0 on a quiet machine): cpu_s_disturbed."""
    d = {k: after[k] - before[k] for k in ("user", "system", "irq", "steal", "ours_user", "ours_system")}
    return {"wall_s": round(wall_s, 2), "cpu_s_job": round(d["ours_user"] + d["ours_system"], 1),
            "cpu_s_irq_softirq": round(d["irq"], 1), "cpu_s_steal": round(d["steal"], 1),
            "cpu_user_s_others": round(max(0.0, d["user"] - d["ours_user"]), 1),
            # what kept this job's CPUs from it: other processes here, and the hypervisor (steal)
            "cpu_s_disturbed": round(max(0.0, d["user"] - d["ours_user"]) + d["steal"], 1),
            "loadavg_before": before["loadavg"], "loadavg_after": after["loadavg"]}


def wait_quiet(max_s: float, fraction: float, window_s: float = 5.0) -> dict:
    """Wait (up to max_s) for a window of window_s seconds in which other processes
    took at most `fraction` of one window in CPU time. Returns how long it waited and
    the last window's share (above `fraction`: it gave up waiting)."""
    t0, share = time.monotonic(), None
    while True:
        a = _cpu_now()
        time.sleep(window_s)
        share = cpu_share(a, _cpu_now(), window_s)["cpu_s_disturbed"] / window_s
        if share <= fraction or time.monotonic() - t0 >= max_s:
            return {"waited_s": round(time.monotonic() - t0, 1), "others_share": round(share, 3)}


def placement(job: Planned, threads: int) -> twonode.Placement:
    """Cores: node 0 takes 0..G-1, node 1 G..2G-1; a one-node job runs on node 0's."""
    g = job.per_node
    return twonode.Placement((tuple(range(g)), tuple(range(g, 2 * g))), threads)


def summary(out: Path, jobs: list[Planned]) -> dict:
    """The numbers the forecast's validation reads, from the results just written."""
    def load(job):
        p = job.path(out)
        return json.loads(p.read_text()) if p.exists() else None
    got = {(j.experiment, j.variant, j.k, j.folder): load(j) for j in jobs}
    s: dict = {}
    w1 = got.get((*DDP, 1, ""))
    link_folder = "internode" if any(j.folder == "internode" for j in jobs) else ""
    w2, sw, pr = (got.get((*DDP, 2, link_folder)), got.get((*SWEEP, 2, link_folder)),
                  got.get((*PROBE, 2, link_folder)))
    for name, r in (("k1", w1), ("k2_across", w2)):
        if r and r["status"] == "ok":
            m = r["metrics"]
            s[f"ddp_weak_{name}"] = {"samples_per_s": m["samples_per_s"], "step_ms_median": m["step_ms_median"],
                                     "step_ms_p10": m["step_ms_p10"], "step_ms_p90": m["step_ms_p90"],
                                     "samples_per_s_repeats": m.get("samples_per_s_repeats")}
    if "ddp_weak_k1" in s and "ddp_weak_k2_across" in s:
        a, b = s["ddp_weak_k1"], s["ddp_weak_k2_across"]
        eff = b["samples_per_s"] / (2 * a["samples_per_s"])
        s["weak_efficiency_k2"] = eff
        s["comm_fraction_of_k2_step"] = {
            "from_step_medians": 1 - a["step_ms_median"] / b["step_ms_median"],
            "from_samples_per_s": 1 - eff,
            "how": "(t2 - t1) / t2: the k=2 step's time beyond k=1's, with the per-rank batch fixed"}
    if sw and sw["status"] == "ok":
        m = sw["metrics"]
        oop = {r["bytes"]: r for r in m["table"]["out_of_place"]}
        inp = {r["bytes"]: r for r in m["table"]["in_place"]}
        top = sorted(oop)[-2:]
        s["allreduce_k2_across"] = {
            "wrong_total": m["wrong_total"], "busbw_GBps_max": m["busbw_GBps_max"],
            "largest_payloads": [{"bytes": b, "busbw_GBps_out_of_place": oop[b]["busbw_GBps"],
                                  "busbw_GBps_in_place": inp[b]["busbw_GBps"],
                                  "time_us_out_of_place": oop[b]["time_us"]} for b in top]}
    if pr and pr["status"] == "ok":
        m = pr["metrics"]
        s["probe_k2_across"] = {"comm_ms": m["comm_ms"], "comm_ms_ci95": m["comm_ms_ci95"],
                                "synced_ms": m["synced_ms"], "no_sync_ms": m["no_sync_ms"],
                                "comm_fraction_of_synced": m["comm_ms"] / m["synced_ms"],
                                "grad_bytes": m["grad_bytes"], "pred_ring_ms": m.get("pred_ring_ms")}
    return s


def run(out: Path, rate: str = DEFAULT_RATE, ks: list[int] | None = None, scale: str = "smoke",
        timeout_s: float | None = None, data_dir: Path | None = None, per_node: int | None = None,
        opts: Options = Options(), command: str | None = None, say=print) -> dict:
    """Measure the stand-in at one link rate into `out` (module doc); returns link.json's
    content. Raises netns.NetnsUnavailable where namespaces cannot be made, ValueError
    for ks or ranks per node the cores cannot hold."""
    t_start = time.monotonic()
    cores = os.cpu_count() or 1
    per_node = per_node or per_node_for(cores)
    if 2 * per_node > cores:
        raise ValueError(f"{per_node} rank(s) per node need {2 * per_node} cores; this machine has {cores}")
    ks = sorted(set(ks or ([1, 2] if per_node == 1 else [1, 2, 4])))
    jobs = plan(ks, per_node)
    fp = fpmod.probe()
    resolved = {g: resolve(scale, ks if g == per_node else [1, 2], g, fp, timeout_s) for g in {1, per_node}}
    out = Path(out).resolve()
    data_dir = Path(data_dir).resolve() if data_dir else out / "data"
    inputs = prepare_data(data_dir, resolved[per_node]["protocol"]["image_size"], say=say)
    out.mkdir(parents=True, exist_ok=True)
    fpmod.save_if_changed(fp, layout.kept(out).fingerprint)
    record: dict = {"what": "two-node stand-in: two network namespaces joined by a veth pair shaped by tbf "
                            "(dpscale.standin.netns); results in runs/ as a kept machine's",
                    "command": command, "started_utc": utc_now(), "rate": rate, "scale": resolved[per_node]["scale"],
                    "ks": ks, "machine": {"nodes": 2, "ranks_per_node": per_node, "cpu_count": cores},
                    "busy_rule": {"retries": opts.busy_retries, "fraction": opts.busy_fraction}, "runs": {}}
    here = os.getcwd()
    os.chdir(out)   # the jobs' paths are relative to the machine's folder, as the workflow's are to its own
    try:
        with netns.two_nodes(rate) as nodes:
            _link(nodes, record, opts, say)
            for job in jobs:
                _job(nodes, job, resolved, fp, inputs, record, opts, say)
        record["summary"] = summary(Path("."), jobs)
    finally:
        os.chdir(here)
    record["finished_utc"], record["wall_s"] = utc_now(), round(time.monotonic() - t_start, 1)
    write_json_atomic(out / LINK, results.portable(record, out))
    machine = [j for j in jobs if j.folder == ""]
    write_json_atomic(layout.kept(out).plan, {
        "targets": [f"{layout.job_label(j.experiment, j.variant, j.k)}.json" for j in machine],
        "planned": len(machine), "command": command,
        "reconstructed": None, "note": "the two-node stand-in (scripts/two_node_standin.py), not a Snakemake "
                                       "run: link.json says what ran where"})
    return record


def _link(nodes: netns.TwoNodes, record: dict, opts: Options, say) -> None:
    """The link's own numbers: its configuration, one TCP stream each way, the threads a rank gets."""
    record["link"] = nodes.record()
    n = opts.transfer_bytes or int(max(nodes.tbf.rate_bps / 8 * 2, 8 << 20))   # ~2 s at the rate
    record["tcp_transfer"] = {f"ns{src}_to_ns{1 - src}": netns.tcp_throughput(nodes, n, src, opts.python)
                              for src in (0, 1)}
    record["threads_per_rank"] = opts.threads
    record["torch_num_threads"] = probe_threads(nodes, 0, opts.threads, opts.python)
    say(f"link {record['rate']}: one TCP stream carries {record['tcp_transfer']['ns0_to_ns1']['bps'] / 1e9:.3f} "
        f"Gbit/s across; torch threads per rank {record['torch_num_threads']}")


def _stash(job: Planned, here: Path, stash: Path, restore: bool = False) -> None:
    """Copy one attempt's result and logs aside (or back): what a later, more disturbed
    attempt overwrites."""
    files = [job.path(here), *job.log(here).parent.glob(f"k{job.k}.*")]
    if restore:
        for f in files:
            if f.name.endswith(".json") or f.name.endswith(".log"):
                f.unlink(missing_ok=True)
        for f in stash.rglob("*"):
            if f.is_file():
                dest = here / f.relative_to(stash)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, dest)
        return
    shutil.rmtree(stash, ignore_errors=True)
    for f in files:
        if f.is_file():
            (stash / f.parent).mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, stash / f)


def _job(nodes: netns.TwoNodes, job: Planned, resolved: dict, fp: dict, inputs: dict, record: dict,
         opts: Options, say) -> None:
    """One job (again while others' CPU use spoilt it, up to opts.busy_retries), into `record`."""
    here = Path(".")
    g = job.per_node
    spec = specs.job_spec(resolved[g], fp, job.experiment, job.variant, job.k, dict(inputs))
    if job.experiment == PROBE[0]:   # as rules/common.smk's job_inputs: the k=2 sweep of its machine
        spec["inputs"]["allreduce"] = {"2": str(Planned(*SWEEP, 2, g, job.folder).path(here))}
    log = job.log(here)
    say(f"{job.path(here)}: k={job.k}, "
        + (f"across the link, {g} rank(s) per side" if job.across else "in one namespace"))
    stash = Path(".attempt") / f"{job.folder or 'runs'}-{job.experiment}-{job.variant}-k{job.k}"
    attempts, best = [], None
    for attempt in range(1 + max(0, opts.busy_retries)):
        quiet = wait_quiet(opts.quiet_wait_s, opts.busy_fraction) if opts.quiet_wait_s > 0 else None
        started: dict = {}   # the CPU window opens when the agents start: not while waiting for the locks
        r = twonode.run_measurement(spec, job.path(here), f"{log}.ranks", nodes, placement(job, opts.threads),
                                    python=opts.python, lock_dir=opts.lock_dir,
                                    on_start=lambda _procs: started.setdefault("at", (_cpu_now(), time.monotonic())))
        c0, t0 = started.get("at") or (_cpu_now(), time.monotonic())
        cpu = cpu_share(c0, _cpu_now(), time.monotonic() - t0)
        share = cpu["cpu_s_disturbed"] / max(cpu["wall_s"], 1e-9)
        busy = share > opts.busy_fraction
        attempts.append({"status": r.status, **cpu, "busy": busy, **({"before": quiet} if quiet else {})})
        again = busy and r.status == "ok" and attempt < opts.busy_retries
        say(f"  -> {r.status} in {r.elapsed_s:.0f} s (others' CPU time meanwhile {cpu['cpu_user_s_others']:g} s, "
            f"steal {cpu['cpu_s_steal']:g} s"
            + (", measured again" if again else "") + ")"
            + (f": {r.result.get('reason')}" if r.status != "ok" else ""))
        if r.status != "ok":
            break
        if best is None or share < best[0]:   # the least disturbed ok attempt so far: keep its files
            best = (share, attempt, r, cpu)
            _stash(job, here, stash)
        if not again:
            break
    if best is not None and (r.status != "ok" or best[1] != attempt):
        _stash(job, here, stash, restore=True)
        _, kept, r, cpu = best
        say(f"  kept attempt {kept + 1}, the least disturbed")
    shutil.rmtree(".attempt", ignore_errors=True)
    for i, a in enumerate(attempts):
        a["kept"] = best is not None and i == best[1]
    record["runs"][str(job.path(here))] = {
        **r.layout, "status": r.status, "elapsed_s": round(r.elapsed_s, 1), "cpu": cpu, "attempts": attempts,
        "commands": [shlex.join(c) for c in r.commands], "log": str(r.log)}
