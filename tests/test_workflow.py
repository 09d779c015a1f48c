"""The workflow itself: lint, format, config errors before any job, dry-run
rerun behaviour (a changed machine, an added k), and a smoke run end to end."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from conftest import ROOT, copy_repo, job_counts, smk, write_hw

pytestmark = pytest.mark.workflow
FAST = ["experiments=[ddp_weak]", "scales={smoke: {train_images: 32, epochs: 2}}"]


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


def test_smoke_run_reruns_and_additions(repo, tmp_path):
    a = write_hw(tmp_path, "machine_a")
    cfg = ["--config", "scale=smoke", "ks=[1]", f"hardware_file={a}", *FAST]
    smk(repo, "--cores", "2", "report", *cfg)
    res = json.loads((repo / "results/runs/ddp_weak/cached/k1.json").read_text())
    assert res["status"] == "ok" and res["data"]["source"] in ("synthetic", "real")
    # the pipeline's own report, in a real browser: every figure loads, tables are there
    from test_browser import check_report, require_chromium
    html = repo / "results/report/report.html"
    page = html.read_text()
    assert "smoke" in page and ("SYNTHETIC" in page) == (res["data"]["source"] == "synthetic")
    found = check_report(html, html.parent / "screenshot.png", require_chromium())
    assert found["images"] >= 6 and found["broken"] == [], found
    assert found["tables"] >= 5
    assert "Nothing to be done" in smk(repo, "-n", "--cores", "2", "report", *cfg).stdout

    # another machine: every measurement reruns, the data stage does not
    b = write_hw(tmp_path, "machine_b", cpu_model="another-cpu")
    counts = job_counts(smk(repo, "-n", "--cores", "2", "report", *cfg[:-3], f"hardware_file={b}", *FAST).stdout)
    assert counts.get("ddp_weak") == 2 and "download" not in counts and "resize" not in counts

    # one more k: only that k's jobs (and the report) run
    more = ["--config", "scale=smoke", "ks=[1,2]", f"hardware_file={a}", *FAST]
    out = smk(repo, "-n", "--cores", "2", "report", *more).stdout
    assert job_counts(out).get("ddp_weak") == 2
    assert "k1.json" not in " ".join(re.findall(r"output: (.*)", out))
