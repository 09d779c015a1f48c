"""dpscale.report.tta_pool: a kept machine's measurements of a time-to-accuracy point,
pooled when independent. On a copy of reference/h200 (its latest measurement in runs/,
on fresh seeds; three earlier ones in earlier/, all with seeds 1-5): the latest pools
with the newest of the three, the two older ones are shown and left out, and the
chapter says why; then another re-measurement with fresh seeds arrives (the latest
filed under earlier/ by file_earlier), and it pools with both, every repeat still left
out; a measurement of another protocol is never pooled."""
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


def test_measurements_with_the_same_seeds_are_shown_not_pooled(kept):
    rule = _rule(kept)
    for p in rule["points"]:
        fresh = json.loads((kept / "runs" / "ddp_tta" / "book" / f"k{p['k']}.json").read_text())["metrics"]["seeds"]
        assert len(set(fresh)) == 5 and not set(fresh) & {1, 2, 3, 4, 5}
        assert [x["label"] for x in p["measurements"]] == ["latest (runs/)", "7aa3da0", "5a04905", "aa73e51"]
        assert [x["pooled"] for x in p["measurements"]] == [True, True, False, False]
        assert all("seeds 1, 2, 3, 4, 5 repeat" in x["why"] for x in p["measurements"][2:])
        assert sorted(s["seed"] for s in p["seeds"]) == sorted([1, 2, 3, 4, 5, *fresh])
    assert tta_pool.earlier_paths(kept / "runs", "ddp_tta", "book", 2) == [
        kept / "earlier" / label / "ddp_tta" / "book" / "k2.json" for label in ("5a04905", "7aa3da0", "aa73e51")]


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
        r["finished_utc"] = "2026-12-06T00:00:00+00:00"
        save(kept / "runs" / "ddp_tta" / "book" / f.name, r)   # as a worker writes it: sealed


def test_a_remeasurement_with_fresh_seeds_pools_with_the_newest_independent_one(kept):
    before = {p["k"]: p for p in _rule(kept)["points"]}
    _remeasured(kept)
    rule = _rule(kept)
    for p in rule["points"]:
        recs = {x["label"]: x for x in p["measurements"]}
        assert [x["label"] for x in p["measurements"]] == ["latest (runs/)", "8b13861", "7aa3da0", "5a04905",
                                                           "aa73e51"]
        assert recs["latest (runs/)"]["pooled"] and recs["8b13861"]["pooled"] and recs["7aa3da0"]["pooled"]
        assert not recs["5a04905"]["pooled"] and not recs["aa73e51"]["pooled"]
        assert sorted(s["seed"] for s in p["seeds"]) == sorted([1, 2, 3, 4, 5, 11, 12, 13, 14, 15,
                                                               *recs["8b13861"]["seeds"]])
        assert [s["seed"] for s in p["clock_seeds"]] == [11, 12, 13, 14, 15]   # the clock: the newest's own
        assert p["samples_lo"] < p["samples"] < p["samples_hi"]
        assert before[p["k"]]["epochs"] != p["epochs"]
    assert rule["fit"]["n"] == 60


def test_another_protocol_is_never_pooled(kept):
    _remeasured(kept, tta_target=0.91)
    for p in _rule(kept)["points"]:
        assert [x["pooled"] for x in p["measurements"]] == [True, False, False, False, False]
        assert p["measurements"][1]["why"] == "another protocol than the latest's"
