"""The fabric model checked on public nccl-tests outputs of one cluster at several scales
(dpscale.analysis.forecast.fabric_check, `dpscale forecast --fabric-check`): the kept
outputs are as printed (each file's own summary line and every row's arithmetic agree
with its numbers), the check reproduces a known two-tier fabric from synthetic outputs
and rejects a model that lost its growth across nodes, the manifest holds at least three
clusters at two scales, and docs/fabric-check.md shows every case as the check computes it."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from dpscale.analysis.forecast import fabric_check as fk, fabric_file as ff, model as fc

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "reference" / "fabrics" / "nccl-tests"
MANIFEST = DATA / "scales.yaml"


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.txt")))
def test_each_kept_output_agrees_with_its_own_numbers(name):
    """A mistyped digit shows: every row's algbw is its size over its time, its busbw
    algbw x 2(n-1)/n (to the printed precision), and the file's Avg bus bandwidth is the
    mean of its rows' busbw (nccl-tests computes it so)."""
    s = ff.read_sweep(DATA / name)
    for rows in s.table.values():
        for r in rows:
            if r.algbw_GBps and r.algbw_GBps >= 0.5:
                assert r.bytes / r.time_s / 1e9 == pytest.approx(r.algbw_GBps, rel=0.006, abs=0.011), (name, r)
                factor = 2 * (s.ranks - 1) / s.ranks   # algbw printed to 0.01: its rounding grows with it
                assert r.algbw_GBps * factor == pytest.approx(r.busbw_GBps, rel=0.006, abs=0.006 + 0.005 * factor), \
                    (name, r)
    if s.avg_busbw_GBps:
        assert s.mean_busbw_GBps() == pytest.approx(s.avg_busbw_GBps, rel=0.002, abs=0.002), name


def test_the_corpus_holds_three_clusters_or_more_at_two_scales_and_names_its_held_out_cases():
    cases = fk.read_cases(MANIFEST)
    checked = [c for c in cases if not c.held_out]
    scales = {}
    for c in checked:
        small = ff.read_sweep(c.small[0])
        large = ff.read_sweep(c.large)
        assert large.ranks > small.ranks, c
        scales.setdefault(c.cluster, set()).update({small.ranks, large.ranks})
    assert len([k for k, v in scales.items() if len(v) >= 2]) >= 3, scales
    assert any(c.held_out for c in cases)
    names = {p.name for p in DATA.glob("*.txt")}
    sources = (DATA / "SOURCES.md").read_text()
    assert all(Path(f).name in names and Path(f).name in sources for c in cases for f in (*c.small, c.large))


