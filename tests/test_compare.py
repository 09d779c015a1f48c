"""`dpscale compare A B` on the committed reference machines: the rows' numbers are
the JSONs' numbers, a result without repeats has no interval and says so."""
from __future__ import annotations

import json
import shutil
import statistics

import pytest

from dpscale import cli
from dpscale.report import compare
from dpscale.results import save
from report_fixtures import ROOT

pytestmark = pytest.mark.report   # builds whole reports: scheduled before the second-long modules (conftest.TIERS)

H200, H200X2 = ROOT / "reference" / "h200", ROOT / "reference" / "h200x2"


def _metrics(folder, e, v, k):
    return json.loads((folder / "runs" / e / v / f"k{k}.json").read_text())["metrics"]


def test_rows_hold_the_jsons_numbers_and_say_when_there_is_no_interval():
    df = compare.table(compare.load(H200), compare.load(H200X2))
    row = df[(df.experiment == "ddp_weak") & (df.variant == "tuned") & (df.k == 1)].iloc[0]
    ma = _metrics(H200, "ddp_weak", "tuned", 1)   # 3 launches: the launches are the samples
    a = statistics.fmean(ma.get("samples_per_s_launches") or ma["samples_per_s_repeats"])
    b = _metrics(H200X2, "ddp_weak", "tuned", 1)["samples_per_s"]      # one epoch, no repeats
    assert row["A"] == pytest.approx(a) and row["B"] == pytest.approx(b) and row["B/A"] == pytest.approx(b / a)
    assert (row.n_A, row.n_B) == (3, 1) and row.isna()["ci_lo"] and row.isna()["ci_hi"]
    assert row.note.startswith("no interval: B has 1 sample(s), A has 3")
    # the only point both measured: on one H200 the lone k=1 series are skipped (lone_k1: false)
    assert set(df.k) == {1} and len(df) == 1
    assert str(df["B/A"].dtype) == "float64"


def test_a_machine_against_itself_gives_ratio_1_inside_its_interval(tmp_path, monkeypatch):
    """The h200's throughput points, with the lone k=1 series of its earlier run (7aa3da0:
    3 launches of one timed epoch each) put back, and one more point kept from 5a04905 (3
    launches of 2 timed epochs) cut to its first launch (its timed epochs the only
    samples): both kinds of interval. (Read as two machines that measured the same
    numbers: one measurement in both folders gets no interval, the next test.)"""
    monkeypatch.setattr(compare, "same_measurement", lambda ra, rb: False)
    h200 = shutil.copytree(H200, tmp_path / "h200", ignore=shutil.ignore_patterns("logs", "report", "extended"))
    earlier = H200 / "earlier" / "7aa3da0"
    for e, v in (("ddp_weak", "seed"), ("ddp_weak", "cached"), ("jax_weak", "host"), ("fsdp", "default")):
        shutil.copy(earlier / e / v / "k1.json", h200 / "runs" / e / v / "k1.json")
    one = h200 / "runs" / "ddp_strong" / "cached" / "k1.json"
    shutil.copy(H200 / "extended" / "runs" / "ddp_strong" / "cached" / "k1.json", one)
    r = json.loads(one.read_text())
    r["metrics"] = {k: v for k, v in r["metrics"].items() if "launch" not in k}
    save(one, r)   # a result as a run without launches would have written it
    df = compare.table(compare.load(h200), compare.load(h200))
    assert len(df) >= 5 and (df["B/A"] == 1.0).all()
    assert ((df.ci_lo < 1) & (df.ci_hi > 1)).all()
    launched = df.apply(lambda r: "samples_per_s_launches" in _metrics(h200, r.experiment, r.variant, r.k), axis=1)
    assert set(df.covers[launched]) == {"independent launches"}
    assert set(df.covers[~launched]) == {"timed epochs within one launch"} and launched.any() and (~launched).any()


def test_a_run_against_its_own_kept_copy_gets_no_interval(tmp_path):
    """`dpscale compare results reference/<its keep>` gave 1.000 [0.976, 1.024]: one set of
    launches read as two independent machines (the one-folder check compares paths; keep
    rewrites paths and seals again, so the digests differ too)."""
    work = _workdir_from(H200X2, tmp_path / "work")
    kept = cli.keep("x2", work, tmp_path / "reference")
    df = compare.table(compare.load(work / "results"), compare.load(kept))
    assert len(df) >= 3 and (df["B/A"] == 1.0).all() and df.ci_lo.isna().all() and df.ci_hi.isna().all()
    assert (df.note == "one measurement in both folders (a copy): no interval").all()


