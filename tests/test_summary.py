"""The closing summary (dpscale.report.summary): what a run prints last. Its text comes
from the report (tests/test_report.py checks summary.txt's numbers); here, what the
Snakefile's onsuccess and onerror print from it. A real run's last lines:
test_isolation.py's crashed job."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT, env_with_src

from dpscale.report import summary
from dpscale.results import audit, make_result, save

SUMMARY = "\n== the answer ==\nh200: k=2 1.29x\n\nreport: /somewhere/report.html\n"


def _result(path, status="ok", reason=None, log=None):
    r = make_result(experiment="ddp_weak", variant="cached", k=2, status=status, reason=reason, metrics={},
                    config={}, fingerprint={}, backend="gloo")
    if log:
        r["log"] = log
    path.parent.mkdir(parents=True, exist_ok=True)
    save(path, r)
    return str(path)


def _report_read(tmp_path, *targets):
    """What the report writes beside summary.txt: the digests of the results it read."""
    read = {"ddp_weak/cached/k2.json": audit(t).digest for t in targets}
    (tmp_path / "plan.json").write_text(json.dumps({"targets": list(read), "read": read}))
    (tmp_path / "summary.txt").write_text(SUMMARY)


def test_closing_prints_the_summary_of_the_results_it_read(tmp_path):
    target = _result(tmp_path / "runs/ddp_weak/cached/k2.json")
    _report_read(tmp_path, target)
    assert summary.closing([target], tmp_path / "summary.txt", tmp_path / "report.html") == SUMMARY.rstrip("\n")


def test_closing_after_a_run_that_did_not_rebuild_the_report(tmp_path):
    """A report built from other results than the planned ones hold now (here: a result
    measured again after it, which failed) is not the answer: the failures, and the
    report named as built from other results."""
    target = _result(tmp_path / "runs/ddp_weak/cached/k2.json")
    _report_read(tmp_path, target)
    (tmp_path / "report.html").write_text("<html></html>")
    _result(tmp_path / "runs/ddp_weak/cached/k2.json", "failed", "RuntimeError: boom", "logs/ddp_weak/cached/k2.log")
    text = summary.closing([target], tmp_path / "summary.txt", tmp_path / "report.html")
    assert "h200: k=2" not in text and "ddp_weak/cached/k2 failed: RuntimeError: boom (log logs/ddp_weak" in text
    assert text.splitlines()[-1] == ("report (built from other results than these, not rebuilt: none of its "
                                     f"numbers is this run's answer): {tmp_path / 'report.html'}")


@pytest.mark.parametrize("damage", ["delete", "truncate", "garbage", "edit", "unsealed"])
def test_closing_names_a_result_that_holds_no_number_now(tmp_path, damage):
    """The report read the result; then it was deleted, truncated, replaced or edited: the
    closing lines never print the old summary, and name the file with what recovers it."""
    target = _result(tmp_path / "runs/ddp_weak/cached/k2.json")
    _report_read(tmp_path, target)
    p = tmp_path / "runs/ddp_weak/cached/k2.json"
    text = p.read_text()
    if damage == "delete":
        p.unlink()
    elif damage == "truncate":
        p.write_text(text[: len(text) // 2])
    elif damage == "garbage":
        p.write_text("not json")
    elif damage == "edit":
        p.write_text(text.replace('"status": "ok"', '"status": "ok", "note": 99999'))
    else:
        r = json.loads(text)
        del r["digest"]
        p.write_text(json.dumps(r))
    out = summary.closing([target], tmp_path / "summary.txt", tmp_path / "report.html")
    state = {"delete": "missing", "truncate": "unreadable", "garbage": "unreadable", "edit": "altered",
             "unsealed": "unsealed"}[damage]
    assert "h200: k=2" not in out and "every planned" not in out
    assert f"{target}: {state}: " in out and "a plain `snakemake --cores 1 report` measures them again" in out


@pytest.fixture(autouse=True)
def _no_run_command(monkeypatch):
    """The closing lines' commands come from the run's own command line (an in-process
    dry run of another test may have exported one): these tests start with none."""
    from dpscale import provenance
    monkeypatch.delenv(provenance.COMMAND_VAR, raising=False)


def test_the_rerun_command_is_the_runs_own_without_what_narrowed_it():
    """A cluster run is told to rerun with its profile and config file, not a workstation's
    `snakemake --cores 1 report`; a run narrowed (--allowed-rules, --until, a forcerun,
    a dry run) is told the command without that; a changed protocol (--config) stays."""
    from dpscale import provenance
    var = provenance.COMMAND_VAR
    cluster = "snakemake report --workflow-profile profiles/slurm --configfile cluster.yaml"
    assert provenance.rerun_command(None, {var: cluster}) == cluster
    assert provenance.rerun_command("results/runs/a b/k2.json", {var: cluster}) == (
        cluster + " --forcerun 'results/runs/a b/k2.json'")
    narrowed = ("snakemake --cores 2 report --allowed-rules report --until fsdp --forcerun=x -R y z -n -F "
                "--config 'scales={smoke: {train_images: 64}}'")
    assert provenance.rerun_command(None, {var: narrowed}) == (
        "snakemake --cores 2 report --config 'scales={smoke: {train_images: 64}}'")
    assert provenance.rerun_command(None, {}) == "snakemake --cores 1 report"


def test_a_job_whose_error_snakemake_logs_twice_is_one_failure(tmp_path):
    """The SLURM executor logs a failed job's error block twice (same jobid, same log)."""
    block = "Error in rule fsdp:\n    message: SLURM-job '266' failed\n    jobid: 7\n    log: logs/fsdp/default/k1.log\n"
    smk_log = tmp_path / "snakemake.log"
    smk_log.write_text(block + "other\n" + block + block.replace("jobid: 7", "jobid: 9"))
    text = summary.closing([], tmp_path / "summary.txt", tmp_path / "report.html", snakemake_log=[str(smk_log)],
                           failed=True)
    assert text.splitlines()[0].startswith("Snakemake stopped: 2 job(s) failed"), text
    assert "  rule fsdp: log logs/fsdp/default/k1.log; SLURM-job '266' failed" in text.splitlines(), text


