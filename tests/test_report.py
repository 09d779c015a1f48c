"""The report from fixture results (tests/report_fixtures.py): figures, tables, HTML,
Markdown, the plan, intervals, several machines side by side."""
from __future__ import annotations

import base64
import csv
import importlib
import json
import re
import subprocess
import sys

import pytest
from report_fixtures import BOOK, CPU_FP, HUNG_REASON, ROOT, SKIP_K4, SKIP_MEMCPY, write_cpu_smoke

from dpscale.analysis import costmodel
from dpscale import report
from dpscale.results import save
from dpscale.report.chapters import csv_tables, figure_specs

pytestmark = pytest.mark.report   # builds whole reports: scheduled before the second-long modules (conftest.TIERS)

FIGURES = [s.name for _c, s in figure_specs()]


def rows_of(built, table: str) -> list[dict]:
    return list(csv.DictReader((built["out"] / "tables" / f"{table}.csv").open()))


def test_every_declared_figure_and_table_is_written(built):
    out = built["out"]
    assert {p.stem for p in (out / "figures").glob("*.png")} == set(FIGURES)
    for name in FIGURES:
        png = out / "figures" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000, png
        assert png.with_suffix(".svg").read_text().lstrip().startswith(("<?xml", "<svg"))
    for key in csv_tables():
        assert list(csv.reader((out / "tables" / f"{key}.csv").open()))[0], key


def test_html_is_self_contained_and_embeds_every_figure(built):
    html = built["raw_html"]
    imgs = re.findall(r'<img [^>]*src="data:image/png;base64,([^"]+)"', html)
    assert len(imgs) == len(FIGURES)
    assert all(base64.b64decode(b)[:4] == b"\x89PNG" for b in imgs)
    assert not re.search(r'(src|href)="(?!data:|#)', html)   # nothing to fetch
    assert html.count("<table") >= 15


def test_markdown_references_figure_files(built):
    for name in FIGURES:
        assert f"](figures/{name}.png)" in built["md"]


def test_provenance_comes_first(built):
    top = built["html"].split("<section", 1)[0]
    for text in ("commit", "snakemake --cores 2 report", "sha256 c0ffee", "CPU x2 (Fixture CPU); scale smoke; data synthetic",
                 "8x H200 (NV18); scale paper; data real", "measured with commit 0123456789", "4x RTX 4090"):
        assert text in top, text
    html = built["html"]   # the answer first; the provenance's tables and notes a chapter further down
    assert html.index('id="answer"') < html.index('id="overview"') < html.index('id="provenance"')


def test_book_numbers_appear_in_the_books_form(built):
    for text in (built["html"], built["md"]):
        for s in ("3706 samples/s, 1.76x, 88% weak-scaling efficiency",
                  "5881 samples/s, 2.81x, 70% strong-scaling efficiency",
                  "4388 samples/s, 1.64x, 82% weak-scaling efficiency",
                  "predicted comm 2N/beta = 20 ms/step; measured 15 ms (synced 133, no_sync 117)",
                  "4.4 GB/s at the default, 22.1 GB/s configured (5.0x)", "36 all-reduce ops", "6.4M floats"):
            assert s in text, s
    for cite in ("13.6.2, weak-scaling sweep", "13.6.2, strong-scaling sweep", "13.6.2, the no_sync() probe",
                 "13.6.2, bare all-reduce benchmark", "13.6.4, jax_throughput", "13.6.4, the all-reduce census"):
        assert cite in built["html"], cite
    assert "2 CPU process(es): 64.0 samples/s, 1.60x, 80% weak-scaling efficiency" in built["html"]


def test_scale_data_source_and_reasons_are_prominent(built):
    html = built["html"]
    assert "SMOKE SCALE" in html and "SYNTHETIC DATA" in html and 'class="banner alert"' in built["raw_html"]
    for reason in (SKIP_K4, SKIP_MEMCPY, HUNG_REASON):
        assert reason in html and reason in built["md"], reason


