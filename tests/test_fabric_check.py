"""The fabric model checked on public nccl-tests outputs of one cluster at several scales
(dpscale.analysis.forecast.fabric_check, `dpscale forecast --fabric-check`): the kept
outputs are as printed (each file's own summary line and every row's arithmetic agree
with its numbers), the check reproduces a known two-tier fabric from synthetic outputs
and rejects a model that lost its growth across nodes, the manifest holds at least three
clusters at two scales, and docs/fabric-check.md's cases are a generated block (`dpscale docs --check`, tests/test_docs.py)."""
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


# ---------------------------------------------------------------- the node-count term (#54 point 4)

def test_every_node_count_case_has_both_predictors_errors_computed_out_of_sample(tmp_path):
    """Every node-count case (a cluster at N nodes predicting it at M > N) carries the model's
    and the naive constant busbw's error at the largest payload and their mean |error| over
    its payloads; the predicting files never hold the predicted node count, and the
    prediction does not move when the predicted file's numbers do (nothing of it is read
    but to compare)."""
    import shutil
    res = live()
    cases = fk.read_cases(MANIFEST)
    nodes = [(c, r) for c, r in zip(cases, res["cases"]) if r["kind"] == "nodes"]
    want = [c for c in cases if ff.read_sweep(c.large).hosts > ff.read_sweep(c.small[0]).hosts
            and ff.read_sweep(c.large).gpus_per_node == ff.read_sweep(c.small[0]).gpus_per_node]
    assert len(nodes) == len(want) >= 4
    for c, r in nodes:
        assert r["large_nodes"] not in r["small_nodes"], r
        assert all(ff.read_sweep(f).hosts != r["large_nodes"] for f in c.small)
        for k in ("error_pct", "naive_error_pct", "model_mean_abs_pct", "naive_mean_abs_pct"):
            assert r[k] is not None and np.isfinite(r[k]), (k, r["large"])
        assert r["payloads"] >= 2
        assert r["first"] == ("naive" if r["naive_mean_abs_pct"] < r["model_mean_abs_pct"] else "model")
    s = res["summary"]["nodes"]
    assert s["cases"] == len(nodes)
    assert s["model_mean_abs_pct"] == pytest.approx(np.mean([abs(r["error_pct"]) for _, r in nodes]))
    assert s["naive_mean_abs_pct"] == pytest.approx(np.mean([abs(r["naive_error_pct"]) for _, r in nodes]))
    # the predicted file doubled in time: the prediction is the same, only the measured side moves
    c, r = nodes[0]
    for f in {*c.small, c.large, MANIFEST}:
        shutil.copy(f, tmp_path / Path(f).name)
    large = tmp_path / Path(c.large).name
    lines = large.read_text().splitlines()
    s0 = ff.read_sweep(large)
    for i, line in enumerate(lines):
        tok = line.split()
        if len(tok) >= 13 and tok[0].isdigit() and int(tok[0]) in s0.bytes:
            for j in (5, 9):
                tok[j] = f"{2 * float(tok[j]):.1f}"
            lines[i] = "  " + "  ".join(tok)
    large.write_text("\n".join(lines) + "\n")
    only = tmp_path / "one.yaml"
    only.write_text(yaml.safe_dump({"cases": [{"cluster": c.cluster, "small": [Path(f).name for f in c.small],
                                               "large": large.name}]}))
    again = fk.check_case(fk.read_cases(only)[0], draws=5)
    assert again["predicted_busbw_GBps"] == pytest.approx(r["predicted_busbw_GBps"], rel=1e-9)
    assert again["measured_busbw_GBps"] == pytest.approx(r["measured_busbw_GBps"] / 2, rel=0.01)


def test_the_naive_predictor_is_listed_first_wherever_it_wins(capsys):
    """In `dpscale forecast --fabric-check`, per case (its error at the largest payload and
    its mean |error| over payloads) and in every summary line, the predictor with the
    smaller error comes first: the naive constant busbw wherever it wins."""
    from dpscale import cli
    assert cli.main(["forecast", "--fabric-check", str(DATA)]) == 0
    out = capsys.readouterr().out
    pairs = re.findall(r"(model|naive) ([+-]?\d+\.\d)%, (model|naive) ([+-]?\d+\.\d)%", out)
    assert len(pairs) >= 2 * len(fk.read_cases(MANIFEST)) + 3
    for first, a, second, b in pairs:
        assert {first, second} == {"model", "naive"}
        assert abs(float(a)) <= abs(float(b)), (first, a, second, b)
    assert any(p[0] == "naive" for p in pairs)   # the corpus has cases the naive one wins


def test_the_algorithm_at_each_scale_and_the_flat_ring_past_it():
    """NCCL's algorithm read per output: stated NCCL_ALGO first, a ring on 3+ nodes or one
    rank per node, else the tree on 2 nodes; past the measured node count the tier is NCCL's
    flat ring over every rank: its busbw flat after a ring, sqrt(n/(2(n-1))) of it after a
    2-node tree, inside the interval [n/(2(n-1)), 1]; at the measured layout what it measured."""
    assert fc.nccl_algorithm(2, 8, "Ring")[0] == "ring" and fc.nccl_algorithm(2, 8, "NVLSTree")[0] == "tree"
    assert fc.nccl_algorithm(4, 8)[0] == "ring" and fc.nccl_algorithm(2, 1)[0] == "ring"
    assert fc.nccl_algorithm(2, 8)[0] == "tree"
    assert ff.read_sweep(DATA / "h100_2node_aion_ring_ctas.txt").nccl_algo == "Ring"
    lo, hi = fc.ring_after_tree_bounds(16)
    assert lo < fc.ring_scale_after_tree(16) < hi and fc.ring_scale_after_tree(16) == pytest.approx((lo * hi) ** 0.5)
    big = 8 * 2**30
    for name, scale in (("h100_2node_aion_ring_ctas.txt", 1.0), ("h100_2node_aion.txt", fc.ring_scale_after_tree(16))):
        s = ff.read_sweep(DATA / name)
        t = ff.fabric_tiers(s)
        plain = fc.replace(t.inter, algo="")   # the same fit, read without the node-count term
        assert t.allreduce_time(big, 2, 8) == pytest.approx(fc.across_time(big, 2, plain), rel=1e-12)
        at2 = fk.busbw_GBps(big, t.allreduce_time(big, 2, 8), 16)
        b4, b16 = (fk.busbw_GBps(big, t.allreduce_time(big, n, 8), 8 * n) for n in (4, 16))
        assert b4 == pytest.approx(b16, rel=0.05)   # flat past 2 nodes but for the ring's latency, 2(n-1) steps
        assert b4 == pytest.approx(scale * at2, rel=0.05)
    # nodes of another size: the two-tier growth, as before (the forecast refuses such a file)
    s = ff.read_sweep(DATA / "gh200_2node_1gpu_alps.txt")
    t = ff.fabric_tiers(s)
    assert t.allreduce_time(2**27, 2, 4) == pytest.approx(t.allreduce_time(2**27, 2, 1))


def test_bands_stop_at_what_the_nodes_nics_carry_and_print_their_width():
    res = live()
    bounded = [r for r in res["cases"] if r["bound_GBps"]]
    assert bounded
    for r in res["cases"]:
        assert r["band_width"] == pytest.approx(r["band_hi"] / r["band_lo"])
        if r["bound_GBps"]:
            assert r["band_hi"] <= r["bound_GBps"] + 1e-9
    from dpscale.report import forecast_text as fct
    assert all(f"x{r['band_width']:.1f} wide" in fct.fabric_check_text(DATA) for r in res["cases"])
