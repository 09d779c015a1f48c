"""Where a run's files live (dpscale.layout) and how a record names them (relative to
its run folder: dpscale.results.portable), read back where they are now; and no
committed reference names a folder of the machine that made it."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import CPU_FP, ROOT

from dpscale import cli, layout, results
from dpscale.data import fetch as dfetch
from dpscale.report import machines

# The folders a machine keeps its runs, homes and checkouts in. A system location
# (/usr/share/datasets/..., a process NVML saw running from /opt/...) is the machine's
# software, not its files, and may stay.
MACHINE_FOLDER = re.compile(r"^/(tmp|root|home|work|mnt|scratch|data)(/|$)")


def _record(tmp_path, **extra) -> dict:
    return results.make_result(experiment="ddp_weak", variant="seed", k=1, status="failed", reason="x",
                               backend="gloo", fingerprint=CPU_FP, **extra)


def test_a_record_names_its_run_folders_paths_relative_and_the_home_as_tilde(tmp_path, monkeypatch):
    run, home = tmp_path / "run", tmp_path / "home"
    run.mkdir()
    monkeypatch.chdir(run)
    monkeypatch.setenv("HOME", str(home))
    log = run / "logs" / "ddp_weak" / "seed" / "k1.log"
    r = _record(tmp_path, log=str(log), rank_logs=[f"{log.with_suffix('')}.rank0.log"],
                runtime={"env": {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{log}.ranks/nccl_trace_rank_",
                                 "JAX_COMPILATION_CACHE_DIR": str(home / ".cache" / "dpscale" / "xla")}},
                data={"source": "real", "origin": "/usr/share/datasets/fashion-mnist"},
                hung_detail=f"rank 0 stuck; see {log} and --log-dir={run}",
                command=f"snakemake --config 'data={{local_dir: {run}/.fmnist}}'")
    assert r["log"] == "logs/ddp_weak/seed/k1.log" and r["rank_logs"] == ["logs/ddp_weak/seed/k1.rank0.log"]
    assert r["runtime"]["env"] == {
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "logs/ddp_weak/seed/k1.log.ranks/nccl_trace_rank_",
        "JAX_COMPILATION_CACHE_DIR": "~/.cache/dpscale/xla"}
    assert r["hung_detail"] == "rank 0 stuck; see logs/ddp_weak/seed/k1.log and --log-dir=."
    assert r["data"]["origin"] == "/usr/share/datasets/fashion-mnist"    # a system location, as it is
    assert r["command"].endswith(f"{run}/.fmnist}}'")                   # what was typed, as typed
    # the project's checkout, outside the run folder: relative to the run folder all the same
    assert results.relative(ROOT / "scripts" / "torch_worker.py", run) == os.path.relpath(
        ROOT / "scripts" / "torch_worker.py", run)


def test_the_data_stage_names_a_local_copy_inside_the_run_folder_relative(tmp_path, monkeypatch):
    """data.local_dir: .fmnist, given absolute as Snakemake's working folder resolves it."""
    monkeypatch.chdir(tmp_path)
    fake = tmp_path / ".fmnist"
    monkeypatch.setattr(dfetch, "copy_local", lambda root, folder, resources, unpacked: {"x": "checked"})
    monkeypatch.setattr(dfetch, "unpack", lambda root: None)
    prov = dfetch.fetch(tmp_path / "results" / "data", "local", [], local_dir=fake, resources=())
    assert prov["origin"] == ".fmnist"
    assert json.loads((tmp_path / "results" / "data" / "source.json").read_text())["origin"] == ".fmnist"


def test_a_kept_machine_is_the_working_folder_flattened_and_resolves_what_its_records_name(tmp_path):
    w, k = layout.working(tmp_path / "w"), layout.kept(tmp_path / "k")
    assert w.runs == tmp_path / "w" / "results" / "runs" and k.runs == tmp_path / "k" / "runs"
    assert w.plan == tmp_path / "w" / "results" / "report" / "plan.json" and k.plan == tmp_path / "k" / "plan.json"
    assert w.logs == tmp_path / "w" / "logs" and k.logs == tmp_path / "k" / "logs"
    assert layout.of_runs(w.runs) == w and layout.of_runs(k.runs) == k
    assert k.resolve("results/runs/allreduce/default/k2.json") == k.runs / "allreduce/default/k2.json"
    assert w.resolve("results/runs/allreduce/default/k2.json") == w.runs / "allreduce/default/k2.json"
    assert k.resolve("logs/a.log") == k.logs / "a.log" and k.resolve("/usr/x") == Path("/usr/x")
    assert layout.result_path("ddp_weak", "seed", 2) == "results/runs/ddp_weak/seed/k2.json"
    assert layout.log_path("ddp_weak", "{variant}", "{k}") == "logs/ddp_weak/{variant}/k{k}.log"


def test_the_report_names_a_kept_results_log_where_it_is_now(tmp_path):
    kept = layout.kept(tmp_path / "reference" / "m")
    path = Path(layout.result_path("ddp_weak", "seed", 1, str(kept.runs)))
    results.save(path, _record(tmp_path, log="logs/ddp_weak/seed/k1.log",
                                            nccl_traces=["logs/ddp_weak/seed/k1.log.ranks/nccl_trace_rank_0"]))
    results.write_json_atomic(kept.fingerprint, CPU_FP)
    r = machines.load_reference(kept.root).get("ddp_weak", "seed", 1)
    assert Path(r["log"]).resolve() == (kept.logs / "ddp_weak" / "seed" / "k1.log").resolve(), r["log"]
    assert Path(r["nccl_traces"][0]).resolve() == (kept.logs / "ddp_weak/seed/k1.log.ranks/nccl_trace_rank_0").resolve()


