#!/usr/bin/env python3
"""Build the report: report.html (self-contained: figures inlined, opens from disk),
report.md, figures/ (PNG + SVG), tables/ (CSV) and plan.json, from this run's results
beside every reference machine and the book's published numbers.

This run: --runs and --fingerprint, its plan given by --targets (the rule passes
every planned result; one that is missing shows as "not run"), or, without
--targets, every result found under --runs. Reference machines: each folder
reference/<machine>/ under a --references folder (fingerprint.json, plan.json,
runs/{experiment}/{variant}/k{k}.json, as `dpscale keep` writes them).

Example, a reference machine's report rebuilt beside the others:
  python scripts/report.py --runs reference/h200x2/runs --fingerprint reference/h200x2/fingerprint.json \\
      --targets-from reference/h200x2/plan.json --name h200x2 --references reference \\
      --out-dir reference/h200x2/report
"""
import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from dpscale.provenance import COMMAND_VAR  # noqa: E402
from dpscale.report import Refused, book, build  # noqa: E402
from dpscale.run import lifeline  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--runs", required=True, help="this run's results folder: {experiment}/{variant}/k{k}.json")
ap.add_argument("--fingerprint", required=True, help="this machine's fingerprint (results/fingerprint.json)")
ap.add_argument("--targets", nargs="*", default=None, help="the planned result files (the rule's inputs)")
ap.add_argument("--targets-from", default=None, help="a plan.json whose targets are the plan")
ap.add_argument("--name", default="this run", help="what to call this run's machine (default: %(default)s)")
ap.add_argument("--references", nargs="*", default=[str(ROOT / "reference")],
                help="folders of reference machines, reference/<machine>/ (default: the workflow's reference/)")
ap.add_argument("--book", default=str(book.PATH),
                help="the book's numbers (default: %(default)s; a missing file means none)")
ap.add_argument("--resolved", default=None, help="the resolved configuration as JSON (its hash is shown)")
ap.add_argument("--out-dir", required=True, help="where report.html, report.md, figures/ and tables/ go")
ap.add_argument("--key", default=None,
                help="write this file once the report is built (the rule's output named by "
                     "dpscale.plan.replan.Replanner.report_key), and remove the earlier ones")
ap.add_argument("--workers", type=int, default=1, help="processes drawing the figures (default: %(default)s)")
a = ap.parse_args()
# Snakemake killed while the report draws (kill -9, a closed terminal): stop, write nothing
lifeline.guard(say=lambda line: print(f"[report] {line}", file=sys.stderr, flush=True))

targets, plan_info = a.targets, None
if a.targets_from:
    plan_info = json.loads(Path(a.targets_from).read_text())
    targets = [str(Path(a.runs) / t) for t in plan_info["targets"]]
info = {"command": os.environ.get(COMMAND_VAR)}
if a.resolved:
    info.update(resolved=json.loads(a.resolved), config_hash=hashlib.sha256(a.resolved.encode()).hexdigest()[:16])
try:
    summary = build(a.runs, a.fingerprint, a.out_dir, targets=targets, references=a.references, book_path=a.book,
                    name=a.name, build_info=info, plan_info=plan_info, workers=a.workers)
except Refused as e:
    sys.exit(str(e))
if a.key:
    from dpscale.results import write_atomic  # noqa: E402
    for old in Path(a.key).parent.glob("key-*.txt"):
        old.unlink(missing_ok=True)
    write_atomic(a.key, "the report was built for these attempt counts, this configuration and this "
                        "report code (dpscale.plan.replan.Replanner.report_key)\n")
print(json.dumps(summary, indent=1))