def test_a_tuned_step_or_data_that_differ_are_named():
    row = compare.table(compare.load(H200), compare.load(H200X2)).set_index(["experiment", "variant", "k"])
    note = row.loc[("ddp_weak", "tuned", 1), "note"]
    assert "tuned step differs in cancelled_bias (drop vs None)" in note
    assert "data differs in source (real vs synthetic)" in note


def test_protocol_difference_is_named(tmp_path):
    for name in ("a", "b"):
        shutil.copytree(H200 / "runs" / "ddp_weak" / "tuned", tmp_path / name / "runs" / "ddp_weak" / "tuned")
    p = tmp_path / "b" / "runs" / "ddp_weak" / "tuned" / "k1.json"
    r = json.loads(p.read_text())
    r["config"]["protocol"]["per_rank_batch"] = 128
    save(p, r)
    row = compare.table(compare.load(tmp_path / "a"), compare.load(tmp_path / "b")).iloc[0]
    assert "protocol differs in per_rank_batch (256 vs 128)" in row.note


def test_cli_prints_the_table_and_names_a_bad_folder(capsys, tmp_path):
    assert cli.main(["compare", str(H200), str(H200X2)]) == 0
    out = capsys.readouterr().out
    assert "A = h200 (1x H200), B = h200x2" in out and "ddp_weak" in out and "no interval" in out
    with pytest.raises(SystemExit, match=r"runs is missing; pass a folder kept by `dpscale keep`"):
        cli.main(["compare", str(H200), str(tmp_path)])


def test_every_efficiency_interval_stays_in_0_2(tmp_path):
    """The committed references and the fixture machines: no efficiency interval reaches
    outside [0, 2] (the old interval arithmetic gave the smoke run 63% [19%, 463%])."""
    from report_fixtures import BOOK, CPU_FP, write_cpu_smoke, write_gpu_paper
    from dpscale.report import load
    from dpscale.report.numbers import THROUGHPUT, scaling
    from dpscale.results import write_json_atomic
    targets = write_cpu_smoke(tmp_path / "runs")
    write_json_atomic(tmp_path / "fingerprint.json", CPU_FP)
    write_gpu_paper(tmp_path / "reference" / "h200x8")
    data = load(tmp_path / "runs", tmp_path / "fingerprint.json", targets, [tmp_path / "reference"], BOOK)
    machines = data.measured + [compare.load(H200), compare.load(H200X2)]
    rows = [r for m in machines for e in THROUGHPUT for v in m.variants(e) for r in scaling(m, e, v)
            if r["efficiency_lo"] is not None]
    assert len(rows) >= 4 and all(0 <= r["efficiency_lo"] <= r["efficiency"] <= r["efficiency_hi"] <= 2 for r in rows)
    assert all(r["ratio_covers"] == "timed epochs within one launch" for r in rows)


def _workdir_from(kept, dest):
    """A run's folder as `dpscale keep` reads it, made from a kept machine."""
    shutil.copytree(kept / "runs", dest / "results" / "runs")
    shutil.copy2(kept / "fingerprint.json", dest / "results" / "fingerprint.json")
    (dest / "results" / "report").mkdir()
    shutil.copy2(kept / "plan.json", dest / "results" / "report" / "plan.json")
    (dest / "logs").mkdir()
    return dest


def test_keep_builds_its_report_in_place_and_a_failed_build_keeps_the_old_machine(tmp_path, monkeypatch):
    """The kept report names the kept files (not the temporary folder it was copied
    through); a replacement whose report fails to build leaves the old machine as it was."""
    work, to = _workdir_from(H200X2, tmp_path / "work"), tmp_path / "reference"
    kept = cli.keep("x2", work, to)
    md = (kept / "report" / "report.md").read_text()
    assert str(kept / "runs" / "ddp_weak") in md and f"{to}/.x2." not in md
    with pytest.raises(SystemExit, match="--force"):
        cli.keep("x2", work, to)
    before = sorted(p.relative_to(kept) for p in kept.rglob("*"))

    def broken(*a, **k):
        raise RuntimeError("matplotlib fell over")
    monkeypatch.setattr(cli, "_report_of_kept", broken)
    (work / "results" / "runs" / "ddp_weak" / "seed" / "k1.json").unlink()
    with pytest.raises(RuntimeError, match="fell over"):
        cli.keep("x2", work, to, force=True)
    assert sorted(p.relative_to(kept) for p in kept.rglob("*")) == before
    assert [p.name for p in to.iterdir()] == ["x2"]   # nothing left aside


