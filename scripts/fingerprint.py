#!/usr/bin/env python3
"""Write the machine's fingerprint (the JSON the workflow probed when it was parsed)
to results/fingerprint.json, atomically: the `fingerprint` rule (rules/report.smk)."""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from dpscale.results import write_atomic  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--json", required=True, help="the fingerprint, as dpscale.plan.fingerprint.dumps wrote it")
ap.add_argument("--out", required=True, help="where it goes (results/fingerprint.json)")
a = ap.parse_args()
write_atomic(a.out, a.json)
print(f"fingerprint: {a.out}")