def test_a_failed_jobs_log_from_an_earlier_run_is_not_shown_as_this_failures(tmp_path):
    """sbatch refused the job (a wrong partition): it never ran, and the log at its path is
    the last successful run's. The closing names sbatch's reason and not those lines."""
    import datetime as dt
    old = tmp_path / "k2.log"
    old.write_text("[watchdog] recorded ok\n")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    start = dt.datetime.now() - dt.timedelta(minutes=5)
    smk_log = tmp_path / f"{start.strftime('%Y-%m-%dT%H%M%S.%f')}.snakemake.log"
    smk_log.write_text("Error in rule jax_hlo:\n    message: SLURM sbatch failed. The error message was 'sbatch: "
                       "error: invalid partition specified: gpux\nsbatch: error: Batch job submission failed'.\n"
                       + "    sbatch script:\n#!/bin/sh\n" + "x\n" * 12 + f"    jobid: 21\n    log: {old} (check log "
                       "file(s) for error details)\n")
    text = summary.closing([], tmp_path / "summary.txt", tmp_path / "report.html", snakemake_log=[str(smk_log)],
                           failed=True)
    lines = text.splitlines()
    assert lines[1] == (f"  rule jax_hlo: log {old}; SLURM sbatch failed. The error message was 'sbatch: error: "
                        "invalid partition specified: gpux"), lines
    assert "recorded ok" not in text and "an earlier run's" in lines[2], lines
    old.write_text("Traceback: this run's\n")   # written after the run started: shown
    text = summary.closing([], tmp_path / "summary.txt", tmp_path / "report.html", snakemake_log=[str(smk_log)],
                           failed=True)
    assert "    | Traceback: this run's" in text.splitlines(), text


def test_closing_after_a_stop_says_no_job_failed(tmp_path):
    """SIGTERM or Ctrl-C: Snakemake's log names no failed job; the closing says it stopped,
    not '0 job(s) failed'."""
    smk_log = tmp_path / "snakemake.log"
    smk_log.write_text("Terminating processes on user request, this might take some time.\n")
    text = summary.closing([], tmp_path / "summary.txt", tmp_path / "report.html", snakemake_log=[str(smk_log)],
                           failed=True)
    assert text.splitlines()[0].startswith("Snakemake stopped before the run finished; no job reported a failure")
    assert "0 job(s)" not in text


