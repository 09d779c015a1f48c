"""Convergence tables (dpscale.analysis.convergence), the E(B) model checked out of sample
on them (convergence_check), the misfit term (batch_misfit) and `dpscale convergence`.

Public data: MLPerf's reference convergence points, as the project's CSV transcriptions
under reference/public/convergence (the design set; SOURCES.md there names each original
and its sha256); reference/public/convergence-kept-back checked the method once, after it
was frozen, and is read here only to check that docs/public-convergence.md shows that
run. The RCP JSON reader is tested on files written here in MLPerf's format."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import ROOT
from dpscale.analysis import convergence as cv, convergence_check as cc
from dpscale.analysis.stateff import batch_misfit
from dpscale.analysis.stateff import batch_model as stateff

RCP = ROOT / "reference/public/convergence"
KEPT_BACK = ROOT / "reference/public/convergence-kept-back"


# ---------------------------------------------------------------- readers

def _rcp(tmp_path, entries: dict, name: str = "rcps_x.json"):
    p = tmp_path / name
    p.write_text(json.dumps(entries))
    return p


def _entry(bs, vals, key="Epochs to converge", bench="x"):
    return {"Benchmark": bench, "BS": bs, "Hyperparams": {}, key: vals}


def test_rcp_json_reads_per_batch_per_seed(tmp_path):
    t = cv.read(_rcp(tmp_path, {"b": _entry(64, [3, 4, 5]), "a": _entry(32, [2, 2.5])}))
    assert t.batches == [32, 64] and t.unit == "epochs" and t.benchmark == "x" and t.fmt == "mlperf-rcp"
    assert t.points() == {32: [2.0, 2.5], 64: [3.0, 4.0, 5.0]}
    s = cv.read_rcp(_rcp(tmp_path, {"a": _entry(8, [10, 20], "samples to converge")}, "s.json"))
    assert s.unit == "samples" and s.per_batch == {8: (10.0, 20.0)}


def test_epochs_become_samples_when_the_epoch_is_given(tmp_path):
    t = cv.read(_rcp(tmp_path, {"a": _entry(32, [2, 3])}), samples_per_epoch=1000)
    assert t.unit == "samples" and t.per_batch[32] == (2000.0, 3000.0) and "1000" in t.notes[0]


def test_csv_reads_samples_epochs_and_censored_seeds(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("# a comment\nbatch,seed,samples\n64,0,100\n64,1,\n128,0,150\n128,1,inf\n128,2,170\n")
    t = cv.read(p)
    assert t.per_batch == {64: (100.0, None), 128: (150.0, None, 170.0)} and t.fmt == "csv"
    q = tmp_path / "e.csv"
    q.write_text("batch,seed,epochs\n64,0,2\n")
    assert cv.read(q, samples_per_epoch=60000).per_batch == {64: (120000.0,)}


@pytest.mark.parametrize("entries,words", [
    ({"a": {"Benchmark": "x", "Epochs to converge": [1]}}, ["a.BS", "missing"]),
    ({"a": _entry(32, [1]), "b": _entry(32, [2])}, ["b.BS", "also entry 'a'"]),
    ({"a": _entry(32, [1, -2])}, ["a.Epochs to converge[1]", "not positive"]),
    ({"a": _entry(0, [1])}, ["a.BS", "positive whole"]),
    ({"a": _entry(32, [])}, ["a.Epochs to converge", "non-empty"]),
    ({"a": {**_entry(32, [1]), "samples to converge": [1]}}, ["has 2 of the keys"]),
    ({"a": _entry(32, [1]), "b": _entry(64, [1], bench="y")}, ["Benchmark", "disagree"]),
    ([], ["(top level)"]),
])
def test_bad_rcp_gets_one_line_naming_file_key_and_fix(tmp_path, entries, words):
    p = _rcp(tmp_path, entries)
    with pytest.raises(cv.ConvergenceInputError) as e:
        cv.read(p)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg and ";" in msg and all(w in msg for w in words), msg


@pytest.mark.parametrize("text,words", [
    ("batch,seed\n64,0\n", ["header", "batch,seed and one of samples or epochs"]),
    ("batch,seed,samples\n64,0,1\n64,0,2\n", ["line 3 seed", "twice"]),
    ("batch,seed,samples\nx,0,1\n", ["line 2 batch", "not a number"]),
    ("batch,seed,samples\n64,0,abc\n", ["line 2 samples", "not a number"]),
    ("batch,seed,samples\n", ["rows", "none"]),
])
def test_bad_csv_gets_one_line_naming_file_key_and_fix(tmp_path, text, words):
    p = tmp_path / "t.csv"
    p.write_text(text)
    with pytest.raises(cv.ConvergenceInputError) as e:
        cv.read(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value) and all(w in str(e.value) for w in words)


def test_unknown_format_and_bad_json_are_refused(tmp_path):
    (tmp_path / "t.txt").write_text("x")
    (tmp_path / "t.json").write_text("{")
    for name, word in (("t.txt", "format '.txt'"), ("t.json", "not JSON")):
        with pytest.raises(cv.ConvergenceInputError, match=word):
            cv.read(tmp_path / name)


def _mlperf(bench: str, per_batch: dict, key: str = "Epochs to converge") -> dict:
    """A table in the form of MLPerf's rcps_<benchmark>.json: one entry per global batch,
    named <benchmark>_ref_<BS>, with the fields MLPerf's entries carry besides BS and the
    per-seed list (the reader keeps only Benchmark, BS and the list)."""
    return {f"{bench}_ref_{bs}": {"Benchmark": bench, "Creator": "someone", "When": "before v0",
                                  "Platform": "8xGPU", "BS": bs,
                                  "Hyperparams": {"opt_base_learning_rate": 1e-4 * bs / 256,
                                                  "opt_learning_rate_warmup_steps": 100},
                                  key: vals} for bs, vals in per_batch.items()}


def _ruleset_file(tmp_path, ruleset: str, bench: str, per_batch: dict, key: str = "Epochs to converge"):
    p = tmp_path / ruleset / f"rcps_{bench}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(_mlperf(bench, per_batch, key), indent=2))
    return p


def test_mlperf_units_steps_in_training_3_1_stable_diffusion_and_samples_count(tmp_path):
    """Training 3.1's Stable Diffusion counts optimizer steps (MLPerf's checker reads
    step_num there): steps x batch are samples. The same file under 4.0 is read as it
    says; the benchmarks MLPerf counts in samples_count are labelled samples."""
    steps = {512: [5000, 5000, 6000], 1024: [2500, 3000]}
    sd31 = cv.read(_ruleset_file(tmp_path, "training_3.1.0", "sd", steps))
    assert sd31.name == "training_3.1.0/rcps_sd.json" and sd31.unit == "samples" and "steps" in sd31.notes[0]
    assert sd31.per_batch == {512: (2560000.0, 2560000.0, 3072000.0), 1024: (2560000.0, 3072000.0)}
    sd40 = cv.read(_ruleset_file(tmp_path, "training_4.0.0", "sd", steps))
    assert sd40.unit == "epochs" and sd40.per_batch[512] == (5000.0, 5000.0, 6000.0) and not sd40.notes
    llama = cv.read(_ruleset_file(tmp_path, "training_5.0.0", "llama31_405b", {1008: [324576, 350000]}))
    assert llama.unit == "samples" and llama.per_batch == {1008: (324576.0, 350000.0)}


def test_json_to_csv_reads_back_to_the_same_table(tmp_path, capsys):
    """MLPerf's JSON -> dpscale convergence --to-csv -> read_csv: the same benchmark, unit,
    per-seed values (floats exactly, a censored seed kept, seeds in order) and notes."""
    from dpscale import cli
    vals = {256: [0.1 + 0.2, 1 / 3, None, 41], 64: [1e-7, 13790871552, 2.5]}
    srcs = [_ruleset_file(tmp_path / "in", "training_1.0.0", "x", vals),
            _ruleset_file(tmp_path / "in", "training_3.1.0", "sd", {512: [5000, 6000], 1024: [2500, 2500]}),
            _ruleset_file(tmp_path / "in", "hpc_2.0.0", "y", {8: [1, 2]}, "samples to converge")]
    assert cli.main(["convergence", *map(str, srcs), "--to-csv", str(tmp_path / "out")]) == 0
    written = capsys.readouterr().out.split()
    assert written == [str(tmp_path / "out" / p.parent.name / p.with_suffix(".csv").name) for p in srcs]
    for src, out in zip(srcs, written):
        a, b = cv.read(src), cv.read(out)
        assert (b.benchmark, b.unit, b.per_batch, b.notes, b.fmt) == (a.benchmark, a.unit, a.per_batch, a.notes, "csv")
        assert b.name == a.name.replace(".json", ".csv")
        assert cv.to_csv(b).splitlines()[1:] == cv.to_csv(a).splitlines()[1:]
    assert cv.read(written[0]).per_batch[256][:3] == (0.1 + 0.2, 1 / 3, None)


def test_csv_fields_benchmark_and_notes(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("# benchmark: bert\n# note: one\n# not a field: x\n#note: two\nbatch,seed,epochs\n64,0,2\n")
    t = cv.read(p)
    assert (t.benchmark, t.notes, t.name) == ("bert", ("one", "two"), "t.csv")
    p.write_text("# benchmark: a\n# benchmark: b\nbatch,seed,epochs\n64,0,2\n")
    with pytest.raises(cv.ConvergenceInputError, match="# benchmark: given 2 times"):
        cv.read(p)
    with pytest.raises(cv.ConvergenceInputError, match="line break"):
        cv.to_csv(cv.Table("t", "x", "samples", {1: (1.0,)}, "-", "csv", ("a\nb",)))


def test_the_kept_tables_as_transcribed():
    """MLPerf Training 4.0's ResNet table as published; 3.1's Stable Diffusion, transcribed
    in samples from its steps, equals 4.0's (the same runs, in MLPerf's new unit)."""
    t = cv.read(RCP / "training_4.0.0/rcps_resnet.csv")
    assert t.benchmark == "resnet" and len(t.batches) == 10 and t.batches[0] == 1632 and t.batches[-1] == 67840
    assert len(t.per_batch[67840]) == 28 and len(t.per_batch[1632]) == 17 and t.unit == "epochs"
    sd31, sd40 = cv.read(RCP / "training_3.1.0/rcps_stable_diffusion.csv"), \
        cv.read(RCP / "training_4.0.0/rcps_stable_diffusion.csv")
    assert sd31.unit == "samples" and "steps" in sd31.notes[0]
    assert sd31.per_batch[512] == sd40.per_batch[512] and sd31.per_batch[1024] == sd40.per_batch[1024]
    assert cv.read(RCP / "training_5.0.0/rcps_llama31_405b.csv").unit == "samples"   # MLPerf's samples_count


# ---------------------------------------------------------------- the misfit term

def _r(rel, v=0.0, h=0.0):
    return {"table": "t", "batch": 1, "fit_batches": [], "relative": rel, "noise_var": v, "leverage": h}


def test_misfit_variance_against_its_closed_forms():
    """No noise, no leverage: tau^2 = mean r^2. Equal noise v: mean r^2 - v, or 0 below it.
    Equal leverage h: (mean r^2 - v) / (1 + h)."""
    rs = [0.1, -0.2, 0.05, 0.3]
    m2 = float(np.mean(np.square(rs)))
    assert batch_misfit.misfit_variance([_r(x) for x in rs]) == pytest.approx(m2, rel=1e-9)
    assert batch_misfit.misfit_variance([_r(x, 0.01) for x in rs]) == pytest.approx(m2 - 0.01, rel=1e-9)
    assert batch_misfit.misfit_variance([_r(x, 0.01, 2.0) for x in rs]) == pytest.approx((m2 - 0.01) / 3, rel=1e-9)
    assert batch_misfit.misfit_variance([_r(x, 0.1) for x in rs]) == 0.0
    assert batch_misfit.misfit_variance([]) is None


def test_leverage_against_the_line_through_two_batches():
    """Two batches: the fit is the line through their means, so the prediction at B3 is
    m1 (1 - l) + m2 l, l = (B3 - B1) / (B2 - B1): relative misfit variance at the fit's
    batches gives (E1^2 (1 - l)^2 + E2^2 l^2) / E3^2; at B1 itself, exactly 1."""
    pts = {100: [10.0] * 5, 200: [14.0] * 5}
    coef = [6.0, 0.04]
    for B3 in (100, 150, 400, 1000):
        lam = (B3 - 100) / 100
        e3 = 6.0 + 0.04 * B3
        want = (10.0 ** 2 * (1 - lam) ** 2 + 14.0 ** 2 * lam ** 2) / e3 ** 2
        assert batch_misfit.leverage(pts, coef, B3) == pytest.approx(want, rel=1e-9)


def _points(rng, tau=0.0, cv_seed=0.05, seeds=10, bs=(64, 128, 256, 512, 1024, 2048, 4096, 8192)):
    """E(B) = 1e5 (1 + B / 1000) exactly, each batch's mean off by a relative N(0, tau), each seed by N(0, cv)."""
    out = {}
    for B in bs:
        mu = 1e5 * (1 + B / 1000) * (1 + tau * rng.standard_normal())
        out[B] = tuple(float(v) for v in mu * (1 + cv_seed * rng.standard_normal(seeds)))
    return out


