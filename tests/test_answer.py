"""One speed-up per point: wherever the answer is printed (the report's first screen in
report.md, the closing summary in summary.txt, README.md's numbers table), each (machine,
k) has one samples/s growth and one time-to-accuracy speed-up (training only, and with
the evaluation on the clock), both of the step the time-to-accuracy runs trained with:
the growth is samples/s(k) / samples/s(1) of the goodput table (the rates time to
accuracy divides by), and the speed-ups are that table's. A forecast at a measured k
is labelled 'forecast' and comes after the measurement.

The texts are parsed as a reader reads them, not from the records that made them."""
from __future__ import annotations

import csv
import re

import pytest

from conftest import ROOT

pytestmark = pytest.mark.report   # builds whole reports: scheduled before the second-long modules (conftest.TIERS)

X = r"(\d+\.\d\d)x"
BAND = r"(?: \[[\d.]+, [\d.]+\])?"


@pytest.fixture(scope="module")
def h200(tmp_path_factory) -> dict:
    """reference/h200's report, beside the book (the fixtures' report has other machines
    beside it): a GPU machine, where the step that trained (tuned) is not the resize
    cache's series (~10 s)."""
    import json

    from dpscale import report
    out, ref = tmp_path_factory.mktemp("h200") / "report", ROOT / "reference" / "h200"
    plan = json.loads((ref / "plan.json").read_text())
    report.build(ref / "runs", ref / "fingerprint.json", out, targets=[str(ref / "runs" / t) for t in plan["targets"]],
                 references=[], book_path=ROOT / "reference/book_4090.yaml", name="h200",
                 plan_info=plan)
    return {"out": out, "md": (out / "report.md").read_text()}


@pytest.fixture(params=["fixtures", "h200"])
def reports(request, built, h200) -> dict:
    return built if request.param == "fixtures" else h200


def first_screen(md: str) -> str:
    start = md.index("## Will k GPUs train sooner?")
    return md[start:md.index("\n## ", start + 3)]


def expected(out) -> dict:
    """{(machine, k): (growth, training only, with evaluation)} of the goodput table's primary
    LR rule (book), as the page prints them (2 decimals)."""
    rows = [r for r in csv.DictReader(open(out / "tables" / "goodput.csv")) if r["lr_rule"] == "book"]
    base = {r["machine"]: float(r["samples_per_s"]) for r in rows if r["k"] == "1" and r["samples_per_s"]}
    got = {}
    for r in rows:   # the clock form is absent (None) where a k's evaluations were not timed as a job's
        if r["k"] == "1" or not r["samples_per_s"] or not r["speedup_training_only"]:
            continue
        got[(r["machine"], int(r["k"]))] = (f"{float(r['samples_per_s']) / base[r['machine']]:.2f}",
                                            f"{float(r['speedup_training_only']):.2f}",
                                            f"{float(r['speedup']):.2f}" if r["speedup"] else None)
    return got


def clauses(text: str, machine: str):
    """(k, its measured part, its forecast part) of every 'k=K' clause in the lines that
    name `machine` (the headline and the notes)."""
    for line in text.splitlines():
        line = line.lstrip("-* ").replace("**", "")
        if not re.match(rf"{re.escape(machine)}[ ,:(]", line):
            continue
        for seg in re.split(r"(?=\bk=\d+\b)", line)[1:]:
            k = int(re.match(r"k=(\d+)", seg).group(1))
            cut = seg.find("forecast")
            yield k, seg if cut < 0 else seg[:cut], "" if cut < 0 else seg[cut:]


def measured_numbers(part: str) -> dict:
    """The speed-ups a measured clause names, by kind, and any x-number it leaves unnamed."""
    kinds = {"growth": re.findall(rf"samples/s {X}", part),
             "train": re.findall(rf"{X}{BAND} training only", part),
             "clock": re.findall(rf"{X}{BAND} with evaluation", part)}
    named = sum(len(v) for v in kinds.values())
    return {**kinds, "unnamed": len(re.findall(X, part)) - named}


def test_the_first_screen_gives_one_growth_and_one_speedup_per_point(reports):
    """report.md's first section: every clause about a measured (machine, k) names the
    goodput table's growth and speed-ups and no other number; a forecast at that k is
    labelled and comes after; the answer table's measured rows carry the same."""
    want, screen = expected(reports["out"]), first_screen(reports["md"])
    assert want, "the fixtures have a time to accuracy at k > 1"
    for (machine, k), (growth, train, clock) in want.items():
        seen = {"growth": set(), "train": set(), "clock": set()}
        for kk, part, fc in clauses(screen, machine):
            if kk != k:
                continue
            got = measured_numbers(part)
            assert got["unnamed"] == 0, (machine, k, part)
            for kind in seen:
                seen[kind] |= set(got[kind])
        assert seen == {"growth": {growth}, "train": {train}, "clock": {clock} if clock else set()}, (machine, k, seen)
        rows = [r for r in table(screen) if r["machine"] == machine and r["k"] == str(k) and r["run"] != "predicted"]
        assert [(r["throughput_x"], r["tta_train_x"], r["tta_x"]) for r in rows] == \
            [(f"{growth}x", f"{train}x", f"{clock}x" if clock else "–")]


