"""dpscale.analysis.fabric_file on real nccl-tests output (reference/fabrics/nccl-tests, sources
in SOURCES.md): each file's rows, ranks and hosts, its busbw against its own `Avg bus
bandwidth`, the column mapping against nccl-tests' definitions (algbw = size / time,
busbw = algbw 2(n-1)/n), the fitted tiers against the file's times, the inversion of
forecast.hierarchical_time against known tiers, and every bad file as one line naming it.
Pure and fast: no torch, no GPU."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from dpscale.analysis import costmodel
from dpscale.analysis.forecast import fabric_file as ff
from dpscale.analysis.forecast import model as fc

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "reference" / "fabrics" / "nccl-tests"
OWN = ROOT / "reference" / "h200x2" / "runs" / "allreduce" / "default" / "k2.json"
OWN_TABLE = ROOT / "reference" / "h200" / "logs" / "gpu" / "cpu_standin" / "results" / "runs" / "allreduce" / \
    "default" / "k8.json"
MiB = 2**20

# file: (rows, ranks, hosts, GPUs per node, GPU name, the file's "# Avg bus bandwidth")
FIXTURES = {
    "h100_1node_8gpu.txt": (6, 8, 1, 8, "NVIDIA H100 80GB HBM3", 439.369),
    "h100_2node_srun_label.txt": (11, 16, 2, 8, "NVIDIA H100 80GB HBM3", 142.735),
    "h100_2node_a3mega.txt": (31, 16, 2, 8, "NVIDIA H100 80GB HBM3", 70.742),
    "a100_2node_oke.txt": (31, 16, 2, 8, "NVIDIA A100-SXM4-40GB", 66.4834),
    "a100_2node_efa_openmpi.txt": (30, 16, 2, 8, "A100-SXM4-40GB", 11.2432),
}
MULTI = [f for f, v in FIXTURES.items() if v[2] > 1]


def rel_err(tiers, sweep) -> np.ndarray:
    return ff.predicted_times(tiers, sweep) / np.array(sweep.time_s) - 1


def with_times(sweep, times_s):
    """The sweep with its in-place times replaced (its payloads and layout kept)."""
    rows = tuple(r._replace(time_s=float(t)) for r, t in zip(sweep.rows, times_s))
    return dataclasses.replace(sweep, table={**sweep.table, sweep.placement: rows})


# ---------------------------------------------------------------- the real files

@pytest.mark.parametrize("name", FIXTURES)
def test_each_fixture_parses_with_its_rows_ranks_hosts(name):
    rows, ranks, hosts, per_node, gpu, _avg = FIXTURES[name]
    s = ff.read_sweep(DATA / name)
    assert (s.format, len(s.rows), s.ranks, s.hosts, s.gpus_per_node, s.gpu) == (
        ff.TABLE, rows, ranks, hosts, per_node, gpu)
    assert s.placement == "in_place" and len(s.table["out_of_place"]) == rows
    assert (s.dtype, s.redop) == ("float", "sum") and len(set(s.hostnames)) == hosts
    assert list(s.bytes) == sorted(s.bytes) and s.bytes[0] >= 8


@pytest.mark.parametrize("name", FIXTURES)
def test_mean_busbw_matches_the_files_avg_bus_bandwidth(name):
    """nccl-tests' Avg is the mean busbw over both placements' rows (src/common.cu: bw[0] /
    bw_count[0]), from unrounded values: each printed busbw is off by at most 0.005 (two
    decimals), so their mean is; the Avg line itself is %g (6 significant digits)."""
    s = ff.read_sweep(DATA / name)
    avg = FIXTURES[name][5]
    assert s.avg_busbw_GBps == avg
    assert abs(s.mean_busbw_GBps() - avg) <= 0.005 + 5e-6 * avg


@pytest.mark.parametrize("name", FIXTURES)
def test_columns_are_read_where_nccl_tests_writes_them(name):
    """algbw = size / time (GB/s from bytes and us) and busbw = algbw 2(n-1)/n, within the
    printed rounding: the time, algbw and busbw columns and the ranks are the right ones."""
    s = ff.read_sweep(DATA / name)
    f = 2 * (s.ranks - 1) / s.ranks
    for rows in s.table.values():
        for r in rows:
            assert r.algbw_GBps == pytest.approx(r.bytes / r.time_s / 1e9, rel=1e-3, abs=0.006)
            assert abs(r.busbw_GBps - f * r.algbw_GBps) <= 0.006 + 0.005 * f


def test_older_release_and_launcher_labels():
    """aws-efa-eks' run: no root column, `error` (a maximum error) for #wrong, OpenMPI's
    [1,0]<stdout>: on every line and NCCL INFO lines of 16 ranks before the table."""
    s = ff.read_sweep(DATA / "a100_2node_efa_openmpi.txt")
    assert s.rows[0].wrong == pytest.approx(1e-7) and s.hostnames == ("nccl-tests-efa-16-worker-0",
                                                                      "nccl-tests-efa-16-worker-1")
    srun = ff.read_sweep(DATA / "h100_2node_srun_label.txt")
    assert all(r.wrong is None for r in srun.rows)   # validation: 0 prints N/A


def _stamped(lines):
    """As -S 1 prints it: a timestamp column in the header, "YYYY-mm-dd HH:MM:SS" on rows."""
    out = []
    for x in lines:
        out.append(x + "  timestamp" if " size " in x else x + "  2025-03-04 09:13:02" if x[:1] == " " else x)
    return out


@pytest.mark.parametrize("how", ["crlf", "srun_label", "hash_lost", "mpich_label", "timestamps"])
def test_the_same_run_pasted_otherwise_reads_the_same(tmp_path, how):
    """A real file re-saved with Windows line ends, with every line labelled as srun --label
    and MPICH's -l do, with its leading '#' eaten by a Markdown renderer, or with -S 1's
    timestamps."""
    src = (DATA / "h100_1node_8gpu.txt").read_text()
    lines = src.splitlines()
    text = {"crlf": lambda: "\r\n".join(lines) + "\r\n",
            "srun_label": lambda: "\n".join(f"{3:>2}: {x}" for x in lines),
            "hash_lost": lambda: "\n".join(x.lstrip("#") for x in lines),
            "mpich_label": lambda: "\n".join(f"[0] {x}" for x in lines),
            "timestamps": lambda: "\n".join(_stamped(lines))}[how]()
    (tmp_path / "run.txt").write_bytes(text.encode())
    a, b = ff.read_sweep(DATA / "h100_1node_8gpu.txt"), ff.read_sweep(tmp_path / "run.txt")
    assert (b.table, b.ranks, b.hosts, b.gpu, b.avg_busbw_GBps) == (a.table, a.ranks, a.hosts, a.gpu,
                                                                    a.avg_busbw_GBps)


def test_without_rank_lines_ranks_come_from_busbw_over_algbw(tmp_path):
    lines = [x for x in (DATA / "h100_2node_a3mega.txt").read_text().splitlines() if "Rank" not in x]
    (tmp_path / "t.txt").write_text("\n".join(lines))
    s = ff.read_sweep(tmp_path / "t.txt")
    assert s.ranks == 16 and s.hosts == 1 and any("busbw/algbw" in n for n in s.notes)
    assert ff.read_sweep(tmp_path / "t.txt", hosts=2).gpus_per_node == 8
    with pytest.raises(ValueError, match="the file says ranks = 16, the caller 8"):
        ff.read_sweep(DATA / "h100_2node_a3mega.txt", ranks=8)


# ---------------------------------------------------------------- the fit

def test_one_node_tier_reproduces_the_files_times():
    """8 H100 on NVLink, 128 MiB to 4 GiB: the ring's two parameters hold every row to 5%."""
    s = ff.read_sweep(DATA / "h100_1node_8gpu.txt")
    tiers = ff.fabric_tiers(s)
    assert tiers.inter is None and tiers.per_node == 8 and tiers.intra.k == 8
    assert np.abs(rel_err(tiers, s)).max() < 0.05
    assert 400e9 < tiers.intra.beta_Bps < 500e9   # the file's busbw: 383 to 477 GB/s