def test_widened_is_stateffs_band_when_there_is_no_misfit_and_says_what_it_used():
    pts = {64: [100.0, 102.0, 98.0], 128: [110.0, 112.0, 108.0], 256: [130.0, 132.0, 128.0]}
    w = batch_misfit.widened(pts, 512, n_seeds=3)
    pr = stateff.predict(stateff.fit_batch_model(pts), 512, n_seeds=3)
    assert w["misfit"]["rel_sd"] == 0.0 and w["misfit"]["source"] == "own" and w["misfit"]["k"] == 1
    assert (w["band_lo"], w["band_hi"]) == pytest.approx((pr["pred_lo"], pr["pred_hi"]), rel=1e-12)
    assert w["misfit"]["residuals"] == [{"table": "", "batch": 256, "fit_batches": [64, 128]}]
    pool = [dict(_r(0.3), table="other", batch=9, fit_batches=[1, 2])]
    wp = batch_misfit.widened(pts, 512, n_seeds=3, pool=pool)
    assert wp["misfit"]["source"] == "pooled" and wp["misfit"]["k"] == 2 and wp["band_hi"] > w["band_hi"]
    assert {"table": "other", "batch": 9, "fit_batches": [1, 2]} in wp["misfit"]["residuals"]


def _synthetic(tau: float, n: int = 60) -> list[dict]:
    rng = np.random.default_rng(1)
    tables = [cv.Table(f"s{i}", f"s{i}", "samples", _points(rng, tau), "synthetic", "csv") for i in range(n)]
    return [r for t in cc.check(tables)["tables"] for r in t["rows"] if not r["note"]]


