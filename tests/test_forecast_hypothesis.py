"""Guarantees of `dpscale forecast` as properties over random inputs (hypothesis), on the
committed machines (reference/*/ and the book), built once per module; each example
varies only the cheap part (a factor, a series, a subset of machines, one dropped file):

- a fabric file scaled slower (times x f, f in [1, 100]) never raises a forecast row's
  efficiency nor lowers its step time; scaled faster (f in [0.01, 1]) never the reverse;
  whichever tier's file is scaled (in one node, between nodes, both), the files given or
  the default ones (issue #54: a slower in-node file raised multi-node rows, its level
  reaching the tier between nodes through the ring subtracted from it);
- a machine's point forecast (each grid row's efficiency and step time, each validation
  row's prediction) is the same whichever committed machines run beside it, in any order;
- one result file of a machine dropped: the output names it and says what the forecast
  did instead (issue #54: DDP [tuned] vanished with its k=1 result and no line).

And point 3 of issue #54, one test each: an inconsistent pair of fabric files refuses only
the machines that read both, one line each, and the rest still prints; two GPU models
across the files are said in one line; the knee line speaks only of the k forecast.
"""
from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from dpscale.analysis.forecast import fabric_file as ff, predict
from dpscale.report import book as bookmod, forecast as fcr
from dpscale.report.machines import NOT_RUN, load_reference, not_run, reference_folders

ROOT = Path(__file__).resolve().parents[1]
FABRICS = ROOT / "reference" / "fabrics" / "nccl-tests"
REFS = [p for p in reference_folders([ROOT / "reference"]) if (p / "runs").is_dir()]
MACHINES = [load_reference(p) for p in REFS] + [bookmod.load(bookmod.PATH)]
SERIES = [(m.name, s) for m in MACHINES for *_, s in fcr.machine_series(m)]
ONE = ff.read_sweep(FABRICS / "h100_1node_8gpu.txt")          # the default files (forecast.fabric_files)
TWO = ff.read_sweep(FABRICS / "h100_2node_srun_label.txt")
CFG = fcr.settings(None, bootstrap_draws=2)
TIERS = ("in one node", "between nodes", "both")
KEYS = [f"{sc}_{q}" for sc in predict.SCALINGS for q in ("efficiency", "step_ms")]
TOL = 1e-9


def scaled(sw: ff.Sweep, f: float) -> ff.Sweep:
    """The sweep f times slower: every time x f, every bandwidth / f."""
    div = (lambda x: None if x is None else x / f)   # noqa: E731
    return dataclasses.replace(sw, table={q: tuple(r._replace(time_s=r.time_s * f, algbw_GBps=div(r.algbw_GBps),
                                                             busbw_GBps=div(r.busbw_GBps)) for r in rows)
                                          for q, rows in sw.table.items()})


def files(tier: str, f: float) -> list:
    return [scaled(ONE, f) if tier != "between nodes" else ONE, scaled(TWO, f) if tier != "in one node" else TWO]


def rows(i: int, sweeps: list, explicit: bool) -> list[dict]:
    """Series i's grid from these files: {key: value} per row (None: not forecast)."""
    g = predict.grid(SERIES[i][1], fcr.given_of(sweeps, explicit=explicit), CFG)
    return [{key: r.get(key) for key in KEYS} for r in g["rows"]]


_BASE: dict = {}


def base(i: int, explicit: bool) -> list[dict]:
    if (i, explicit) not in _BASE:
        _BASE[(i, explicit)] = rows(i, [ONE, TWO], explicit)
    return _BASE[(i, explicit)]


def never_against(i, tier, f, explicit, slower: bool):
    """No row of series i moves against the fabric's direction: slower, efficiency never up
    and step time never down; faster, the reverse. Rows not forecast on one side (a pair
    that cannot be one cluster's is refused, not fitted) have nothing to compare."""
    before, after = base(i, explicit), rows(i, files(tier, f), explicit)
    assert len(before) == len(after)
    for b, a in zip(before, after):
        for key in KEYS:
            if a[key] is None or b[key] is None:
                continue
            up = a[key] - b[key] if key.endswith("efficiency") else b[key] - a[key]   # > 0: the forecast improved
            bound = TOL * max(1.0, abs(b[key]))
            assert (up <= bound) if slower else (up >= -bound), (SERIES[i][0], SERIES[i][1].name, tier, f, explicit,
                                                                b, a)