def test_the_plan_is_counted_and_every_job_shown(built):
    """This run's plan is exactly the targets it was given; a reference's, its plan.json."""
    plan = {r["machine"].split(":")[0]: r for r in rows_of(built, "plan")}
    ours = plan["this run"]
    assert int(ours["planned"]) == len(built["targets"]) == 34
    assert (ours["ok"], ours["skipped"], ours["hung"], ours["not run"]) == ("25", "8", "1", "0")
    assert (plan["h200x8"]["planned"], plan["h200x8"]["not run"]) == ("34", "1")
    status = rows_of(built, "status")
    k4 = [r for r in status if r["machine"] == "this run" and r["k"] == "4" and r["experiment"] != "ddp_tta"]
    assert len(k4) == 7 and all(r["status"] == "SKIPPED" and r["reason"] == SKIP_K4 for r in k4)
    never = [r for r in status if r["status"] == "NOT RUN"]
    assert [(r["machine"], r["experiment"], r["k"]) for r in never] == [("h200x8", "jax_hlo", "8")]
    assert "h200x8: jax_hlo default k=8 NOT RUN" in built["html"]   # marked in its figure's notes


def test_headlines_compare_like_with_like(built):
    head = built["summary"]["headlines"]["scaling_weak"]
    at2, largest = head.split(". Largest k: ")
    assert at2.startswith("DDP weak scaling at k=2: ")
    assert "this run [seed] 1.60x (80%" in at2 and "book [seed] 1.76x (88%)" in at2 and "h200x8 [seed] 1.80x" in at2
    assert "book k=4 3.29x (82%)" in largest and "h200x8 k=8" in largest and "this run" not in largest


def test_intervals_in_tables(built):
    rows = [r for r in rows_of(built, "scaling") if r["machine"].startswith("this run") and r["status"] == "ok"]
    assert rows and all(float(r["interval_lo"]) <= float(r["mean"]) <= float(r["interval_hi"]) for r in rows)
    k2 = [r for r in rows if r["k"] == "2" and r["experiment"] == "ddp_weak" and r["variant"] == "seed"][0]
    assert k2["repeats"] == "3" and float(k2["speedup_interval_lo"]) < float(k2["speedup"]) < float(k2["speedup_interval_hi"])
    assert float(k2["efficiency_interval_lo"]) < float(k2["efficiency"]) < float(k2["efficiency_interval_hi"]) < 2
    assert k2["covers"] == k2["ratio_covers"] == "timed epochs within one launch"   # what each interval covers
    assert k2["ratio_method"].startswith("Fieller") and "over timed epochs within one launch" in \
        built["summary"]["headlines"]["scaling_weak"]
    probe = [r for r in rows_of(built, "comm_probe") if r["machine"].startswith("this run")][0]
    assert float(probe["comm_interval_lo"]) < float(probe["comm_ms"]) and "distinguishable from 0" in probe["verdict"]
    noise = rows_of(built, "noise")
    assert {r["experiment"] for r in noise} >= {"ddp_weak", "ddp_strong", "jax_weak", "ddp_comm_probe", "allreduce"}
    assert all(0 <= float(r["cv"]) < 1 for r in noise)
    # the page shows them formatted
    assert re.search(r"\[[\d.,]+, [\d.,]+\]", built["md"]) and "%" in built["md"]


def test_csv_tables_hold_numbers_not_display_strings(built):
    import pandas as pd
    frames = {key: pd.read_csv(built["out"] / "tables" / f"{key}.csv") for key in csv_tables()}
    for key, df in frames.items():
        text = df.select_dtypes(exclude="number").astype(str)
        assert not text.isin(["–"]).any().any(), f"{key}.csv holds '–' for a missing number"
        assert not text.apply(lambda col: col.str.contains("np.float", regex=False)).any().any(), \
            f"{key}.csv holds numpy's repr of a number"
    numeric = {"scaling": ["samples_per_s", "mean", "interval_lo", "interval_hi", "speedup", "efficiency",
                           "efficiency_interval_hi", "mfu"],
               "allreduce": ["size_B", "count", "ip_busbw_GBps"], "comm_probe": ["comm_ms", "comm_interval_lo"],
               "noise": ["cv"], "forecast": ["weak_efficiency", "weak_efficiency_lo", "weak_efficiency_hi"],
               "weak_side": [c for c in frames["weak_side"].columns if c != "k"]}
    for key, cols in numeric.items():
        for col in cols:
            assert pd.api.types.is_float_dtype(frames[key][col]) or pd.api.types.is_integer_dtype(frames[key][col]), \
                f"{key}.csv: {col} reads as {frames[key][col].dtype}"
    assert frames["allreduce"]["size_B"].max() > 1_000_000   # "1,048,576" read as a number


