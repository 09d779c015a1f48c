"""`dpscale compare A B`: machine B against machine A, like for like.

For every (experiment, variant, k) that both kept folders hold with status ok, and
every metric both results carry (samples/s, all-reduce bus bandwidth), one row: A's
number, B's, and B/A with a 95% interval computed on the ratio (stats.ratio_ci via
numbers.ratio, the two machines' samples independent), and what the interval covers
(independent launches, or timed epochs within one launch). A result with a single
number (no repeats) gives the ratio with no interval, and the row says so.
"""
from __future__ import annotations

from pathlib import Path

from dpscale import layout
from dpscale.report.machines import Machine, load_found
from dpscale.report.numbers import fmt_num, metric, ok, ratio, samples

# metric -> unit; each compared as its per-launch samples, else its repeats, else its one number
METRICS = {"samples_per_s": "samples/s", "busbw_GBps_64MiB": "GB/s", "avg_busbw_GBps": "GB/s"}
# Protocol keys that change the spread, not the number. warmup_steps: once warm, the first
# timed epoch reads as the second, whether the warm-up was the book's epoch or 50 steps
# (docs/measurements/launch-cost_h200_2026-12-03.md).
SAME_ANYWAY = ("repeats", "launches", "warmup_steps")
COLUMNS = ["experiment", "variant", "k", "metric", "unit", "A", "B", "B/A", "ci_lo", "ci_hi", "n_A", "n_B",
           "covers", "note"]


def load(folder: Path) -> Machine:
    """A kept machine folder (<dir>/runs/<experiment>/<variant>/k<k>.json), or one clear line."""
    kept = layout.kept(folder)
    if not kept.has_results():
        raise SystemExit(f"dpscale compare: {kept.runs} is missing; pass a folder kept by `dpscale keep` "
                         f"(layout {layout.result_path('<experiment>', '<variant>', '<k>', '<dir>/runs')}), "
                         "e.g. reference/h200")
    m = load_found(kept.runs, kept.fingerprint, key=kept.root.name, kind="reference", label=kept.root.name)
    if m.errors:   # a result that cannot be read as measured is left out, and named
        import sys
        print(f"dpscale compare: {kept.root}: left out:", *(f"  {e}" for e in m.errors), sep="\n", file=sys.stderr)
    if not m.results:
        raise SystemExit(f"dpscale compare: {kept.runs} holds no result "
                         f"{layout.job_label('<experiment>', '<variant>', '<k>')}.json")
    return m


def _differ(a: dict, b: dict, skip=()) -> list[str]:
    return [f"{k} ({a.get(k)} vs {b.get(k)})" for k in sorted(set(a) | set(b)) if k not in skip and a.get(k) != b.get(k)]


def _protocol_note(ra: dict, rb: dict) -> str:
    """What makes two results not like for like: the protocol, the tuned step's own
    choices (stem, projection, ...), the data (real against the synthetic stand-in)."""
    ca, cb = ra.get("config") or {}, rb.get("config") or {}
    da, db = ra.get("data") or {}, rb.get("data") or {}
    parts = [(what, d) for what, d in (
        ("protocol", _differ(ca.get("protocol") or {}, cb.get("protocol") or {}, SAME_ANYWAY)),
        ("tuned step", _differ(ca.get("tuned") or {}, cb.get("tuned") or {})),
        ("data", _differ({"source": da.get("source")}, {"source": db.get("source")}))) if d]
    return "not like for like: " + "; ".join(f"{what} differs in " + ", ".join(d) for what, d in parts) \
        if parts else ""


def same_measurement(ra: dict, rb: dict) -> bool:
    """One measurement in two folders (a run and its kept copy: `keep` rewrites paths and
    seals again, so the digests differ): started at the same instant with the same numbers."""
    return ra.get("started_utc") == rb.get("started_utc") and ra.get("metrics") == rb.get("metrics")


def _row(key: tuple, name: str, ra: dict, rb: dict) -> dict:
    (xa, _), (xb, _) = samples(ra, name), samples(rb, name)
    r = ratio(rb, ra, name)
    e, v, k = key
    if same_measurement(ra, rb):   # no ratio of independent samples: one set of launches read twice
        r = {**r, "ci_lo": None, "ci_hi": None, "covers": ""}
        note = "one measurement in both folders (a copy): no interval"
    else:
        note = "" if r["ci_lo"] is not None else (
            f"no interval: B has {len(xb)} sample(s), A has {len(xa)}; an interval needs 2 on each side"
            if min(len(xa), len(xb)) < 2 else r["method"])
    note = "; ".join(t for t in (note, _protocol_note(ra, rb)) if t)
    return {"experiment": e, "variant": v, "k": k, "metric": name, "unit": METRICS[name],
            "A": sum(xa) / len(xa), "B": sum(xb) / len(xb), "B/A": r["value"], "ci_lo": r["ci_lo"],
            "ci_hi": r["ci_hi"], "n_A": len(xa), "n_B": len(xb), "covers": r["covers"], "note": note}


def rows(a: Machine, b: Machine) -> list[dict]:
    """One row per like-for-like point and metric that both machines measured."""
    out = []
    for key in sorted(set(a.results) & set(b.results)):
        ra, rb = a.results[key], b.results[key]
        if not (ok(ra) and ok(rb)):
            continue
        for name in METRICS:
            if metric(ra, name) is not None and metric(rb, name) is not None:
                out.append(_row(key, name, ra, rb))
    return out


def table(a: Machine, b: Machine):
    """The rows as a pandas DataFrame (numbers stay numbers)."""
    import pandas as pd
    return pd.DataFrame(rows(a, b), columns=COLUMNS)


def render(a: Machine, b: Machine) -> str:
    """The table as text, with a head that says what B/A and the interval are."""
    import pandas as pd
    df = table(a, b)
    head = (f"A = {a.label} ({a.hardware}), B = {b.label} ({b.hardware}): each a mean over its samples "
            "(n_A, n_B).\nB/A with its 95% interval [ci_lo, ci_hi], computed on the ratio (Fieller's, the "
            "machines' samples independent), over what `covers` says.")
    if df.empty:
        return head + f"\nNo (experiment, variant, k) has an ok result in both {a.source} and {b.source}."
    ratio_text = {c: df[c].map(lambda x: "–" if pd.isna(x) else f"{x:.3f}") for c in ("B/A", "ci_lo", "ci_hi")}
    shown = df.assign(A=df["A"].map(fmt_num), B=df["B"].map(fmt_num), covers=df["covers"].replace("", "–"),
                      **ratio_text)
    return head + "\n" + shown.to_string(index=False)


def compare(folder_a: Path, folder_b: Path) -> str:
    if Path(folder_a).resolve() == Path(folder_b).resolve():
        raise SystemExit(f"dpscale compare: {folder_a} and {folder_b} are one folder; a ratio of a machine to itself "
                         "is 1 by construction, and its interval would treat one set of launches as two independent "
                         "ones. Name two kept machines, e.g. dpscale compare reference/h200 reference/h200x2")
    a, b = load(folder_a), load(folder_b)
    warn = [f"warning: unreadable result skipped: {e}" for e in a.errors + b.errors]
    return "\n".join(warn + [render(a, b)])
