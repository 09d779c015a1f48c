"""The workflow itself: lint, format, config errors before any job, dry-run
rerun behaviour (a changed machine, an added k), and a smoke run end to end."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import CPU_FP, ROOT

pytestmark = pytest.mark.workflow
SNAKEMAKE = shutil.which("snakemake") or "snakemake"
FAST = ["experiments=[ddp_weak]", "scales={smoke: {train_images: 32, epochs: 2}}"]


def copy_repo(dest: Path) -> Path:
    """A clean copy of the workflow (what a fresh clone holds), no results."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        src = ROOT / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    return dest


def smk(cwd, *args, check=True, timeout=900):
    p = subprocess.run([SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    return p


def job_counts(out: str) -> dict[str, int]:
    """Parse the 'Job stats' table of a dry run."""
    counts = {}
    m = re.search(r"Job stats:\n.*?\n-+\s+-+\n(.*?)\n\s*total", out, re.S)
    for line in (m.group(1).splitlines() if m else []):
        name, n = line.split()
        counts[name] = int(n)
    return counts


def hw(tmp_path: Path, name: str, **over) -> str:
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps({**CPU_FP, **over}))
    return str(p)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return copy_repo(tmp_path_factory.mktemp("wf"))


def test_lint_is_clean():
    p = smk(ROOT, "--lint", check=False)
    assert p.returncode == 0, p.stdout + p.stderr


def test_snakefmt_check():
    p = subprocess.run([shutil.which("snakefmt") or "snakefmt", "--check", "."], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_default_config_dry_run(repo):
    out = smk(repo, "-n", "--cores", "1", "report").stdout
    counts = job_counts(out)
    assert counts["download"] == 1 and counts["resize"] == 1 and counts["report"] == 1


@pytest.mark.parametrize("args, key", [
    (["colour=red"], "colour"),
    (["ks=[1,two]"], "ks"),
    (["ks=[0]"], "ks"),
    (["scale=huge"], "scale"),
    (["ks=[1,3]"], "global_batch"),
    (["watchdog={hang_timeout_s: -5}"], "hang_timeout_s"),
])
def test_bad_config_fails_before_any_job_naming_the_key(repo, args, key):
    p = smk(repo, "-n", "--cores", "1", "report", "--config", *args, check=False)
    assert p.returncode != 0
    text = p.stdout + p.stderr
    assert key in text, text[-2000:]
    assert "Job stats" not in text


def test_smoke_run_reruns_and_additions(repo, tmp_path):
    a = hw(tmp_path, "machine_a")
    cfg = ["--config", "scale=smoke", "ks=[1]", f"hardware_file={a}", *FAST]
    smk(repo, "--cores", "2", "report", *cfg)
    res = json.loads((repo / "results/runs/ddp_weak/cached/k1.json").read_text())
    assert res["status"] == "ok" and res["data"]["source"] in ("synthetic", "real")
    assert "Nothing to be done" in smk(repo, "-n", "--cores", "2", "report", *cfg).stdout

    # another machine: every measurement reruns, the data stage does not
    b = hw(tmp_path, "machine_b", cpu_model="another-cpu")
    counts = job_counts(smk(repo, "-n", "--cores", "2", "report", *cfg[:-3], f"hardware_file={b}", *FAST).stdout)
    assert counts.get("ddp_weak") == 2 and "download" not in counts and "resize" not in counts

    # one more k: only that k's jobs (and the report) run
    more = ["--config", "scale=smoke", "ks=[1,2]", f"hardware_file={a}", *FAST]
    out = smk(repo, "-n", "--cores", "2", "report", *more).stdout
    assert job_counts(out).get("ddp_weak") == 2
    assert "k1.json" not in " ".join(re.findall(r"output: (.*)", out))