@pytest.mark.parametrize("name", ["h100_1node_8gpu.txt", "h100_2node_a3mega.txt", "a100_2node_oke.txt"])
def test_the_fit_is_the_least_squares_optimum_on_relative_error(name):
    """Moving alpha or beta 2% either way from the fit (where not at alpha's bound, 0) makes
    the sum of squared relative errors over the fitted rows larger."""
    s = ff.read_sweep(DATA / name)
    tiers = ff.fabric_tiers(s)
    keep = np.array(s.bytes) >= MiB

    def cost(t):
        return float(np.sum(rel_err(t, s)[keep] ** 2))
    tier = "inter" if tiers.inter else "intra"
    fab = getattr(tiers, tier)
    for field_, step in (("alpha_s", 1.02), ("alpha_s", 0.98), ("beta_Bps", 1.02), ("beta_Bps", 0.98)):
        if field_ == "alpha_s" and fab.alpha_s == 0:
            continue
        moved = dataclasses.replace(tiers, **{tier: dataclasses.replace(fab, **{field_: getattr(fab, field_) * step})})
        assert cost(moved) > cost(tiers), (field_, step)


@pytest.mark.parametrize("name", MULTI)
def test_the_default_window_fits_ddps_payloads_better_than_every_row(name):
    """Fitted to 1 MiB and up (DDP's buckets), the tiers miss those payloads by less than
    when the 8 B to 512 KiB rows (launch latency, NCCL's LL protocol) pull the fit too; and
    over the window the across-node tier stays within 20% at the median."""
    s = ff.read_sweep(DATA / name)
    keep = np.array(s.bytes) >= MiB
    window = np.median(np.abs(rel_err(ff.fabric_tiers(s), s)[keep]))
    assert window < 0.20
    if (~keep).any():
        assert window < np.median(np.abs(rel_err(ff.fabric_tiers(s, min_bytes=0), s)[keep]))


