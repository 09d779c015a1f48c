"""dpscale.report.tta_pool: a kept machine's measurements of a time-to-accuracy point,
pooled. On a copy of reference/h200 (its latest measurement in runs/, on fresh seeds;
three earlier ones in earlier/, all with seeds 1-5): all four pool, each of seeds 1-5
counted once as the mean of its three launches (never one measurement picked), and the
chapter says so; then another re-measurement with fresh seeds arrives (the latest filed
under earlier/ by file_earlier), and it pools with them; a measurement of another
protocol is never pooled, one that differs only in when it evaluated is."""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import ROOT
from dpscale.report import machines, tta, tta_pool
from dpscale.results import save

H200 = ROOT / "reference" / "h200"


@pytest.fixture
def kept(tmp_path):
    dest = tmp_path / "h200"
    for rel in ("fingerprint.json", "plan.json", "runs/ddp_tta", "runs/ddp_weak", "earlier"):
        src, dst = H200 / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy(src, dst)
    return dest


def _rule(folder):
    return tta.of_rule(machines.load_reference(folder), "book", None)


def test_measurements_that_reused_seeds_are_averaged_per_seed_never_one_picked(kept):
    from dpscale.analysis.stateff import crossings
    rule = _rule(kept)
    for p in rule["points"]:
        fresh = json.loads((kept / "runs" / "ddp_tta" / "book" / f"k{p['k']}.json").read_text())["metrics"]["seeds"]
        assert len(set(fresh)) == 5 and not set(fresh) & {1, 2, 3, 4, 5}
        labels = {x["label"] for x in p["measurements"]}
        assert labels == {"latest (runs/)", *(f.parts[-4] for f in (kept / "earlier").glob(f"*/ddp_tta/book/k{p['k']}.json"))}
        assert {"7aa3da0", "5a04905", "aa73e51"} <= labels and all(x["pooled"] for x in p["measurements"])
        ones = [x for x in p["measurements"] if set(x["seeds"]) == {1, 2, 3, 4, 5}]   # newest first
        assert len(ones) == 3 and not ones[0]["averaged"]
        assert all("seeds 1, 2, 3, 4, 5 repeat" in x["averaged"] for x in ones[1:])
        every = {s for x in p["measurements"] for s in x["seeds"]}
        assert sorted(s["seed"] for s in p["seeds"]) == sorted(every) and set(fresh) <= every   # each seed once
        rows = {s["seed"]: s for s in p["seeds"]}
        for seed in (1, 2, 3, 4, 5):
            assert rows[seed]["launches"] == 3
            each = []   # the seed's crossing in each measurement, read off that file alone
            for label in ("7aa3da0", "5a04905", "aa73e51"):
                r = json.loads((kept / "earlier" / label / "ddp_tta" / "book" / f"k{p['k']}.json").read_text())
                run = next(x for x in r["metrics"]["runs"] if x["seed"] == seed)
                each.append(crossings.crossing(run["curve"], p["target"])["samples"])
            assert None not in each and len(set(each)) > 1
            assert rows[seed]["samples"] == pytest.approx(sum(each) / 3)
        assert p["samples"] == pytest.approx(sum(s["samples"] for s in p["seeds"]) / len(every))
    assert tta_pool.earlier_paths(kept / "runs", "ddp_tta", "book", 2) == sorted(
        (kept / "earlier").glob("*/ddp_tta/book/k2.json"))


def _remeasured(kept, seeds=(11, 12, 13, 14, 15), **proto):
    """The re-measurement: the latest filed under earlier/8b13861, and in runs/ a result
    with fresh seeds (aa73e51's launches relabelled: the mechanics, not new data)."""
    moved = tta_pool.file_earlier(kept, "8b13861")
    assert len(moved) == 4 and not list((kept / "runs" / "ddp_tta").glob("*/k*.json"))
    for f in sorted((kept / "earlier" / "aa73e51" / "ddp_tta" / "book").glob("k*.json")):
        r = json.loads(f.read_text())
        for run, s in zip(r["metrics"]["runs"], seeds):
            run["seed"] = s
        r["metrics"].update(seeds=list(seeds), run_id=0x5EED)
        r["config"]["protocol"].update(proto)
        r["finished_utc"] = "2099-01-01T00:00:00+00:00"   # newer than every kept one
        save(kept / "runs" / "ddp_tta" / "book" / f.name, r)   # as a worker writes it: sealed


def test_a_remeasurement_with_fresh_seeds_pools_with_the_newest_independent_one(kept):
    before = {p["k"]: p for p in _rule(kept)["points"]}
    _remeasured(kept)
    rule = _rule(kept)
    for p in rule["points"]:
        recs = {x["label"]: x for x in p["measurements"]}
        assert p["measurements"][0]["label"] == "latest (runs/)" and "8b13861" in recs
        assert all(x["pooled"] for x in recs.values())
        assert sorted(s["seed"] for s in p["seeds"]) == sorted({s for x in recs.values() for s in x["seeds"]})
        assert {11, 12, 13, 14, 15} <= {s["seed"] for s in p["seeds"]}
        assert [s["seed"] for s in p["clock_seeds"]] == [11, 12, 13, 14, 15]   # the clock: the newest's own
        assert p["samples_lo"] < p["samples"] < p["samples_hi"]
        assert before[p["k"]]["epochs"] != p["epochs"]
    assert rule["fit"]["n"] == sum(len(p["seeds"]) for p in rule["points"])   # seeds 1-5 once each


def test_another_protocol_is_never_pooled(kept):
    _remeasured(kept, tta_target=0.91)
    for p in _rule(kept)["points"]:
        assert p["measurements"][0]["pooled"] and not any(x["pooled"] for x in p["measurements"][1:])
        assert p["measurements"][1]["why"] == "another protocol than the latest's"


def test_a_measurement_that_differs_only_in_when_it_evaluated_pools(kept):
    """registry.TTA_EVALUATION: the evaluation's cadence and the instrument's grid move
    nothing training does, so such a measurement pools; the clock is the newest's own."""
    _remeasured(kept, tta_eval_every_epochs=1, tta_eval_every_samples=20000)
    for p in _rule(kept)["points"]:
        assert all(x["pooled"] for x in p["measurements"])