def _rate(rows, key):
    return float(np.mean([r[key] for r in rows]))


def test_coverage_is_the_level_where_the_model_is_exact():
    """E(B) exactly linear, seeds' noise only: stateff's band and the widened one both
    cover about 95% of 360 out-of-sample rows (60 tables)."""
    rows = _synthetic(0.0)
    assert len(rows) == 360
    assert 0.90 <= _rate(rows, "inside") <= 0.985
    assert 0.90 <= _rate(rows, "inside_wide") <= 0.99


def test_the_widened_band_covers_the_level_under_between_batch_misfit():
    """Each batch's mean off the line by 10% (the misfit model): stateff's band, which
    holds only seeds and fit, covers far less; the widened one about 95%, both where the
    misfit is the table's own and where it is pooled from other tables (a prediction from
    2-4 batches, which extrapolates furthest: the leverage term is what keeps it there)."""
    rows = _synthetic(0.10)
    assert _rate(rows, "inside") < 0.7
    for source in ("own", "pooled"):
        sub = [r for r in rows if r["misfit_source"] == source]
        assert len(sub) >= 150 and 0.90 <= _rate(sub, "inside_wide") <= 0.985, (source, _rate(sub, "inside_wide"))


# ---------------------------------------------------------------- the check on public tables

@pytest.fixture(scope="module")
def public():
    tables = [cv.read(p) for p in sorted(RCP.glob("*/*.csv"))]
    return tables, cc.check(tables)


