#!/usr/bin/env python3
"""Fetch Fashion-MNIST into ROOT/FashionMNIST/raw (torchvision's layout).

Sources: download (mirrors in order, each file checked against its published
md5, retried, written atomically; never falls back), local (the four .gz files
from --local-dir, each matching the published md5 of the .gz or of its unpacked
bytes), synthetic (a deterministic labelled stand-in), auto (--local-dir, then
Debian's dataset-fashion-mnist folder /usr/share/datasets/fashion-mnist, then the
mirrors, falling back loudly to the stand-in). Provenance, with which check each
file passed and the package it came from, goes to ROOT/source.json.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the package beside the workflow
import argparse
import logging

from dpscale.data.fetch import DataError, fetch

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--root", required=True, help="data folder (results/data)")
ap.add_argument("--source", default="auto", choices=["auto", "download", "local", "synthetic"])
ap.add_argument("--mirrors", nargs="*", default=[], help="base URLs, tried in order")
ap.add_argument("--local-dir", default="", help="folder with the four .gz files (--source local)")
ap.add_argument("--retries", type=int, default=3, help="attempts per file and mirror")
ap.add_argument("--timeout-s", type=float, default=30.0, help="socket timeout per attempt")
args = ap.parse_args()
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
try:
    prov = fetch(args.root, args.source, args.mirrors, args.local_dir or None,
                 retries=args.retries, timeout_s=args.timeout_s)
except DataError as e:
    logging.error("%s", e)
    sys.exit(1)
logging.info("Fashion-MNIST ready: source=%s origin=%s package=%s checks=%s", prov["source"], prov["origin"],
             prov.get("package"), sorted(set((prov.get("checks") or {}).values())))
