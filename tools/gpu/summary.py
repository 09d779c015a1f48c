"""One line per result JSON under results/runs: status, reason, the headline metrics."""
import glob, json
for p in sorted(glob.glob("results/runs/*/*/k*.json")):
    r = json.load(open(p)); m = r["metrics"]
    pick = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in m.items()
            if k in ("samples_per_s", "samples_per_s_per_device", "mfu", "step_ms_median", "synced_ms", "no_sync_ms", "comm_ms",
                     "pred_flat_ms", "busbw_GBps_64MiB", "busbw_GBps_256MiB", "busbw_GBps_max", "correct", "hung_after_s",
                     "best_bucket_cap_MiB", "cuda_graph", "cuda_graph_error", "bf16_matmul_peak_TFLOPs", "state_ratio_fsdp_over_ddp", "n_allreduce", "rel_diff", "passed", "broken_flagged", "peak_mem_MiB")}
    print(p[13:], r["status"], (r.get("reason") or "")[:80], json.dumps(pick))