def test_allreduce_table_as_nccl_tests_prints_it(built):
    rows = [r for r in rows_of(built, "allreduce") if r["machine"].startswith("h200x8") and r["k"] == "8"]
    assert rows and all(r["oop_time_us"] != "–" and r["ip_time_us"] != "–" for r in rows)
    assert {r["oop_wrong"] for r in rows} == {"0"}
    assert "# Avg bus bandwidth    :" in built["html"] and "out-of-place" in built["html"]


def test_tuned_headline(built):
    head = built["summary"]["headlines"]["tuned"]
    assert "h200x8 k=1: DDP 20,000 (4.0x), MFU 0.34; JAX 23,000 (2.1x), MFU 0.39" in head, head


def test_forecast_tables_and_json(built):
    """The forecast chapter: the book's k=4 predicted from its k <= 2 in the validation
    table (within 5 points, out of sample, each row with its inputs and the naive
    predictors beside it), the summary per machine, a grid to 16 nodes of 8 per machine
    with a band where a spread was measured and none (with the reason) where it was not,
    and the same records in forecast.json."""
    book = [r for r in rows_of(built, "forecast_validation") if r["machine"].startswith("book") and r["k"] == "4"]
    assert {(r["series"], r["scaling"]) for r in book} == {("DDP [seed]", "weak"), ("DDP [seed]", "strong"),
                                                          ("JAX [host]", "weak")}
    assert all(abs(float(r["error_points"])) < 5 and "probe k=4" not in r["inputs"] for r in book), book
    assert all(r["naive_constant"] != "" and r["naive_bare"] != "" and r["predicted_lo"] != "" for r in book)
    assert {r["machine"].split(":")[0] for r in rows_of(built, "forecast_summary")} >= {"book"}
    grid = [r for r in rows_of(built, "forecast") if r["machine"].startswith("book") and r["series"] == "DDP [seed]"]
    assert [int(r["k"]) for r in grid][-1] == 128 and grid[-1]["weak_efficiency_lo"] != ""
    banded = [r for r in rows_of(built, "forecast") if r["weak_efficiency_lo"] != ""]
    assert banded and all(0 < float(r["weak_efficiency_lo"]) < float(r["weak_efficiency_hi"]) for r in banded)
    record = json.loads((built["out"] / "forecast.json").read_text())
    assert record["settings"]["fabric_files"] and len(record["machines"]) >= 2
    assert all("used" not in r for m in record["machines"] for r in m["validation"])


def test_committed_h200x2_counts_its_plan(tmp_path):
    """The 2 x H200 run planned 27 measurements (30 jobs with download, resize and the
    report); 16 ran, 1 hung, 10 never ran before that session's device time was spent."""
    ref = ROOT / "reference" / "h200x2"
    plan = json.loads((ref / "plan.json").read_text())
    s = report.build(ref / "runs", ref / "fingerprint.json", tmp_path, name="h200x2",
                     targets=[str(ref / "runs" / t) for t in plan["targets"]], references=[], book_path=BOOK)
    assert s["counts"]["h200x2"] == {"ok": 16, "skipped": 0, "hung": 1, "failed": 0, "not run": 10}
    # its files are named from the repository, not from the folder this clone sits in
    md = (tmp_path / "report.md").read_text()
    assert str(ROOT) not in md and "reference/h200x2/runs/allreduce/default/k2.json" in md


