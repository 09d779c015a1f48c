"""The forecast model (dpscale.analysis.forecast, forecast_data): it recovers known
alpha, beta, exposed fraction and straggler spread from synthetic measurements made
with noise by formulas written here, independently of the module, and predicts the
k it was not shown; a mutated model (the overlap term dropped, beta read in bits)
is rejected by the same check. Pure and cheap: no torch, no report."""
from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from dpscale.analysis import forecast as fc
from dpscale.analysis import forecast_data as fd

ROOT = Path(__file__).resolve().parents[1]
TRUE = {"alpha_s": 20e-6, "beta_Bps": 100e9, "exposed": 0.6, "sigma_s": 1.5e-3, "a_s": 2e-3, "b_s": 0.1e-3,
        "inter_Bps": 25e9, "inter_alpha_s": 5e-6}
BUCKETS = [2**20, 25 * 2**20, 25 * 2**20, 20 * 2**20]
B, G = 256, 512


def ring(S, k, alpha, beta):
    return 0.0 if k < 2 else 2 * (k - 1) / k * S / beta + 2 * (k - 1) * alpha


def true_comm(k, per_node=8):
    t = TRUE
    if k <= per_node:
        return sum(ring(S, k, t["alpha_s"], t["beta_Bps"]) for S in BUCKETS)
    n = k // per_node
    return sum(ring(S, per_node, t["alpha_s"], t["beta_Bps"]) + 2 * (n - 1) / n * S / t["inter_Bps"]
               + 2 * (n - 1) * t["inter_alpha_s"] for S in BUCKETS)


@functools.cache
def e_max(k):
    """E[max of k standard normals], by Monte Carlo (not the module's integral)."""
    rng = np.random.default_rng(k)
    return float(rng.standard_normal((400_000, k)).max(axis=1).mean()) if k > 1 else 0.0


def true_step(batch, k):
    t = TRUE
    return t["a_s"] + t["b_s"] * batch + t["exposed"] * true_comm(k) + t["sigma_s"] * e_max(k)


def throughput(exp, k, batch, rng, noise):
    sps = [k * batch / true_step(batch, k) * (1 + noise * rng.standard_normal()) for _ in range(5)]
    z = 1.2815515655446004   # the normal's 0.9 quantile, typed once: p10/p90 of the truth
    steps = {"p10_ms": 1e3 * (true_step(batch, 1) - z * TRUE["sigma_s"]),
             "p90_ms": 1e3 * (true_step(batch, 1) + z * TRUE["sigma_s"])}
    return {"experiment": exp, "variant": "seed", "k": k, "status": "ok",
            "metrics": {"samples_per_s": sps[0], "samples_per_s_repeats": sps, "per_rank_batch": batch,
                        "global_batch": batch * k, "per_rank": [{"rank": 0, "steps": steps}]}}