def test_inverting_hierarchical_time_recovers_known_tiers():
    """Times made by forecast.hierarchical_time from known tiers, on a real file's payloads
    and layout (2 nodes x 8): fabric_tiers gives the across-node tier back exactly; read
    with the intra-node part neglected (the mutation), it does not."""
    s = ff.read_sweep(DATA / "h100_2node_a3mega.txt")
    intra = fc.Fabric(8e-6, 450e9, 8, "known")
    inter = fc.Fabric(15e-6, 90e9, 16, "known")
    made = with_times(s, [fc.hierarchical_time(S, 2, 8, intra, inter) for S in s.bytes])
    got = ff.fabric_tiers(made, intra).inter
    assert got.alpha_s == pytest.approx(15e-6, rel=1e-9) and got.beta_Bps == pytest.approx(90e9, rel=1e-9)
    neglected = ff.fabric_tiers(made).inter
    assert not neglected.beta_Bps == pytest.approx(90e9, rel=0.05)
    assert "neglected" in neglected.source and ff.fabric_tiers(made).intra.beta_Bps == math.inf
    # one device per node (16 x 1): no intra-node part to know, the tier comes back without one
    one_each = dataclasses.replace(s, hosts=16, gpus_per_node=1)
    made = with_times(one_each, [fc.hierarchical_time(S, 16, 1, intra, inter) for S in s.bytes])
    got = ff.fabric_tiers(made)
    assert (got.inter.alpha_s, got.inter.beta_Bps) == pytest.approx((15e-6, 90e9), rel=1e-9)
    assert "one device per node" in got.inter.source


def test_two_tiers_from_one_cluster_reproduce_its_two_node_run():
    """nccl-tests#290: one node (node005, 8 H100) gives the intra-node ring, the two-node run
    (node005 + node007) the across-node tier; together they give the two-node times within
    25% at every payload (the ring's two parameters cannot follow NCCL's protocol changes,
    and the one-node sweep starts at 128 MiB, so its alpha is extrapolated to 8 MiB) and
    within 10% at the median. Neglecting the intra-node part fits closer (the across tier
    absorbs it), and says so in its source."""
    one = ff.read_sweep(DATA / "h100_1node_8gpu.txt")
    two = ff.read_sweep(DATA / "h100_2node_srun_label.txt")
    intra = ff.fabric_tiers(one).intra
    tiers = ff.fabric_tiers(two, intra)
    err = np.abs(rel_err(tiers, two))
    assert err.max() < 0.25 and np.median(err) < 0.10
    assert tiers.intra is intra and tiers.per_node == 8 and tiers.nodes_measured == 2
    assert "h100_1node_8gpu.txt" in tiers.inter.source and "subtracted" in tiers.inter.source
    alone = ff.fabric_tiers(two)
    assert np.abs(rel_err(alone, two)).max() < 0.10


