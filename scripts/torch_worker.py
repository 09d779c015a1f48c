#!/usr/bin/env python3
"""torchrun target: one rank of a PyTorch experiment (DDP weak/strong scaling,
no_sync probe, all-reduce sweep, memcpy training, bucket sweep, FSDP).

    torchrun --standalone --nproc-per-node=K scripts/torch_worker.py --spec JSON --result OUT.json

The spec (built by the workflow's rules/common.smk) names the experiment, its
protocol numbers and input files. Rank 0 writes OUT.json atomically. A rank gets
SIGKILL when its torchrun dies, however it dies.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the package beside the workflow
from dpscale.run.lifeline import die_with_parent

die_with_parent()   # first, before torch loads: a rank never outlives its torchrun (dpscale.run.lifeline)
import argparse
import json

from dpscale.measure.torch_job import run

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--spec", required=True, help="job spec as JSON")
ap.add_argument("--result", required=True, help="result JSON written by rank 0")
args = ap.parse_args()
run(json.loads(args.spec), args.result)