@settings(max_examples=200, deadline=None)
@given(i=st.integers(0, len(SERIES) - 1), tier=st.sampled_from(TIERS), f=st.floats(1.0, 100.0), explicit=st.booleans())
def test_a_slower_fabric_file_never_raises_a_forecast_row(i, tier, f, explicit):
    never_against(i, tier, f, explicit, slower=True)


@settings(max_examples=200, deadline=None)
@given(i=st.integers(0, len(SERIES) - 1), tier=st.sampled_from(TIERS), f=st.floats(0.01, 1.0), explicit=st.booleans())
def test_a_faster_fabric_file_never_lowers_a_forecast_row(i, tier, f, explicit):
    never_against(i, tier, f, explicit, slower=False)


def test_a_slower_in_node_file_reaches_the_multi_node_rows_of_no_machine():
    """The issue's case, stated once: the in-node file 1.5x slower raises no row of any
    committed series (before the fix, 104 multi-node rows rose by up to 1.2 points)."""
    for i in range(len(SERIES)):
        for explicit in (False, True):
            never_against(i, "in one node", 1.5, explicit, slower=True)


# ---------------------------------------------------------------- one machine, one answer

GIVEN = fcr.default_fabric(CFG)
SMALL = {**CFG, "max_nodes": 2}   # the grid to 2 nodes: what a machine reads is the same at every k, and it is cheap


def points(f: dict) -> dict:
    """A machine's point forecast: each grid row's efficiency and step time, each
    validation row's prediction."""
    grid = {(s["series"], r["k"], key): r.get(key) for s in f["series"] for r in s["rows"] for key in KEYS}
    val = {(r["series"], r["scaling"], r["k"], r["rule"]): r["predicted"] for r in f["validation"]}
    return {"grid": grid, "validation": val}


ALONE = {m.name: points(fcr.of_machines([m], SMALL, GIVEN)[0]) for m in MACHINES}


@settings(max_examples=200, deadline=None)
@given(order=st.permutations(range(len(MACHINES))), n=st.integers(1, len(MACHINES)))
def test_a_machines_point_never_moves_with_the_machines_beside_it(order, n):
    """Any committed machines, added, removed or reordered (a subset of them in any order):
    each one's point forecast is the one it gives alone."""
    chosen = [MACHINES[j] for j in order[:n]]
    for m, f in zip(chosen, fcr.of_machines(chosen, SMALL, GIVEN)):
        assert f["machine"] == m.name
        assert points(f) == ALONE[m.name], m.name


def bands(f: dict) -> dict:
    """A machine's bands: each grid row's efficiency band, each validation row's."""
    grid = {(s["series"], r["k"], key): (r.get(f"{key}_lo"), r.get(f"{key}_hi")) for s in f["series"]
            for r in s["rows"] for key in ("weak_efficiency", "strong_efficiency")}
    val = {(r["series"], r["scaling"], r["k"], r["rule"]): (r["predicted_lo"], r["predicted_hi"]) for r in f["validation"]}
    return {"grid": grid, "validation": val}


ALONE_BANDS = {m.name: bands(fcr.of_machines([m], SMALL, GIVEN)[0]) for m in MACHINES}


@settings(max_examples=200, deadline=None)
@given(order=st.permutations(range(len(MACHINES))), n=st.integers(1, len(MACHINES)))
def test_a_machines_band_moves_only_with_the_declared_prior(order, n):
    """Any committed machines beside it, added, removed or reordered: each one's bands are
    those it gives alone, and its record names the prior they borrowed from (file, version,
    hardware class): nothing but reference/forecast-prior.json moves a band."""
    chosen = [MACHINES[j] for j in order[:n]]
    for m, f in zip(chosen, fcr.of_machines(chosen, SMALL, GIVEN)):
        assert bands(f) == ALONE_BANDS[m.name], m.name
        assert f["prior"] == {"path": "reference/forecast-prior.json", "version": fcr.prior_version(),
                              "class": fcr.hardware_class(m), "rows": len(fcr.committed(SMALL, fcr.hardware_class(m)))}