def table(screen: str) -> list[dict]:
    lines = [x for x in screen.splitlines() if x.startswith("| machine |")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    body = screen[screen.index(lines[0]):].splitlines()[2:]
    return [dict(zip(head, (c.strip() for c in x.strip("|").split("|")))) for x in body if x.startswith("|")]


def test_a_forecast_at_a_measured_k_is_labelled_and_follows_the_measurement(reports):
    screen = first_screen(reports["md"])
    for (machine, k) in expected(reports["out"]):
        numbered = [(part, fc) for kk, part, fc in clauses(screen, machine) if kk == k and re.search(X, part + fc)]
        assert re.search(X, numbered[0][0]), (machine, k, "the first number said at this k is a forecast", numbered[0])
    rows = table(screen)
    for i, r in enumerate(rows):
        if r["run"] == "predicted" and any(x["machine"] == r["machine"] and x["k"] == r["k"] and x["run"] !=
                                           "predicted" for x in rows):
            assert "measured row comes first" in r["note"]
            assert i > max(j for j, x in enumerate(rows) if x["machine"] == r["machine"] and x["k"] == r["k"]
                           and x["run"] != "predicted")


def summary_rows(text: str, machine: str) -> dict[int, tuple]:
    """{k: (growth, training only, with evaluation)} of a machine's block in summary.txt."""
    block = text[text.index(f"\n{machine}:"):]
    block = block[:block.find("\n\n", 1)]
    out = {}
    for line in block.splitlines():
        m = re.match(rf"\s+(\d+)\s+{X}{BAND}(?: forecast(?: \d+%)?)?\s+{X}{BAND}\s+(?:{X}|–)", line)
        if m:
            out[int(m.group(1))] = m.groups()[1:]
    return out


def test_the_summary_gives_one_growth_and_one_speedup_per_point(reports):
    """summary.txt: each measured k's row has the goodput table's growth and speed-ups; a
    clause about that k elsewhere in the block is labelled a forecast."""
    text = (reports["out"] / "summary.txt").read_text()
    want = expected(reports["out"])
    for machine in {m for m, _k in want}:
        rows = summary_rows(text, machine)
        for (mm, k), numbers in want.items():
            if mm == machine:
                assert rows.get(k) == numbers, (machine, k, rows)
        block = text[text.index(f"\n{machine}:"):]
        for line in block[:block.find("\n\n", 1)].splitlines():
            for seg in re.split(r"(?=\bk=\d+\b)", line)[1:]:
                if re.findall(X, seg):
                    assert "forecast" in seg.split(" training only")[0], seg




def test_the_first_figure_names_in_its_legend_only_what_it_drew():
    """The first screen's figure of one machine: a machine with no time-to-accuracy result
    (the two-node CPU pair: throughput only, so no forecast drawn either) gets no key and no
    axis for what it did not draw, even beside kept machines that have them; the kept
    machines' figure, where the H200 draws its time to accuracy and forecast, gets them."""
    from dpscale import report
    from dpscale.report.figures.answer import answer, answer_others
    ref = ROOT / "reference" / "cpu2-twonode"
    data = report.load(ref / "runs", ref / "fingerprint.json", None, [ROOT / "reference"],
                       ROOT / "reference/book_4090.yaml", "cpu2-twonode", None, None)

    def keys(fig):
        return [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    fig = answer(data)
    mine, others = keys(fig), keys(answer_others(data))
    assert any(t.startswith("samples/s, measured") for t in mine), mine
    assert not any("time to accuracy" in t or "forecast" in t for t in mine), mine
    assert fig.axes[0].get_xlim()[1] < 4, "the axis runs past the k=1, 2 drawn"
    assert any("time to accuracy" in t for t in others) and any("samples/s, forecast" in t for t in others), others

    # every time-to-accuracy key stands for a mark the axes hold, and every such mark has its key
    from matplotlib.colors import to_hex
    for fig in (answer(data), answer_others(data)):
        lines = [x for x in fig.axes[0].get_lines()]
        drawn = {"reaches the target soonest": any(x.get_marker() == "*" for x in lines),
                 "the same, predicted": any(x.get_linestyle() == "--" for x in lines),
                 "the same, training only (predicted)": any(x.get_linestyle() == ":" for x in lines),
                 "the same, training only (measured)": any(x.get_marker() == "^" for x in lines),
                 "the same, k emulated": any(x.get_marker() in ("s", "^") and to_hex(x.get_markerfacecolor())
                                             == "#ffffff" for x in lines)}
        said = keys(fig)
        for start, mark in drawn.items():
            assert any(t.startswith(start) for t in said) == mark, (start, mark, said)


def _point(k, run, sps, speedup=None, speedup_train=None):
    """A scored time-to-accuracy point as report.tta.timing leaves it (the keys the
    verdict reads): speed-ups as (value, lo, hi) or None where an input was missing."""
    p = {"k": k, "run": run, "scored": True, "samples_per_s": sps, "seeds": [{"launches": 1}] * 3,
         "measurements": [{"label": "latest (runs/)", "pooled": True}]}
    for key, v in (("speedup", speedup), ("speedup_train", speedup_train)):
        val, lo, hi = v or (None, None, None)
        p.update({key: val, f"{key}_lo": lo, f"{key}_hi": hi})
    from dpscale.report.tta import verdict
    p["verdict"] = verdict(p["speedup_lo"], p["speedup_hi"]) if speedup else "not measured"
    p["verdict_train"] = verdict(p["speedup_train_lo"], p["speedup_train_hi"]) if speedup_train else "not measured"
    p["measurements"][0].update(verdict=p["verdict"], verdict_train=p["verdict_train"])   # one measurement: the pool
    return p


def test_a_k_without_samples_per_s_says_which_input_is_missing_and_the_others_keep_the_clock():
    """Issue #52, point 5 (a missing input is said, never answered), as a 2-core CPU box
    prints it: its emulated k=4 point reached the target in samples, but nothing measured
    samples/s at k=4 there. That k says so; k=2, which has both forms, keeps the clock form
    (it fell back to training only for every k, and k=4 read 'not measured')."""
    from types import SimpleNamespace

    from dpscale.report.chapters.answer import headline, verdict_text
    m = SimpleNamespace(kind="run", label="this run", scale="paper", data_sources=lambda: ["real"])
    rows = [{"k": 1, "point": _point(1, "real DDP", 100.0, (1.0, None, None), (1.0, None, None))},
            {"k": 2, "point": _point(2, "real DDP", 150.0, (0.92, 0.27, 2.38), (0.91, 0.27, 2.36))},
            {"k": 4, "point": _point(4, "emulated", None)}]
    text = verdict_text({"rule": {"target": 0.2}, "rows": rows, "machine": m})
    assert "k=2 (real DDP) not distinguishable: 0.92x [0.27, 2.38] with evaluation on the clock, " \
           "0.91x [0.27, 2.36] training only" in text, text
    assert "k=4 (emulated): no time to accuracy, no samples/s at k=4 on this machine" in text, text
    assert "not measured" not in text
    head = headline({"rule": {"target": 0.2, "rule": "linear"}, "rows": rows, "machine": m, "predicted": None,
                     "variant": None})
    assert "k=4 (emulated): no time to accuracy, no samples/s at k=4 on this machine" in head, head
    assert "–" not in head, head   # it printed '– training only, – with evaluation on the clock'
    rows[0]["point"]["samples_per_s"] = None   # no k=1 rate: no k has a time, each says why
    for r in rows[1:]:
        r["point"].update(_point(r["k"], r["point"]["run"], r["point"]["samples_per_s"]))
    text = verdict_text({"rule": {"target": 0.2}, "rows": rows, "machine": m})
    assert text.count("no time to accuracy, no samples/s at k=1 on this machine") == 2, text


def test_a_two_core_run_draws_its_first_figure_over_the_k_it_measured(tmp_path):
    """A 2-core CPU smoke run as the README's command 1 leaves it: time to accuracy at k=1
    and 2 real and at k=4 emulated (which reached the target in samples), and no
    weak-scaling series at its protocol (the smoke's throughput runs at 32 px, time to
    accuracy at 16), so samples/s is the launches' own and k=4 has none. The first figure
    spans the k=1, 2 it drew (a row without a mark stretched it to k=4 here, and on the
    real run to the forecast's k=128), and the answer's verdict says what k=4 lacks."""
    import shutil

    from report_fixtures import BOOK, write_cpu_smoke

    from dpscale import report
    from dpscale.report.chapters.answer import opening, verdict_text
    from dpscale.report.figures.answer import answer
    from dpscale.results import write_json_atomic
    from conftest import CPU_FP
    runs, fp = tmp_path / "results" / "runs", tmp_path / "fingerprint.json"
    targets = [t for t in write_cpu_smoke(runs) if "/ddp_weak/" not in t]
    shutil.rmtree(runs / "ddp_weak")
    write_json_atomic(fp, CPU_FP)
    data = report.load(runs, fp, targets, [], BOOK)
    ax = answer(data).axes[0]
    assert ax.get_xlim()[1] < 4, ax.get_xlim()
    assert max(x for line in ax.get_lines() for x in line.get_xdata()) < 4
    text = verdict_text(opening(data, data.current))
    assert "k=4 (emulated): no time to accuracy, no samples/s at k=4 on this machine" in text, text