def test_a_user_forecasts_four_nodes_of_eight():
    """The tiers as forecast.hierarchical_time and as a StepModel's fabric: one 25 MiB bucket
    on 4 nodes x 8 costs the formula's time, more than on 2 nodes, and the StepModel's
    all-reduce at k = 32 is the same number."""
    intra = ff.fabric_tiers(ff.read_sweep(DATA / "h100_1node_8gpu.txt")).intra
    tiers = ff.fabric_tiers(ff.read_sweep(DATA / "h100_2node_srun_label.txt"), intra)
    S = 25 * MiB
    t4 = tiers.allreduce_time(S, nodes=4, per_node=8)
    by_hand = (2 * 7 / 8 * S / intra.beta_Bps + 14 * intra.alpha_s
               + 2 * 3 / 4 * S / tiers.inter.beta_Bps + 6 * tiers.inter.alpha_s)
    assert t4 == pytest.approx(by_hand, rel=1e-12)
    assert tiers.allreduce_time(S, 2) < t4 < tiers.allreduce_time(S, 8)
    m = fc.StepModel(compute_a_s=0.0, compute_b_s=1e-3, fabric=tiers.intra, buckets=(S,),
                     internode=tiers.inter, per_node=tiers.per_node)
    assert fc.allreduce_time(m, 32) == pytest.approx(t4, rel=1e-12)
    with pytest.raises(ValueError, match="no across-node tier"):
        ff.fabric_tiers(ff.read_sweep(DATA / "h100_1node_8gpu.txt")).allreduce_time(S, nodes=4)


# ---------------------------------------------------------------- other formats

def nccl_json_from(table_file: Path, *, typo: bool = False) -> dict:
    """The document nccl-tests -J would write for this run, built from its printed numbers
    in the shape of NVIDIA/nccl-tests src/util.cu (v2.19.6; v2.17.3-8 with typo=True):
    config.devices holds each MPI process's first rank, root is the "%6i" string, booleans
    are "true"/"false" strings. Not a captured file: no public -J output was found."""
    s = ff.read_sweep(table_file)
    body = {q: {r.bytes: {"time": r.time_s * 1e6, "alg_bw": r.algbw_GBps, "bus_bw": r.busbw_GBps,
                          "nwrong": r.wrong} for r in rows} for q, rows in s.table.items()}
    results = [{"size": b, "count": b // 4, "type": "float", "redop": "sum", "root": f"{-1:6d}",
                "out_of_place": body["out_of_place"][b], "in_place": body["in_place"][b],
                "actual_iterations": 20, "experiment_name": ""} for b in s.bytes]
    hosts = [h for h in s.hostnames for _ in range(s.gpus_per_node)]
    devices = [{"rank": i, "group": 0, "pid": 1000 + i, "hostname": h, "device": i % 8, "device_hex": "0000:04:00",
                "device_info": s.gpu} for i, h in enumerate(hosts)]
    avg = ("average_bus_bandwidith", "bandwidith") if typo else ("average_bus_bandwidth", "bandwidth")
    return {"version": 1 if typo else 3, "start_time": "2025-04-02 10:00:00",
            "args": ["/opt/src/nccl-tests/build/all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "1"],
            "env": ["PATH=/usr/bin"], "nccl_version": 22305,
            "config": {"nthreads": 1, "ngpus": 1, "minimum_bytes": 8, "maximum_bytes": 8589934592,
                       "step_factor": 2, "warmup_iters": 5, "iterations": 20, "aggregated_iterations": 1,
                       "validation": 1, "graph": 0, "blocking_collectives": "false", "parallel_init": "false",
                       "devices": devices},
            "results": results, "out_of_bounds": {"count": 0, "okay": "true"},
            avg[0]: {avg[1]: s.avg_busbw_GBps, "okay": "unchecked"}, "errors": [], "end_time": "2025-04-02 10:01:00"}


@pytest.mark.parametrize("typo", [False, True])
def test_nccl_tests_json_reads_as_its_table(tmp_path, typo):
    table = ff.read_sweep(DATA / "h100_2node_a3mega.txt")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(nccl_json_from(DATA / "h100_2node_a3mega.txt", typo=typo)))
    s = ff.read_sweep(path)
    assert s.format == ff.NCCL_JSON
    assert (s.ranks, s.hosts, s.gpus_per_node, s.gpu, s.hostnames, s.avg_busbw_GBps) == (
        16, 2, 8, table.gpu, table.hostnames, 70.742)
    for q in ff.PLACEMENTS:   # time in us there, s here: equal to the last bit or two
        assert [r._replace(time_s=0) for r in s.table[q]] == [r._replace(time_s=0) for r in table.table[q]]
        assert [r.time_s for r in s.table[q]] == pytest.approx([r.time_s for r in table.table[q]], rel=1e-12)


def test_nccl_tests_json_one_process_of_eight_and_in_place_only(tmp_path):
    """-g 8 in one process lists one device (ranks = 1 x nthreads x ngpus); an entry whose
    out_of_place is null reads in-place alone; a NaN is the string "nan"."""
    doc = nccl_json_from(DATA / "h100_1node_8gpu.txt")
    doc["config"].update(ngpus=8, devices=doc["config"]["devices"][:1])
    doc["results"][0]["out_of_place"] = None
    doc["results"][1]["in_place"]["nwrong"] = "nan"
    (tmp_path / "g8.json").write_text(json.dumps(doc))
    s = ff.read_sweep(tmp_path / "g8.json")
    assert (s.ranks, s.hosts, s.gpus_per_node, len(s.rows), len(s.table["out_of_place"])) == (8, 1, 8, 6, 5)
    assert s.rows[1].wrong is None


