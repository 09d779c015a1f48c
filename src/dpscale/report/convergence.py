"""`dpscale convergence FILE [FILE ...]`: the E(B) model checked out of sample on published
convergence tables (MLPerf RCP JSON or a batch,seed,samples CSV), every row and the
summary per table and pooled, as text or JSON (dpscale.analysis.convergence_check)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

HELP = """Each table's global batches predicted from the smaller ones only: the E(B) model
(stateff.fit_batch_model) with its 95% prediction band (the seeds' spread and the fit's
uncertainty) and the same band with the model's misfit added (batch_misfit), beside the
naive "previous batch" and "linear from the last two". Errors are (predicted - measured)
/ measured in %. The pooled summary counts one table per family (tables sharing a
benchmark or an entry are one family). Method: docs/public-convergence.md.

  dpscale convergence reference/public/convergence
  dpscale convergence my_table.csv --pool reference/public/convergence   (misfit borrowed from the public tables)
  dpscale convergence reference/public/convergence --json > check.json
  dpscale convergence rcps_resnet.json --to-csv DIR     (MLPerf's RCP JSON kept as the CSV it reads back from)"""
NAMES = {"model": "E(B) model", "previous": "previous batch", "linear": "linear from the last two"}


def add_parser(sub) -> None:
    import argparse
    c = sub.add_parser("convergence", help="check the E(B) model out of sample on convergence tables",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("files", nargs="+", type=Path, metavar="FILE",
                   help="MLPerf RCP .json (rcps_<benchmark>.json) or .csv with columns batch,seed,samples (or epochs)")
    c.add_argument("--pool", type=Path, action="append", default=None, metavar="PATH",
                   help="tables (a file, or a folder searched for .json/.csv) whose residuals a table with "
                        "fewer than 3 of its own may borrow for the misfit (default: the FILEs themselves)")
    c.add_argument("--level", type=float, default=0.95, help="the bands' level (default: %(default)s)")
    c.add_argument("--samples-per-epoch", type=float, default=None,
                   help="convert tables in epochs to samples (the check is the same in either unit)")
    form = c.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print the check as JSON instead of text")
    form.add_argument("--markdown", action="store_true",
                      help="print the tables as Markdown (docs/public-convergence.md holds this output)")
    form.add_argument("--to-csv", type=Path, default=None, metavar="DIR",
                      help="check nothing: write each FILE, as read, to DIR/<its name>.csv (batch,seed,samples "
                           "or epochs, with its benchmark and notes), which reads back to the same table")


def _files(paths: list[Path]) -> list[Path]:
    out = []
    for p in paths:
        out += sorted(q for q in p.rglob("*") if q.suffix.lower() in (".json", ".csv")) if p.is_dir() else [p]
    return out


def run(a) -> int:
    from dpscale.analysis import convergence as cv, convergence_check as cc
    try:
        tables = [cv.read(f, a.samples_per_epoch) for f in _files(a.files)]
        pool = None if a.pool is None else [cv.read(f, a.samples_per_epoch) for f in _files(a.pool)]
    except cv.ConvergenceInputError as e:
        raise SystemExit(f"dpscale convergence: {e}") from None
    if a.to_csv is not None:
        return _to_csv(tables, a.to_csv)
    if not 0 < a.level < 1:
        raise SystemExit(f"dpscale convergence: --level {a.level} is not between 0 and 1; give e.g. 0.95")
    result = cc.check(tables, pool, level=a.level)
    sys.stdout.write(json.dumps(result, indent=1) + "\n" if a.json else markdown(result) if a.markdown
                     else text(result))
    return 0


def _to_csv(tables: list, folder: Path) -> int:
    from dpscale.analysis import convergence as cv
    names = [t.name for t in tables]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SystemExit(f"dpscale convergence: --to-csv: tables {twice} would be written to one file; "
                         "convert them one at a time")
    for t in tables:
        print(cv.write_csv(t, folder))
    return 0


def _g(x, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def _pct(x, sign: bool = True) -> str:
    return "-" if x is None else (f"{x:+.1f}" if sign else f"{x:.1f}")


def _yes(flag) -> str:
    return "-" if flag is None else ("yes" if flag else "NO")


COLUMNS = ("batch", "from", "seeds", "measured", "seed cv%", "predicted", "band (seeds+fit)", "in",
           "band (+misfit)", "in", "misfit", "error%", "previous%", "linear%", "note")


def row_cells(r: dict) -> list[str]:
    """One row of the table, as strings (COLUMNS)."""
    head = [str(r["batch"]), "", f"{r['n']}" + (f"+{r['censored']} cens." if r["censored"] else ""),
            _g(r["measured"]), _pct(None if r["seed_cv"] is None else 100 * r["seed_cv"], False)]
    if r["note"]:
        return head + [""] * (len(COLUMNS) - len(head) - 1) + [r["note"]]
    fb = r["fit_batches"]
    head[1] = f"{fb[0]}..{fb[-1]} ({len(fb)})"
    mis = "-" if r["misfit_rel_sd"] is None else f"{100 * r['misfit_rel_sd']:.1f}% {r['misfit_source']}({r['misfit_k']})"
    return head + [_g(r["predicted"]), f"[{_g(r['band_lo'])}, {_g(r['band_hi'])}]", _yes(r["inside"]),
                   f"[{_g(r['wide_lo'])}, {_g(r['wide_hi'])}]", _yes(r["inside_wide"]), mis,
                   _pct(r["error_model"]), _pct(r["error_previous"]), _pct(r["error_linear"]),
                   f"reads {r['leaks']} at or above its batch" if r["leaks"] else ""]


def _grid(rows: list[list[str]]) -> str:
    widths = [max(len(c[i]) for c in rows) for i in range(len(rows[0]))]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip() for cells in rows)


def _cov(c: dict) -> str:
    if not c["n"]:
        return "no rows"
    return f"{c['k']}/{c['n']} = {100 * c['rate']:.0f}% [{100 * c['ci_lo']:.0f}, {100 * c['ci_hi']:.0f}]"


def summary_text(s: dict) -> str:
    """The winner on mean |error| first (a naive one said so), then each predictor and both coverages."""
    if not s["compared"]:
        return f"  no row predicted ({s['skipped']} rows with fewer than 2 smaller batches or no fit)"
    e = s["error_pct"]
    win = s["winner"]
    lead = ("the E(B) model is best" if win == ["model"] else
            f"a naive predictor wins: {NAMES[win[0]]}" if len(win) == 1 else
            "a tie between " + " and ".join(NAMES[p] for p in win))
    errs = ", ".join(f"{NAMES[p]} {e[p]['mean_abs']:.1f} (median {e[p]['median_abs']:.1f}, max {e[p]['max_abs']:.1f})"
                     for p in e)
    return (f"  {lead} on mean |error| % over {s['compared']} rows: {errs}\n"
            f"  95% band coverage (exact 95% interval over rows): seeds+fit {_cov(s['coverage'])}; "
            f"+misfit {_cov(s['coverage_wide'])}; median half-width {s['median_half_width_pct']['band']:.1f}% and "
            f"{s['median_half_width_pct']['band_wide']:.1f}% of the prediction"
            + "".join(f"\n  +misfit where it is {src}: {_cov(b['coverage_wide'])}, median half-width "
                      f"{b['median_half_width_pct']:.1f}%" for src, b in s["by_misfit_source"].items())
            + (f"\n  +misfit without its largest contributor ({s['without_largest']['family']}, "
               f"{100 * s['without_largest']['share']:.0f}% of the pool's squared errors), its rows left out too: "
               f"{_cov(s['without_largest']['coverage_wide'])}, median half-width "
               f"{s['without_largest']['median_half_width_pct']:.1f}%" if s.get("without_largest") else "")
            + (f"\n  LEAKS: {s['leaks']}" if s["leaks"] else ""))


def text(result: dict) -> str:
    out = [f"The E(B) model out of sample: each batch from the smaller ones only ({100 * result['level']:.0f}% bands).",
           f"band (seeds+fit): {result['band']}; band (+misfit): {result['band_wide']}.",
           "misfit: its relative sd, own(k) from the table's own k residuals or pooled(k) with other families'.", ""]
    for tab in result["tables"]:
        notes = f"; {'; '.join(tab['notes'])}" if tab["notes"] else ""
        out += [f"{tab['name']} ({tab['benchmark']}, {tab['unit']} to target{notes})",
                _grid([list(COLUMNS)] + [row_cells(r) for r in tab["rows"]]), summary_text(tab["summary"]), ""]
    p = result["pooled"]
    out += [f"POOLED over {len(p['tables'])} tables, one per family: {', '.join(p['tables'])}", summary_text(p)]
    return "\n".join(out) + "\n"


def _md_table(rows: list[list[str]]) -> str:
    cells = [[c.replace("|", "/") for c in r] for r in rows]
    return "\n".join(["| " + " | ".join(cells[0]) + " |", "|" + "---|" * len(cells[0])]
                     + ["| " + " | ".join(r) + " |" for r in cells[1:]])


SUMMARY = ("table", "rows", "band (seeds+fit)", "band (+misfit)", "half-width (+misfit)",
           "model abs error % mean / median / max", "previous", "linear", "best on mean")


def summary_cells(name: str, s: dict) -> list[str]:
    """One line of the summary table: a table's (or the pool's) coverage, errors and winner."""
    if not s["compared"]:
        return [name, "0"] + ["-"] * (len(SUMMARY) - 2)
    e, c, w = s["error_pct"], s["coverage"], s["coverage_wide"]
    err = [f"{e[p]['mean_abs']:.1f} / {e[p]['median_abs']:.1f} / {e[p]['max_abs']:.1f}" for p in e]
    return [name, str(s["compared"]), f"{c['k']}/{c['n']}", f"{w['k']}/{w['n']}",
            f"{s['median_half_width_pct']['band_wide']:.1f}%", *err, " = ".join(s["winner"])]


def markdown(result: dict) -> str:
    """A summary table (every table, then the pool), then every table's rows, as Markdown."""
    p = result["pooled"]
    out = [_md_table([list(SUMMARY)] + [summary_cells(t["name"], t["summary"]) for t in result["tables"]]
                     + [summary_cells(f"**pooled, one table per family ({len(p['tables'])})**", p)]), ""]
    for tab in result["tables"]:
        notes = f"; {'; '.join(tab['notes'])}" if tab["notes"] else ""
        out += [f"#### {tab['name']} ({tab['benchmark']}, {tab['unit']} to target{notes})", "",
                _md_table([list(COLUMNS)] + [row_cells(r) for r in tab["rows"]]), "",
                summary_text(tab["summary"]).replace("\n  ", "\n\n").strip(), ""]
    p = result["pooled"]
    out += [f"#### Pooled over {len(p['tables'])} tables, one per family", "", ", ".join(p["tables"]), "",
            summary_text(p).replace("\n  ", "\n\n").strip()]
    return "\n".join(out) + "\n"
