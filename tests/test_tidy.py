"""The tidy results table (dpscale.report.tidy) and `dpscale export`: units from the
metrics' names, intervals on the right rows, numbers that pandas reads as numbers."""
from __future__ import annotations

import pandas as pd
import pytest
from report_fixtures import CPU_FP, ROOT, write_cpu_smoke, write_gpu_paper

from dpscale import cli
from dpscale.report import machines, tidy
from dpscale.results import write_json_atomic

FLOATS = ("value", "ci_lo", "ci_hi")


@pytest.mark.parametrize("name, unit", [
    ("samples_per_s", "samples/s"), ("samples_per_s_mean", "samples/s"), ("samples_per_s_cv", "1"),
    ("roofline_samples_per_s_compiler", "samples/s"), ("busbw_GBps_64MiB", "GB/s"), ("avg_busbw_GBps", "GB/s"),
    ("achieved_TFLOPs_per_device", "TFLOP/s"), ("step_ms_median", "ms"), ("epoch_ms_per_step", "ms"),
    ("step_ms_n", "count"), ("step_ms_rank", "rank"), ("per_rank_batch", "count"), ("peak_mem_MiB", "MiB"),
    ("state_MiB_per_rank", "MiB"), ("roofline_bytes_per_sample_MB_compiler", "MB"), ("epoch_s", "s"),
    ("hung_after_s", "s"), ("grad_bytes", "B"), ("grad_floats", "elements"), ("mfu", "1"),
    ("dispatch_share_of_epoch", "1"), ("state_ratio_fsdp_over_ddp", "1"), ("n_allreduce", "count"),
    ("repeats", "count"), ("flops_per_sample", "FLOP/sample"), ("loss_last", "1"), ("widgets", None),
])
def test_unit_comes_from_the_name(name, unit):
    assert tidy.unit_of(name) == unit


def test_interval_sits_on_the_mean_and_says_what_it_covers():
    m = {"samples_per_s": 100.0, "samples_per_s_repeats": [100.0, 98.0, 102.0], "samples_per_s_mean": 100.0,
         "samples_per_s_median": 100.0, "samples_per_s_ci95": [95.0, 105.0], "repeats": 3, "busbw_GBps_max": 4.0,
         "step_ms_median": 3.0, "step_ms_n": 20, "text_txt": "x", "passed": True, "per_rank": [{}], "nan_ms": None}
    rows = {r["metric"]: r for r in tidy.metric_rows(m)}
    assert set(rows) == {"samples_per_s", "samples_per_s_mean", "samples_per_s_median", "repeats",
                         "busbw_GBps_max", "step_ms_median", "step_ms_n"}   # no text, bool, list, null
    mean = rows["samples_per_s_mean"]
    assert (mean["ci_lo"], mean["ci_hi"], mean["n"], mean["covers"]) == (95.0, 105.0, 3, tidy.WITHIN)
    assert rows["samples_per_s"]["ci_lo"] is None and rows["samples_per_s"]["n"] is None   # the first epoch
    assert rows["samples_per_s_median"]["n"] == 3 and rows["samples_per_s_median"]["ci_lo"] is None
    assert rows["step_ms_median"]["n"] == 20 and rows["busbw_GBps_max"]["n"] is None
    across = {r["metric"]: r for r in tidy.metric_rows({**m, "samples_per_s_launches": [99.0, 101.0, 97.0, 103.0]})}
    assert (across["samples_per_s_mean"]["n"], across["samples_per_s_mean"]["covers"]) == (4, tidy.ACROSS)
    alone = tidy.metric_rows({"comm_ms": 2.0, "comm_ms_ci95": [1.5, 2.5], "repeats": 5})
    assert (alone[0]["ci_lo"], alone[0]["n"], alone[0]["covers"]) == (1.5, 5, tidy.WITHIN)
    probe = {r["metric"]: r for r in tidy.metric_rows(
        {"comm_ms": 2.0, "comm_ms_ci95": [1.5, 2.5], "comm_ms_pairs": [2.0] * 12, "comm_ms_ci95_coverage": 0.96})}
    assert (probe["comm_ms"]["ci_hi"], probe["comm_ms"]["n"], probe["comm_ms"]["covers"]) == (2.5, 12, tidy.PAIRED)
    assert probe["comm_ms_ci95_coverage"]["unit"] == "1"