def test_this_projects_own_allreduce_result_parses_and_fits_as_the_forecast_does():
    s = ff.read_sweep(OWN)
    metrics = json.loads(OWN.read_text())["metrics"]
    want = costmodel.allreduce_sweep(metrics)
    assert s.format == ff.DPSCALE and (s.ranks, s.hosts, s.gpus_per_node, s.gpu) == (2, 1, 2, "NVIDIA H200")
    assert list(s.bytes) == want["bytes"] and list(s.time_s) == pytest.approx(want["time_s"], rel=1e-12)
    fab = ff.fabric_tiers(s).intra
    ref = fc.fit_fabric(want["bytes"], want["time_s"], 2)
    assert (fab.alpha_s, fab.beta_Bps) == pytest.approx((ref.alpha_s, ref.beta_Bps), rel=1e-12)
    assert any("one host assumed" in n for n in s.notes)
    table = ff.read_sweep(OWN_TABLE)   # the nccl-tests-like table this project writes now
    assert table.ranks == 8 and table.mean_busbw_GBps() == pytest.approx(table.avg_busbw_GBps, rel=1e-12)


# ---------------------------------------------------------------- bad files

def _truncated(p):
    lines = (DATA / "a100_2node_oke.txt").read_text().splitlines()
    p.write_text("\n".join(lines[:25]) + "\n")   # through the column header: no data row


def _short_row(p):
    lines = (DATA / "h100_1node_8gpu.txt").read_text().splitlines()
    lines[15] = " ".join(lines[15].split()[:-1])   # a row missing its last column
    p.write_text("\n".join(lines) + "\n")


BAD = {
    "empty.txt": (lambda p: p.write_text(""), "empty"),
    "blank.txt": (lambda p: p.write_text("\n  \n\r\n"), "empty"),
    "sweep.csv": (lambda p: p.write_text("size,time_us,busbw\n1048576,85.5,22.9\n2097152,99.1,39.6\n"),
                  "no all-reduce rows found"),
    "truncated.txt": (_truncated, "header but no data rows"),
    "short_row.txt": (_short_row, "a table row has 12 columns where its header gives 13"),
    "other.json": (lambda p: p.write_text(json.dumps({"experiment": "weak_scaling", "metrics": {"x": 1}})),
                   "JSON of another shape"),
    "list.json": (lambda p: p.write_text("[1, 2, 3]"), "JSON of another shape"),
    "broken.json": (lambda p: p.write_text('{"results": [{"size": 8, '), "not valid JSON"),
    "model.npy": (lambda p: np.save(p, np.arange(64.0)), "binary"),
    "image.png": (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4), "binary"),
    "latin1.txt": (lambda p: p.write_bytes("Gr\xfc\xdfe\n".encode("latin-1")), "not UTF-8"),
    "two_runs.txt": (lambda p: p.write_text((DATA / "h100_1node_8gpu.txt").read_text() * 2), "2 result tables"),
}


@pytest.mark.parametrize("name", BAD)
def test_a_bad_file_is_one_line_naming_it(tmp_path, name):
    make, says = BAD[name]
    path = tmp_path / name
    make(path)
    with pytest.raises(ValueError) as e:
        ff.read_sweep(path)
    msg = str(e.value)
    assert isinstance(e.value, ff.FabricFileError) and "\n" not in msg
    assert msg.startswith(str(path)) and says in msg
    assert "expected" in msg or "pass" in msg


def test_a_missing_file_is_one_line_too(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        ff.read_sweep(tmp_path / "nope.txt")
    assert isinstance(e.value, ValueError) and "\n" not in str(e.value)
    assert str(e.value).startswith(f"{tmp_path / 'nope.txt'}: no such file; expected nccl-tests'")


def test_a_fault_inside_the_parser_still_reaches_the_user_as_one_line(monkeypatch):
    def broken(*_a):
        raise KeyError("size")
    monkeypatch.setattr(ff, "_scan", broken)
    with pytest.raises(ff.FabricFileError) as e:
        ff.read_sweep(DATA / "h100_1node_8gpu.txt")
    assert "\n" not in str(e.value) and "h100_1node_8gpu.txt: could not be read" in str(e.value)
