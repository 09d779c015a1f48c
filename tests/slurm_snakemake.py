"""`python tests/slurm_snakemake.py ARGS` is `python -m snakemake ARGS` with the SLURM
executor plugin's status polling capped at DPSCALE_TEST_SLURM_POLL_S seconds (default
2): test_slurm.py's runs, nothing a user runs.

snakemake-executor-plugin-slurm 2.8.0 queries the job states
init_seconds_before_status_checks after a submission (a setting: the tests pass 1),
then waits 10 s longer after every query that finds no job ended (11, 21, 31 s, up to
180 s; not a setting), and the first wait again once one has. A job of ~10 s was
therefore seen done ~33 s after it was submitted, and the smoke pipeline of five jobs
spent most of its 232 s in these waits. The cap changes when Snakemake learns that a
job ended (one squeue every 2 s here), not what SLURM runs or what Snakemake does then.
"""
from __future__ import annotations

import os
import sys

import snakemake_executor_plugin_slurm as plugin
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

CAP_S = float(os.environ.get("DPSCALE_TEST_SLURM_POLL_S", "2"))
_wait = RemoteExecutor.next_seconds_between_status_checks


def _capped(self, seconds):
    _wait.fset(self, seconds if seconds is None else min(seconds, CAP_S))


# the plugin sets the next wait through this property after each query
plugin.Executor.next_seconds_between_status_checks = property(_wait.fget, _capped)

if __name__ == "__main__":
    from snakemake.cli import main

    sys.exit(main())
