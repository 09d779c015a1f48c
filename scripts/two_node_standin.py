#!/usr/bin/env python3
"""Two nodes on one machine, joined by a link of a chosen rate: measure the pipeline's
inter-node tier (and DDP scaling across it) where there is no second machine.

Two network namespaces joined by a veth pair, each end shaped by tc's tbf to --rate
(dpscale.standin.netns); in them, torchrun agents with a c10d rendezvous across the link,
as on a cluster (dpscale.standin.twonode); the pipeline's own job specs and worker
(dpscale.standin.standin). It measures, at one rate:

  allreduce/default k=2        the all-reduce sweep, one rank per namespace: every byte
                               crosses the link (the forecast's inter-node tier)
  ddp_weak/cached k=1, k=2     weak scaling, k=1 in one namespace, k=2 one rank per side
  ddp_comm_probe/default k=2   synced vs no_sync() steps across the link
  with 4+ cores also k=4 (2 ranks per side) and the one-namespace k=2 measurements

Every rank is pinned to its own core and runs --threads threads at every k. Results
go to OUT/runs/<experiment>/<variant>/k<k>.json (a kept machine's layout, with
fingerprint.json, plan.json, logs/), and OUT/link.json records the link (rate, tbf
burst/latency, namespaces, a TCP transfer's measured rate), where each run's ranks ran,
and a summary (samples/s, step times, busbw, the communication share of the k=2 step).

Needs root (network namespaces, tc). Example:

    sudo python scripts/two_node_standin.py --out results/twonode            # 500mbit
    sudo python scripts/two_node_standin.py --rate 1gbit --out results/twonode-1g
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the package beside the workflow
import argparse
import shlex
import signal

from dpscale import layout
from dpscale.standin import netns, standin

REPO = Path(__file__).resolve().parents[1]


def _stop(signum, frame):   # SIGTERM/SIGHUP: unwind, so that every process and namespace goes
    raise KeyboardInterrupt(signal.Signals(signum).name)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default=standin.DEFAULT_RATE,
                    help=f"the link's rate each way, in tc's units (bit, kbit, mbit, gbit; default "
                         f"{standin.DEFAULT_RATE})")
    ap.add_argument("--ks", default=None,
                    help="comma-separated k to measure (default 1,2; 1,2,4 with 4+ cores): k <= ranks per node "
                         "runs in one namespace, k = 2 x ranks per node across the link")
    ap.add_argument("--out", required=True, type=Path, help="folder of the results (a kept machine's layout)")
    ap.add_argument("--scale", default="smoke", choices=["smoke", "paper"],
                    help="the protocol's scale, resolved from config.yaml as the workflow does (default smoke)")
    ap.add_argument("--timeout-s", type=float, default=None,
                    help="hang limit of each measurement (config watchdog.hang_timeout_s; default: the "
                         "config's, 120 s at smoke)")
    ap.add_argument("--data", type=Path, default=layout.working(REPO).data,
                    help="folder of the resize cache, built there by the data stage's functions if missing "
                         "(default: the workflow's results/data)")
    ap.add_argument("--threads", type=int, default=1, help="threads per rank at every k (default 1)")
    ap.add_argument("--per-node", type=int, default=None,
                    help="ranks per namespace (default: 2 with 4+ cores, else 1)")
    ap.add_argument("--busy-retries", type=int, default=2,
                    help="measure a job again when other processes' CPU time and the hypervisor's steal took "
                         "more than --busy-fraction of its wall time meanwhile, up to this many times, and keep the least disturbed "
                         "attempt (default 2; 0: never)")
    ap.add_argument("--busy-fraction", type=float, default=0.05,
                    help="the share of a job's wall time others' CPU time and steal may take (default 0.05)")
    ap.add_argument("--quiet-wait-s", type=float, default=300,
                    help="before each job, wait up to this long for a 5 s window in which other processes (and "
                         "steal) stay under --busy-fraction of the CPU (default 300; 0: start at once)")
    ap.add_argument("--lock-dir", default=None,
                    help="folder of the per-core locks shared with the workflow (default /tmp/dpscale-locks)")
    return ap


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    ks = [int(k) for k in a.ks.split(",")] if a.ks else None
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    command = shlex.join(["python", "scripts/two_node_standin.py", *(sys.argv[1:] if argv is None else argv)])
    try:
        opts = standin.Options(threads=a.threads, lock_dir=a.lock_dir, busy_retries=a.busy_retries,
                               busy_fraction=a.busy_fraction, quiet_wait_s=a.quiet_wait_s)
        rec = standin.run(a.out, a.rate, ks, a.scale, a.timeout_s, a.data, a.per_node, opts, command=command)
    except netns.NetnsUnavailable as e:
        print(f"two_node_standin: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"two_node_standin: stopped ({e or 'interrupt'}): its processes and namespaces are gone",
              file=sys.stderr)
        return 130
    say_summary(rec, a.out)
    bad = [p for p, r in rec["runs"].items() if r["status"] != "ok"]
    if bad:
        print(f"not ok: {', '.join(bad)} (see their records and logs)", file=sys.stderr)
    return 1 if bad else 0


def say_summary(rec: dict, out: Path) -> None:
    s = rec.get("summary", {})
    print(f"wrote {layout.kept(out).runs}, {out / standin.LINK} in {rec['wall_s']:.0f} s")
    for key in ("ddp_weak_k1", "ddp_weak_k2_across"):
        if key in s:
            print(f"  {key}: {s[key]['samples_per_s']:.1f} samples/s, step {s[key]['step_ms_median']:.1f} ms")
    if "comm_fraction_of_k2_step" in s:
        c = s["comm_fraction_of_k2_step"]
        print(f"  communication share of the k=2 step: {c['from_step_medians']:.1%} (step medians), "
              f"{c['from_samples_per_s']:.1%} (samples/s)")
    for row in s.get("allreduce_k2_across", {}).get("largest_payloads", []):
        print(f"  all-reduce across the link, {row['bytes'] / 2**20:g} MiB: busbw "
              f"{row['busbw_GBps_out_of_place']:.4f} GB/s out-of-place, {row['busbw_GBps_in_place']:.4f} in-place")


if __name__ == "__main__":
    sys.exit(main())
