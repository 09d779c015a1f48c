"""Turn result JSONs into a report (minimal first version: a status table)."""
from __future__ import annotations

import html
import json
from pathlib import Path

from .results import load_result, write_atomic


def collect(runs_dir) -> list[dict]:
    return [load_result(p) for p in sorted(Path(runs_dir).glob("*/*/k*.json"))]


def build(runs_dir, fingerprint_path, references_dir, out_dir) -> dict:
    results = collect(runs_dir)
    fp = json.loads(Path(fingerprint_path).read_text())
    rows = [(r["experiment"], r["variant"], r["k"], r["status"], r.get("reason") or "",
             r["data"].get("source", "")) for r in results]
    md = ["# dpscale report", "", f"Machine: {fp.get('gpu_model') or fp.get('cpu_model')}", "",
          "| experiment | variant | k | status | reason | data |", "|---|---|---|---|---|---|"]
    md += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    out = Path(out_dir)
    write_atomic(out / "report.md", "\n".join(md) + "\n")
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    write_atomic(out / "report.html", f"<!doctype html><html><body><h1>dpscale report</h1><table>{body}</table></body></html>")
    return {"n": len(results)}
