"""The report from small fixture results: figures, tables, HTML, Markdown, several machines.

The fixtures are written here with dpscale.results.make_result (the contract every
rule writes); the numbers are made up, shaped like a CPU smoke run and a GPU paper run.
"""
from __future__ import annotations

import base64
import csv
import html as htmllib
import json
import re
from pathlib import Path

import pytest

from dpscale import costmodel, report
from dpscale.results import make_result, write_json_atomic

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "reference" / "book_4090.yaml"

CPU_FP = {"gpu_model": None, "gpu_count": 0, "cpu_model": "Fixture CPU", "cpu_count": 2, "torch": "2.14.1",
          "jax": "0.10.2", "nccl": None, "driver": None, "cuda": None, "interconnect": "none",
          "hostname": "ci-box", "python": "3.11.7"}
GPU_FP = {"gpu_model": "NVIDIA H200", "gpu_count": 8, "gpu_memory_MiB": 143771, "cpu_model": "Xeon",
          "cpu_count": 128, "torch": "2.11.0+cu130", "jax": "0.11.2", "nccl": "2.27.7", "driver": "580.1",
          "cuda": "13.0", "interconnect": "NV18", "hostname": "gpu-node", "python": "3.12.3"}
SKIP_K4 = "k=4 needs 4 devices; this machine has 2 CPU core(s), and a CPU stand-in runs one process per core"
SKIP_MEMCPY = ("NCCL_SHM_USE_CUDA_MEMCPY is a setting of NCCL's shared-memory transport; "
               "the gloo backend used without GPUs has no equivalent")
HUNG_REASON = "no progress: killed by the outer watchdog after 30.2 s (limit 30 s)"


def _write(root: Path, exp, variant, k, *, fp, backend, scale, status="ok", reason=None, metrics=None,
           source="synthetic"):
    data = {"source": source, "origin": "fixture", "image_size": 32} if status == "ok" else {}
    r = make_result(experiment=exp, variant=variant, k=k, status=status, reason=reason, metrics=metrics or {},
                    config={"scale": scale, "protocol": {"per_rank_batch": 8}}, fingerprint=fp, backend=backend,
                    data=data)
    write_json_atomic(root / exp / variant / f"k{k}.json", r)


def throughput(s, k, prb):
    return {"samples_per_s": s, "samples_per_s_per_device": s / k, "per_rank_batch": prb, "global_batch": prb * k,
            "step_ms_median": 1e3 * prb * k / s, "step_ms_p10": 0.9e3 * prb * k / s,
            "step_ms_p90": 1.2e3 * prb * k / s, "epoch_s": 3.0, "peak_mem_MiB": None, "loss_last": 2.3,
            "per_rank": [{"rank": r, "samples_per_s": s / k} for r in range(k)]}


def sweep(mibs, gbps, k):
    rows = []
    for mib in mibs:
        size = int(mib * 2**20)
        t = size / (gbps * 1e9) * (1 + 0.5 / mib)
        rows.append({"MiB": mib, "bytes": size, "time_ms_median": 1e3 * t, "time_ms_p10": 0.9e3 * t,
                     "time_ms_p90": 1.3e3 * t, "algbw_GBps": costmodel.algbw(size, t) / 1e9,
                     "busbw_GBps": costmodel.busbw(size, t, k) / 1e9, "book_GBps": costmodel.book_beta(size, t) / 1e9,
                     "correct": True})
    return {"sweep": rows, "correct": True, "busbw_GBps_max": max(r["busbw_GBps"] for r in rows)}


def fsdp_metrics(k, gpu):
    p, g, o = 42.6, 42.6, 42.6

    def side(div, peak):
        rows = [{"rank": r, "params_MiB": p / div, "grads_MiB": g / div, "optimizer_MiB": o / div,
                 "peak_mem_MiB": peak, "samples_per_s": 10.0} for r in range(k)]
        return {"samples_per_s": 10.0 * k, "peak_mem_MiB_max": peak, "state_MiB_per_rank": (p + g + o) / div,
                "per_rank": rows}
    return {"fsdp": side(k, 900.0 if gpu else None), "ddp": side(1, 1400.0 if gpu else None),
            "state_ratio_fsdp_over_ddp": 1 / k, "zero_sizing_7B_8x80GB": costmodel.zero_table()}


