"""The workflow itself: lint, format, dry runs, and a smoke run end to end whose
results live outside the clone: the plan it reports, its report in a real browser,
and what reruns after a changed experiment's code, a changed machine, an added k."""
from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess

import pytest
from conftest import ROOT, copy_repo, job_counts, smk, write_hw

pytestmark = pytest.mark.workflow
# k=1 runs and k=4 is skipped: what this test checks (where results go, the plan, what
# reruns, the report in a browser) needs no k=2; the fault tests run k=2 workflows
FAST = ["experiments=[ddp_weak]", "scales={smoke: {train_images: 32, epochs: 2, image_size: 16}}"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return copy_repo(tmp_path_factory.mktemp("wf"))


def elsewhere(repo, work, *args, check=True):
    """snakemake -s <clone>/Snakefile -d <work>: results in a folder outside the clone."""
    work.mkdir(parents=True, exist_ok=True)
    return smk(work, "-s", str(repo / "Snakefile"), "-d", str(work), *args, check=check)


def test_lint_is_clean():
    p = smk(ROOT, "--lint", check=False)
    assert p.returncode == 0, p.stdout + p.stderr


def test_snakefmt_check():
    p = subprocess.run([shutil.which("snakefmt") or "snakefmt", "--check", "."], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_default_config_dry_run(repo):
    counts = job_counts(smk(repo, "-n", "--cores", "1", "report").stdout)
    # two resizes at smoke scale: 32 px for throughput, 16 px for time to accuracy (paper: both 64)
    assert counts["download"] == 1 and counts["resize"] == 2 and counts["report"] == 1


def planned_results(out: str) -> set[str]:
    """The result files a forced dry run schedules: the DAG's result targets."""
    return {f for line in re.findall(r"output: (.*)", out) for f in line.split(", ")
            if f.startswith("results/runs/")}


@pytest.mark.slow
def test_smoke_run_elsewhere_reruns_and_additions(repo, tmp_path):
    work, a = tmp_path / "run", write_hw(tmp_path, "machine_a")
    cfg = ["--config", "scale=smoke", "ks=[1,4]", f"hardware_file={a}", *FAST]
    elsewhere(repo, work, "--cores", "2", "report", *cfg)
    assert not (repo / "results/runs").exists(), "results belong to the working folder, not the clone"
    res = json.loads((work / "results/runs/ddp_weak/cached/k1.json").read_text())
    assert res["status"] == "ok" and res["data"]["source"] in ("synthetic", "real")

    # the report planned exactly the DAG's result targets; k=4 is skipped, with its reason
    plan = json.loads((work / "results/report/plan.json").read_text())
    dag = planned_results(elsewhere(repo, work, "-n", "-F", "--cores", "2", "report", *cfg).stdout)
    assert {f"results/runs/{t}" for t in plan["targets"]} == dag and len(dag) == 4
    status = list(csv.DictReader((work / "results/report/tables/status.csv").open()))
    k4 = [r for r in status if r["k"] == "4" and r["machine"] == "this run"]   # not a kept machine's k=4
    assert len(k4) == 2 and all(r["status"] == "SKIPPED" and "k=4 needs 4 devices" in r["reason"] for r in k4)
    assert plan["counts"] == {"ok": 2, "skipped": 2, "hung": 0, "failed": 0, "not run": 0}

    # the pipeline's own report, in a real browser at 900 and 1400 px
    from test_browser import assert_legible, check_report, require_chromium

    from dpscale.report.chapters import figure_specs
    html = work / "results/report/report.html"
    page = html.read_text()
    # this run's provenance line names its data; other machines on the page may be synthetic
    assert "smoke" in page and f"scale smoke; data {res['data']['source']};" in page
    # what the page shows is read from the DOM; no screenshot (test_browser saves those: 2.5 s here)
    assert_legible(check_report(html, None, require_chromium()), len(figure_specs()))
    assert "Nothing to be done" in elsewhere(repo, work, "-n", "--cores", "2", "report", *cfg).stdout

    # a change to what an experiment's code does marks its results stale; a comment or a docstring does not
    source = repo / "src/dpscale/measure/torch_ddp.py"
    original = source.read_text()
    try:
        source.write_text(original.replace('"""PyTorch DDP throughput', '"""(reworded) PyTorch DDP throughput') + "\n# a comment\n")
        assert "Nothing to be done" in elsewhere(repo, work, "-n", "--cores", "2", "report", *cfg).stdout
        source.write_text(original + "\nTIMING_FIX = 1\n")
        out = elsewhere(repo, work, "-n", "--cores", "2", "report", *cfg).stdout
        assert job_counts(out).get("ddp_weak") == 4 and "Params have changed" in out
    finally:
        source.write_text(original)
    # the planner, the supervisor, the data stage's download and the lab are in no digest:
    # all four edited, one dry run (a file in a digest plans its jobs; the plan names them)
    edits = {rel: (repo / "src/dpscale" / rel).read_text()
             for rel in ("plan/cluster.py", "run/command.py", "data/fetch.py", "lab/kernel_table.py")}
    try:
        for rel, before in edits.items():
            (repo / "src/dpscale" / rel).write_text(before + "\nUNRELATED_CONSTANT = 1\n")
        out = elsewhere(repo, work, "-n", "--cores", "2", "report", *cfg).stdout
        assert set(job_counts(out)) <= {"report"}, out[-3000:]
    finally:
        for rel, before in edits.items():
            (repo / "src/dpscale" / rel).write_text(before)
    # a change to what draws the report rebuilds the report alone
    kit = repo / "src/dpscale/report/figures/kit.py"
    original = kit.read_text()
    try:
        kit.write_text(original + "\nFIGURE_FIX = 1\n")
        assert job_counts(elsewhere(repo, work, "-n", "--cores", "2", "report", *cfg).stdout) == {"report": 1}
    finally:
        kit.write_text(original)

    # another machine: every measurement reruns, the data stage does not
    b = write_hw(tmp_path, "machine_b", cpu_model="another-cpu")
    counts = job_counts(elsewhere(repo, work, "-n", "--cores", "2", "report", *cfg[:-3], f"hardware_file={b}",
                                  *FAST).stdout)
    assert counts.get("ddp_weak") == 4 and "download" not in counts and "resize" not in counts

    # one more k: only that k's jobs (and the report) run
    more = ["--config", "scale=smoke", "ks=[1,4,8]", f"hardware_file={a}", *FAST]
    out = elsewhere(repo, work, "-n", "--cores", "2", "report", *more).stdout
    assert job_counts(out).get("ddp_weak") == 2 and all("k8.json" in f for f in planned_results(out))