def test_a_new_prior_version_moves_the_bands_that_borrow_and_only_within_a_class(tmp_path, monkeypatch):
    """The prior's GPU rows' errors doubled, in a file of its own: the bands of a GPU
    machine that borrows (h200x2: too few rows of its own) move and name the new version;
    a CPU machine's do not (no row of another class is ever borrowed)."""
    rec = json.loads(fcr.PRIOR.read_text())
    for r in rec["rows"]:
        if r["class"] == "gpu":
            r["error_log"] *= 2
    new = tmp_path / "forecast-prior.json"
    new.write_text(json.dumps(rec))
    monkeypatch.setattr(fcr, "PRIOR", new)
    for m in MACHINES:
        f = fcr.of_machines([m], SMALL, GIVEN)[0]
        assert f["prior"]["version"] == fcr.prior_version(new) and f["prior"]["path"] == str(new)
        if m.label == "h200x2":
            assert bands(f) != ALONE_BANDS[m.name]
        if fcr.hardware_class(m) == "cpu":
            assert bands(f) == ALONE_BANDS[m.name]


# ---------------------------------------------------------------- a dropped result file

FILES = [(j, key) for j, m in enumerate(MACHINES) if m.kind != "book" for key, r in sorted(m.results.items())
         if r.get("_path")]


def dropped(m, key, folder: str):
    """The machine, kept in `folder`, as load_reference reads it with that result's file
    deleted (a planned result with no file: not run)."""
    missing = not_run(key, f"planned ({folder}/plan.json), but no result was kept")
    return dataclasses.replace(m, results={**m.results, key: missing}, source=f"{folder}/runs", derived={},
                               errors=list(m.errors))


def output_lines(m) -> list[str]:
    """What `dpscale forecast` prints of the machine's left-out inputs (report.forecast.text)."""
    return [f"  left out: {line}" for line in fcr.left_out(m, fcr.machine_series(m))]


@settings(max_examples=200, deadline=None)
@given(pick=st.sampled_from(FILES), folder=st.from_regex(r"[a-z][a-z0-9_.-]{0,12}(/[a-z0-9_-]{1,8}){0,3}", fullmatch=True))
def test_a_dropped_result_file_is_named_with_what_the_forecast_did_instead(pick, folder):
    """Any result file of any committed machine (68 today), the machine kept in any folder."""
    j, key = pick
    m = MACHINES[j]
    e, v, k = key
    path = f"{folder}/runs/{e}/{v}/k{k}.json"
    gone = dropped(m, key, folder)
    said = [line for line in output_lines(gone) if path in line]
    assert len(said) == 1, (path, output_lines(gone))
    line = said[0]
    assert f"{path} (no result kept)" in line
    built = {(fam, v) for fam, v, _ in fcr.machine_series(gone)}
    fam = next((fam for fam in ("torch", "jax") for sc in ("weak", "strong")
                if fcr.registry.scaling_of(fam, sc) == e), None)
    if fam is not None and (fam, v) not in built:
        assert "so no forecast of it" in line, line        # the series is gone, and it says so
    elif fam is not None:
        assert "not forecast" in line or f"predicted only, no validation row at k={k}" in line, line
    else:
        assert re.search(r": (no sweep|no probe|no HLO census|time to accuracy|no time to accuracy)|"
                         r"the forecast does not read (it|them)$", line), line


def test_a_dropped_k1_result_is_said_by_the_command(tmp_path, capsys):
    """The issue's case end to end: reference/h200 without runs/ddp_weak/tuned/k1.json."""
    from dpscale import cli
    copy = tmp_path / "h200"
    shutil.copytree(ROOT / "reference" / "h200", copy, ignore=shutil.ignore_patterns("logs", "report", "extended"))
    gone = copy / "runs" / "ddp_weak" / "tuned" / "k1.json"
    gone.unlink()
    assert cli.main(["forecast", str(copy), "--no-book", "--bootstrap-draws", "10"]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if str(gone) in x)
    assert line.startswith("  left out: ") and "DDP [tuned] has no k=1 throughput left, so no forecast of it" in line
    assert load_reference(copy).results[("ddp_weak", "tuned", 1)]["status"] == NOT_RUN   # as dropped() builds it


# ---------------------------------------------------------------- every machine answered alone (point 3)