def write_cpu_smoke(runs: Path, fp=CPU_FP):
    kw = dict(fp=fp, backend="gloo", scale="smoke")
    for exp, base, prb in (("ddp_weak", 40.0, 8), ("ddp_strong", 38.0, None)):
        for variant, f in (("seed", 1.0), ("cached", 1.5)):
            for k, eff in ((1, 1.0), (2, 0.8)):
                b = prb or 16 // k
                _write(runs, exp, variant, k, metrics=throughput(base * f * k * eff, k, b), **kw)
            _write(runs, exp, variant, 4, status="skipped", reason=SKIP_K4, **kw)
    _write(runs, "ddp_comm_probe", "default", 2, metrics={
        "synced_ms": 410.0, "no_sync_ms": 380.0, "comm_ms": 30.0, "pred_flat_ms": 25.0, "pred_ring_ms": 25.0,
        "pred_book_ms": 19.9, "grad_bytes": 44_703_272, "bucket_bytes": [1_000_000, 26_000_000, 17_000_000]}, **kw)
    _write(runs, "ddp_comm_probe", "default", 4, status="skipped", reason=SKIP_K4, **kw)
    _write(runs, "allreduce", "default", 2, metrics=sweep([0.25, 1, 4], 1.5, 2), **kw)
    _write(runs, "allreduce", "memcpy", 2, status="skipped", reason=SKIP_MEMCPY, **kw)
    _write(runs, "ddp_memcpy_training", "default", 2, status="hung", reason=HUNG_REASON,
           metrics={"hung_after_s": 30.2}, **kw)
    _write(runs, "ddp_bucket_sweep", "default", 2, metrics={
        "sweep": [{"bucket_cap_MiB": 1, "n_buckets": 12, "samples_per_s": 55.0, "step_ms_median": 290.0,
                   "step_ms_p10": 280.0, "step_ms_p90": 320.0},
                  {"bucket_cap_MiB": 25, "n_buckets": 2, "samples_per_s": 61.0, "step_ms_median": 262.0,
                   "step_ms_p10": 250.0, "step_ms_p90": 275.0}],
        "best_bucket_cap_MiB": 25, "best_samples_per_s": 61.0}, **kw)
    for k in (1, 2):
        _write(runs, "fsdp", "default", k, metrics=fsdp_metrics(k, False), **kw)
    jkw = dict(fp=fp, backend="xla-cpu", scale="smoke")
    for variant, f in (("host", 1.0), ("device", 1.2)):
        for k, eff in ((1, 1.0), (2, 0.75)):
            _write(runs, "jax_weak", variant, k, metrics=throughput(60.0 * f * k * eff, k, 8), **jkw)
        _write(runs, "jax_weak", variant, 4, status="skipped", reason=SKIP_K4, **jkw)
    sizes = [6_447_680, 4_718_592] + [64] * 33
    _write(runs, "jax_hlo", "default", 2, metrics={
        "n_allreduce": len(sizes), "allreduce_elements": sizes, "largest_two_elements": sizes[:2],
        "total_elements": sum(sizes), "total_bytes": 4 * sum(sizes),
        "sharding_batch_txt": "┌───────┐\n│ CPU 0 │\n├───────┤\n│ CPU 1 │\n└───────┘"}, **jkw)
    _write(runs, "jax_equality", "default", 2, metrics={
        "max_abs_update": 0.011, "max_abs_diff": 2.1e-7, "rel_diff": 1.9e-5, "threshold": 1e-2, "passed": True,
        "broken": {"rel_diff": 0.5, "passed": False}, "broken_flagged": True}, **jkw)