def test_a_planned_result_that_is_not_sound_refuses_the_report(tmp_path):
    """The report is built from exactly the results it lists: a planned one that is half a
    file, edited by hand or gone refuses the build, naming each (a plain run measures
    them again first: dpscale.plan.replan)."""
    runs = tmp_path / "runs"
    targets = write_cpu_smoke(runs)
    (runs / "ddp_weak" / "seed" / "k2.json").write_text("{ half a file")
    eq = runs / "jax_equality" / "default" / "k2.json"
    eq.write_text(eq.read_text().replace('"status": "ok"', '"status": "ok", "by_hand": 1', 1))
    (tmp_path / "fp.json").write_text(json.dumps(CPU_FP))
    with pytest.raises(report.Refused) as e:
        report.build(runs, tmp_path / "fp.json", tmp_path / "out", targets=targets, references=[], book_path=BOOK)
    assert "ddp_weak/seed/k2.json: unreadable: not valid JSON" in str(e.value)
    assert "jax_equality/default/k2.json: altered: its content does not match its digest" in str(e.value)
    assert not (tmp_path / "out" / "report.html").exists()


def test_missing_keys_no_results_and_corrupt_kept_files_still_build(tmp_path):
    """A kept machine's folder with a damaged result and a result of unknown keys: the report
    builds, shows the rest and names the damaged file (it is left out, never read)."""
    runs = tmp_path / "runs"
    targets = write_cpu_smoke(runs)
    (runs / "ddp_weak" / "seed" / "k2.json").write_text("{ half a file")
    eq = runs / "jax_equality" / "default" / "k2.json"
    save(eq, {**json.loads(eq.read_text()), "metrics": {"something_new": 1.0}})
    (tmp_path / "fp.json").write_text(json.dumps(CPU_FP))
    s = report.build(runs, tmp_path / "fp.json", tmp_path / "out", references=[], book_path=BOOK)
    html = (tmp_path / "out" / "report.html").read_text()
    assert "unreadable artifact" in html and "not valid JSON" in html and "not recorded" in html
    assert len(targets) - 1 == sum(s["counts"]["this run"].values())
    report.build(tmp_path / "nothing", tmp_path / "fp.json", tmp_path / "out2", references=[], book_path=BOOK)
    assert "no result JSONs found" in (tmp_path / "out2" / "report.html").read_text()


def _smoke_data(tmp):
    runs = tmp / "runs"
    targets = write_cpu_smoke(runs)
    (tmp / "fp.json").write_text(json.dumps(CPU_FP))
    return report.load(runs, tmp / "fp.json", targets, [], BOOK, "this run", {}, None)


def _replace_a_figure(draw) -> str:
    """The second figure's function replaced by `draw` (for good: called in a spawned
    process); its name."""
    chapter, spec = list(figure_specs())[1]
    setattr(importlib.import_module(f"dpscale.report.figures.{chapter.key}"), spec.name, draw)
    return spec.name


