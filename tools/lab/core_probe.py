#!/usr/bin/env python3
"""What one pinned, single-threaded rank of the CPU stand-in gets from its core, alone
and beside others (issue #30: one pinned rank read 62.6, 78.2 and 68.7 samples/s in
three launches a minute apart on the H200 box's 16 cores).

    python3 tools/lab/core_probe.py [--cores 2-15] [--seconds 4] [--rounds 3]

Prints the CPU topology (which logical CPUs share a physical core) and, for n = 1, 2,
4, 8 processes each pinned to its own logical CPU (the stand-in's placement: the first
n of --cores), and for n = 8 on distinct physical cores where the box has SMT siblings,
each process's ResNet-18 forward+backward rate at the smoke scale (batch 8, 32 px,
fp32, one thread), for --seconds after a warm-up; the configurations interleaved over
--rounds rounds, so a drift of the box shows as a spread within one configuration.
"""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))


def cpus(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def topology() -> dict[int, str]:
    """logical CPU -> its thread_siblings_list (CPUs sharing its physical core)."""
    base = Path("/sys/devices/system/cpu")
    return {int(p.name[3:]): (p / "topology/thread_siblings_list").read_text().strip()
            for p in base.glob("cpu[0-9]*") if (p / "topology/thread_siblings_list").exists()}


def worker(core: int, seconds: float, start, out) -> None:
    os.sched_setaffinity(0, [core])
    import torch
    torch.set_num_threads(1)
    from dpscale.model.models import torch_resnet18
    net = torch_resnet18()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    X, y = torch.randn(8, 1, 32, 32), torch.randint(0, 10, (8,))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(X), y).backward()
        opt.step()
    for _ in range(3):
        step()
    start.wait()   # every process times the same window
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
    out.put((core, 8 * n / (time.perf_counter() - t0)))


def run(cores: list[int], seconds: float) -> list[float]:
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(len(cores)), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(c, seconds, start, out)) for c in cores]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=300) for _ in procs)
    for p in procs:
        p.join()
    return [got[c] for c in cores]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cores", default="2-15")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    pool, topo = cpus(a.cores), topology()
    groups = sorted({topo[c] for c in pool})
    print(f"logical CPUs {a.cores}: {len(pool)}; physical cores among them: {len(groups)}; siblings: {groups}")
    configs = {f"n={n}": pool[:n] for n in (1, 2, 4, 8) if n <= len(pool)}
    if len(groups) < len(pool):   # SMT: one logical CPU per physical core
        distinct = [cpus(g)[0] for g in groups if cpus(g)[0] in pool]
        if len(distinct) >= 8:
            configs["n=8 distinct physical"] = distinct[:8]
    rows = {name: [] for name in configs}
    for r in range(a.rounds):
        for name, cores in configs.items():
            rates = run(cores, a.seconds)
            rows[name].append(rates)
            print(f"round {r + 1} {name:<24} cores {cores}: per process "
                  + ", ".join(f"{x:.1f}" for x in rates) + f" samples/s (mean {statistics.fmean(rates):.1f})",
                  flush=True)
    summary = {name: {"mean_per_process": statistics.fmean(x for rr in v for x in rr),
                      "round_means": [statistics.fmean(rr) for rr in v]} for name, v in rows.items()}
    print(json.dumps({"topology": topo, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