def write_gpu_paper(root: Path):
    runs = root / "runs"
    kw = dict(fp=GPU_FP, backend="nccl", scale="paper", source="real")
    for exp, variant, base, effs in (("ddp_weak", "seed", 5000.0, {2: 0.9, 4: 0.85, 8: 0.8}),
                                     ("ddp_weak", "cached", 5600.0, {2: 0.95, 4: 0.93, 8: 0.9}),
                                     ("ddp_weak", "tuned", 20000.0, {2: 0.9, 4: 0.85, 8: 0.78}),
                                     ("ddp_strong", "seed", 5100.0, {2: 0.85, 4: 0.7, 8: 0.5}),
                                     ("ddp_strong", "cached", 5700.0, {2: 0.9, 4: 0.8, 8: 0.6})):
        _write(runs, exp, variant, 1, metrics=throughput(base, 1, 256), **kw)
        for k, e in effs.items():
            _write(runs, exp, variant, k, metrics=throughput(base * k * e, k, 256), **kw)
    # the tuned series at k=1, with MFU (counted FLOPs x samples/s / measured matmul peak)
    flops, peak = 13_297_022_976, 780e12
    for exp, variant, s in (("ddp_weak", "tuned", 20000.0), ("jax_weak", "host", 11000.0),
                            ("jax_weak", "tuned", 23000.0)):
        _write(runs, exp, variant, 1, metrics={**throughput(s, 1, 256), "flops_per_sample": flops,
                                               "bf16_matmul_peak_TFLOPs": peak / 1e12, "mfu": flops * s / peak},
               **{**kw, "backend": "xla-gpu" if exp.startswith("jax") else "nccl"})
    for k in (2, 4, 8):
        _write(runs, "allreduce", "default", k, metrics=sweep([1, 4, 16, 64, 256], 300.0, k), **kw)
        _write(runs, "allreduce", "memcpy", k, metrics=sweep([1, 4, 16, 64, 256], 60.0, k), **kw)
        _write(runs, "ddp_comm_probe", "default", k, metrics={
            "synced_ms": 20.0 + k * 0.1, "no_sync_ms": 19.5, "comm_ms": 0.5 + 0.1 * k, "pred_flat_ms": 0.4,
            "pred_ring_ms": 0.4 * (k - 1) / k * 2, "pred_book_ms": 19.9, "grad_bytes": 44_703_272,
            "bucket_bytes": [1_000_000, 26_000_000, 17_000_000]}, **kw)
    _write(runs, "ddp_memcpy_training", "default", 2, status="hung", reason=HUNG_REASON.replace("30", "120"),
           metrics={"hung_after_s": 120.4}, **kw)
    for k in (1, 2, 4, 8):
        _write(runs, "fsdp", "default", k, metrics=fsdp_metrics(k, True), **kw)
    write_json_atomic(root / "fingerprint.json", GPU_FP)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    runs = tmp / "results" / "runs"
    write_cpu_smoke(runs)
    write_json_atomic(tmp / "results" / "fingerprint.json", CPU_FP)
    refs = tmp / "reference"
    write_gpu_paper(refs / "h200x8")
    (refs / "book_4090.yaml").write_text(BOOK.read_text())
    out = tmp / "results" / "report"
    summary = report.build(runs, tmp / "results" / "fingerprint.json", refs, out)
    raw = (out / "report.html").read_text()
    return {"tmp": tmp, "out": out, "summary": summary, "raw_html": raw,
            "html": htmllib.unescape(raw), "md": (out / "report.md").read_text()}


def test_every_declared_figure_and_table_is_written(built):
    out = built["out"]
    pngs = sorted((out / "figures").glob("*.png"))
    assert len(pngs) >= 6
    assert {p.stem for p in pngs} == set(report.FIGURES)
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000, p
        assert (p.with_suffix(".svg")).read_text().lstrip().startswith(("<?xml", "<svg"))
    for key in report.TABLES:
        rows = list(csv.reader((out / "tables" / f"{key}.csv").open()))
        assert rows and rows[0], key
    expected = report.expected_outputs(str(out))
    assert all(Path(p).exists() for group in expected.values() for p in group)


def test_html_is_self_contained_and_embeds_every_figure(built):
    html = built["raw_html"]
    imgs = re.findall(r'<img [^>]*src="data:image/png;base64,([^"]+)"', html)
    assert len(imgs) == len(report.FIGURES)
    for b in imgs:
        assert base64.b64decode(b)[:4] == b"\x89PNG"
    # nothing to fetch: no external src/href (anchors inside the page only)
    assert not re.search(r'(src|href)="(?!data:|#)', html)
    assert html.count("<table") >= 10


def test_markdown_references_figure_files(built):
    md = built["md"]
    for name in report.FIGURES:
        assert f"](figures/{name}.png)" in md


def test_book_numbers_appear_in_the_books_form(built):
    for text in (built["html"], built["md"]):
        for s in ("3706 samples/s, 1.76x, 88% weak-scaling efficiency",
                  "5881 samples/s, 2.81x, 70% strong-scaling efficiency",
                  "4388 samples/s, 1.64x, 82% weak-scaling efficiency",
                  "predicted comm 2N/beta = 20 ms/step; measured 15 ms (synced 133, no_sync 117)",
                  "4.4 GB/s at the default, 22.1 GB/s configured (5.0x)",
                  "36 all-reduce ops", "6.4M floats", "1.5e-04"):
            assert s in text, s
    # each book number cites where in the section it comes from
    for cite in ("13.6.2, weak-scaling sweep", "13.6.2, strong-scaling sweep", "13.6.2, the no_sync() probe",
                 "13.6.2, bare all-reduce benchmark", "13.6.4, jax_throughput", "13.6.4, the all-reduce census",
                 "13.6.4, one step on one device"):
        assert cite in built["html"], cite
    # our own numbers in the same form, on the CPU stand-in
    assert "2 CPU process(es): 64.0 samples/s, 1.60x, 80% weak-scaling efficiency" in built["html"]