def synthetic(ks=(1, 2, 4), noise=0.003, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    res = {}
    for k in ks:
        res[("ddp_weak", "seed", k)] = throughput("ddp_weak", k, B, rng, noise)
        res[("ddp_strong", "seed", k)] = throughput("ddp_strong", k, G // k, rng, noise)
        if k < 2:
            continue
        rows = [{"bytes": 2**p, "time_us_median": 1e6 * ring(2**p, k, TRUE["alpha_s"], TRUE["beta_Bps"])
                 * (1 + noise * rng.standard_normal())} for p in range(20, 31)]
        res[("allreduce", "default", k)] = {"status": "ok", "metrics": {"table": {"in_place": rows}}}
        pairs = [1e3 * TRUE["exposed"] * true_comm(k) * (1 + 5 * noise * rng.standard_normal()) for _ in range(30)]
        res[("ddp_comm_probe", "default", k)] = {"status": "ok", "metrics": {
            "comm_ms": float(np.median(pairs)), "comm_ms_pairs": pairs, "bucket_bytes": BUCKETS,
            "grad_bytes": sum(BUCKETS)}}
    return res


SCHEMA = yaml.safe_load((ROOT / "schemas" / "config.schema.yaml").read_text())["properties"]["forecast"]
CFG = fd.config({**{k: v["default"] for k, v in SCHEMA["properties"].items()}, "bootstrap_draws": 40,
                 "internode_GBps": 25.0, "internode_alpha_us": 5.0})


def test_expected_max_of_k_normals_closed_forms():
    assert fc.expected_max_normal(1) == 0.0
    assert fc.expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    assert fc.expected_max_normal(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), rel=1e-6)
    assert fc.expected_max_normal(8) == pytest.approx(e_max(8), abs=0.01)


def test_fit_recovers_alpha_beta_from_a_noisy_sweep():
    rng = np.random.default_rng(1)
    sizes = [2**p for p in range(20, 31)]
    times = [ring(s, 4, 20e-6, 100e9) * (1 + 0.01 * rng.standard_normal()) for s in sizes]
    fab = fc.fit_fabric(sizes, times, 4)
    assert fab.beta_Bps == pytest.approx(100e9, rel=0.03)
    assert fab.alpha_s == pytest.approx(20e-6, rel=0.25)


def test_recovers_exposed_fraction_straggler_and_compute():
    m = fd.build(synthetic(), "ddp", "seed", CFG)
    assert m.exposed == pytest.approx(TRUE["exposed"], rel=0.05)
    assert m.sigma_s == pytest.approx(TRUE["sigma_s"], rel=0.01)
    assert m.fabric.beta_Bps == pytest.approx(TRUE["beta_Bps"], rel=0.03)
    assert m.compute_b_s == pytest.approx(TRUE["b_s"], rel=0.03)


def test_hierarchical_all_reduce_against_the_formula():
    intra, inter = fc.Fabric(20e-6, 100e9, 8), fc.Fabric(5e-6, fc.bytes_per_s(25), 0)
    S = 2**30
    want = ring(S, 8, 20e-6, 100e9) + 2 * 3 / 4 * S / 25e9 + 2 * 3 * 5e-6
    assert fc.hierarchical_time(S, 4, 8, intra, inter) == pytest.approx(want, rel=1e-9)


def forecast_error_points() -> float:
    """Largest |predicted - true| weak/strong efficiency, in points, at the k the model
    was not shown: k = 8 in the node, 2 and 4 nodes of 8 (from measured k = 1, 2, 4)."""
    s = fd.forecast_series(synthetic(), "ddp", "seed", CFG)
    errs = []
    for r in s["rows"]:
        k = r["k"]
        if k in (8, 16, 32):
            errs.append(abs(r["weak_efficiency"] - true_step(B, 1) / true_step(B, k)))
            errs.append(abs(r["strong_efficiency"] - true_step(G, 1) / (k * true_step(G / k, k))))
    return 100 * max(errs)


def drop_overlap(monkeypatch):
    monkeypatch.setattr(fc, "exposed_comm_time", lambda m, k: fc.allreduce_time(m, k))


def beta_in_bits(monkeypatch):
    monkeypatch.setattr(fc, "bytes_per_s", lambda GBps: GBps * fc.GB / 8)


@pytest.mark.parametrize("mutate, accepted", [(None, True), (drop_overlap, False), (beta_in_bits, False)],
                         ids=["model", "overlap-dropped", "beta-in-bits"])
def test_forecast_of_unseen_k_accepts_the_model_and_rejects_mutants(monkeypatch, mutate, accepted):
    if mutate:
        mutate(monkeypatch)
    assert bool(forecast_error_points() < 0.5) is accepted


def test_validation_rows_hold_predicted_measured_and_error():
    rows = fd.validation(synthetic(ks=(1, 2, 4, 8)), CFG)
    k8 = [r for r in rows if r["k"] == 8 and r["scaling"] == "weak"]
    assert {r["method"] for r in k8} == {"k=1 compute + fabric at k", "smaller k only"}
    for r in rows:
        assert r["error_points"] == pytest.approx(100 * (r["predicted"] - r["measured"]))
        assert abs(r["error_points"]) < 1.0
        assert r["predicted_lo"] <= r["predicted"] + 1e-9 and r["predicted"] <= r["predicted_hi"] + 1e-9


def test_book_k4_from_k_up_to_2_within_5_points():
    from dpscale.report import book as bookmod
    m = bookmod.load(ROOT / "reference" / "book_4090.yaml")
    rows = fd.validation(m.results, CFG, m.book["model"]["params"])
    got = {(r["framework"], r["scaling"]): r for r in rows if r["k"] == 4 and r["method"] == "smaller k only"}
    assert set(got) == {("ddp", "weak"), ("ddp", "strong"), ("jax", "weak")}
    for r in got.values():
        assert abs(r["error_points"]) < 5, r


def test_knee_is_the_last_k_at_or_above_the_threshold():
    assert fc.knee([1, 2, 4, 8], [1.0, 0.9, 0.81, 0.7], 0.8) == 4
    assert fc.knee([1, 2, 4], [1.0, 0.9, 0.85], 0.8) is None


def test_cli_prints_the_forecast_and_the_validation_from_kept_results(capsys, tmp_path):
    from dpscale import cli
    out = tmp_path / "forecast.json"
    assert cli.main(["forecast", str(ROOT / "reference" / "h200x2"), "--bootstrap-draws", "10",
                     "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "== h200x2" in text and "== book" in text
    assert "ddp weak   [seed] k=2   k=1 compute + fabric at k" in text
    assert "ddp weak   [seed] k=4   smaller k only" in text   # the book's k=4 from its k <= 2
    import json
    rec = json.loads(out.read_text())
    assert rec["settings"]["bootstrap_draws"] == 10
    assert [r["k"] for r in rec["machines"][0]["series"][0]["rows"]][-1] == 128


def test_cli_names_a_folder_without_runs(tmp_path):
    from dpscale import cli
    with pytest.raises(SystemExit, match="has no runs/ folder"):
        cli.main(["forecast", str(tmp_path)])


