#!/usr/bin/env python3
"""Run a measurement command (torchrun, or a JAX process) under a watchdog.

    watchdog.py --spec JSON --result OUT.json --rank-logs DIR -- torchrun ...

A skipped spec writes a `skipped` result without running anything; a run that
passes its limit has its whole process group killed and is recorded `hung`; a
crashed rank fails the job with per-rank logs kept and no result left.
See dpscale.watchdog.
"""
import sys

from dpscale.watchdog import main

sys.exit(main())
