"""Never an old number: a result that is missing, unreadable or not what its job wrote
is measured again by a plain run (dpscale.plan.replan), the report refuses to be built
from one, the closing lines say only what the results hold at the end of the run, and a
dry run writes nothing. Each case as it happens to a user: a file deleted, truncated,
replaced or edited by hand; a forced rerun stopped with Ctrl-C; the disk filling up; a
clone in a folder whose name has a space; Snakemake killed while the report draws.
Rows of the README's table of faults."""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (SNAKEMAKE, copy_done, copy_primed, done_config, fill_disk, job_counts, local_env, mount_tmpfs,
                      smk, write_hw)

from dpscale import results

pytestmark = [pytest.mark.workflow, pytest.mark.slow]   # a smoke run, then a run or rerun a test

TARGETS = [f"results/runs/ddp_weak/{v}/k{k}.json" for v in ("seed", "cached") for k in (1, 2)]
# Where every planned result is measured again (a change that stales them all), the plan
# is the k=1 half: the same decision per result, each job one rank and no torchrun
# (a k=2 job costs twice the CPU of a k=1 job on the 2-core machine, and the fault tests'
# share of command 2 is mostly these jobs). The cases that give each result its own
# fault keep all four.
K1 = [t for t in TARGETS if t.endswith("k1.json")]


def only_k1(cfg: list[str]) -> list[str]:
    return [c.replace("ks=[1,2]", "ks=[1]") for c in cfg]


def tree(folder: Path) -> dict[str, str]:
    """Every file under folder, by content."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def set_aside(repo: Path) -> list[str]:
    """The copies a run set aside (k<k>.json.<state>-<UTC>), by result and state."""
    return sorted(str(p.relative_to(repo)).rsplit("-", 1)[0] for p in (repo / "results/runs").glob("*/*/k*.json.*"))


def digest(repo: Path, target: str) -> str | None:
    return results.audit(repo / target).digest


def closing_lines(p: subprocess.CompletedProcess) -> str:
    """What the run printed after Snakemake's own last lines."""
    err = p.stderr
    return err[err.rfind("Complete log"):] if "Complete log" in err else err[-4000:]


