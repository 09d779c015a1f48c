#!/usr/bin/env python3
"""Count the model's training FLOPs per sample once, with torch.utils.flop_counter
(forward + backward of the seed's ResNet-18 at the protocol's image size, 2 FLOPs per
multiply-add), so both frameworks' MFU divide by the same, counted number.

    python scripts/flops.py --size 64 --out results/model/flops_64px.json

The PyTorch workers count in-process with the same function; the JAX workers read
this file (they do not import torch). Written atomically."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the package beside the workflow
import argparse
import logging

from dpscale.model.models import model_flops_record
from dpscale.results import write_json_atomic

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--size", type=int, required=True, help="side of the (square) input images, pixels")
ap.add_argument("--out", required=True, help="the JSON to write")
args = ap.parse_args()
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
rec = model_flops_record(args.size)
write_json_atomic(args.out, rec)
logging.info("ResNet-18 at %dpx: %.4g FLOP per sample (forward+backward), %d parameters -> %s",
             args.size, rec["flops_per_sample"], rec["parameters"], args.out)