def test_naive_predictors_by_hand():
    t = cv.Table("t", "t", "samples", {10: (1.0, 3.0), 20: (4.0,), 40: (9.0, 11.0)}, "-", "csv")
    n = cc.naive(t, 2)
    assert n["previous"] == 4.0 and n["linear"] == pytest.approx(4.0 + 2.0 * 20 / 10)
    assert n["previous_inputs"] == [20] and n["linear_inputs"] == [10, 20]
    r = cc.row(t, 2, [])
    assert r["error_previous"] == pytest.approx(-60.0) and r["error_linear"] == pytest.approx(-20.0)
    assert cc.row(t, 1, [])["note"] == cc.SKIPPED


def test_the_audits_resnet_figures_and_stateffs_own_holdout(public):
    """Issue 44's audit of the E(B) band on a public table of 10 batches (ResNet, MLPerf
    4.0): covered 4 of 8, mean |error| 6.4%, max 16.3%. Every row's band is
    stateff.holdout's for the same inputs."""
    tables, res = public
    tab = next(t for t in res["tables"] if t["name"] == "training_4.0.0/rcps_resnet.csv")
    s = tab["summary"]
    assert (s["coverage"]["k"], s["coverage"]["n"]) == (4, 8)
    assert round(s["error_pct"]["model"]["mean_abs"], 1) == 6.4 and round(s["error_pct"]["model"]["max_abs"], 1) == 16.3
    pts = next(t for t in tables if t.name == tab["name"]).points()
    for r in (r for r in tab["rows"] if not r["note"]):
        h = stateff.holdout(pts, r["batch"])
        assert (r["predicted"], r["band_lo"], r["band_hi"]) == pytest.approx(
            (h["predicted"]["mean"], h["predicted"]["pred_lo"], h["predicted"]["pred_hi"]), rel=1e-12)
        assert r["inside"] == h["inside_band"] and r["error_model"] == pytest.approx(100 * h["relative_error"])