def damage(path: Path, how: str) -> None:
    text = path.read_text()
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        path.write_text(text[: len(text) // 2])
    elif how == "unseal":   # the seal taken off, the numbers as they were
        r = json.loads(text)
        r.pop("digest")
        path.write_text(json.dumps(r, indent=1))
    elif how == "garbage":
        path.write_text("<html>not a result</html>\n")
    elif how == "edit":   # the number a reader would quote, by hand
        r = json.loads(text)
        r["metrics"]["samples_per_s"] = 99999.0
        path.write_text(json.dumps(r, indent=2))


def test_a_plain_run_measures_again_what_was_replaced_or_edited(done, tmp_path):
    """With Snakemake's metadata kept (the next tests: a deleted one, and without it; an
    unsealed one is the copied clone's). The damage is on the k=1 results; both k=2
    results are left sound and kept as they were."""
    repo, cfg = copy_done(done, tmp_path / "repo")
    edited, sound_seed, garbage, sound_cached = TARGETS   # seed k1, seed k2, cached k1, cached k2
    hows = {garbage: "garbage", edited: "edit"}
    old = {t: digest(repo, t) for t in TARGETS}
    sound = {t: (old[t], (repo / t).stat().st_mtime_ns) for t in (sound_seed, sound_cached)}
    for t, how in hows.items():
        damage(repo / t, how)
    before = tree(repo / "results")

    dry = smk(repo, "-n", "--cores", "2", "report", *cfg)
    assert job_counts(dry.stdout) == {"attempt_stamp": 2, "ddp_weak": 2, "report": 1}, dry.stdout[-3000:]
    assert tree(repo / "results") == before, "a dry run wrote under results/"
    for t, state in ((garbage, "unreadable"), (edited, "altered")):
        assert f"{t}: {state}: " in dry.stdout + dry.stderr and "a real run measures it again" in dry.stdout

    run = smk(repo, "--cores", "2", "report", *cfg)
    end = closing_lines(run)
    assert "at this run's start 2 planned result(s) held no number it could serve, so they were measured " \
           "again:" in end, end
    assert "this run: every planned measurement left a number or was skipped" in end
    for t in hows:
        a = results.audit(repo / t)
        assert a.sound and a.digest != old[t], t
    assert {t: (digest(repo, t), (repo / t).stat().st_mtime_ns) for t in sound} == sound
    assert set_aside(repo) == sorted([f"{garbage}.unreadable", f"{edited}.altered"]), set_aside(repo)
    import pandas as pd
    rows = pd.read_csv(repo / "results/report/results.csv")
    mine = rows[(rows.machine == "this run") & (rows.metric == "samples_per_s")]
    assert len(mine) == 4 and not (mine.value == 99999.0).any()
    again = smk(repo, "--cores", "2", "report", *cfg)
    assert "Nothing to be done" in again.stdout + again.stderr


def test_an_interrupted_forced_rerun_is_measured_again(done, tmp_path):
    """The README's advice for a hung result, --forcerun, stopped by Ctrl-C in its first
    job: the job's result is gone and the report is newer than what remains; a plain
    rerun measures it again (Snakemake alone would say 'Nothing to be done')."""
    repo, cfg = copy_done(done, tmp_path / "repo")
    cfg = only_k1(cfg)   # every planned job forced: the plan is the k=1 half (K1)
    old = {t: digest(repo, t) for t in K1}
    k2 = {t: digest(repo, t) for t in set(TARGETS) - set(K1)}
    html = (repo / "results/report/report.html").read_bytes()
    shutil.rmtree(repo / "logs/ddp_weak")   # the first job's log, when it appears, is this run's
    with open(tmp_path / "forced.log", "w") as out:
        p = subprocess.Popen([SNAKEMAKE, "--cores", "1", "report", *cfg, "--forcerun", "ddp_weak"], cwd=repo,
                             stdout=out, stderr=subprocess.STDOUT, env=local_env(), start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(
            "[watchdog] $" in f.read_text(errors="replace") for f in (repo / "logs/ddp_weak").glob("*/k*.log")):
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGINT)   # Ctrl-C in the terminal: the whole foreground group
    p.wait(timeout=120)
    gone = [t for t in K1 if not (repo / t).exists()]
    assert gone, (tmp_path / "forced.log").read_text()[-3000:]
    assert (repo / "results/report/report.html").read_bytes() == html

    run = smk(repo, "--cores", "2", "report", *cfg)
    assert f"{gone[0]}: missing: the last report read it" in run.stdout + run.stderr
    for t in gone:
        assert digest(repo, t) not in (None, old[t])
    plan = json.loads((repo / "results/report/plan.json").read_text())
    assert plan["read"] == {t.removeprefix("results/runs/"): digest(repo, t) for t in K1}
    for t in set(TARGETS) - set(K1):   # not planned: left as they were, and not read
        assert digest(repo, t) == k2[t], t
    again = smk(repo, "--cores", "2", "report", *cfg)
    assert "Nothing to be done" in again.stdout + again.stderr


# ---------------------------------------------------------------- without Snakemake's metadata
# Users lose .snakemake/ (deleted, results/ copied to another clone, cached in CI,
# --cleanup-metadata). The project's own record decides what is up to date
# (dpscale.plan.replan): each case ends measured again, or taken as it is, and the
# closing lines say which.

def fail_record(path: Path) -> None:
    """What the watchdog leaves after a failed attempt: a sealed `failed` record and a
    line in k<k>.failures (dpscale.run.watchdog.Job.fail)."""
    r = results.load_result(path)
    r.pop("digest")
    r.update(status="failed", reason="RuntimeError: injected", metrics={})
    results.save(path, r)
    results.record_failure(path, "RuntimeError: injected")


def older_version(path: Path, **change) -> None:
    """The result as another dpscale version wrote it: other code digest or protocol, sealed."""
    r = results.load_result(path)
    r.pop("digest")
    if "code" in change:
        r["code"]["sources_sha256"] = change["code"]
    if "train_images" in change:
        r["config"]["protocol"]["train_images"] = change["train_images"]
    results.save(path, r)


def unseal(path: Path) -> None:
    damage(path, "unseal")


def test_deleted_truncated_and_failed_results_are_measured_again_and_a_sound_one_is_kept(done, tmp_path):
    """Without Snakemake's metadata (the first test keeps it; test_isolation's crashed
    job is a failed attempt with it; an unsealed result without it is the copied
    clone's below). The result left sound is the k=2 job beside the failed one: kept as it
    was, not measured again."""
    repo, cfg = copy_done(done, tmp_path / "repo")
    shutil.rmtree(repo / ".snakemake")
    old = {t: digest(repo, t) for t in TARGETS}
    deleted, failed, truncated, sound = TARGETS
    mtime = (repo / sound).stat().st_mtime_ns
    (repo / deleted).unlink()
    damage(repo / truncated, "truncate")
    fail_record(repo / failed)
    before = tree(repo / "results")

    dry = smk(repo, "-n", "--cores", "2", "report", *cfg)
    assert job_counts(dry.stdout) == {"attempt_stamp": 3, "ddp_weak": 3, "report": 1}, dry.stdout[-3000:]
    assert tree(repo / "results") == before, "a dry run wrote under results/"

    run = smk(repo, "--cores", "2", "report", *cfg)
    end = closing_lines(run)
    assert "at this run's start 2 planned result(s) held no number it could serve, so they were measured " \
           "again:" in end, end
    for t, state in ((deleted, "missing"), (truncated, "unreadable")):
        assert f"  {t}: {state}: " in end, end
    assert "this run: every planned measurement left a number or was skipped" in end, end
    for t in (deleted, failed, truncated):
        a = results.audit(repo / t)
        assert a.sound and a.status == "ok" and a.digest != old[t], t
    assert (digest(repo, sound), (repo / sound).stat().st_mtime_ns) == (old[sound], mtime)
    shutil.rmtree(repo / ".snakemake")
    assert "Nothing to be done" in smk(repo, "-n", "--cores", "2", "report", *cfg).stdout


@pytest.mark.parametrize("change", ["source edited", "protocol changed"])
def test_a_result_of_other_code_or_another_protocol_is_planned_again_without_metadata(done, tmp_path, change):
    """Both cases plan the k=1 half again and say why in a dry run, which writes nothing.
    Both are planned by dpscale.plan.replan's stale result, and a real run over results
    of other code and of another protocol is measured in
    test_results_of_another_version_copied_into_a_fresh_clone_... below; the plan's k=1
    half read alone, the k=2 results left, in test_an_interrupted_forced_rerun_... (a real
    run here repeated two jobs and a report, ~20 s of command 2 each)."""
    repo, cfg = copy_done(done, tmp_path / "repo")
    cfg = only_k1(cfg)
    shutil.rmtree(repo / ".snakemake")
    if change == "source edited":
        with open(repo / "src/dpscale/measure/torch_ddp.py", "a") as f:
            f.write("\nEDITED = True   # a change to what the measured code does\n")
        why = "stale: measured by other code"
    else:
        cfg = [c.replace("train_images: 32", "train_images: 64") for c in cfg]
        why = "stale: measured with another protocol or on another machine than the plan's: " \
              "config.protocol.train_images 32 (plan: 64)"
    before = tree(repo / "results")
    dry = smk(repo, "-n", "--cores", "2", "report", *cfg)
    assert job_counts(dry.stdout).get("ddp_weak") == 2, dry.stdout[-3000:]
    assert all(f"{t}: {why}" in dry.stdout + dry.stderr for t in K1), (dry.stdout + dry.stderr)[-3000:]
    assert tree(repo / "results") == before, "a dry run wrote under results/"


def test_a_report_built_alone_after_a_protocol_change_says_its_results_are_not_the_plans(done, tmp_path):
    """--allowed-rules report after train_images changed: the report is built from what
    exists, and its header and the closing lines say those results are not the plan's."""
    repo, cfg = copy_done(done, tmp_path / "repo")
    shutil.rmtree(repo / ".snakemake")
    cfg = [c.replace("train_images: 32", "train_images: 64") for c in cfg]
    old = {t: digest(repo, t) for t in TARGETS}
    run = smk(repo, "--cores", "2", "report", "--allowed-rules", "report", *cfg)
    end = closing_lines(run)
    assert "NOT THIS PLAN'S: 4 result(s) of this run were measured otherwise than the plan asks" in end, end
    assert f"  {TARGETS[0]}: measured with another protocol or on another machine than the plan's: " \
           "config.protocol.train_images 32 (plan: 64)" in end
    assert "and this run did not measure them again" in end and \
        f"to measure it: snakemake --cores 2 report {shlex.join(cfg)} --forcerun {TARGETS[0]}" in end, end
    assert {t: digest(repo, t) for t in TARGETS} == old
    html = (repo / "results/report/report.html").read_text()
    assert "4 result(s) were not measured as this report&#39;s plan asks" in html \
        or "4 result(s) were not measured as this report's plan asks" in html


def test_results_of_another_version_copied_into_a_fresh_clone_are_taken_or_measured_again_once(
        done, primed, tmp_path):
    """A fresh clone given results/ from elsewhere, no .snakemake/: a result whose code and
    protocol match the plan is taken as it is; one unsealed, or sealed by a version with
    other code or another protocol, is measured again, once."""
    repo = copy_primed(primed, tmp_path / "clone", machines=False)
    shutil.rmtree(repo / ".snakemake")
    cfg = done_config(repo)
    shutil.rmtree(repo / "results")
    shutil.copytree(done / "results", repo / "results")
    unsealed, genuine, other_code, other_protocol = TARGETS   # a k=2 result taken, not measured again
    unseal(repo / unsealed)
    older_version(repo / other_code, code="0123456789abcdef")
    older_version(repo / other_protocol, train_images=128)
    kept = {genuine: (digest(repo, genuine), (repo / genuine).stat().st_mtime_ns)}

    run = smk(repo, "--cores", "2", "report", *cfg)
    end = closing_lines(run)
    assert "at this run's start 3 planned result(s) held no number it could serve, so they were measured " \
           "again:" in end, end
    assert f"  {unsealed}: unsealed: " in end and f"  {other_code}: stale: measured by other code" in end
    assert f"  {other_protocol}: stale: measured with another protocol" in end and "altered" not in end, end
    assert (digest(repo, genuine), (repo / genuine).stat().st_mtime_ns) == kept[genuine]
    for t in (unsealed, other_code, other_protocol):
        assert results.audit(repo / t).sound, t
    assert set_aside(repo) == sorted([f"{unsealed}.unsealed", f"{other_code}.stale", f"{other_protocol}.stale"]), \
        set_aside(repo)
    for _ in range(2):   # never in a loop
        shutil.rmtree(repo / ".snakemake", ignore_errors=True)
        again = smk(repo, "--cores", "2", "report", *cfg)
        assert "Nothing to be done" in again.stdout + again.stderr, closing_lines(again)


def test_the_disk_filling_during_a_forced_rerun_leaves_no_old_number_in_the_closing_lines(done, tmp_path):
    repo, cfg = copy_done(done, tmp_path / "repo")
    cfg = only_k1(cfg)   # every planned job forced: the plan is the k=1 half (K1)
    runs = repo / "results/runs"
    saved = tmp_path / "runs"
    shutil.copytree(runs, saved)
    shutil.rmtree(runs)
    if not mount_tmpfs(runs, "1m"):
        pytest.skip("needs root and tmpfs to fill a disk of its own (mount -t tmpfs)")
    try:
        shutil.copytree(saved, runs, dirs_exist_ok=True)
        fill_disk(runs)
        p = smk(repo, "--cores", "1", "report", *cfg, "--forcerun", "ddp_weak", check=False)
        end = closing_lines(p)
        assert "every planned measurement left a number" not in end and "samples/s" not in end, end
        assert "planned result(s) hold no number now" in end or "failed or hung" in end, end
        for t in TARGETS:   # no half file, whatever was written
            assert results.audit(repo / t).state in (results.SOUND, results.MISSING)
        assert not list(runs.glob("*/*/*.tmp"))
    finally:
        subprocess.run(["umount", "-l", str(runs)])


@pytest.mark.parametrize("metadata", ["gone", "kept"])
def test_a_dry_run_after_a_machine_change_plans_it_and_writes_nothing(done, tmp_path, metadata):
    repo, cfg = copy_done(done, tmp_path / "repo")
    if metadata == "gone":
        shutil.rmtree(repo / ".snakemake")
    before = tree(repo / "results")
    hw = write_hw(tmp_path, "other", cpu_model="Another CPU", cpu_count=2)
    dry = smk(repo, "-n", "--cores", "2", "report", *cfg, f"hardware_file={hw}")
    counts = job_counts(dry.stdout)
    assert counts.get("fingerprint") == 1 and counts.get("ddp_weak") == 4, dry.stdout[-2000:]
    assert "stale: measured with another protocol or on another machine than the plan's: fingerprint." \
        in dry.stdout + dry.stderr
    assert tree(repo / "results") == before


def test_a_clone_under_a_path_with_a_space_and_non_ascii_runs_in_place_and_with_d(done, tmp_path):
    """In place: a measurement (k=2: torchrun, its ranks' logs); with -d from a fresh
    folder: the data stage, the k=1 jobs and the report, the scripts' path with a space
    too. One job of each kind is what a path can break (the report's in place was the -d
    run's job again: ~8 CPU-s of command 2); the other results stay."""
    home = tmp_path / "my dpscale ü"
    repo, cfg = copy_done(done, home / "my clone")
    (repo / TARGETS[1]).unlink()
    logs = repo / "logs/ddp_weak/seed"
    for f in logs.glob("k2*"):
        f.unlink()
    run = smk(repo, "--cores", "2", TARGETS[1], *cfg)   # in place
    assert job_counts(run.stdout + run.stderr).get("ddp_weak") == 1
    assert all(results.audit(repo / t).sound for t in TARGETS)
    assert sorted(f.name for f in logs.glob("k2*")) == ["k2.log", "k2.rank0.log", "k2.rank1.log"]
    work = home / "other folder ß"
    work.mkdir()
    smk(work, "-s", str(repo / "Snakefile"), "-d", str(work), "--cores", "2", "report", *cfg[:-1], "ks=[1]",
        f"locks={{dir: {work / 'locks'}}}")
    assert all(results.audit(work / t).sound for t in TARGETS if t.endswith("k1.json"))
    assert (work / "results/report/report.html").exists()


def test_snakemake_killed_while_the_report_draws_leaves_no_report_process(done, tmp_path):
    repo, cfg = copy_done(done, tmp_path / "repo")
    shutil.rmtree(repo / "results/report")
    with open(tmp_path / "run.log", "w") as out:
        p = subprocess.Popen([SNAKEMAKE, "--cores", "2", "report", *cfg], cwd=repo, stdout=out,
                             stderr=subprocess.STDOUT, env=local_env())
    mine = lambda: [pid for pid in os.listdir("/proc") if pid.isdigit() and _is_report_of(int(pid), repo)]  # noqa: E731
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not mine():
        time.sleep(0.1)
    assert mine(), (tmp_path / "run.log").read_text()[-2000:]
    os.kill(p.pid, signal.SIGKILL)   # Snakemake's main process alone
    p.wait()
    t0 = time.monotonic()
    while mine() and time.monotonic() - t0 < 10:
        time.sleep(0.2)
    assert not mine(), "report.py alive 10 s after Snakemake was killed"
    time.sleep(2)
    assert not (repo / "results/report/report.html").exists()


def _is_report_of(pid: int, repo: Path) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(a.endswith(b"scripts/report.py") for a in argv) and str(repo).encode() in Path(
        f"/proc/{pid}/cwd").resolve().as_posix().encode()


def test_a_refused_local_copy_of_the_data_is_said_at_the_end_and_in_the_report(done, tmp_path):
    """data.local_dir with a truncated file: the data stage refuses it and takes the next
    copy (Debian's package, or the mirrors); the closing lines and the report say so."""
    repo, cfg = copy_done(done, tmp_path / "repo")
    bad = tmp_path / "fmnist copy"
    shutil.copytree(repo / "results/data/FashionMNIST/raw", bad, ignore=shutil.ignore_patterns("*-ubyte"))
    gz = bad / "t10k-labels-idx1-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:100])
    run = smk(repo, "--cores", "2", "report", *cfg, f"data={{source: auto, local_dir: {bad}}}")
    end = closing_lines(run)
    assert f"data: Fashion-MNIST in {bad} was refused" in end, end
    assert f"Fashion-MNIST in {bad} was refused" in (repo / "results/report/report.html").read_text()


# ---------------------------------------------------------------- one line each

def test_a_fingerprint_count_that_is_not_a_number_is_one_line(tmp_path, primed):
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps({"gpu_count": "two", "cpu_count": 2}))
    p = smk(primed, "-n", "--cores", "1", "report", "--config", f"hardware_file={hw}", check=False)
    assert p.returncode != 0
    assert p.stderr.splitlines()[-1] == (f"Invalid configuration: hardware_file: {hw}: 'gpu_count' is \"two\"; "
                                         "it must be a whole number >= 0 (e.g. \"gpu_count\": 2)")
    hw.write_text(json.dumps({"gpu_count": 0, "cpu_count": 2}))   # accepted, with what it leaves out said
    p = smk(primed, "-n", "--cores", "1", "report", "--config", f"hardware_file={hw}")
    assert f"hardware_file {hw} leaves out gpu_model, gpu_memory_MiB, driver, cuda, nccl, torch," in p.stdout, p.stdout


def test_a_list_with_an_open_bracket_is_one_line_with_the_fix(primed):
    p = smk(primed, "-n", "--cores", "1", "report", "--config", "ks=[1,2", check=False)
    assert p.stderr.splitlines()[-1] == ("Invalid configuration: ks: [1,2 is not a list (a bracket is not "
                                         "closed); write it whole, e.g. 'ks=[1, 2, 4]'")


def test_a_missing_configfile_is_named_on_the_last_line(primed):
    """Snakemake reads --configfile before the workflow is parsed, so its own traceback is
    printed; its last line names the file (README, faults)."""
    p = smk(primed, "-n", "--cores", "1", "report", "--configfile", "no/such config.yaml", check=False)
    assert p.returncode != 0
    last = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert "FileNotFoundError: [Errno 2] No such file or directory: 'no/such config.yaml'" in last[-2:], last[-3:]


def test_every_committed_machine_loads_with_no_alert():
    """A clean report carries no ALERT for a committed machine (a missing plan.json, a
    result whose seal does not hold)."""
    from dpscale.report.machines import load_reference, reference_folders
    from conftest import ROOT
    for m in map(load_reference, reference_folders([ROOT / "reference"])):
        assert not m.errors and not m.alerts, (m.label, m.errors, m.alerts)
