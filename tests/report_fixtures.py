"""Fixture results for the report's tests, written with dpscale.results.make_result
(the contract every rule writes), in the shape the workers write them: repeats per
timed epoch, paired probe trials, the nccl-tests table. The numbers are made up,
shaped like a CPU smoke run (this run) and a GPU paper run (a reference machine)."""
from __future__ import annotations

from pathlib import Path

from dpscale.analysis import costmodel, stats, tta
from dpscale.analysis.stateff import noise
from dpscale import layout, results
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
CODE = {"version": "0.1.0", "commit": "0123456789abcdef0123456789abcdef01234567", "dirty": False, "source": "git",
        "sources": ["torch_ddp"], "sources_sha256": "feedfacefeedface"}


def write(root: Path, exp, variant, k, *, fp, backend, scale, status="ok", reason=None, metrics=None,
          source="synthetic") -> str:
    data = {"source": source, "origin": "fixture", "image_size": 32} if status == "ok" else {}
    r = make_result(experiment=exp, variant=variant, k=k, status=status, reason=reason, metrics=metrics or {},
                    config={"scale": scale, "protocol": {"per_rank_batch": 8}}, fingerprint=fp, backend=backend,
                    data=data, code=CODE)
    path = layout.result_path(exp, variant, k, str(root))
    results.save(path, r)
    return path


def throughput(s, k, prb, wobble=(1.0, 1.01, 0.99)):
    reps = [s * w for w in wobble]
    iv = stats.interval(reps)
    secs = [[prb * 8 / (x / k) for x in reps] for _r in range(k)]
    return {"samples_per_s": reps[0], "samples_per_s_repeats": reps, "repeats": len(reps),
            **{f"samples_per_s_{key}": iv[key] for key in ("median", "min", "max", "mean", "cv")},
            "samples_per_s_ci95": [iv["ci_lo"], iv["ci_hi"]], "samples_per_s_per_device": s / k,
            "per_rank_batch": prb, "global_batch": prb * k, "step_ms_median": 1e3 * prb * k / s, "epoch_s": 3.0,
            "peak_mem_MiB": None, "loss_last": 2.3,
            "per_rank": [{"rank": r, "samples_per_s": s / k, "seconds_repeats": secs[r],
                          "steps": {"n": 8, "median_ms": 1e3 * prb * k / s, "cv": 0.03}} for r in range(k)]}


def nccl_table(mibs, gbps, k, wrong_at=None):
    tables = {}
    for placement, slower in (("out_of_place", 1.0), ("in_place", 0.98)):
        rows = []
        for mib in mibs:
            size = int(mib * 2**20)
            med = size / (gbps * 1e9) * (1 + 0.5 / mib) * slower
            t = 1.08 * med   # a few slow calls lift the mean above the median's interval
            rows.append({"bytes": size, "count": size // 4, "type": "float", "redop": "sum", "root": -1,
                         "time_us": 1e6 * t, "time_us_median": 1e6 * med,
                         "time_us_ci95": [0.97e6 * med, 1.05e6 * med],
                         "time_us_cv": 0.02, "iters": 20, "algbw_GBps": costmodel.algbw(size, t) / 1e9,
                         "busbw_GBps": costmodel.busbw(size, t, k) / 1e9, "wrong": 1 if mib == wrong_at else 0})
        tables[placement] = rows
    busbw = [r["busbw_GBps"] for rows in tables.values() for r in rows]
    return {"table": tables, "avg_busbw_GBps": sum(busbw) / len(busbw), "correct": wrong_at is None,
            "time_aggregation": "mean over ranks of each rank's mean over the timed loop (nccl-tests -a 1)"}


def probe(synced, comm, k, pairs=12):
    diffs = [comm * (1 + 0.05 * ((i % 3) - 1)) for i in range(pairs)]
    return {"synced_ms": synced, "no_sync_ms": synced - comm, "comm_ms": comm, "comm_ms_pairs": diffs,
            "synced_ms_pairs": [synced] * pairs, "no_sync_ms_pairs": [synced - d for d in diffs], "pairs": pairs,
            "pred_flat_ms": comm * 0.8, "pred_ring_ms": comm * 0.8 * (k - 1) / k * 2, "pred_book_ms": 19.9,
            "grad_bytes": 44_703_272, "bucket_bytes": [1_000_000, 26_000_000, 17_000_000]}


def fsdp_metrics(k, gpu):
    p = 42.6

    def side(div, peak):
        rows = [{"rank": r, "params_MiB": p / div, "grads_MiB": p / div, "optimizer_MiB": p / div,
                 "peak_mem_MiB": peak, "samples_per_s": 10.0} for r in range(k)]
        return {"samples_per_s": 10.0 * k, "peak_mem_MiB_max": peak, "state_MiB_per_rank": 3 * p / div,
                "per_rank": rows}
    return {"fsdp": side(k, 900.0 if gpu else None), "ddp": side(1, 1400.0 if gpu else None),
            "state_ratio_fsdp_over_ddp": 1 / k, "zero_sizing_7B_8x80GB": costmodel.zero_table()}