def test_no_prediction_reads_its_batch_or_a_larger_one(public):
    """Smaller batches only, by what each predictor used (the fit's own batches, each own
    residual's, the naives'), on every row of every public table."""
    _, res = public
    rows = [r for t in res["tables"] for r in t["rows"] if not r["note"]]
    assert len(rows) > 300 and not [(r["table"], r["batch"], r["leaks"]) for r in rows if r["leaks"]]
    assert all(max(r["fit_batches"]) < r["batch"] for r in rows)


def test_a_leak_into_the_fit_is_seen(monkeypatch):
    """A fit handed the predicted batch (whatever the row says it used) shows in `leaks`."""
    real = batch_misfit.widened

    def leaky(points, batch, **kw):
        return real({**points, batch: list(points[max(points)])}, batch, **kw)

    monkeypatch.setattr(cc.batch_misfit, "widened", leaky)
    t = cv.read(RCP / "training_4.0.0/rcps_resnet.csv")
    assert cc.row(t, 5, [])["leaks"] == [t.batches[5]]


def test_the_misfit_gives_the_issues_coverage_on_public_tables(public):
    """Issue 44's target: 95% bands covering >= 85% of every holdout pooled (one table per
    family). stateff's band alone (seeds and fit) does not (53% at the time of writing)."""
    _, res = public
    p = res["pooled"]
    assert len(p["tables"]) >= 5 and p["compared"] >= 50
    assert p["coverage_wide"]["rate"] >= 0.85, p["coverage_wide"]
    assert p["coverage"]["rate"] < 0.85
    assert all(p["error_pct"][k]["mean_abs"] is not None for k in cc.PREDICTORS)


