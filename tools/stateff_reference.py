"""Statistical efficiency of a committed ddp_tta series, read-only: every seed's
interpolated epochs to target beside MLPerf's, statistical efficiency with 95%
intervals over seeds, the E(B) fit checked out of sample, what it says about the
largest k, and the time-to-accuracy forecast with the scaling forecast's samples/s.

    PYTHONPATH=src python tools/stateff_reference.py [reference/h200] [--json out.json]

Changes no file of the series (dpscale.analysis.stateff does the work)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dpscale.analysis import stateff


def load(series: Path) -> dict[int, dict]:
    out = {}
    for p in sorted(series.glob("k*.json")):
        out[int(p.stem[1:])] = json.loads(p.read_text())["metrics"]
    return out


def throughput(root: Path, ks) -> dict:
    """samples/s(k) = k x per-rank batch / weak step from the report's scaling forecast (its
    DDP `cached` series, the loop time to accuracy runs), with the forecast's band."""
    f = json.loads((root / "report/forecast.json").read_text())
    level = f["settings"]["band_level"]
    m = f["machines"][0]
    s = next(s for s in m["series"] if s["family"] == "torch" and s["variant"] == "cached")
    b = s["per_rank_batch"]
    out = {}
    for r in s["rows"]:
        if r["k"] in ks:
            v = lambda ms: r["k"] * b / (ms / 1e3)
            ms = r["weak_step_ms"]   # a measured row (k=1) has no band of its own
            out[r["k"]] = {"value": v(ms), "lo": v(r.get("weak_step_ms_hi", ms)), "hi": v(r.get("weak_step_ms_lo", ms)),
                           "level": level, "source": "measured" if r["point"] == "measured" else "forecast"}
    return out


def analyse(root: Path) -> dict:
    series = load(root / "runs/ddp_tta/book")
    any_m = next(iter(series.values()))
    n_img, target, b = any_m["train_images"], any_m["target_accuracy"], any_m["per_rank_batch"]
    rows = {k: stateff.seed_rows(m["runs"], target, n_img) for k, m in series.items()}
    samples = {k: [r["samples"] for r in rs] for k, rs in rows.items()}
    mlperf = {k: [r["mlperf_samples"] for r in rs] for k, rs in rows.items()}
    points = {k * b: v for k, v in samples.items()}
    sources = {k * b: "emulated" if m["emulated"] else "measured" for k, m in series.items()}
    budget = max(r["censored_samples"] or 0 for rs in rows.values() for r in rs) or None
    eff = {k: {"interpolated": stateff.statistical_efficiency(samples[1], samples[k]),
               "mlperf_evaluations": stateff.statistical_efficiency(mlperf[1], mlperf[k])}
           for k in series if k > 1}
    ks_scored = [k for k in sorted(series) if all(v is not None for v in samples[k])]
    fit_all = stateff.fit_batch_model({k * b: samples[k] for k in ks_scored},
                                      sources={k * b: sources[k * b] for k in ks_scored})
    checks = []
    for i in range(2, len(sorted(series))):
        ks = sorted(series)
        checks.append(stateff.holdout(points, ks[i] * b, fit_batches=[k * b for k in ks[:i]], budget=budget))
    eval_rate = sum(r["eval_s"] for r in series[1]["runs"]) / sum(r["samples_trained"] for r in series[1]["runs"])
    thr = throughput(root, sorted(series))
    fc = stateff.tta_forecast(fit_all, sorted(series), b, thr, eval_s_per_sample=eval_rate)
    return {"train_images": n_img, "target": target, "per_rank_batch": b, "budget_samples": budget, "rows": rows,
            "olympic_epochs": {k: {"interpolated": (stateff.olympic(samples[k]) or 0) / n_img or None,
                                   "mlperf": (stateff.olympic(mlperf[k]) or 0) / n_img or None} for k in series},
            "efficiency": eff, "fit": fit_all, "holdout": checks, "eval_s_per_sample": eval_rate,
            "throughput": thr, "forecast": fc}


