#!/usr/bin/env python3
"""Build the report from every result JSON: figures (PNG + SVG), tables (CSV), a
self-contained report.html (figures inlined; opens from disk) and report.md.

Machines shown side by side: this run (--runs + --fingerprint), every reference
machine under --references (a folder reference/<machine>/ holding fingerprint.json
and runs/{experiment}/{variant}/k{k}.json, laid out like results/), and the book's
published RTX 4090 numbers (--book, default <references>/book_4090.yaml).

Example:
  python scripts/report.py --runs results/runs --fingerprint results/fingerprint.json \\
      --references reference --out-dir results/report
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from dpscale.report import build  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--runs", required=True, help="this run's results folder: {experiment}/{variant}/k{k}.json")
ap.add_argument("--fingerprint", required=True, help="this machine's fingerprint (results/fingerprint.json)")
ap.add_argument("--references", default="reference",
                help="folder of reference machines, reference/<machine>/{fingerprint.json,runs/} "
                     "(default: %(default)s; a missing folder means none)")
ap.add_argument("--book", default=None,
                help="the book's numbers (default: <references>/book_4090.yaml; a missing file means none)")
ap.add_argument("--out-dir", required=True, help="where report.html, report.md, figures/ and tables/ go")
a = ap.parse_args()
summary = build(a.runs, a.fingerprint, a.references, a.out_dir, book_path=a.book)
print(json.dumps(summary, indent=1))