def _spawned(fn, *args):
    """fn(*args) in a spawned process: its only thread is the main one, so draw_all's
    workers > 1 forks there (it does not beside pytest-xdist's threads)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result(300)


def _nap():
    import time
    time.sleep(5)


def _alone_before_and_beside_a_raw_thread():
    import _thread
    import time
    from dpscale.report.figures import alone
    before = alone()
    _thread.start_new_thread(_nap, ())   # as execnet starts its receiver: invisible to threading
    time.sleep(0.2)
    return before, alone()


def test_figures_fork_only_where_no_other_python_thread_runs():
    """A thread started with _thread (pytest-xdist's execnet receiver) stops the fork:
    threading.active_count() does not see it, and a fork beside it hung a CI run."""
    assert _spawned(_alone_before_and_beside_a_raw_thread) == (True, False)


def _build_with_a_broken_figure(tmp: str, workers: int):
    """The first four figures the chapters declare, the second replaced by one that raises,
    then draw_all. (error, its name, the figures asked for, the figures written). Four, not
    all: what is tested is the failure's path (the figures before and after it, in one
    process or three); every figure is drawn by the tests that build whole reports, and
    drawing all of them here twice was ~20 CPU-s of the quick loop."""
    from pathlib import Path
    from dpscale.report import figures

    def broken(data):
        raise ValueError("a broken figure")
    name = _replace_a_figure(broken)
    four = list(figure_specs())[:4]
    figures.figure_specs = lambda: four   # in the spawned process only
    try:
        figures.draw_all(_smoke_data(Path(tmp)), Path(tmp) / "figures", workers)
        error = None
    except RuntimeError as e:
        error = str(e)
    return error, name, sorted(s.name for _, s in four), sorted(p.stem for p in (Path(tmp) / "figures").glob("*.png"))


@pytest.mark.parametrize("workers", [1, 3])
def test_a_figure_that_raises_is_drawn_as_its_error_and_fails_the_build_after_the_rest(tmp_path, workers):
    """In one process or forked ones: the failing figure's file says what failed, every
    other figure is written, and the build raises naming the figure."""
    error, name, asked, written = _spawned(_build_with_a_broken_figure, str(tmp_path), workers)
    assert error == f"figure {name!r} failed: ValueError: a broken figure", error
    assert name in asked and written == asked, (asked, written)


def _interrupt_a_hung_figure(tmp: str):
    """One figure hangs, SIGALRM interrupts draw_all after 3 s (as a Ctrl-C or a test's
    timeout would); the pids of the drawing processes, and whether each is still alive
    a second later."""
    import os
    import signal
    import time
    from pathlib import Path
    from dpscale.report.figures import draw_all
    _replace_a_figure(lambda data: time.sleep(600))
    data = _smoke_data(Path(tmp))
    pids = []

    def interrupt(*_):
        import multiprocessing
        pids.extend(p.pid for p in multiprocessing.active_children())
        raise KeyboardInterrupt
    signal.signal(signal.SIGALRM, interrupt)
    signal.alarm(3)
    try:
        draw_all(data, Path(tmp) / "figures", 3)
    except KeyboardInterrupt:
        pass
    time.sleep(1)

    def alive(pid):
        try:
            os.kill(pid, 0)
            return not open(f"/proc/{pid}/stat").read().split()[2] == "Z"
        except (OSError, ProcessLookupError):
            return False
    return pids, [alive(p) for p in pids]


def test_an_interrupted_forked_draw_leaves_no_process(tmp_path):
    pids, alive = _spawned(_interrupt_a_hung_figure, str(tmp_path))
    assert len(pids) == 3 and not any(alive), (pids, alive)


def test_figures_are_not_drawn_in_forked_processes_beside_another_thread(tmp_path, monkeypatch):
    """A lock another thread holds at a fork stays held in the child: with a second
    Python thread alive (a pytest-xdist worker has several) the figures are drawn in
    this process, whatever `workers` asks."""
    import threading
    from dpscale.report import figures

    def no_pool(*a, **kw):
        raise AssertionError("forked beside another thread")
    monkeypatch.setattr(figures.multiprocessing, "get_context", no_pool)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        metas = figures.draw_all(_smoke_data(tmp_path), tmp_path / "figures", workers=3)
    finally:
        stop.set()
        other.join()
    assert set(metas) == {s.name for _, s in figure_specs()}


def test_script_help_is_helpful():
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "report.py"), "--help"], capture_output=True,
                       text=True, env={"PYTHONPATH": str(ROOT / "src")})
    assert p.returncode == 0 and "--references" in p.stdout and "reference/<machine>/" in p.stdout


def _bars(fig) -> list[tuple[float, float, float]]:
    """(position, low, high) of every error bar a figure draws, vertical or horizontal."""
    from matplotlib.container import BarContainer, ErrorbarContainer
    out = []
    for ax in fig.axes:
        for c in ax.containers:
            eb = c.errorbar if isinstance(c, BarContainer) else c if isinstance(c, ErrorbarContainer) else None
            for coll in (eb.lines[2] if eb else ()):
                for (x0, y0), (x1, y1) in coll.get_segments():
                    out.append((x0, min(y0, y1), max(y0, y1)) if x0 == x1 else (y0, min(x0, x1), max(x0, x1)))
    return out


def _has(bars, pos, lo, hi, rel=1e-6) -> bool:
    return any(abs(p - pos) < 1e-9 and lo == pytest.approx(a, rel=rel) and hi == pytest.approx(b, rel=rel)
               for p, a, b in bars)


def test_figures_draw_their_intervals_as_error_bars(built):
    """Each plotted throughput, efficiency and communication number carries the interval
    its table gives (the same numbers, from dpscale.report.numbers)."""
    from dpscale.report import load
    from dpscale.report.figures import communication, input_pipeline, jax, scaling as sfig
    from dpscale.report.numbers import probe_rows, scaling
    tmp = built["tmp"]
    data = load(tmp / "results/runs", tmp / "results/fingerprint.json", built["targets"], [tmp / "reference"], BOOK)
    this = data.current
    weak, eff = _bars(sfig.scaling_weak(data)), _bars(sfig.efficiency(data))
    dvj, loader = _bars(jax.ddp_vs_jax(data)), _bars(input_pipeline.loader(data))
    rows = [r for v in ("seed", "cached") for r in scaling(this, "ddp_weak", v) if r["ci_lo"] is not None]
    assert len(rows) == 4
    for r in rows:
        assert _has(weak, r["k"], r["ci_lo"], r["ci_hi"]) and _has(dvj, r["k"], r["ci_lo"], r["ci_hi"])
        assert any(lo == pytest.approx(r["ci_lo"]) and hi == pytest.approx(r["ci_hi"]) for _p, lo, hi in loader)
        if r["k"] > 1:
            assert _has(eff, r["k"], 100 * r["efficiency_lo"], 100 * r["efficiency_hi"])
    probe = [r for r in probe_rows(this) if r["comm_lo"] is not None][0]
    assert any(lo == pytest.approx(probe["comm_lo"]) and hi == pytest.approx(probe["comm_hi"])
               for _p, lo, hi in _bars(communication.comm_probe(data)))
    times = _bars(communication.allreduce(data))
    oop = this.get("allreduce", "default", 2)["metrics"]["table"]["out_of_place"]
    for row in oop:   # the bars are the median call's interval, in time and in busbw
        lo, hi = row["time_us_ci95"]
        assert _has(times, row["bytes"] / 2**20, lo, hi)
        bw = costmodel.busbw(row["bytes"], 1e-6 * row["time_us_median"], 2) / 1e9 * row["time_us_median"]
        assert _has(times, row["bytes"] / 2**20, bw / hi, bw / lo)
    import matplotlib.pyplot as plt
    plt.close("all")


def test_report_writes_the_tidy_table(built):
    import pandas as pd
    df = pd.read_csv(built["out"] / "results.csv")
    assert all(df[c].dtype == "float64" for c in ("value", "ci_lo", "ci_hi"))
    assert set(df.machine) == {"this run", "h200x8"}   # the measured machines, not the book
    assert len(df) > 50


def test_time_to_accuracy_says_emulated_and_splits_goodput(built):
    """samples/s now says which measurement it is ('measured (ddp_weak cached)'), and the
    fixtures' time-to-accuracy runs share the throughput fixtures' per-rank batch, since
    a samples/s at another batch no longer applies."""
    tta_rows = {(r["lr_rule"], r["k"]): r for r in rows_of(built, "tta") if r["machine"] == "this run"}
    assert tta_rows[("book", "4")]["run"] == "emulated" and tta_rows[("book", "2")]["run"] == "real DDP"
    assert tta_rows[("linear", "4")]["samples_to_target"] in ("", "–")   # two seeds did not converge: no score
    assert "2 of 3 launches" in tta_rows[("linear", "4")]["no_result_reason"]
    good = {(r["lr_rule"], r["k"]): r for r in rows_of(built, "goodput") if r["machine"] == "this run"}
    two = good[("book", "2")]   # fixtures: samples 1536 at k=1, 2560 at k=2; weak samples/s 60 and 96
    assert float(two["statistical_efficiency"]) == pytest.approx(1536 / 2560)
    assert float(two["hardware_efficiency"]) == pytest.approx(0.8)
    assert float(two["goodput_efficiency"]) == pytest.approx(0.8 * 1536 / 2560)
    assert two["samples_per_s_source"] == "measured (ddp_weak cached)"
    assert good[("book", "4")]["samples_per_s_source"] == "forecast"
    assert "emulated" in built["summary"]["headlines"]["answer"]


def test_time_to_accuracy_has_one_definition_with_intervals(built):
    """Every speed-up, statistical and goodput efficiency carries its 95% interval over
    seeds; the two forms (evaluation on the clock, training only) are labelled alike in
    the table, the first screen and results.csv; time = samples x (1/samples/s + e)."""
    import pandas as pd
    two = {(r["lr_rule"], r["k"]): r for r in rows_of(built, "goodput") if r["machine"] == "this run"}[("book", "2")]
    for col in ("speedup", "speedup_training_only", "statistical_efficiency", "goodput_efficiency"):
        lo, v, hi = (float(two[c]) for c in (f"{col}_interval_lo", col, f"{col}_interval_hi"))
        assert lo < v < hi, col
    e = float(two["time_to_accuracy_s"]) / 2560 - 1 / 96   # evaluation seconds per sample, the same at k=1
    assert e > 0 and float(two["time_training_only_s"]) == pytest.approx(2560 / 96)
    one = {(r["lr_rule"], r["k"]): r for r in rows_of(built, "goodput") if r["machine"] == "this run"}[("book", "1")]
    assert float(two["speedup"]) == pytest.approx(float(one["time_to_accuracy_s"]) / float(two["time_to_accuracy_s"]))
    head = built["summary"]["headlines"]["answer"]
    assert "evaluation on the clock" in head and "training only" in head and re.search(r"\d\.\d\dx \[", head)
    df = pd.read_csv(built["out"] / "results.csv")
    got = df[(df.machine == "this run") & (df.experiment == "ddp_tta") & (df.variant == "book") & (df.k == 2)]
    for metric in ("statistical_efficiency", "tta_speedup", "tta_speedup_training_only", "goodput_efficiency"):
        row = got[got.metric == metric].iloc[0]
        assert row.ci_lo < row.value < row.ci_hi and row.covers == "independent seeded launches" and row.unit == "1"
    assert (df[df.variant == "book (forecast)"].metric == "predicted_tta_speedup").any()


def test_time_to_accuracy_interpolates_fits_checks_and_forecasts(built):
    """Each seed's crossing beside MLPerf's; the E(B) fit; k=4 predicted from k <= 2 with
    its error and band; B_simple where measured, else 'not measured'; the forecast on
    the throughput forecast's grid (to 16 nodes of 8), the soonest k named first screen."""
    seeds = [r for r in rows_of(built, "tta_seeds") if r["machine"] == "this run" and r["lr_rule"] == "book"]
    assert len(seeds) == 9 and {r["crossing"] for r in seeds} <= {"interpolated", "exact", "never"}
    assert all(r["mlperf_epochs"] and r["epochs"] for r in seeds if r["converged"] == "True")
    model = {(r["lr_rule"], r["model"].split(":")[0]): r for r in rows_of(built, "tta_model") if r["machine"] == "this run"}
    assert float(model[("book", "line")]["b_crit_samples"]) > 0 and model[("book", "line")]["e_min_interval_lo"] != ""
    assert float(model[("book", "power law")]["alpha"]) > 0
    assert float(model[("book", "line")]["weight"]) + float(model[("book", "power law")]["weight"]) == pytest.approx(1)
    check = {(r["lr_rule"], r["k"]): r for r in rows_of(built, "tta_holdout") if r["machine"] == "this run"
             and r["check"] == "forward"}
    four = check[("book", "4")]
    assert four["predicted_from"] == "k = 1, 2" and four["combined_inside"] in ("True", "False")
    for m in ("line", "power", "combined"):   # each model and their mixture, with its band
        assert float(four[f"{m}_band_lo"]) < float(four[f"{m}_epochs"]) < float(four[f"{m}_band_hi"]), m
    noise = {(r["lr_rule"], r["k"], r["window"].split(" (")[0]): r for r in rows_of(built, "tta_noise")
             if r["machine"] == "this run"}
    start = "step 0 to the target"
    assert float(noise[("book", "2", start)]["b_noise"]) == pytest.approx(20.0, rel=0.05)
    assert noise[("book", "2", start)]["b_crit_over_b_noise"] != "" and noise[("book", "4", start)]["b_noise"] == \
        "not measured"
    grid = [r for r in rows_of(built, "tta_forecast") if r["machine"] == "this run" and r["lr_rule"] == "book"]
    assert [int(r["k"]) for r in grid][-1] == 128 and {r["samples_input"] for r in grid} >= {"measured", "predicted"}
    good = [r for r in rows_of(built, "goodput") if r["machine"] == "this run" and r["lr_rule"] == "book"]
    # e(k), evaluation seconds per sample, where k was measured (fixtures: 0.5 s / k every 512 samples); past the
    # largest measured k, that k's: the forecast claims no gain from sharding it did not see
    e = {int(r["k"]): float(r["time_to_accuracy_s"]) / float(r["time_training_only_s"]) / 1 for r in good
         if r["time_to_accuracy_s"] and r["time_training_only_s"]}
    e = {k: (t - 1) / float(next(r for r in good if int(r["k"]) == k)["samples_per_s"]) for k, t in e.items()}
    assert e[2] == pytest.approx(0.5 / 2 / 512) and e[1] == pytest.approx(0.5 / 512)
    for r in (r for r in grid if r["samples_per_s"]):         # the clock form carries the evaluation, band and all
        sps, ek = float(r["samples_per_s"]), e[max(j for j in e if j <= int(r["k"]))]
        assert float(r["time_to_accuracy_s"]) == pytest.approx(float(r["time_training_only_s"]) * (1 + ek * sps))
        assert float(r["time_to_accuracy_band_lo"]) < float(r["time_to_accuracy_s"]) < float(r["time_to_accuracy_band_hi"])
    assert any(r["nodes"] == "4" and r["speedup_band_lo"] != "" for r in grid)
    lines = built["summary"]["headlines"]["answer"] + built["html"]
    assert "soonest at k=" in lines and "fewest GPU-hours at k=" in lines


