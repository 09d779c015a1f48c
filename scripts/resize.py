#!/usr/bin/env python3
"""Build the resize cache: every image resized once, the seed's way (torchvision
Resize on PIL images, antialiased bilinear, uint8), stored with the labels in one
.npz, its sha256 and provenance in a JSON beside it. Readers verify the sha256."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the package beside the workflow
import argparse
import logging
import time

from dpscale.data.resize import build_cache

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--root", required=True, help="data folder holding FashionMNIST/raw and source.json")
ap.add_argument("--size", type=int, required=True, help="side of the resized images, pixels")
ap.add_argument("--out", required=True, help="the .npz to write")
ap.add_argument("--meta", required=True, help="the JSON (sha256, provenance) to write beside it")
args = ap.parse_args()
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
t0 = time.perf_counter()
meta = build_cache(args.root, args.size, args.out, args.meta)
logging.info("resized %d + %d images to %dx%d in %.1f s (source=%s, sha256 %s...)", meta["n_train"],
             meta["n_test"], args.size, args.size, time.perf_counter() - t0, meta["source"], meta["sha256"][:12])
