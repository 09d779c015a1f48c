"""One line per result JSON under results/runs: status, reason, the headline metrics,
and the spread over repeats where a result has one (dpscale.analysis.stats)."""
import glob
import json
import sys

sys.path.insert(0, "src")
from dpscale.analysis import stats  # noqa: E402

KEYS = ("samples_per_s", "samples_per_s_per_device", "mfu", "roofline_fraction", "step_ms_median", "synced_ms",
        "no_sync_ms", "straggler_share", "comm_ms", "comm_ms_ci95", "pred_flat_ms", "busbw_GBps_64MiB", "avg_busbw_GBps", "correct",
        "hung_after_s", "best_bucket_cap_MiB", "cuda_graph", "cuda_graph_error", "bf16_matmul_peak_TFLOPs",
        "state_ratio_fsdp_over_ddp", "n_allreduce", "rel_diff", "passed", "broken_flagged", "peak_mem_MiB",
        "epochs_to_target", "seconds_to_target", "no_result_reason", "not_launched_seeds", "eval_s_mean")
for p in sorted(glob.glob("results/runs/*/*/k*.json")):
    r = json.load(open(p))
    m = r["metrics"]
    pick = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in m.items() if k in KEYS}
    if len(m.get("samples_per_s_repeats") or []) >= 2:
        iv = stats.interval(m["samples_per_s_repeats"])
        pick["repeats"] = f"n={iv['n']} median {iv['median']:.0f} [{iv['ci_lo']:.0f}, {iv['ci_hi']:.0f}] cv {iv['cv']:.2%}"
    print(p[13:], r["status"], (r.get("reason") or "")[:100], json.dumps(pick))
    for run in m.get("runs") or []:   # time to accuracy: one line per seed
        print(f"    seed {run['seed']}: {'reached' if run['converged'] else 'not converged'} "
              f"epochs {run['epochs_to_target']} s {run['seconds_to_target']} best {run['best_accuracy']:.4f} "
              f"curve {[round(c['accuracy'], 3) for c in run['curve']]}")
