"""Pool rounds of one stand-in protocol into one results folder the forecast reads
(dpscale.standin.rounds says how and why):

    python tools/lab/pool_rounds.py OUT ROUND1/results ROUND2/results ...

The first round's fingerprint and data records are copied; a point measured in one
round is copied as it is.
"""
import json
import shutil
import sys
from pathlib import Path

from dpscale import layout
from dpscale.results import save, write_json_atomic
from dpscale.standin import rounds as dsrounds


def main(out: Path, rounds: list[Path]) -> None:
    if out.exists():
        sys.exit(f"pool_rounds: {out} exists; give a new folder")
    pooled, kept = layout.kept(out), [layout.kept(r) for r in rounds]   # ROUND/results: flat, as a kept machine
    pooled.runs.mkdir(parents=True)
    for name in ("fingerprint", "data"):
        src = getattr(kept[0], name)
        if src.exists():
            (shutil.copytree if src.is_dir() else shutil.copy)(src, getattr(pooled, name))
    for rel in sorted({p.relative_to(r.runs) for r in kept for p in r.runs.glob(layout.RESULT_GLOB)}):
        got = [(json.loads((r.runs / rel).read_text()), str(r.root)) for r in kept if (r.runs / rel).exists()]
        got = [(res, name) for res, name in got if res.get("status") == "ok"]
        if got:
            save(pooled.runs / rel, dsrounds.pool([g[0] for g in got], [g[1] for g in got]))
            print(rel, f"{len(got)} round(s)")
    targets = sorted(str(p.relative_to(pooled.runs)) for p in pooled.runs.glob(layout.RESULT_GLOB))
    # the report reads a kept machine's plan: without one it warns that the plan is unknown
    write_json_atomic(pooled.plan, {"targets": targets, "planned": len(targets),
                                         "command": f"tools/lab/pool_rounds.py over {len(rounds)} round(s)",
                                         "pooled_from": [str(r) for r in rounds]})


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), [Path(x) for x in sys.argv[2:]])