def test_scale_data_source_and_reasons_are_prominent(built):
    html = built["html"]
    assert "SMOKE SCALE" in html and "smoke" in html
    assert "SYNTHETIC DATA" in html
    assert 'class="banner alert"' in html
    for reason in (SKIP_K4, SKIP_MEMCPY, HUNG_REASON):
        assert reason in html, reason
        assert reason in built["md"], reason
    assert "HUNG" in html and "killed after 30.2 s" in html


def test_second_machine_side_by_side(built):
    html = built["html"]
    cpu = "this run: CPU x2 (Fixture CPU), smoke"
    gpu = "h200x8: 8x H200 (NV18), paper"
    book = "book: 4x RTX 4090, paper"
    for name in (cpu, gpu, book):
        assert name in html, name
    # one table holds all three as columns
    m = re.search(r'<table id="table-book_comparison".*?</thead>', html, re.S)
    assert m and cpu in m.group(0) and gpu in m.group(0) and book in m.group(0)
    # provenance: both fingerprints, both dates
    assert "143771" in html and "Fixture CPU" in html
    # measured k=8 beside the prediction on the GPU machine
    k8 = list(csv.DictReader((built["out"] / "tables" / "k8_prediction.csv").open()))
    gpu_seed = [r for r in k8 if r["machine"] == gpu and r["variant"] == "seed"][0]
    assert gpu_seed["measured"] == "80.0%" and gpu_seed["from_k"] == "4"


def test_tuned_series_beside_the_books_protocol(built):
    # the headline gives each tuned bar, its speed-up over the book's protocol and its MFU
    md = built["md"]
    line = [ln for ln in md.splitlines() if "](figures/tuned.png)" in ln][0]
    assert "DDP 20,000 (4.0x), MFU 0.34" in line and "JAX 23,000 (2.1x), MFU 0.39" in line, line
    rows = list(csv.DictReader((built["out"] / "tables" / "scaling.csv").open()))
    tuned = [r for r in rows if r["variant"] == "tuned" and r["k"] == "1" and "h200x8" in r["machine"]]
    assert {r["experiment"] for r in tuned} == {"ddp_weak", "jax_weak"} and all(r["mfu"] for r in tuned)


def test_k8_prediction_matches_cost_model(built):
    k8 = list(csv.DictReader((built["out"] / "tables" / "k8_prediction.csv").open()))
    book = [r for r in k8 if r["machine"].startswith("book")][0]
    pred = costmodel.weak_efficiency_k({2: 3706 / 2106 / 2, 4: 6921 / 2106 / 4}, 8)
    assert book["predicted_flat"] == f"{100 * pred['flat']:.1f}%"
    assert book["predicted_ring"] == f"{100 * pred['ring']:.1f}%"


def test_jax_side_is_tolerant_of_missing_files_and_keys(tmp_path):
    runs = tmp_path / "runs"
    write_cpu_smoke(runs)
    for p in (runs / "jax_hlo").rglob("*.json"):
        p.unlink()
    eq = runs / "jax_equality" / "default" / "k2.json"
    obj = json.loads(eq.read_text())
    obj["metrics"] = {"something_new": 1.0}
    eq.write_text(json.dumps(obj))
    (tmp_path / "fp.json").write_text(json.dumps(CPU_FP))
    s = report.build(runs, tmp_path / "fp.json", None, tmp_path / "out", book_path=BOOK)
    assert len(s["figures"]) == len(report.FIGURES)
    html = (tmp_path / "out" / "report.html").read_text()
    assert "update-equality check: not recorded" in html


def test_no_results_at_all_still_builds(tmp_path):
    (tmp_path / "fp.json").write_text(json.dumps(CPU_FP))
    report.build(tmp_path / "nothing", tmp_path / "fp.json", None, tmp_path / "out", book_path=BOOK)
    html = (tmp_path / "out" / "report.html").read_text()
    assert "no result JSONs found" in html
    assert len(list((tmp_path / "out" / "figures").glob("*.png"))) == len(report.FIGURES)


def test_corrupt_artifact_is_reported_not_fatal(tmp_path):
    runs = tmp_path / "runs"
    write_cpu_smoke(runs)
    (runs / "ddp_weak" / "seed" / "k2.json").write_text("{ half a file")
    (tmp_path / "fp.json").write_text(json.dumps(CPU_FP))
    report.build(runs, tmp_path / "fp.json", None, tmp_path / "out", book_path=BOOK)
    html = (tmp_path / "out" / "report.html").read_text()
    assert "unreadable artifact" in html and "not valid JSON" in html


def test_script_help_is_helpful():
    import subprocess
    import sys
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "report.py"), "--help"], capture_output=True,
                       text=True, env={"PYTHONPATH": str(ROOT / "src")})
    assert p.returncode == 0
    assert "--references" in p.stdout and "reference/<machine>/" in p.stdout
