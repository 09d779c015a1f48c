#!/usr/bin/env python3
"""Build results/report/{report.html,report.md} from every result JSON."""
import argparse

from dpscale.report import build

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--runs", required=True)
ap.add_argument("--fingerprint", required=True)
ap.add_argument("--references", default="reference")
ap.add_argument("--out-dir", required=True)
a = ap.parse_args()
print(build(a.runs, a.fingerprint, a.references, a.out_dir))