def test_families_pool_only_other_benchmarks_and_the_pooled_summary_counts_each_once(public):
    tables, res = public
    fams = cc.families(tables)
    reps = sorted(cc.representative(f).name for f in fams)
    assert res["pooled"]["tables"] == reps and "training_5.1.0/rcps_bert.csv" in reps
    assert res["pooled"]["rows"] == sum(t["summary"]["rows"] for t in res["tables"] if t["name"] in reps)
    names = {t.name: i for i, f in enumerate(fams) for t in f}
    assert names["training_5.0.0/rcps_retinanet.csv"] == names["training_4.0.0/rcps_ssd.csv"]
    assert names["training_5.1.0/rcps_rgat.csv"] == names["training_4.0.0/rcps_gnn.csv"]
    assert names["training_3.1.0/rcps_stable_diffusion.csv"] == names["training_5.0.0/rcps_stable_diffusion.csv"]
    bert = next(t for t in tables if t.name == "training_5.1.0/rcps_bert.csv")
    pool = cc.pool_for(bert, cc.residual_pool(fams))
    assert pool and not any("bert" in r["table"] for r in pool)


# ---------------------------------------------------------------- the command

def test_command_prints_rows_and_summary_and_json(capsys):
    from dpscale import cli
    f = str(RCP / "training_3.1.0/rcps_rnnt.csv")
    assert cli.main(["convergence", f, "--pool", str(RCP / "training_4.0.0")]) == 0
    out = capsys.readouterr().out
    assert "training_3.1.0/rcps_rnnt.csv" in out and "POOLED" in out and "fewer than 2 smaller" in out
    assert "6144" in out and "band (+misfit)" in out
    assert cli.main(["convergence", f, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    rows = res["tables"][0]["rows"]
    assert [r["batch"] for r in rows] == [512, 1024, 1536, 2048, 3072, 6144]
    assert all(math.isfinite(r["wide_hi"]) for r in rows[2:]) and res["pooled"]["rows"] == 4


def test_command_refuses_bad_input_in_one_line(tmp_path):
    from dpscale import cli
    p = tmp_path / "t.csv"
    p.write_text("batch,seed\n")
    with pytest.raises(SystemExit) as e:
        cli.main(["convergence", str(p)])
    assert str(e.value).startswith("dpscale convergence: ") and "header" in str(e.value) and "\n" not in str(e.value)


def test_public_pool_is_one_table_per_family(public):
    tables, _ = public
    pool = cc.public_pool(tables)
    reps = {cc.representative(f).name for f in cc.families(tables)}
    assert {r["table"] for r in pool} <= reps and len(pool) >= 50
    assert all(r["leverage"] >= 0 and r["noise_var"] >= 0 for r in pool)


def test_every_kept_table_has_its_source_and_no_original_is_kept():
    """SOURCES.md names each CSV's benchmark, MLPerf version, original (repository, path,
    commit, URL, sha256 of its bytes) and the CSV's own sha256 (a CSV edited by hand no
    longer matches); the originals themselves are not kept."""
    import hashlib
    import re
    for folder in (RCP, KEPT_BACK):
        rows = {m[0]: m[1:] for m in re.findall(r"^\| (\S+\.csv) \| (\S+) \| (\w+ [0-9.]+) \| (\S+) \| (\S+) \| "
                                                  r"([0-9a-f]{40}) \| (\S+) \| ([0-9a-f]{64}) \| ([0-9a-f]{64}) \|$",
                                                  (folder / "SOURCES.md").read_text(), re.M)}
        kept = sorted(p.relative_to(folder).as_posix() for p in folder.glob("*/*.csv"))
        assert kept and sorted(rows) == kept and not list(folder.rglob("*.json"))
        for name, (bench, version, repo, path, commit, url, _, sha_csv) in rows.items():
            ruleset = name.split("/")[0]
            assert repo == "mlcommons/logging" and path == f"mlperf_logging/rcp_checker/{name[:-4]}.json"
            assert url == f"https://github.com/{repo}/blob/{commit}/{path}"
            assert cv.read(folder / name).benchmark == bench
            assert version.replace(" ", "_").lower() == ruleset
            assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == sha_csv


def test_the_method_page_shows_what_the_commands_print(capsys):
    """docs/public-convergence.md holds, between its BEGIN/END markers, the output of the
    command each marker names, unchanged; the summary's figures in its prose are those."""
    import re
    import shlex
    from dpscale import cli
    doc = (ROOT / "docs/public-convergence.md").read_text()
    blocks = re.findall(r"<!-- BEGIN (.*?) -->\n(.*?)<!-- END -->", doc, flags=re.S)
    assert [c for c, _ in blocks] == ["dpscale convergence reference/public/convergence --markdown",
                                      "dpscale convergence reference/public/convergence-kept-back "
                                      "--pool reference/public/convergence --markdown"]
    for command, shown in blocks:
        args = [a if a.startswith("-") or a == "convergence" else str(ROOT / a) for a in shlex.split(command)[1:]]
        assert cli.main(args) == 0
        printed = capsys.readouterr().out
        assert shown == printed.replace(str(ROOT) + "/", ""), command
    pooled = blocks[0][1].split("#### Pooled over")[1]
    for figure in ("38/72", "67/72", "50.7%", "17.6", "16.7", "20.1"):
        assert figure in pooled and figure in doc.split("## Data")[0], figure
    readme = (ROOT / "README.md").read_text()   # its sentence copies the same figures
    for figure in ("38/72", "67/72"):
        assert figure in pooled and figure.replace("/", " of ") in readme, figure
    errors = re.search(r"E\(B\) model ([\d.]+) \(median ([\d.]+),.*?previous batch ([\d.]+) \(median ([\d.]+),", pooled)
    eb, eb_med, prev, prev_med = errors.groups()
    assert (f"mean |error| {prev}% against E(B)'s {eb}% (median {prev_med}% against {eb_med}%)"
            in " ".join(readme.split())), errors.groups()


def test_the_borrowed_misfit_is_checked_without_its_largest_contributor():
    """Issue #52: the public pool's misfit leaned on one HPC table. The pooled check says
    which family weighs most in the residuals' squares, and the coverage and width with
    that family left out of the pool and of the rows."""
    from dpscale.analysis import convergence as cv, convergence_check as cc
    tables = [cv.read(p) for p in sorted((ROOT / "reference/public/convergence").glob("*/*.csv"))]
    res = cc.check(tables)
    x = res["pooled"]["without_largest"]
    pools = cc.residual_pool(cc.families(tables))
    sq = {cc.representative(f).name: sum(r["relative"] ** 2 for r in rs) for f, rs in pools}
    assert x["family"] == max(sq, key=sq.get) and x["share"] == pytest.approx(max(sq.values()) / sum(sq.values()))
    assert x["coverage_wide"]["n"] < res["pooled"]["coverage_wide"]["n"]       # its rows left out too
    assert x["median_half_width_pct"] < res["pooled"]["median_half_width_pct"]["band_wide"]