def test_the_summary_ends_with_the_report_and_names_failures(built):
    text = (built["out"] / "summary.txt").read_text()
    last = text.rstrip("\n").splitlines()
    assert last[-1] == f"report: {(built['out'] / 'report.html').resolve()}"
    assert "ddp_memcpy_training/default/k2 hung" in text   # this run's, with its reason
    mine = text[text.index("this run:"):text.index("h200x8:")]
    assert re.search(r"\n\s+2\s+1\.60x \[[\d.]+, [\d.]+\]\s+[\d.]+x \[", mine), mine
    assert "forecast knee" in mine and "soonest to 60%: k=" in mine and "fewest GPU-hours: k=" in mine


def test_a_numpy_number_reaches_the_csv_as_a_number():
    """The forecast's numpy scalars were written as 'np.float64(0.98)' (repr of numpy 2's
    scalars) in the committed reports' forecast.csv; pandas read the column as text."""
    import numpy as np
    from dpscale.report.render import _csv_value
    assert _csv_value(np.float64(0.25)) == "0.25" and _csv_value(0.1) == "0.1" and _csv_value(None) == ""


@pytest.mark.timeout(20)
def test_fresh_seeds_are_listed_without_spanning_their_range():
    """Fresh seeds are random 31-bit numbers: '1-5' is for a run of consecutive seeds only,
    found without building the range between the smallest and the largest (which held the
    first fresh-seed report for 208 s and took 24 GB)."""
    from dpscale.report.chapters.tta import listed, seeds_text
    assert seeds_text([3, 1, 2, 4, 5]) == "1-5"
    fresh = [1715080628, 395013632, 1715840148, 878780210, 1924942291]
    assert seeds_text(fresh) == listed(fresh)
