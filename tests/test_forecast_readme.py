"""README.md's "Forecast" section states what `dpscale forecast --json` over the committed
references prints today: every row of its summary table, the coverage, the errors, which
predictor did best, the settings and the fabric check's figures; docs/forecast.md's
"Every row, today" holds every row of its validation table. Every number in the README's
section is checked: what the checks below do not account for (a table row, a sentence
they read) may hold no digit but in file names, issue numbers and formulas."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFS = ["h200", "h200x2", "cpu16-standin", "cpu2-twonode"]
LABEL = {"h200": "1 x H200", "h200x2": "2 x H200", "cpu16-standin": "16-core stand-in",
         "cpu2-twonode": "two-node stand-in", "book": "book (4 x RTX 4090)"}
NAIVE = {"naive_constant": "the efficiency at the largest smaller k", "naive_ring": "the ring-scaled overhead",
         "naive_bare": "the fully exposed all-reduce"}


def section(path="README.md", heading="## Forecast", table="| machine | rows | model: mean / max error |") -> str:
    """A page's section, from its heading to the next heading of its level (or the end)."""
    text = (ROOT / path).read_text()
    m = re.search(rf"^{re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"{path} has no '{heading}' section"
    body = m.group(1)
    assert table in body, f"{path}'s '{heading}' section has no table headed '{table}'"
    return body


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from dpscale import cli
    out = tmp_path_factory.mktemp("fc") / "forecast.json"
    assert cli.main(["forecast", *[str(ROOT / "reference" / r) for r in REFS], "--json", str(out)]) == 0
    return json.loads(out.read_text())


def key(machine: str) -> str:
    return machine.split(":")[0]


def pc(x) -> str:
    return f"{100 * x:.1f}%"


def validation_rows(live) -> list[str]:
    """The README's validation table, row by row, as the live forecast has it."""
    out = []
    for m in live["machines"]:
        for r in m["validation"]:
            point = f"{r['series']} {r['scaling']} k={r['k']}" + (f", {r['nodes']} nodes of 1" if r["nodes"] > 1 else "")
            meas = pc(r["measured"]) + (f" [{100 * r['measured_lo']:.1f}, {100 * r['measured_hi']:.1f}]"
                                        if r["measured_lo"] is not None else "")
            naive = " / ".join("–" if r[k] is None else pc(r[k]) for k in ("naive_constant", "naive_ring", "naive_bare"))
            src = "own rows" if r["misfit_from"].startswith("this machine") else "pooled"
            out.append(f"| {LABEL[key(m['machine'])]} | {point} | {r['method']} | {pc(r['predicted'])} "
                       f"[{100 * r['predicted_lo']:.1f}, {100 * r['predicted_hi']:.1f}] | {meas} | "
                       f"{r['error_points']:+.1f} | {100 * r['misfit']:.1f}% ({src}) | {naive} |")
    return out


def summary_rows(live) -> list[str]:
    out = []
    for m in live["machines"]:
        s, v = m["summary"], m["summary"]["verdict"]
        if not s["model"]["n"]:
            out.append(f"| {LABEL[key(m['machine'])]} | 0 | – | – | – | – | – | nothing measured at k >= 2 |")
            continue

        def nv(k):
            return "–" if k not in v else f"{v[k]['mean_abs']:.2f} on {v[k]['n']} (model {v[k]['model_mean_abs']:.2f})"
        best = "the model" if v["winner"] == "model" else f"**{NAIVE[v['winner']]}**"
        out.append(f"| {LABEL[key(m['machine'])]} | {s['model']['n']} | {s['model']['mean_abs']:.1f} / "
                   f"{s['model']['max_abs']:.1f} | {s['inside']} of {s['banded']} | {nv('naive_constant')} | "
                   f"{nv('naive_ring')} | {nv('naive_bare')} | {best} |")
    return out


def sentences(live) -> list[str]:
    """The section's sentences with numbers, as the live forecast has them."""
    p, cfg = live["pooled_coverage"], live["settings"]
    h200 = next(m for m in live["machines"] if key(m["machine"]) == "h200")
    tuned = next(s for s in h200["series"] if s["series"] == "DDP [tuned]")
    k8 = next(r for r in tuned["rows"] if r["k"] == cfg["gpus_per_node"])
    out = [f"k = 1..{cfg['gpus_per_node']} in one node and 2..{cfg['max_nodes']} nodes of {cfg['gpus_per_node']}",
           f"{p['inside']} of {p['banded']} rows fall inside their {100 * cfg['band_level']:.0f}% band "
           f"({100 * p['coverage']:.0f}%)",
           f"{cfg['bootstrap_draws']} bootstrap draws",
           f"1 x H200's DDP [tuned] at k={cfg['gpus_per_node']} reads {pc(k8['weak_efficiency'])} whatever else is on "
           "the command line"]
    for m in live["machines"]:
        v = m["summary"]["verdict"]
        if v["winner"] != "model":
            w = v[v["winner"]]
            out.append(f"on the {LABEL[key(m['machine'])]}, {NAIVE[v['winner']]} did better out of sample "
                       f"({w['mean_abs']:.2f} against the model's {w['model_mean_abs']:.2f} points mean |error| on "
                       f"its {w['n']} rows)")
    return out


def fabric_sentences() -> list[str]:
    """The fabric check's two figures as the README states them: the checked cases, then
    the held-out ones, leading with whichever predictor did better there."""
    from dpscale.report import forecast as fcr
    summary = fcr.fabric_check(ROOT / "reference" / "fabrics" / "nccl-tests")["summary"]
    s, h = summary["checked"], summary["held_out"]
    out = (f"{s['cases']} cases of {s['clusters']} clusters with mean absolute error {s['model_mean_abs_pct']:.1f}% "
           f"against the naive constant busbw's {s['naive_mean_abs_pct']:.1f}%" if s["model_mean_abs_pct"] <=
           s["naive_mean_abs_pct"] else f"{s['cases']} cases of {s['clusters']} clusters: **the naive constant "
           f"did better** ({s['naive_mean_abs_pct']:.1f}% against {s['model_mean_abs_pct']:.1f}%)")
    won = h["naive_mean_abs_pct"] < h["model_mean_abs_pct"]
    return [out, f"on the {h['cases']} outputs kept back, "
                  + (f"**the naive constant did better** ({h['naive_mean_abs_pct']:.1f}% against "
                     f"{h['model_mean_abs_pct']:.1f}%)" if won else
                     f"the model did better ({h['model_mean_abs_pct']:.1f}% against {h['naive_mean_abs_pct']:.1f}%)")]


ALLOWED = [r"[\w./-]*\d[\w./-]*\.(txt|json|yaml|md|py)",   # file names
           r"#\d+",                                          # issue numbers
           r"2\(k-1\)/k", r"2\(N-1\)/N", r"e_k", r"k'", r"k=\d+", r"k >= 2", r"t_c\(B\)",
           r"nccl-tests\s?\d[\d.]*", r"f = 1",
           r"\b(G?H\d{3}|A100|RTX \d{4})\b",                    # GPU models
           r"16-core"]                                            # a machine's name


def table_rows(body: str) -> list[str]:
    return [x for x in body.splitlines() if x.startswith("| ") and not x.startswith(("| machine", "|---"))]


def test_every_validation_row_in_the_docs_is_the_forecast_s(live):
    """docs/forecast.md's "Every row, today": every validation row the live forecast prints."""
    rows, want = table_rows(section("docs/forecast.md", "## Every row, today",
                                    "| machine | point | predicted from | predicted [band] |")), validation_rows(live)
    assert sorted(rows) == sorted(want), (
        "rows the page has that the forecast does not: " + repr(sorted(set(rows) - set(want))) +
        "; rows the forecast has that the page does not: " + repr(sorted(set(want) - set(rows))))


def test_the_forecast_section_states_what_the_forecast_prints(live):
    body = section()
    lines = body.splitlines()
    table, want_s = table_rows(body), summary_rows(live)
    assert sorted(table) == sorted(want_s), (
        "rows the README has that the forecast does not: " + repr(sorted(set(table) - set(want_s))) +
        "; rows the forecast has that the README does not: " + repr(sorted(set(want_s) - set(table))))
    flat = " ".join(x.strip() for x in lines if not x.startswith("|"))
    rest = re.sub(r"```.*?```", " ", " ".join(x for x in body.split("\n") if not x.startswith("|")), flags=re.S)
    rest = " ".join(rest.split())
    for s in sentences(live) + fabric_sentences():
        assert " ".join(s.split()) in " ".join(flat.split()), s
        rest = rest.replace(" ".join(s.split()), " ")
    for pattern in ALLOWED:
        rest = re.sub(pattern, " ", rest)
    leftover = re.findall(r"[^\s]*\d[^\s]*", rest)
    assert not leftover, f"numbers in the Forecast section that no check reads: {leftover}"
