#!/usr/bin/env python3
"""Run a measurement command (torchrun, or a JAX process) under a watchdog.

    watchdog.py --spec JSON --result OUT.json --rank-logs DIR -- torchrun ...

A skipped spec writes a `skipped` result without running anything; a run that
passes its limit has its whole process group killed and is recorded `hung`; a
crashed rank fails the job with per-rank logs kept and no result left.
See dpscale.watchdog.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the package beside the workflow

from dpscale.watchdog import main

sys.exit(main())
