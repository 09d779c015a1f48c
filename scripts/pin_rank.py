#!/usr/bin/env python3
"""torchrun target that pins its rank to one core, then becomes the real worker.

    torchrun ... pin_rank.py --cpus 2,3 -- scripts/torch_worker.py --spec JSON --result OUT.json

Local rank r (torchrun's LOCAL_RANK) is bound to the r-th core of --cpus, then this
process exec()s `python -u <worker> <args>`: the same pid, so torchrun still watches
(and kills) it, and the worker sets its own parent-death signal as it always does.
Used by dpscale.standin.twonode where a node runs more than one rank; with one rank per
node, `taskset` on the torchrun agent pins it and this script is not used.
"""
import argparse
import os
import sys

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--cpus", required=True, help="comma-separated cores, one per local rank")
ap.add_argument("worker", nargs=argparse.REMAINDER, help="-- the worker script and its arguments")
args = ap.parse_args()
cmd = args.worker[1:] if args.worker[:1] == ["--"] else args.worker
cores = [int(c) for c in args.cpus.split(",")]
local = int(os.environ["LOCAL_RANK"])
if local >= len(cores):
    sys.exit(f"pin_rank.py: local rank {local} has no core in --cpus {args.cpus}")
os.sched_setaffinity(0, {cores[local]})
os.execv(sys.executable, [sys.executable, "-u", *cmd])