def test_onerror_names_the_failed_jobs_with_their_logs(tmp_path):
    """After a Snakemake error: each failed rule, its log and the log's last lines (read
    from Snakemake's own log), then whatever report exists."""
    (tmp_path / "report.log").write_text("\n".join(f"line {i}" for i in range(20)) + "\nValueError: no figure\n")
    smk_log = tmp_path / "snakemake.log"
    smk_log.write_text(f"Error in rule report:\n    jobid: 0\n    input: a, b\n    output: c\n"
                       f"    log: {tmp_path / 'report.log'} (check log file(s) for error details)\n    shell: x\n")
    text = summary.closing([], tmp_path / "summary.txt", tmp_path / "report.html", snakemake_log=[str(smk_log)],
                           failed=True)   # Snakemake 9 passes its log files as a list
    lines = text.splitlines()
    assert lines[0].startswith("Snakemake stopped: 1 job(s) failed")
    assert lines[1] == f"  rule report: log {tmp_path / 'report.log'}" and "    | ValueError: no figure" in lines
    assert lines[-1] == "no report built yet: snakemake --cores 1 report"


def test_announce_prints_after_everything_else(tmp_path):
    code = ("import sys; from dpscale.report import summary; summary.announce('THE ANSWER'); "
            "print('snakemake says goodbye', file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_with_src(), cwd=ROOT)
    assert p.stderr.splitlines()[-2:] == ["snakemake says goodbye", "THE ANSWER"]


def test_the_summary_names_the_series_a_lone_k1_left_unmeasured():
    from types import SimpleNamespace
    from dpscale.plan.specs import LONE_K1
    skip = {"status": "skipped", "reason": f"{LONE_K1}: no k >= 2 can run on this machine (1 device), ..."}
    m = SimpleNamespace(label="this run", results={("ddp_strong", "cached", 1): skip, ("fsdp", "default", 1): skip,
                                                    ("ddp_weak", "tuned", 1): {"status": "ok"},
                                                    ("allreduce", "default", 2): {"status": "skipped", "reason": "k=2"}})
    assert summary.lone_lines(m) == [f"this run: not measured, {LONE_K1} on this machine (no k >= 2 can run): "
                                     "ddp_strong/cached, fsdp/default"]


def test_closing_from_other_results_still_says_a_refused_data_copy(tmp_path):
    """The report is not this run's answer (a result changed after it), and the data stage
    refused a copy before the one it used: the closing lines say so on that path too, not
    only inside a report's summary."""
    from dpscale import layout
    work = layout.working(tmp_path)
    report_dir = work.report
    report_dir.mkdir(parents=True)
    target = _result(tmp_path / "results/runs/ddp_weak/cached/k2.json")
    _report_read(report_dir, target)
    (report_dir / "report.html").write_text("<html></html>")
    _result(tmp_path / "results/runs/ddp_weak/cached/k2.json", "failed", "RuntimeError: boom")
    work.data.mkdir(parents=True, exist_ok=True)
    (work.data / "source.json").write_text(json.dumps({"origin": "debian", "rejected": [
        {"folder": "/my copy", "reason": "train-images-idx3-ubyte.gz is truncated"}]}))
    text = summary.closing([target], report_dir / "summary.txt", report_dir / "report.html")
    assert "h200: k=2" not in text
    assert ("data: Fashion-MNIST in /my copy was refused (train-images-idx3-ubyte.gz is truncated); the run used "
            "debian instead") in text.splitlines()


def test_the_closing_lines_name_the_ks_that_were_skipped():
    """Issue #53: `ks=[1,2,4,8]` on two cores skipped k=4 and 8 with a clear reason, but the
    closing lines said only that every planned measurement left a number or was skipped."""
    from types import SimpleNamespace
    why4 = "k=4 needs 4 devices; this machine has 2"
    m = SimpleNamespace(label="this run", results={
        ("ddp_weak", "cached", 4): {"status": "skipped", "reason": why4},
        ("ddp_weak", "cached", 8): {"status": "skipped", "reason": "k=8 needs 8 devices; this machine has 2"},
        ("ddp_weak", "seed", 4): {"status": "skipped", "reason": why4},
        ("ddp_weak", "cached", 2): {"status": "ok"}})
    assert summary.skipped_lines(m) == [f"this run: skipped at k = 4, 8: {why4} (and so at each k) "
                                        "(ddp_weak/cached, ddp_weak/seed)"]
