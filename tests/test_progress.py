"""Following a run: Snakemake's rich logger plugin (snakemake-logger-plugin-rich, a
dependency) runs this workflow, and the default profile leaves Snakemake's own output
alone, whose job lines `snakemake -n` and the workflow tests read.

Why opt-in (`--logger rich`), not in profiles/default: with Snakemake 9.27.1 and the
plugin 0.5.1 a dry run prints to stderr, its job stats as a drawn table ("rule  count"
under a rule of box characters, not "job  count" over dashes), and no per-job block
(rule, output, reason: the "why" of `snakemake -n`) unless --verbose; a real run off a
terminal prints no line per finished job. A profile cannot ask whether the plugin is
installed either: Snakemake refuses an unknown --logger before parsing anything."""
from __future__ import annotations

import importlib.util

import pytest
import yaml

from conftest import ROOT, SMALL, copy_repo, job_counts, smk

HAS_RICH = importlib.util.find_spec("snakemake_logger_plugin_rich") is not None


def test_the_default_profile_keeps_snakemakes_own_output():
    profile = yaml.safe_load((ROOT / "profiles/default/config.yaml").read_text())
    assert "logger" not in profile, ("the rich logger changes what `snakemake -n` prints (the tests parse it): "
                                     "keep it opt-in, `--logger rich`")


def test_the_plugin_is_a_dependency_and_on_the_gpu_wheel_list():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"snakemake-logger-plugin-rich>=' in text   # installed by the README's `pip install -e .`
    wheels = [ln for ln in (ROOT / "tools/offline-gpu/wheels.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    assert any(ln.startswith("snakemake-logger-plugin-rich==") for ln in wheels)


@pytest.mark.slow
@pytest.mark.workflow
@pytest.mark.skipif(not HAS_RICH, reason="snakemake-logger-plugin-rich is not installed (pip install -e .)")
def test_the_rich_logger_runs_this_workflow(tmp_path):
    repo = copy_repo(tmp_path / "repo")
    cfg = ["--config", *SMALL, "ks=[1]", "data={source: synthetic}", f"locks={{dir: {tmp_path / 'locks'}}}"]
    dry = smk(repo, "-n", "--cores", "1", "report", "--logger", "rich", *cfg)
    assert "Job stats" in dry.stderr and "dry-run" in dry.stderr, dry.stderr[-2000:]
    plain = smk(repo, "-n", "--cores", "1", "report", *cfg)   # the same plan, as the tests read it
    assert job_counts(plain.stdout)["report"] == 1 and "Job stats" not in plain.stderr
    run = smk(repo, "--cores", "1", "results/data/fmnist_16px.npz", "--logger", "rich", *cfg)
    assert (repo / "results/data/fmnist_16px.npz").exists() and "Workflow Finished" in run.stdout + run.stderr