def buckets():
    return {"sweep": [{"bucket_cap_MiB": 1, "n_buckets": 12, "samples_per_s": 55.0, "step_ms_median": 290.0,
                       "step_ms_ci95": [280.0, 300.0]},
                      {"bucket_cap_MiB": 25, "n_buckets": 2, "samples_per_s": 61.0, "step_ms_median": 262.0,
                       "step_ms_ci95": [255.0, 270.0]}],
            "best_bucket_cap_MiB": 25, "best_samples_per_s": 61.0}


def noise_window(b_simple: float, steps: int = 40) -> dict:
    """A noise-scale record as the worker keeps it (noise.b_simple_window), B_simple about b_simple."""
    g2 = [1.0 + 0.1 * ((i * 7) % 5) for i in range(steps)]
    return noise.b_simple_window(g2, [b_simple * g * (1 + 0.05 * ((i * 3) % 4 - 1.5)) for i, g in enumerate(g2)])


def tta_metrics(rule: str, k: int, samples: list[int | None], emulated: bool = False, prb: int = 8) -> dict:
    """A ddp_tta result: one launch per entry of samples (None: did not converge), 2,000 images an epoch,
    at the throughput fixtures' per-rank batch (so their samples/s apply)."""
    runs = []
    for seed, n in enumerate(samples, 1):   # the protocol every 512 samples (0.5 s sharded over k), the instrument between
        curve = [{"samples": s, "epochs": s / 2000, "seconds": s / 40.0, "accuracy": 0.4 + 0.2 * s / (n or 8000),
                  "role": "protocol" if s % 512 == 0 else "instrument", "eval_s": 0.5 / k if s % 512 == 0 else 0.0,
                  "eval_images": 100 // k if s % 512 == 0 else 0}
                 for s in range(512, (n or 8000) + 1, 256)]
        runs.append({"seed": seed, "converged": n is not None, "samples_to_target": n,
                     "seconds_to_target": n / 40.0 if n else None, "epochs_to_target": n / 2000 if n else None,
                     "eval_s": sum(c["eval_s"] for c in curve), "evaluations": len(curve),
                     "samples_trained": curve[-1]["samples"] if curve else 0, "eval_every_epochs": 0.512,
                     "curve": curve, "best_accuracy": curve[-1]["accuracy"] if curve else None})
    return {"lr_rule": rule, "target_accuracy": 0.6, "seeds": list(range(1, len(samples) + 1)), "train_images": 2000,
            "eval_every_samples": 512, "max_epochs": 4, "global_batch": prb * k, "per_rank_batch": prb,
            "emulated": emulated, "processes": min(k, 2), "eval_s_mean": 0.5, **tta.score_fields(runs), "runs": runs}


def write_cpu_smoke(runs: Path, fp=CPU_FP) -> list[str]:
    """This run: a 2-core CPU smoke run with ks=[1, 2, 4]; returns its planned targets."""
    kw, jkw, out = dict(fp=fp, backend="gloo", scale="smoke"), dict(fp=fp, backend="xla-cpu", scale="smoke"), []
    for exp, base, prb in (("ddp_weak", 40.0, 8), ("ddp_strong", 38.0, None)):
        for variant, f in (("seed", 1.0), ("cached", 1.5)):
            for k, eff in ((1, 1.0), (2, 0.8)):
                out.append(write(runs, exp, variant, k, metrics=throughput(base * f * k * eff, k, prb or 16 // k), **kw))
            out.append(write(runs, exp, variant, 4, status="skipped", reason=SKIP_K4, **kw))
    out.append(write(runs, "ddp_comm_probe", "default", 2, metrics=probe(410.0, 30.0, 2), **kw))
    out.append(write(runs, "ddp_comm_probe", "default", 4, status="skipped", reason=SKIP_K4, **kw))
    out.append(write(runs, "allreduce", "default", 2, metrics=nccl_table([0.25, 1, 4], 1.5, 2), **kw))
    out.append(write(runs, "allreduce", "memcpy", 2, status="skipped", reason=SKIP_MEMCPY, **kw))
    out.append(write(runs, "ddp_memcpy_training", "default", 2, status="hung", reason=HUNG_REASON,
                     metrics={"hung_after_s": 30.2}, **kw))
    out.append(write(runs, "ddp_bucket_sweep", "default", 2, metrics=buckets(), **kw))
    out += [write(runs, "fsdp", "default", k, metrics=fsdp_metrics(k, False), **kw) for k in (1, 2)]
    for variant, f in (("host", 1.0), ("device", 1.2)):
        for k, eff in ((1, 1.0), (2, 0.75)):
            out.append(write(runs, "jax_weak", variant, k, metrics=throughput(60.0 * f * k * eff, k, 8), **jkw))
        out.append(write(runs, "jax_weak", variant, 4, status="skipped", reason=SKIP_K4, **jkw))
    sizes = [6_447_680, 4_718_592] + [64] * 33
    out.append(write(runs, "jax_hlo", "default", 2, metrics={
        "n_allreduce": len(sizes), "allreduce_elements": sizes, "largest_two_elements": sizes[:2],
        "total_elements": sum(sizes), "total_bytes": 4 * sum(sizes), "grad_floats": 11_175_818,
        "sharding_batch_txt": "┌───────┐\n│ CPU 0 │\n├───────┤\n│ CPU 1 │\n└───────┘"}, **jkw))
    out.append(write(runs, "jax_equality", "default", 2, metrics={
        "max_abs_update": 0.011, "max_abs_diff": 2.1e-7, "rel_diff": 1.9e-5, "threshold": 0.05, "passed": True,
        "broken": {"rel_diff": 0.5, "passed": False}, "broken_flagged": True}, **jkw))
    for rule, per_k in (("book", {1: [1024, 1536, 2048], 2: [2048, 2560, 3072], 4: [3072, 4096, None]}),
                        ("linear", {1: [1024, 1536, 2048], 2: [1536, 2048, 3072], 4: [None, None, 4096]})):
        for k, samples in per_k.items():
            m = tta_metrics(rule, k, samples, emulated=k > 2)
            if (rule, k) == ("book", 2):   # the gradient noise scale, where the worker measured it
                m["noise_scale"] = noise_window(20.0)
            out.append(write(runs, "ddp_tta", rule, k, metrics=m, **kw))
    return out


def write_gpu_paper(root: Path) -> None:
    """A reference machine, reference/<name>/: 8 x H200 at paper scale, with a plan.json."""
    kept = layout.kept(root)
    runs, kw, targets = kept.runs, dict(fp=GPU_FP, backend="nccl", scale="paper", source="real"), []
    for exp, variant, base, effs in (("ddp_weak", "seed", 5000.0, {2: 0.9, 4: 0.85, 8: 0.8}),
                                     ("ddp_weak", "cached", 5600.0, {2: 0.95, 4: 0.93, 8: 0.9}),
                                     ("ddp_strong", "seed", 5100.0, {2: 0.85, 4: 0.7, 8: 0.5}),
                                     ("ddp_strong", "cached", 5700.0, {2: 0.9, 4: 0.8, 8: 0.6})):
        for k, e in {1: 1.0, **effs}.items():
            targets.append(write(runs, exp, variant, k, metrics=throughput(base * k * e, k, 256), **kw))
    flops, peak = 13_297_022_976, 780e12
    for exp, variant, s in (("ddp_weak", "tuned", 20000.0), ("jax_weak", "host", 11000.0), ("jax_weak", "tuned", 23000.0)):
        m = {**throughput(s, 1, 256), "flops_per_sample": flops, "bf16_matmul_peak_TFLOPs": peak / 1e12,
             "mfu": flops * s / peak}
        targets.append(write(runs, exp, variant, 1, metrics=m, **{**kw, "backend": "xla-gpu" if "jax" in exp else "nccl"}))
    for k in (2, 4, 8):
        targets.append(write(runs, "allreduce", "default", k, metrics=nccl_table([1, 4, 16, 64, 256], 300.0, k), **kw))
        targets.append(write(runs, "allreduce", "memcpy", k, metrics=nccl_table([1, 4, 16, 64, 256], 60.0, k), **kw))
        targets.append(write(runs, "ddp_comm_probe", "default", k, metrics=probe(20.0 + k * 0.1, 0.5 + 0.1 * k, k), **kw))
    targets.append(write(runs, "ddp_memcpy_training", "default", 2, status="hung", reason=HUNG_REASON,
                         metrics={"hung_after_s": 120.4}, **kw))
    targets += [write(runs, "fsdp", "default", k, metrics=fsdp_metrics(k, True), **kw) for k in (1, 2, 4, 8)]
    planned = [str(Path(t).relative_to(runs)) for t in targets] + ["jax_hlo/default/k8.json"]   # one never ran
    write_json_atomic(kept.fingerprint, GPU_FP)
    write_json_atomic(kept.plan, {"targets": planned, "command": "snakemake --cores 8 report"})


def build_fixture(tmp: Path, **kw) -> dict:
    """The report of the fixture results (this run, a kept 8 x H200, the book), built
    under tmp; what the tests read of it. conftest's `built` builds it once a session."""
    import html as htmllib

    from dpscale import report
    run = layout.working(tmp)
    runs = run.runs
    targets = write_cpu_smoke(runs)
    write_json_atomic(run.fingerprint, CPU_FP)
    write_gpu_paper(tmp / "reference" / "h200x8")
    out = run.report
    info = {"command": "snakemake --cores 2 report", "config_hash": "c0ffee",
            "resolved": {"ks": [1, 2, 4], "forecast": {"bootstrap_draws": 20}}}
    summary = report.build(runs, run.fingerprint, out, targets=targets,
                           references=[tmp / "reference"], book_path=BOOK, build_info=info, **{"workers": 2, **kw})
    raw = (out / "report.html").read_text()
    return {"tmp": tmp, "out": out, "summary": summary, "raw_html": raw, "targets": targets,
            "html": htmllib.unescape(raw), "md": (out / "report.md").read_text()}