def write_table(sw: ff.Sweep, path: Path) -> Path:
    """The sweep as nccl-tests prints it (Rank lines, header, in-place and out-of-place rows)."""
    g = sw.gpus_per_node or sw.ranks
    hosts = list(sw.hostnames) or [f"node{h}" for h in range(sw.hosts)]
    lines = [f"#  Rank {r:2d} Group  0 Pid {1000 + r} on {hosts[r // g]:>10} device {r % g:2d} [0x{r:02x}] {sw.gpu}"
             for r in range(sw.ranks)]
    lines += ["#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   "
              "busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  "
              "(GB/s)"]
    for o, i in zip(sw.table["out_of_place"], sw.table["in_place"]):
        cols = lambda r: f"{r.time_s * 1e6:.4f} {r.algbw_GBps:.4f} {r.busbw_GBps:.4f} 0"   # noqa: E731
        lines.append(f"{o.bytes} {o.bytes // 4} float sum -1 {cols(o)} {cols(i)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def forecast_text(capsys, *args) -> str:
    from dpscale import cli
    assert cli.main(["forecast", *map(str, args), "--bootstrap-draws", "10"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("one_f, two_f", [(1.0, 1 / 20), (10.0, 1.0)],
                         ids=["between-node file 20x faster", "in-node file 10x slower"])
def test_an_inconsistent_pair_refuses_each_machine_that_reads_it_in_one_line(tmp_path, capsys, one_f, two_f):
    """Before: exit 1 for every machine, and no time-to-accuracy forecast. Now each machine
    that reads both files gets one line naming them and which tier is faster than which;
    its validation (which reads no file) and the time to accuracy still print."""
    one = write_table(scaled(ONE, one_f), tmp_path / "node.txt")
    two = write_table(scaled(TWO, two_f), tmp_path / "two_nodes.txt")
    text = forecast_text(capsys, ROOT / "reference" / "cpu16-standin", ROOT / "reference" / "h200",
                         "--fabric", one, "--fabric", two)
    for name in ("cpu16-standin", "h200", "book"):
        block = text.split(f"\n== {name}")[1].split("\n== ")[0]
        refused = [x for x in block.splitlines() if x.startswith("  refused past k=1: ")]
        assert len(refused) == 1, (name, refused)
        assert "two_nodes.txt" in refused[0] and "node.txt" in refused[0]
        assert "the tier between nodes, two_nodes.txt" in refused[0] and "is faster than the tier in one node, node.txt" \
            in refused[0]
    assert "validation, every row: mean |error|" in text.split("\n== cpu16-standin")[1]
    assert "\nTime to accuracy" in text


def test_an_inconsistent_pair_of_default_files_refuses_only_the_machines_that_read_both():
    """Default files fill only the tiers a machine did not measure: the 16-core stand-in
    (its own sweeps in one node) does not read the in-node file and is forecast; the 1 x
    H200 (no sweep of its own) reads both, and is refused alone."""
    slow = fcr.given_of([scaled(ONE, 10.0), TWO], explicit=False)
    by = {m.name.split(":")[0]: fcr.of_machine(m, CFG, slow) for m in MACHINES[:len(REFS)]}
    assert by["h200"]["refused"] and all(r.get("why_none", "").startswith("refused") for s in by["h200"]["series"]
                                         for r in s["rows"] if r["k"] > 1)
    assert not by["cpu16-standin"]["refused"]
    assert any(r.get("weak_efficiency") is not None for s in by["cpu16-standin"]["series"] for r in s["rows"]
               if r["nodes"] > 1)


def test_two_gpu_models_across_the_files_are_said_in_one_line(capsys):
    """An 8-GPU H100 in-node file with a 4-GPU-per-node GH200 file between nodes: every
    machine's nodes hold 4; the output says the two models in one line."""
    text = forecast_text(capsys, ROOT / "reference" / "h200", "--no-book",
                         "--fabric", FABRICS / "h100_1node_8gpu.txt", "--fabric", FABRICS / "gh200_2node_4gpu_alps.txt")
    said = [x for x in text.splitlines() if x.startswith("fabric files of two GPU models")]
    assert len(said) == 1
    assert "NVIDIA H100 80GB HBM3" in said[0] and "NVIDIA GH200 120GB" in said[0] and "nodes hold 4" in said[0]
    plain = forecast_text(capsys, ROOT / "reference" / "h200", "--no-book")
    assert "two GPU models" not in plain


def test_the_knee_line_speaks_only_of_what_was_forecast(capsys):
    """--gpus-per-node 4: the default files measure nodes of 8, so nothing past k=4 is
    forecast; the knee line says so (it said 'weak past k=64')."""
    text = forecast_text(capsys, ROOT / "reference" / "h200", "--no-book", "--gpus-per-node", "4")
    knee = next(x for x in text.splitlines() if "DDP [tuned]: knee" in x)
    assert "weak past k=4," in knee, knee
    assert "k=64" not in knee
    rows = [x.split() for x in text.split("Time to accuracy")[0].splitlines() if re.match(r"\s+\d+\s+\d+\s+predicted", x)]
    assert max(int(r[0]) for r in rows if "%" in r[3] and r[3] != "–%") == 4