def write_table(path, hosts: int, per_node: int, fabric, sizes):
    """An all_reduce_perf table whose times are the two-tier model's with `fabric`."""
    lines = ["# nThread 1 nGpus 1 minBytes 1048576 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 "
             "agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
    n = hosts * per_node
    for r in range(n):
        lines.append(f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on node{r // per_node:02d} device  {r % per_node} "
                     f"[0x{r % per_node:02x}] NVIDIA H100 80GB HBM3")
    lines += ["#", "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
              "algbw   busbw #wrong", "#        (B)    (elements)                               (us)  (GB/s)  "
              "(GB/s)            (us)  (GB/s)  (GB/s)"]
    for S in sizes:
        t = fabric(S, hosts, per_node)
        alg = S / t / 1e9
        bus = alg * 2 * (n - 1) / n
        cell = f"{1e6 * t:8.2f} {alg:7.2f} {bus:7.2f}      0"
        lines.append(f"{S:12d} {S // 4:13d}     float     sum      -1 {cell} {cell}")
    path.write_text("\n".join(lines) + "\n")


def known(S, hosts, per_node):
    """The truth of the synthetic cluster: nodes of 8 at 300 GB/s in the node, 50 GB/s
    per node between nodes, 10 us and 5 us per step."""
    intra, inter = fc.Fabric(10e-6, 300e9, per_node), fc.Fabric(5e-6, 50e9, 0)
    return fc.hierarchical_time(S, hosts, per_node, intra, inter)


def synthetic_case(tmp_path):
    sizes = [2**p for p in range(20, 31)]
    write_table(tmp_path / "one.txt", 1, 8, known, sizes)
    write_table(tmp_path / "two.txt", 2, 8, known, sizes)
    write_table(tmp_path / "eight.txt", 8, 8, known, sizes)
    (tmp_path / "scales.yaml").write_text(yaml.safe_dump({"cases": [
        {"cluster": "synthetic", "small": ["one.txt", "two.txt"], "large": "eight.txt"},
        {"cluster": "synthetic again", "small": ["one.txt", "two.txt"], "large": "eight.txt"}]}))
    return fk.run(tmp_path / "scales.yaml", draws=40)


def test_the_check_recovers_a_known_fabric_from_the_smaller_scale(tmp_path):
    """From one node and two nodes of 8, the eight-node time of every payload within 1%
    (the tables print 2 decimals of us); the naive constant busbw is far off."""
    res = synthetic_case(tmp_path)
    r = res["cases"][0]
    assert all(abs(x["error_pct"]) < 1.0 for x in r["rows"]), r["rows"]
    assert abs(r["error_pct"]) < 1.0 and abs(r["naive_error_pct"]) > 10
    assert r["band_lo"] <= r["measured_busbw_GBps"] <= r["band_hi"]


def test_the_check_rejects_a_model_that_lost_its_growth_across_nodes(tmp_path, monkeypatch):
    """The across-node ring's growth lost (N nodes computed as 2): the eight-node
    prediction is off by more than 10% at the largest payload."""
    synthetic_case(tmp_path)   # the outputs, written by the true model
    real = fc.hierarchical_time
    monkeypatch.setattr(fc, "hierarchical_time", lambda S, nodes, g, intra, inter: real(S, min(nodes, 2), g, intra, inter))
    r = fk.run(tmp_path / "scales.yaml", draws=10)["cases"][0]
    assert abs(r["error_pct"]) > 10, r["error_pct"]


def live():
    from dpscale.report import forecast as fcr
    return fcr.fabric_check(DATA)


def test_docs_fabric_check_shows_every_case_as_the_check_computes_it():
    """Every case row of docs/fabric-check.md (measured, predicted, band, error, naive)
    equals the live check at the shown precision, and its summary sentence too."""
    res = live()
    doc = (ROOT / "docs" / "fabric-check.md").read_text()
    rows = [line for line in doc.splitlines() if re.match(r"\| \d+( \(held out\))? \|", line)]
    assert len(rows) == len(res["cases"])
    for line, r in zip(rows, res["cases"]):
        want = (f"{r['measured_busbw_GBps']:.1f} | {r['predicted_busbw_GBps']:.1f} [{r['band_lo']:.1f}, "
                f"{r['band_hi']:.1f}] | {r['error_pct']:+.1f}% | {'yes' if r['inside'] else 'no'} | "
                f"{r['naive_busbw_GBps']:.1f} ({r['naive_error_pct']:+.1f}%)")
        assert want in line, (line, want)
    s, h = res["summary"]["checked"], res["summary"]["held_out"]
    assert (f"mean |error| of the model {s['model_mean_abs_pct']:.1f}%, of the naive busbw "
            f"{s['naive_mean_abs_pct']:.1f}%; {s['inside']} of {s['banded']} inside") in " ".join(doc.split())
    assert (f"model {h['model_mean_abs_pct']:.1f}%, naive {h['naive_mean_abs_pct']:.1f}%; {h['inside']} of "
            f"{h['banded']} inside") in " ".join(doc.split())


def test_the_cli_prints_the_fabric_check(capsys):
    from dpscale import cli
    assert cli.main(["forecast", "--fabric-check", str(DATA)]) == 0
    out = capsys.readouterr().out
    assert out.count("->") == len(fk.read_cases(MANIFEST)) and "held out" in out and "naive" in out


def test_a_row_with_wrong_elements_is_left_out_of_the_fit():
    s = ff.read_sweep(DATA / "gh200_2node_1gpu_olivia.txt")
    rows, wrong = ff.fitted_rows(s)
    assert [r.bytes for r in wrong] == [1048576] and 1048576 not in [r.bytes for r in rows]
    assert "#wrong > 0 left out" in ff.fabric_tiers(s).inter.source
    assert np.isfinite(ff.fabric_tiers(s).inter.beta_Bps)
