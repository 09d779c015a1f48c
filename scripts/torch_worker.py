#!/usr/bin/env python3
"""torchrun target: one rank of a PyTorch experiment (every experiment of the torch
family in dpscale.registry: `--help` lists them).

    torchrun --standalone --nproc-per-node=K scripts/torch_worker.py --spec JSON --result OUT.json

The spec (dpscale.plan.specs.job_spec, a params value of the rule) names the experiment, its
protocol numbers and input files. Rank 0 writes OUT.json atomically. A rank gets
SIGKILL when its torchrun dies, however it dies.
"""
import sys
import time

STARTED = time.time()   # torchrun's own start and this interpreter's, before anything is imported
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the package beside the workflow
from dpscale.run.lifeline import die_with_parent

die_with_parent()   # first, before torch loads: a rank never outlives its torchrun, or its watchdog where it runs alone
import argparse
import gc
import json
import os

from dpscale import registry
from dpscale.measure import timing
from dpscale.measure.torch_job import run

# torchrun's agent starts every rank of a job of several; one rank starts alone (dpscale.run.command)
timing.mark("torchrun and interpreter" if "TORCHELASTIC_RUN_ID" in os.environ else "interpreter", STARTED)
timing.mark("imports")

listing = "\n".join(f"  {e.name:<20}{e.title} (variants {'|'.join(e.variant_names())})"
                    for e in registry.EXPERIMENTS.values() if e.family == "torch")
ap = argparse.ArgumentParser(description=__doc__, epilog="experiments:\n" + listing,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--spec", required=True, help="job spec as JSON")
ap.add_argument("--result", required=True, help="result JSON written by rank 0")
args = ap.parse_args()
run(json.loads(args.spec), args.result)
# The interpreter's last garbage collection walks every object torch made (about 0.7 s
# of CPU per rank on a 2-core box, part of each launch's "result and exit"). The result is
# written and the process group gone, so it is skipped; the OS frees what is left.
gc.freeze()
