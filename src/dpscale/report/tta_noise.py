"""Time to accuracy's gradient noise scale, over the windows of training that matter,
beside the fitted B_crit: from each seed's per-step |G|^2 and tr(Sigma) estimates
(the result's runs[i]["noise_g2_grad_sq_steps"] and ["noise_trace_grad_sq_steps"]),
computed here, not re-measured (dpscale.analysis.stateff.noise_windows):

    start        from step 0 to the target: the worker's own pooled B_simple (its
                 interval over blocks of steps), kept and labelled as what it is: the
                 first steps, where |G|^2 is largest, carry most of its sums
    near         from the first evaluation within the near margin of the target
                 (tta_eval_near_margin: 85% for a 90% target) to the crossing
    progress     the progress-weighted average over the run, the one E(B) =
                 E_min (1 + B / B_crit) ties to B_crit (noise_windows.progress_terms)
    intervals    per evaluation interval (eval_every_samples), the noise scale's course

Intervals over the seeds (each seed's window one sample), so they compare with B_crit's.
"""
from __future__ import annotations

from dpscale.analysis.stateff import batch_model, noise_windows as nw

WINDOWS = {"start": "step 0 to the target (the first steps dominate it)",
           "near": "the first evaluation within the near margin to the target",
           "progress": "the whole run, progress-weighted (what E(B) ties to B_crit)"}


def _runs(p: dict) -> list[dict]:
    return [r for r in p["runs"] if r.get("noise_g2_grad_sq_steps")]


def windows(p: dict) -> dict | None:
    """One point's windows ({"near", "progress", "intervals", "progress_terms"}), each
    pooled over its seeds; None where the runs kept no per-step records (k = 1, or
    results before the probe). dpscale.report.tta keeps it as the point's noise_windows."""
    import numpy as np
    runs, B, every, margin = _runs(p), p["global_batch"], p["eval_every_samples"], p.get("eval_near_margin")
    if not runs or not B or not every:
        return None
    near, terms, by_interval = [], [], {}
    for r in runs:
        g2, tr = np.asarray(r["noise_g2_grad_sq_steps"], float), np.asarray(r["noise_trace_grad_sq_steps"], float)
        n = min(int(r.get("noise_steps") or g2.size), g2.size)
        blocks = [nw.steps_in(B, j * every, min((j + 1) * every, n * B)) for j in range(-(-n * B // every))]
        terms.append(nw.progress_terms(g2[:n], tr[:n], B, blocks))
        for j, sl in enumerate(blocks):
            by_interval.setdefault(j, []).append((float(tr[sl].sum()), float(g2[sl].sum()), len(g2[sl])))
        first = next((c for c in r["curve"] if c["accuracy"] >= p["target"] - margin), None) \
            if margin and p["target"] is not None else None
        if first:
            a = nw.steps_in(B, 0, first["samples"]).stop
            near.append((float(tr[a:n].sum()), float(g2[a:n].sum()), max(n - a, 0)))
    return {"near": nw.window_over_seeds(near) if near else None, "progress": nw.window_over_seeds(terms),
            "progress_terms": terms,
            "intervals": [{"from_samples": j * every, "to_samples": (j + 1) * every, **nw.window_over_seeds(pairs)}
                          for j, pairs in sorted(by_interval.items())]}


def _row(p: dict, window: str, rec: dict | None, model: dict | None, source: str) -> dict:
    row = {"k": p["k"], "global_batch": p["global_batch"], "window": window, "window_text": WINDOWS.get(window, window),
           "b_noise": None, "b_noise_lo": None, "b_noise_hi": None, "covers": "", "seeds": None, "steps": None,
           "source": (source if rec.get("b_simple") is not None else rec.get("method") or "no step in the window")
           if rec else "not measured", "b_crit": model["B_crit"]["value"] if model else None,
           "b_crit_lo": model["B_crit"]["ci_lo"] if model else None,
           "b_crit_hi": model["B_crit"]["ci_hi"] if model else None, "ratio": None, "ratio_lo": None,
           "ratio_hi": None, "same_order": None}
    if rec and rec.get("b_simple") is not None:
        row.update(b_noise=rec["b_simple"], b_noise_lo=rec.get("ci_lo"), b_noise_hi=rec.get("ci_hi"),
                   covers=rec.get("covers", ""), seeds=rec.get("seeds", rec.get("runs")), steps=rec.get("steps"))
        if model and rec.get("cov") is not None:
            c = batch_model.compare_b_crit(model, rec)
            row.update(ratio=c["ratio"], ratio_lo=c["ci_lo"], ratio_hi=c["ci_hi"], same_order=c["same_order"])
    return row


def rows(points: list[dict], model: dict | None) -> list[dict]:
    """Per k >= 2 and window: the noise scale with its interval beside the fitted B_crit
    (batch_model.compare_b_crit: B_crit over it, with an interval), then the
    progress-weighted average pooled over every k ("k >= 2"), B_crit's counterpart."""
    out, pooled = [], []
    for p in (q for q in points if q["k"] >= 2):
        w = p.get("noise_windows")
        out.append(_row(p, "start", p["noise"], model, (p["noise"] or {}).get("source", "")))
        out.append(_row(p, "near", (w or {}).get("near"), model, "each seed's per-step records"))
        out.append(_row(p, "progress", (w or {}).get("progress"), model, "each seed's per-step records"))
        pooled += (w or {}).get("progress_terms", [])
    if pooled and len(out) > 3:
        every = {"k": "k >= 2", "global_batch": None}
        out.append(_row(every, "progress", nw.window_over_seeds(pooled), model, "every seed of every k >= 2"))
    return out


def interval_rows(points: list[dict]) -> list[dict]:
    """Per k >= 2 and evaluation interval: the noise scale over the seeds' steps in it."""
    out = []
    for p in (q for q in points if q["k"] >= 2):
        for r in (p.get("noise_windows") or {}).get("intervals", []):
            out.append({"k": p["k"], "global_batch": p["global_batch"], **r})
    return out
