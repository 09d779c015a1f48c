"""The E(B) model checked out of sample on convergence tables (dpscale.analysis.convergence):
each global batch predicted from the smaller ones only, beside two naive predictors.

Per row (a table's batch B with at least two batches below it):
  model      stateff.fit_batch_model on the batches below B, stateff.predict at B for the
             mean of the seeds that reached the target there, with stateff's 95% prediction
             band (the seeds' spread and the fit's uncertainty: the band stateff.holdout
             checks) and the band widened by the model's misfit (batch_misfit.widened).
  previous   the mean at the next-smaller batch (E does not change with B).
  linear     the line through the means at the two next-smaller batches, at B.
Errors are (predicted - measured) / measured, the measured value being the mean over the
seeds that reached the target at B (as stateff.holdout has it). Every row records the
batches each predictor read, taken from what it used (the fit's own `batches`, each
residual's batches), and `leaks` lists any at or above B.

Families and the pool: tables that share an entry (a batch with the same per-seed values)
or a benchmark name are one family (MLPerf's versions repeat entries). A table's misfit
pool is the residuals of one table per *other* family, never its own; the pooled summary
counts one table per family (the representative: most batches, then most seeds, then the
newest), so no measurement is counted twice.
"""
from __future__ import annotations

import re
import statistics

from dpscale.analysis.stateff import batch_misfit
from dpscale.analysis.convergence import Table

LEVEL = batch_misfit.LEVEL
PREDICTORS = ("model", "previous", "linear")
SKIPPED = "fewer than 2 smaller batches: not predicted"


def _mean(vals) -> float | None:
    conv = [v for v in vals if v is not None]
    return sum(conv) / len(conv) if conv else None


def _err(pred: float | None, meas: float | None) -> float | None:
    return None if pred is None or meas is None else 100.0 * (pred - meas) / meas


def naive(t: Table, i: int) -> dict:
    """The two naive predictions of batch index i from the means at i-1 and i-2, with the batches each read."""
    bs = t.batches
    B, m1 = bs[i], _mean(t.per_batch[bs[i - 1]])
    out = {"previous": m1, "previous_inputs": [bs[i - 1]], "linear": None, "linear_inputs": bs[i - 2:i]}
    m2 = _mean(t.per_batch[bs[i - 2]])
    if m1 is not None and m2 is not None:
        out["linear"] = m1 + (m1 - m2) * (B - bs[i - 1]) / (bs[i - 1] - bs[i - 2])
    return out


def _measured(t: Table, B: int) -> dict:
    vals = t.per_batch[B]
    conv = [v for v in vals if v is not None]
    m = _mean(conv)
    cv = statistics.stdev(conv) / m if len(conv) > 1 and m else None
    return {"table": t.name, "batch": B, "n": len(conv), "censored": len(vals) - len(conv), "measured": m,
            "seed_cv": cv, "seed_min": min(conv, default=None), "seed_max": max(conv, default=None)}


def row(t: Table, i: int, pool: list[dict], level: float = LEVEL, weighting: str = "cv") -> dict:
    """Batch index i of table t predicted from the batches below it (see the module)."""
    B = t.batches[i]
    out = _measured(t, B)
    if i < 2:
        return {**out, "note": SKIPPED}
    below = {b: list(t.per_batch[b]) for b in t.batches[:i]}
    try:
        w = batch_misfit.widened(below, B, n_seeds=max(out["n"], 1), level=level, weighting=weighting,
                                 pool=pool, table=t.name)
    except ValueError as e:
        return {**out, "note": str(e)}
    pr, nv, m = w["predicted"], naive(t, i), out["measured"]
    own = [r for r in w["misfit"]["residuals"] if r["table"] == t.name]
    read = set(w["fit"]["batches"]) | {b for r in own for b in [r["batch"], *r["fit_batches"]]}
    read |= set(nv["previous_inputs"]) | set(nv["linear_inputs"])
    out.update(note="", fit_batches=w["fit"]["batches"], predicted=pr["mean"], band_lo=pr["pred_lo"],
               band_hi=pr["pred_hi"], wide_lo=w["band_lo"], wide_hi=w["band_hi"],
               misfit_rel_sd=w["misfit"]["rel_sd"], misfit_k=w["misfit"]["k"], misfit_source=w["misfit"]["source"],
               misfit_tables=sorted({r["table"] for r in w["misfit"]["residuals"]}),
               previous=nv["previous"], linear=nv["linear"], naive_inputs={k: nv[f"{k}_inputs"] for k in
                                                                           ("previous", "linear")},
               leaks=sorted(b for b in read if b >= B), level=level)
    out.update(inside=None if m is None else pr["pred_lo"] <= m <= pr["pred_hi"],
               inside_wide=None if m is None else w["band_lo"] <= m <= w["band_hi"],
               error_model=_err(pr["mean"], m), error_previous=_err(nv["previous"], m),
               error_linear=_err(nv["linear"], m))
    return out