def test_keep_rewrites_an_older_records_absolute_paths_and_copies_a_portable_one_as_it_is(tmp_path):
    work = tmp_path / "work"
    old, new = work / "old.json", work / "new.json"
    results.write_json_atomic(old, {"log": str(work / "logs" / "k1.log"), "metrics": {"step_ms": 1.25}})
    new.write_text('{"log": "logs/k1.log",   "metrics": {"step_ms": 1.25}}\n')   # not as json.dumps writes it
    cli._copy(old, tmp_path / "kept" / "old.json", work)
    cli._copy(new, tmp_path / "kept" / "new.json", work)
    kept_old = json.loads((tmp_path / "kept" / "old.json").read_text())
    assert kept_old == {"log": "logs/k1.log", "metrics": {"step_ms": 1.25}}
    assert (tmp_path / "kept" / "new.json").read_bytes() == new.read_bytes()


def absolute_paths(folder: Path) -> list[str]:
    """Every path of a machine's own folders that a JSON under `folder` names, but in
    what a user typed (results.TYPED: kept as typed)."""
    found = []

    def walk(x, where):
        if isinstance(x, dict):
            for k, v in x.items():
                if k not in results.TYPED:
                    walk(v, where)
        elif isinstance(x, list):
            for v in x:
                walk(v, where)
        elif isinstance(x, str):
            found.extend(f"{where}: {t}" for t in results._ABSOLUTE.findall(x) if MACHINE_FOLDER.match(t))
    for p in sorted(folder.rglob("*.json")):
        walk(json.loads(p.read_text()), p.relative_to(folder))
    return found


def test_no_committed_reference_names_a_folder_of_the_machine_that_made_it(tmp_path):
    bad = absolute_paths(ROOT / "reference")
    assert not bad, f"{len(bad)} absolute path(s), e.g. {bad[:5]}"
    (tmp_path / "m" / "runs").mkdir(parents=True)
    (tmp_path / "m" / "runs" / "k1.json").write_text(json.dumps(
        {"runtime": {"env": {"X": "/tmp/wd/logs/a"}}, "commands": ["ip taskset /work/main/.venv/bin/torchrun"],
         "command": "snakemake --config local_dir=/work/main/.fmnist", "gpu": "/opt/torch/.venv/bin/python"}))
    assert absolute_paths(tmp_path) == ["m/runs/k1.json: /tmp/wd/logs/a",
                                        "m/runs/k1.json: /work/main/.venv/bin/torchrun"]


@pytest.mark.parametrize("text, want", [("https://a.b/c d", "https://a.b/c d"), ("1/2", "1/2"),
                                        ("x=/usr/bin/ip", "x=/usr/bin/ip")])
def test_text_that_is_no_path_of_the_run_is_left_as_it_is(text, want, tmp_path):
    assert results.portable({"v": text}, tmp_path) == {"v": want}


def test_keep_seals_again_a_sealed_record_whose_paths_it_rewrites(tmp_path):
    """A sealed result naming an absolute path of the run: keep rewrites the path, and the
    copy is still sound (a path-only rewrite); a damaged one is copied as it is, unsealed
    by nothing, so keep's audit still refuses it."""
    work = tmp_path / "work"
    sealed = results.save(work / "k1.json", _record(tmp_path, log=str(work / "logs" / "k1.log")))
    cli._copy(work / "k1.json", tmp_path / "kept" / "k1.json", work)
    assert results.audit(tmp_path / "kept" / "k1.json").state == results.SOUND
    assert json.loads((tmp_path / "kept" / "k1.json").read_text())["log"] == "logs/k1.log"
    (work / "k2.json").write_text(json.dumps({**sealed, "reason": "edited"}))
    cli._copy(work / "k2.json", tmp_path / "kept" / "k2.json", work)
    assert results.audit(tmp_path / "kept" / "k2.json").state == results.ALTERED


def test_a_runs_results_folder_read_as_a_machine_finds_its_plan(tmp_path):
    """`dpscale forecast results` (a run's results/, its plan at results/report/plan.json)
    prints no 'no plan recorded' line (issue #53)."""
    import shutil
    from dpscale.report.machines import load_reference
    src = ROOT / "reference" / "h200x2"
    res = tmp_path / "results"
    shutil.copytree(src / "runs", res / "runs")
    shutil.copy(src / "fingerprint.json", res / "fingerprint.json")
    (res / "report").mkdir()
    shutil.copy(src / "plan.json", res / "report" / "plan.json")
    m = load_reference(res)
    assert not [e for e in m.errors if "no plan recorded" in e], m.errors
    (res / "report" / "plan.json").unlink()
    assert [e for e in load_reference(res).errors if "no plan recorded" in e]


def test_forecast_and_export_answer_alike_outside_a_project(tmp_path, monkeypatch, capsys):
    """Issue #53: outside a project folder `forecast` read the repository's machines while
    `export` refused. Both now read ./reference where it exists, else the repository's,
    and say so."""
    monkeypatch.chdir(tmp_path)
    assert cli.default_reference("export") == ROOT / "reference"
    assert "no ./reference here" in capsys.readouterr().err
    (tmp_path / "reference").mkdir()
    assert cli.default_reference("forecast") == Path("reference")