def show(a: dict) -> str:
    n = a["train_images"]
    ep = lambda s: "-" if s is None else f"{s / n:.2f}"
    iv = lambda r: "-" if r["ci_lo"] is None else f"{r['value']:.1%} [{r['ci_lo']:.1%}, {r['ci_hi']:.1%}]"
    out = [f"target {a['target']:.0%}, per-rank batch {a['per_rank_batch']}, {n} images an epoch", "",
           "k  seed  MLPerf epochs  interpolated epochs  resolution (epochs)  best accuracy"]
    for k, rs in sorted(a["rows"].items()):
        for r in rs:
            out.append(f"{k:<2} {r['seed']:>4}  {ep(r['mlperf_samples']):>13}  {ep(r['samples']):>19}  "
                       f"{ep(r['resolution_samples']):>19}  {r['best_accuracy']:.2%}")
    out.append("")
    for k, o in sorted(a["olympic_epochs"].items()):
        f = lambda v: "no score" if v is None else f"{v:.2f} epochs"
        out.append(f"k={k}: MLPerf score {f(o['mlperf'])}; the same olympic score of the interpolated "
                   f"crossings {f(o['interpolated'])}")
    out.append("")
    pct = lambda v: "-" if v is None else f"{v:.1%}"
    for k, e in sorted(a["efficiency"].items()):
        i, m = e["interpolated"], e["mlperf_evaluations"]
        out.append(f"statistical efficiency k={k}, interpolated crossings: {iv(i)} ({i['method']}; ratio of their "
                   f"olympic scores {pct(i['mlperf_value'])}); MLPerf's evaluations: {iv(m)} (ratio of MLPerf "
                   f"scores {pct(m['mlperf_value'])})")
    f = a["fit"]
    out += ["", f"fit on batches {f['batches']} ({f['n']} seeds, df {f['df']}, {f['weighting']}-weighted, "
                f"per-seed cv {f['sigma']:.1%}): E_min {f['E_min']['value'] / n:.2f} epochs "
                f"[{f['E_min']['ci_lo'] / n:.2f}, {f['E_min']['ci_hi'] / n:.2f}], B_crit {f['B_crit']['value']:.0f} "
                f"[{f['B_crit']['ci_lo']:.0f}, {f['B_crit']['ci_hi']:.0f}] samples, S_min {f['S_min']['value']:.0f} steps"]
    for h in a["holdout"]:
        p, g = h["predicted"], h["fit"]
        line = (f"holdout B={h['predict_batch']:.0f} from {h['fit_batches']}: fit E_min {g['E_min']['value'] / n:.2f} "
                f"epochs, B_crit {g['B_crit']['value']:.0f} [{g['B_crit']['ci_lo']:.0f}, {g['B_crit']['ci_hi']:.0f}]; "
                f"predicted {p['mean'] / n:.2f} epochs (mean band [{p['conf_lo'] / n:.2f}, {p['conf_hi'] / n:.2f}], "
                f"{h['band']} [{p['pred_lo'] / n:.2f}, {p['pred_hi'] / n:.2f}])")
        if h["measured_mean"] is not None:
            line += (f"; measured {h['measured_mean'] / n:.2f}, error {h['relative_error']:+.1%}, "
                     f"inside band: {h['inside_band']}")
        if h["censored_n"]:
            line += (f"; {h['censored_n']} seed(s) censored at {a['budget_samples'] / n:.2f} epochs: P(a seed needs "
                     f"more) = {h['p_seed_over_budget']:.2f}, P(as many censored as seen) = {h['p_censored_as_seen']:.2f}")
        out.append(line)
    out += ["", f"forecast (evaluation {a['eval_s_per_sample'] * 1e6:.1f} us a training sample; samples/s from the "
                f"scaling forecast, its band {next(iter(a['throughput'].values()))['level']:.0%}): fastest k "
                f"{a['forecast']['fastest_k']}, fewest GPU-hours k {a['forecast']['cheapest_k']}",
            "k  batch  samples(epochs) [95%]  input  samples/s [band]  input  time s [95%]  speed-up [95%]  p_fastest"]
    for r in a["forecast"]["rows"]:
        out.append(f"{r['k']:<2} {r['global_batch']:>5}  {r['samples'] / n:.2f} [{r['samples_lo'] / n:.2f}, "
                   f"{r['samples_hi'] / n:.2f}]  {r['samples_input']}  {r['samples_per_s']:.0f} "
                   f"[{r['samples_per_s_lo']:.0f}, {r['samples_per_s_hi']:.0f}]  {r['samples_per_s_input']}  "
                   f"{r['time_s']:.1f} [{r['time_s_lo']:.1f}, {r['time_s_hi']:.1f}]  {r['speedup']:.2f} "
                   f"[{r['speedup_lo']:.2f}, {r['speedup_hi']:.2f}]  {r['p_fastest']:.2f}")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default="reference/h200", type=Path)
    ap.add_argument("--json", type=Path, help="also write the analysis here")
    args = ap.parse_args(argv)
    a = analyse(args.root)
    print(show(a))
    if args.json:
        args.json.write_text(json.dumps(a, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
