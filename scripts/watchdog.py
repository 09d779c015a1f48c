#!/usr/bin/env python3
"""Run a measurement command (torchrun, or a JAX process) under a watchdog.

    watchdog.py --spec JSON --result OUT.json --rank-logs LOG.ranks [--lock-dir D --lock-wait-s S] [-- CMD ...]

A skipped spec writes a `skipped` result without running anything; the job waits
for its devices' locks (--lock-dir, --lock-wait-s) or records `failed: devices
busy`; a run that passes its limit has its whole process group killed and is
recorded `hung`; a crashed one is recorded `failed` with its reason and logs (exit
0: the report still builds); if Snakemake or the job's shell dies, the job is
killed at once. See dpscale.run.watchdog.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the package beside the workflow

from dpscale.run.watchdog import main

sys.exit(main())
