"""The report shows the spread across launches beside the spread within one, and a
warning beside a number measured on a shared or slowed GPU (one report build)."""
from __future__ import annotations

import csv
import html as htmllib
import json

import pytest

from report_fixtures import BOOK, CPU_FP, write_cpu_smoke

from dpscale import report
from dpscale.analysis import stats
from dpscale.results import save, write_json_atomic

pytestmark = pytest.mark.report   # builds whole reports: scheduled before the second-long modules (conftest.TIERS)

LAUNCHES = [14.0, 15.5, 13.0]


def test_launch_spread_and_gpu_flags_reach_the_report(tmp_path):
    runs = tmp_path / "results" / "runs"
    targets = write_cpu_smoke(runs)
    write_json_atomic(tmp_path / "results" / "fingerprint.json", CPU_FP)
    path = runs / "ddp_weak" / "seed" / "k2.json"
    r = json.loads(path.read_text())
    r["metrics"].update(samples_per_s_launches=LAUNCHES, launches=3)
    r["gpu_state"] = {"source": "nvml", "flags": ["shared", "throttled: sw_power_cap"], "devices": []}
    save(path, r)
    out = tmp_path / "results" / "report"
    report.build(runs, tmp_path / "results" / "fingerprint.json", out, targets=targets, references=[],
                 book_path=BOOK, build_info={"command": "snakemake report", "config_hash": "c", "resolved": {}})

    noise = list(csv.DictReader((out / "tables" / "noise.csv").open()))
    mine = {row["over"]: row for row in noise if row["experiment"] == "ddp_weak" and row["variant"] == "seed"
            and row["k"] == "2"}
    across = mine["samples/s across independent launches"]
    assert across["n"] == "3" and float(across["cv"]) == pytest.approx(stats.interval(LAUNCHES)['cv'])   # a number in the CSV
    assert f"samples/s over {stats.WITHIN}" in mine
    assert sum(row["over"] == "samples/s across independent launches" for row in noise) == 1   # only where launched

    page = htmllib.unescape((out / "report.html").read_text())
    assert page.count("(GPU shared; throttled: sw_power_cap)") == 1   # the seed cell of the side-by-side table
    assert "ddp_weak [seed] k=2: the GPU was shared; throttled: sw_power_cap during the timing" in page
    assert page.count("the GPU was ") == 1


def test_more_ranks_than_cores_is_flagged_on_the_result_the_report_and_the_closing_lines(tmp_path):
    """cluster={gpus_per_node: 8} on two cores: eight gloo ranks took turns on two cores.
    The watchdog records it on the result; the report's cell, its banner and the summary say it."""
    from dpscale.run.watchdog import oversubscribed
    assert oversubscribed({"k": 8, "threads_per_rank": 1}, cores=2)["ranks"] == 8
    assert oversubscribed({"k": 8, "processes": 2, "threads_per_rank": 1}, cores=2) is None   # emulated k: 2 processes
    assert oversubscribed({"k": 2, "threads_per_rank": 1}, cores=2) is None
    runs = tmp_path / "results" / "runs"
    targets = write_cpu_smoke(runs)
    write_json_atomic(tmp_path / "results" / "fingerprint.json", CPU_FP)
    path = runs / "ddp_weak" / "seed" / "k2.json"
    r = json.loads(path.read_text())
    r["oversubscribed"] = oversubscribed({"k": 2, "threads_per_rank": 1}, cores=1)
    save(path, r)
    out = tmp_path / "results" / "report"
    report.build(runs, tmp_path / "results" / "fingerprint.json", out, targets=targets, references=[],
                 book_path=BOOK, build_info={"command": "snakemake report", "config_hash": "c", "resolved": {}})
    page = htmllib.unescape((out / "report.html").read_text())
    assert "(2 ranks on 1 CPU cores)" in page
    assert "ddp_weak [seed] k=2: 2 ranks on 1 CPU cores took turns during the timing" in page
    assert "flagged: ddp_weak/seed/k2: 2 rank(s) x 1 thread(s) shared 1 CPU core(s)" in (out / "summary.txt").read_text()