def test_keep_sigterm_puts_the_old_machine_back_and_a_killed_keep_is_finished_next_time(tmp_path, monkeypatch):
    """kill (SIGTERM) during keep --force left the old machine aside as .x2.replaced and a
    half one in its place, and every later keep --force failed on it (an audit's finding)."""
    import os
    import signal
    work, to = _workdir_from(H200X2, tmp_path / "work"), tmp_path / "reference"
    kept = cli.keep("x2", work, to)
    before = sorted(p.relative_to(kept) for p in kept.rglob("*"))
    build = cli._report_of_kept
    monkeypatch.setattr(cli, "_report_of_kept", lambda *a: os.kill(os.getpid(), signal.SIGTERM))
    with pytest.raises(SystemExit) as e:
        cli.keep("x2", work, to, force=True)
    assert e.value.code == 128 + signal.SIGTERM
    assert sorted(p.relative_to(kept) for p in kept.rglob("*")) == before
    assert [p.name for p in to.iterdir()] == ["x2"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL   # the handler is the caller's again
    # SIGKILL at the same point: the old machine aside, a half one (no report) in its place
    kept.rename(to / ".x2.replaced")
    shutil.copytree(to / ".x2.replaced" / "runs", kept / "runs")
    monkeypatch.setattr(cli, "_report_of_kept", build)
    again = cli.keep("x2", work, to, force=True)
    assert (again / "report" / "report.md").exists() and [p.name for p in to.iterdir()] == ["x2"]


@pytest.mark.parametrize("name, why", [(".hidden", "starting with a letter"), ("book", "book's label"),
                                       ("naïve", "starting with a letter"), ("a/b", "starting with a letter")])
def test_keep_refuses_a_name_the_report_would_not_show_as_this_machine(name, why, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["keep", name])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: dpscale keep") and why in err


def test_keep_force_replaces_only_a_kept_machine(tmp_path):
    """`dpscale keep public --force` deleted the project's public convergence tables."""
    work, to = _workdir_from(H200X2, tmp_path / "work"), tmp_path / "reference"
    (to / "public").mkdir(parents=True)
    (to / "public" / "table.csv").write_text("kept by git\n")
    with pytest.raises(SystemExit, match=r"public is not a kept machine .* choose another NAME"):
        cli.keep("public", work, to, force=True)
    assert (to / "public" / "table.csv").read_text() == "kept by git\n"
    assert [p.name for p in to.iterdir()] == ["public"]


def test_keep_force_keeps_the_machines_earlier_measurements(tmp_path):
    """A re-measurement kept over a machine (keep --force) carries its earlier/ over: the
    report pools independent measurements of one protocol (dpscale.report.tta_pool)."""
    work, to = _workdir_from(H200X2, tmp_path / "work"), tmp_path / "reference"
    kept = cli.keep("x2", work, to)
    old = kept / "earlier" / "first" / "ddp_weak" / "cached" / "k1.json"
    old.parent.mkdir(parents=True)
    shutil.copy(kept / "runs" / "ddp_weak" / "cached" / "k1.json", old)
    before = old.read_bytes()
    again = cli.keep("x2", work, to, force=True)
    assert (again / "earlier" / "first" / "ddp_weak" / "cached" / "k1.json").read_bytes() == before


def test_a_folder_compared_with_itself_is_refused_in_one_line(tmp_path, monkeypatch):
    """Issue #53: `dpscale compare results results` printed 1.000 [0.743, 1.347], as if the
    two were independent machines."""
    from dpscale import cli
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as e:
        cli.main(["compare", "reference/h200", "reference/../reference/h200"])
    assert "are one folder" in str(e.value) and "\n" not in str(e.value)