def _entries(t: Table) -> set:
    return {(b, vals) for b, vals in t.per_batch.items()}


def families(tables: list[Table]) -> list[list[Table]]:
    """Tables joined where they share a benchmark name or an entry (connected components)."""
    groups: list[list[Table]] = []
    for t in tables:
        joined = [g for g in groups if any(u.benchmark == t.benchmark or _entries(u) & _entries(t) for u in g)]
        merged = [t] + [u for g in joined for u in g]
        groups = [g for g in groups if g not in joined] + [merged]
    return [sorted(g, key=lambda u: u.name) for g in groups]


def _version(name: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", name))


def representative(family: list[Table]) -> Table:
    """The family's table with the most batches, then the most seeds, then the newest name."""
    return max(family, key=lambda t: (len(t.batches), sum(len(v) for v in t.per_batch.values()), _version(t.name),
                                      t.name))


def _related(u: Table, t: Table) -> bool:
    return u is t or u.benchmark == t.benchmark or bool(_entries(u) & _entries(t))


def residual_pool(fams: list[list[Table]], level: float = LEVEL, weighting: str = "cv",
                  residuals=None) -> list[tuple[list, list]]:
    """Per family: (its tables, the "predict the next" residuals of its representative):
    the line's (batch_misfit.next_residuals), or residuals(points, level, table) of another
    model (model_choice.next_residuals: the mixture's)."""
    out = []
    for fam in fams:
        rep = representative(fam)
        out.append((fam, batch_misfit.next_residuals(rep.points(), weighting, level, rep.name) if residuals is None
                    else residuals(rep.points(), level, rep.name)))
    return out


def pool_for(t: Table, pools: list[tuple[list, list]]) -> list[dict]:
    """The residuals t's misfit may borrow: those of every family that holds no table related to t."""
    return [r for fam, res in pools if not any(_related(u, t) for u in fam) for r in res]


def public_pool(tables: list[Table], level: float = LEVEL, weighting: str = "cv", residuals=None) -> list[dict]:
    """The residuals another E(B) fit (the project's own) may borrow when it has fewer than
    batch_misfit.MIN_OWN of its own: one representative table per family of `tables`
    (residuals: as residual_pool's)."""
    return [r for _, res in residual_pool(families(tables), level, weighting, residuals) for r in res]


def _coverage(flags: list[bool]) -> dict:
    """k of n inside, with the exact (Clopper-Pearson) 95% interval of the proportion over rows."""
    from scipy import stats as sps
    k, n = sum(flags), len(flags)
    if not n:
        return {"k": 0, "n": 0, "rate": None, "ci_lo": None, "ci_hi": None}
    ci = sps.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return {"k": k, "n": n, "rate": k / n, "ci_lo": float(ci.low), "ci_hi": float(ci.high)}


def _half_width(rows: list[dict], hi: str) -> float | None:
    """Median half-width of a band in % of the prediction."""
    return statistics.median(abs(r[hi] - r["predicted"]) / abs(r["predicted"]) * 100 for r in rows) if rows else None


def summary(rows: list[dict]) -> dict:
    """Coverage of both bands; mean, median and max |error| % of the model and both naives
    over the rows where all three predicted; the winner on mean |error| (a list: more than
    one where they tie at 0.1 point); each band's median half-width in % of the prediction;
    the widened band by where its misfit came from (own or pooled)."""
    done = [r for r in rows if not r["note"] and r["measured"] is not None]
    both = [r for r in done if all(r[f"error_{p}"] is not None for p in PREDICTORS)]
    err = {p: {"mean_abs": statistics.fmean(abs(r[f"error_{p}"]) for r in both) if both else None,
               "max_abs": max((abs(r[f"error_{p}"]) for r in both), default=None),
               "median_abs": statistics.median(abs(r[f"error_{p}"]) for r in both) if both else None}
           for p in PREDICTORS}
    best = min((e["mean_abs"] for e in err.values() if e["mean_abs"] is not None), default=None)
    # a tie at the printed precision (0.1 point) is a tie: the model first where it ties
    win = [p for p, e in err.items() if best is not None and round(e["mean_abs"], 1) == round(best, 1)]
    by = {src: [r for r in done if r["misfit_source"] == src] for src in ("own", "pooled", "none")}
    return {"rows": len(done), "compared": len(both), "skipped": len(rows) - len(done),
            "median_half_width_pct": {"band": _half_width(done, "band_hi"), "band_wide": _half_width(done, "wide_hi")},
            "coverage": _coverage([r["inside"] for r in done]),
            "coverage_wide": _coverage([r["inside_wide"] for r in done]),
            "by_misfit_source": {src: {"coverage_wide": _coverage([r["inside_wide"] for r in rs]),
                                       "median_half_width_pct": _half_width(rs, "wide_hi")}
                                 for src, rs in by.items() if rs},
            "error_pct": err, "winner": win,
            "leaks": sorted({(r["table"], r["batch"]) for r in done if r["leaks"]})}


def without_largest(tables: list[Table], pools: list[tuple[list, list]], level: float, weighting: str) -> dict:
    """The pooled check again with the family that weighs most in the borrowed misfit left
    out of the pool (the largest share of the residuals' squared relative errors): is the
    band's coverage a property of the pool, or of one table?"""
    sq = [sum(r["relative"] ** 2 for r in res) for _fam, res in pools]
    i = max(range(len(pools)), key=sq.__getitem__)
    fam = pools[i][0]
    names = {t.name for t in fam}
    rest = [t for t in tables if t.name not in names]
    again = check(rest, pool_tables=[t for f, _ in pools if f is not fam for t in f], level=level, weighting=weighting)
    return {"family": representative(fam).name, "share": sq[i] / sum(sq) if sum(sq) else None,
            "coverage_wide": again["pooled"]["coverage_wide"],
            "median_half_width_pct": again["pooled"]["median_half_width_pct"]["band_wide"]}


def check(tables: list[Table], pool_tables: list[Table] | None = None, level: float = LEVEL,
          weighting: str = "cv") -> dict:
    """Every table's rows and summary, and the pooled summary over one table per family.
    pool_tables: where the misfit may borrow residuals (default: the tables themselves)."""
    pools = residual_pool(families(pool_tables if pool_tables is not None else tables), level, weighting)
    out = []
    for t in tables:
        pool = pool_for(t, pools)
        rows = [row(t, i, pool, level, weighting) for i in range(len(t.batches))]
        out.append({"name": t.name, "benchmark": t.benchmark, "unit": t.unit, "source": t.source,
                    "notes": list(t.notes), "rows": rows, "summary": summary(rows)})
    reps = {representative(f).name for f in families(tables)}
    pooled_rows = [r for tab in out if tab["name"] in reps for r in tab["rows"]]
    pooled = {**summary(pooled_rows), "tables": sorted(reps)}
    if pool_tables is None and len(pools) > 1:
        pooled["without_largest"] = without_largest(tables, pools, level, weighting)
    return {"level": level, "tables": out, "pooled": pooled,
            "band": "stateff.predict's prediction band for the mean of the seeds measured at the batch",
            "band_wide": f"the same with the model's misfit added (batch_misfit: {batch_misfit.WHAT})"}
