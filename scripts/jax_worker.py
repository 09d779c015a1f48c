#!/usr/bin/env python3
"""One JAX experiment in one process that sees all k devices (section 13.6.4).

    python scripts/jax_worker.py --spec JSON --result OUT.json

The spec (built by rules/common.smk, see dpscale.plan.specs.job_spec) names the
experiment (see the list below, from dpscale.registry) and its protocol numbers.

Before JAX is imported this sets, for backend xla-cpu, JAX_PLATFORMS=cpu and
XLA_FLAGS=--xla_force_host_platform_device_count=N (N = k, or the experiment's
min_devices if larger) so a CPU-only box has k host devices; for xla-gpu,
XLA_PYTHON_CLIENT_PREALLOCATE=false (JAX would otherwise take 75% of each GPU's
memory up front, and peak-memory numbers would be meaningless).
OUT.json is written atomically; an error exits non-zero and leaves no result.
"""
import sys
import time

STARTED = time.time()   # the interpreter's start, before anything is imported
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the package beside the workflow
import argparse
import json
import os

from dpscale import registry


def set_platform_env(spec: dict) -> None:
    """Must run before `import jax`: XLA reads these once, at backend start-up."""
    k = int(spec["k"])
    if spec["backend"] == "xla-cpu":
        n = max(k, registry.get(spec["experiment"]).min_devices)
        if spec.get("launch"):   # one process per node, each with its node's devices
            n = int(spec["launch"]["gpus_per_node"])
        flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count")]
        os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={n}"])
        os.environ["JAX_PLATFORMS"] = "cpu"
    elif spec["backend"] == "xla-gpu":
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    else:
        raise SystemExit(f"jax_worker: backend {spec['backend']!r} is not xla-cpu or xla-gpu")


def main() -> None:
    listing = "\n".join(f"  {e.name:<14}{e.title} (variants {'|'.join(e.variant_names())})"
                        for e in registry.EXPERIMENTS.values() if e.family == "jax")
    ap = argparse.ArgumentParser(description=__doc__, epilog="experiments:\n" + listing,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="job spec as JSON (keys experiment, variant, k, "
                                                  "backend, config.protocol, inputs.cache, ...)")
    ap.add_argument("--result", required=True, help="result JSON to write")
    args = ap.parse_args()
    spec = json.loads(args.spec)
    set_platform_env(spec)
    if spec.get("launch"):   # k spans nodes: join the other nodes' processes first
        from dpscale.run.command import jax_initialize
        jax_initialize(gpu=spec["backend"] == "xla-gpu")
    from dpscale.measure.jax_job import run   # imports jax: only after the environment is set
    from dpscale.measure import timing
    timing.mark("interpreter", STARTED)
    timing.mark("imports")

    run(spec, args.result)


if __name__ == "__main__":
    main()