@pytest.fixture(scope="module")
def fixture_machines(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tidy")
    targets = write_cpu_smoke(tmp / "runs")
    write_json_atomic(tmp / "fingerprint.json", CPU_FP)
    write_gpu_paper(tmp / "reference" / "h200x8")
    current = machines.load_planned(tmp / "runs", tmp / "fingerprint.json", targets)
    return tmp, [current, machines.load_reference(tmp / "reference" / "h200x8")]


def test_table_round_trips_through_csv_as_numbers(fixture_machines, tmp_path):
    _tmp, ms = fixture_machines
    tidy.write(ms, tmp_path / "results.csv")
    df = pd.read_csv(tmp_path / "results.csv")
    assert list(df.columns) == tidy.COLUMNS
    assert all(df[c].dtype == "float64" for c in FLOATS), df.dtypes
    assert df["k"].dtype == "int64"
    assert set(df["machine"]) == {"this run", "h200x8"}
    ok = df[df.status == "ok"]
    assert ok["metric"].notna().all() and ok["value"].notna().all()
    assert set(ok["data_source"]) == {"synthetic", "real"}
    assert ok["commit"].str.fullmatch("[0-9a-f]{40}").all()
    means = ok[ok.metric == "samples_per_s_mean"]
    assert len(means) and means["ci_lo"].notna().all() and (means.ci_lo <= means.value).all()
    assert (means.value <= means.ci_hi).all() and (means.covers == tidy.WITHIN).all() and (means.n == 3).all()
    # a planned job without a number keeps its row: status and reason are not dropped
    missing = df[df.status.isin(["hung", "failed", "skipped", "not run"])]
    assert len(missing) and set(missing.status) >= {"hung", "skipped"}


def test_every_committed_metric_has_a_unit():
    df = tidy.table([machines.load_reference(f) for f in machines.reference_folders([ROOT / "reference"])])
    assert len(df) > 100
    unitless = sorted(set(df[df.metric.notna() & df.unit.isna()].metric))
    assert not unitless, f"metric names that carry no unit tidy.UNITS knows: {unitless}"


def test_export_is_the_reports_table_of_a_kept_machine(tmp_path):
    """`dpscale export reference/h200` wrote 292 rows, its report's results.csv 421: every
    time-to-accuracy speed-up, statistical efficiency and forecast row was missing."""
    out = tmp_path / "h200.csv"
    cli.export([ROOT / "reference" / "h200"], str(out))
    key = ["machine", "experiment", "variant", "k", "metric"]
    got = pd.read_csv(out)
    report = pd.read_csv(ROOT / "reference" / "h200" / "report" / "results.csv")
    report = report[report.machine == "h200"]
    assert set(map(tuple, got[key].astype(str).values)) == set(map(tuple, report[key].astype(str).values))
    assert {"tta_speedup", "statistical_efficiency"} <= set(got.metric)


def test_export_writes_the_kept_machines(fixture_machines, tmp_path, capsys):
    tmp, _ms = fixture_machines
    out = tmp_path / "kept.csv"
    assert cli.main(["export", str(tmp / "reference"), "--to", str(out)]) == 0
    df = pd.read_csv(out)
    assert set(df.machine) == {"h200x8"} and all(df[c].dtype == "float64" for c in FLOATS)
    assert f"rows to {out}" in capsys.readouterr().out
    assert cli.main(["export", str(tmp / "reference" / "h200x8"), "--to", "-"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == ",".join(tidy.COLUMNS)
    with pytest.raises(SystemExit, match="holds no kept machine"):
        cli.export([tmp_path], "-")
