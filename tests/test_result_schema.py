"""schemas/result.schema.yaml: every committed result meets it, and a result that
breaks it is refused, on write and on read, with one line naming the key."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpscale import results

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted(ROOT.glob("reference/*/runs/*/*/k*.json"))


def good() -> dict:
    return results.make_result(experiment="ddp_weak", variant="seed", k=2, status="ok", backend="gloo",
                               metrics={"samples_per_s": 10.0, "samples_per_s_ci95": [9.0, 11.0],
                                        "per_rank": [{"rank": 0}], "passed": True, "peak_mem_MiB": None,
                                        "largest_op_txt": "all-reduce"})


def test_the_committed_results_meet_the_schema():
    assert len(COMMITTED) >= 20
    for path in COMMITTED:
        results.check_schema(json.loads(path.read_text()), str(path))


def test_the_schema_is_valid_and_a_written_result_meets_it(tmp_path):
    import jsonschema
    jsonschema.validators.validator_for({}).check_schema(results._validator().schema)
    results.save(tmp_path / "k2.json", good())
    assert results.load_result(tmp_path / "k2.json")["metrics"]["samples_per_s"] == 10.0


def test_a_result_without_status_is_refused_naming_the_key(tmp_path):
    bad = {k: v for k, v in good().items() if k != "status"}
    with pytest.raises(ValueError, match=r"x\.json: top level: 'status' is a required property"):
        results.check_schema(bad, "x.json")
    (tmp_path / "k2.json").write_text(json.dumps(results.seal(bad)))   # sealed: the contract is read next
    with pytest.raises(ValueError, match=r"k2\.json: missing key\(s\) \['status'\]"):
        results.load_result(tmp_path / "k2.json")


@pytest.mark.parametrize("metrics, match", [
    ({"samples_per_s": "1,048,576"}, r"metrics\.samples_per_s: '1,048,576' is not of type 'number'.*_txt"),
    ({"input_path": 3}, r"metrics\.input_path: 3 is not of type 'string'"),
])
def test_a_text_metric_is_refused_when_written_and_when_read(tmp_path, metrics, match):
    with pytest.raises(ValueError, match=rf"ddp_weak/seed/k2: {match}"):
        results.make_result(experiment="ddp_weak", variant="seed", k=2, status="ok", backend="gloo",
                            metrics=metrics)
    (tmp_path / "k2.json").write_text(json.dumps(results.seal(dict(good(), metrics=metrics))))
    with pytest.raises(ValueError, match=rf"k2\.json: {match}"):
        results.load_result(tmp_path / "k2.json")


@pytest.mark.parametrize("change, match", [
    ({"k": 0}, r"k: 0 is less than the minimum of 1"),
    ({"status": "failed", "reason": ""}, r"reason: '' should be non-empty"),
    ({"data": {"source": "imagined"}}, r"data\.source: 'imagined' is not one of"),
    ({"started_utc": "yesterday"}, r"started_utc: 'yesterday' does not match"),
])
def test_other_breaches_name_their_key(change, match):
    with pytest.raises(ValueError, match=match):
        results.check_schema(dict(good(), **change), "x.json")


def test_what_an_interval_covers_is_text_the_schema_allows():
    """Found by a smoke run, not a unit test: timing.spread_fields and launches.merge write
    <name>_ci95_covers beside each interval; the schema refused it and failed every
    throughput job. The writers' own output must pass."""
    from dpscale.measure import timing
    from dpscale.run import launches
    spread = timing.spread_fields("samples_per_s", [100.0, 101.0, 99.0])
    assert any(k.endswith("_covers") for k in spread)
    one = json.loads((ROOT / "reference/h200/runs/ddp_weak/tuned/k1.json").read_text())
    one["metrics"].update(spread)
    results.check_schema(one, "one launch")
    merged = launches.merge([json.loads(json.dumps(one)) for _ in range(3)])
    results.check_schema(merged, "merged launches")


@pytest.mark.parametrize("damage", ["edited", "unsealed", "truncated"])
def test_a_reader_refuses_a_result_that_is_not_what_was_written(tmp_path, damage):
    """results.load_result, what every reader of a kept machine goes through
    (report.machines, tta_pool, forecast, compare, export): a sealed result edited by hand,
    one without a seal, one cut short, each a ValueError naming the file and the state;
    the same file as written loads."""
    p = tmp_path / "k2.json"
    sealed = results.save(p, good())
    assert results.load_result(p)["metrics"]["samples_per_s"] == 10.0
    if damage == "edited":
        p.write_text(json.dumps({**sealed, "metrics": {**sealed["metrics"], "samples_per_s": 99999.0}}))
    elif damage == "unsealed":
        p.write_text(json.dumps({k: v for k, v in sealed.items() if k != "digest"}))
    else:
        p.write_text(p.read_text()[: len(p.read_text()) // 2])
    state = {"edited": "altered", "unsealed": "unsealed", "truncated": "unreadable"}[damage]
    with pytest.raises(ValueError, match=rf"{p.name}.*{state}|{state}.*{p.name}"):
        results.load_result(p)
