"""Pool rounds of one stand-in protocol: the launches of each throughput point and the
pairs of each probe from several runs of the same specs (rounds minutes apart), into
one results folder the forecast reads. On a host whose cores' speed moves between
windows a few minutes apart (the 16-core stand-in, issue #30), the launches of one job
share one window; rounds put each k in several windows, so that k=1 and k=8 are
compared over the same spread of windows rather than one window each.

    python tools/gpu/pool_rounds.py OUT ROUND1/results ROUND2/results ...

A point measured in one round is copied as it is; the all-reduce sweeps (a collective,
not the training) are the first round's that has them. Each pooled result lists its
rounds in `pooled_from`; its launches stay launches (never pooled with epochs).
"""
import json
import shutil
import statistics
import sys
from pathlib import Path

PAIRS = ("comm_ms_pairs", "synced_ms_pairs", "no_sync_ms_pairs", "straggler_share_pairs")


def pool_throughput(rs: list[dict]) -> dict:
    out = json.loads(json.dumps(rs[0]))
    m = out["metrics"]
    m["samples_per_s_launch_repeats"] = [x for r in rs for x in r["metrics"]["samples_per_s_launch_repeats"]]
    m["samples_per_s_launches"] = [x for r in rs for x in r["metrics"]["samples_per_s_launches"]]
    m["launches"] = len(m["samples_per_s_launches"])
    m["samples_per_s"] = statistics.median_low(m["samples_per_s_launches"])   # a launch's, as the watchdog records
    return out


def pool_probe(rs: list[dict]) -> dict:
    out = json.loads(json.dumps(rs[0]))
    m = out["metrics"]
    for key in PAIRS:
        m[key] = [x for r in rs for x in r["metrics"][key]]
    m["no_sync_ms_ranks"] = [sum(ranks, []) for ranks in zip(*(r["metrics"]["no_sync_ms_ranks"] for r in rs))]
    m["pairs"] = len(m["comm_ms_pairs"])
    m["comm_ms"] = statistics.median(m["comm_ms_pairs"])
    m["straggler_share"] = statistics.fmean(m["straggler_share_pairs"])
    m["synced_ms"], m["no_sync_ms"] = statistics.median(m["synced_ms_pairs"]), statistics.median(m["no_sync_ms_pairs"])
    return out


def pool(rs: list[dict]) -> dict:
    m = rs[0]["metrics"]
    if len(rs) == 1 or not ("samples_per_s_launch_repeats" in m or "comm_ms_pairs" in m):
        return rs[0]
    out = pool_throughput(rs) if "samples_per_s_launch_repeats" in m else pool_probe(rs)
    out["pooled_from"] = [r["_round"] for r in rs]
    return out


def main(out: Path, rounds: list[Path]) -> None:
    if out.exists():
        sys.exit(f"pool_rounds: {out} exists; give a new folder")
    (out / "runs").mkdir(parents=True)
    for name in ("fingerprint.json", "data"):
        src = rounds[0] / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, out / name)
    points = sorted({p.relative_to(r / "runs") for r in rounds for p in (r / "runs").glob("*/*/k*.json")})
    for rel in points:
        rs = []
        for r in rounds:
            p = r / "runs" / rel
            if p.exists() and (res := json.loads(p.read_text())).get("status") == "ok":
                rs.append({**res, "_round": str(r)})
        if not rs:
            continue
        res = pool(rs)
        res.pop("_round", None)
        (out / "runs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / "runs" / rel).write_text(json.dumps(res, indent=1))
        print(rel, f"{len(rs)} round(s)")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), [Path(x) for x in sys.argv[2:]])
