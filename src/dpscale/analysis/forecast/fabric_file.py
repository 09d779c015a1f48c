"""A cluster's own measured all-reduce, read from a file, as the forecast's fabric.

read_sweep(path) reads one all-reduce payload sweep from any of:

- nccl-tests' printed table, all_reduce_perf's stdout as people paste it: the `#`
  header, the `#  Rank  r Group  g Pid  p on <host> device d [<pci>] <GPU>` lines, the
  rows `size count type redop root  time algbw busbw #wrong  time algbw busbw #wrong`
  (out-of-place, then in-place) and `# Avg bus bandwidth : x`. Older releases lack
  `Group` and `root` and print `error` (a maximum error, 2e-07) for `#wrong`; very old
  ones lack `redop`; `-c 0` prints `N/A`; `-S 1` appends a timestamp, `-I 1` four
  per-iteration columns per placement (the header says which). Launchers' line labels are
  taken off (srun --label `  0: `, OpenMPI --tag-output `[1,0]<stdout>:`, MPICH/Intel
  `[0] `, pdsh `host: `, an ISO timestamp); NCCL INFO/WARN lines, ssh warnings and Markdown
  around the table are skipped; CRLF line ends are read as LF.
- nccl-tests' JSON (`-J file.json`, `--output_file`: NVIDIA/nccl-tests src/util.cu, in
  every release since v2.17.3; JSON_FILE_VERSION 1, 2 from v2.19.2 with -I's per-iteration
  statistics, 3 from v2.19.6; v2.17.3 to v2.17.8 spell the summary
  `average_bus_bandwidith: {bandwidith}`, later ones `average_bus_bandwidth: {bandwidth}`): `results` is a list of
  {size, count, type, redop, root (a padded string), out_of_place and in_place: {time or
  cpu_time (us), alg_bw, bus_bw, nwrong} or null}; `config` holds nthreads, ngpus and
  `devices`, one {rank, hostname, device_info, ...} per process (its first rank only):
  ranks = len(devices) x nthreads x ngpus. Booleans are the strings "true"/"false" and a
  NaN is the string "nan" there.
- this project's own all-reduce result (results/runs/allreduce/<variant>/k<k>.json),
  through costmodel.allreduce_rows; the time is time_us_median (the median over calls of
  the slowest rank), as forecast_data.sweep_at fits it.

The sweep keeps the in-place rows by default (DDP all-reduces its buckets in place),
the out-of-place ones where a file has no in-place column; ranks and hosts come from the
Rank lines (distinct host names are what tell a multi-node run). Where a file does not say,
ranks come from busbw/algbw = 2(n-1)/n, and hosts = 1 unless the caller passes hosts=.

fabric_tiers(sweep, intra) turns it into forecast.Fabric tiers:
- one host: the intra-node ring, forecast.fit_fabric at k = ranks;
- N hosts of G GPUs: the across-node tier of forecast.hierarchical_time, solved for:
      t(S) = ring_time(S, G, intra) + 2(N-1)/N S / beta_node + 2(N-1) alpha_node,
  alpha_node and 1/beta_node by least squares on the relative error of t (as fit_fabric),
  the intra-node ring from `intra` (a one-node sweep's tier). Without it the intra-node
  part is taken as free (alpha 0, beta infinite): the across-node tier then carries the
  whole measured time (forecast.fit_whole, marked `whole`), an upper bound on its own
  cost, and `source` says so. The forecast takes a multi-node file so (whole), never with
  another file's ring subtracted (model.py: that carried the in-node file's level into
  the tier between nodes).

Use (a node's sweep for the in-node ring, a multi-node one for the tier across nodes):
    intra = fabric_tiers(read_sweep("one_node.txt")).intra      # all_reduce_perf -g 8
    tiers = fabric_tiers(read_sweep("two_nodes.txt"), intra)     # mpirun -np 16 ... -g 1
    tiers.allreduce_time(25 * 2**20, nodes=4, per_node=8)        # seconds, one 25 MiB bucket
    StepModel(..., fabric=tiers.intra, internode=tiers.inter, per_node=tiers.per_node)

Every file that is not one of these raises FabricFileError (a ValueError), whose message
is one line naming the file, what was expected and what to do; a missing file raises
MissingFabricFile (FabricFileError and FileNotFoundError). Units: bytes, seconds, bytes/s
(forecast.Fabric) and GB/s = 1e9 bytes/s (nccl-tests' columns).
"""
from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from dpscale.analysis import costmodel
from dpscale.analysis.forecast import model as fc

TABLE, NCCL_JSON, DPSCALE = "nccl-tests table", "nccl-tests JSON", "dpscale all-reduce result"
PLACEMENTS = ("out_of_place", "in_place")   # nccl-tests' order within a row
EXPECTED = ("expected nccl-tests' all_reduce_perf output (the table it prints, or its JSON from -J file.json) "
            "or a dpscale all-reduce result (results/runs/allreduce/<variant>/k<k>.json)")


class FabricFileError(ValueError):
    """A file that is not an all-reduce sweep: the message is one line, naming the file."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class MissingFabricFile(FabricFileError, FileNotFoundError):
    pass


class Row(NamedTuple):
    bytes: int
    time_s: float
    algbw_GBps: float | None
    busbw_GBps: float | None
    wrong: float | None        # nccl-tests' #wrong (a count), older `error` (a max error); None: N/A


@dataclass(frozen=True)
class Sweep:
    """One all-reduce payload sweep. bytes/time_s/busbw_GBps are `placement`'s rows, in
    the file's order; `table` holds both placements as read."""
    source: str
    format: str
    ranks: int
    hosts: int
    gpus_per_node: int | None          # None: the hosts hold different numbers of ranks
    gpu: str | None
    placement: str
    table: dict = field(hash=False)
    hostnames: tuple = ()
    dtype: str | None = None
    redop: str | None = None
    avg_busbw_GBps: float | None = None   # the file's own "Avg bus bandwidth", where it has one
    nccl_algo: str | None = None          # NCCL_ALGO=... as the output states it (its command line, env echo)
    notes: tuple = field(default=(), compare=False)

    @property
    def rows(self) -> tuple:
        return self.table[self.placement]

    @property
    def bytes(self) -> tuple:
        return tuple(r.bytes for r in self.rows)

    @property
    def time_s(self) -> tuple:
        return tuple(r.time_s for r in self.rows)

    @property
    def busbw_GBps(self) -> tuple:
        return tuple(r.busbw_GBps for r in self.rows)

    def mean_busbw_GBps(self) -> float | None:
        """nccl-tests' Avg bus bandwidth: the mean busbw over every row of both placements."""
        bws = [r.busbw_GBps for rows in self.table.values() for r in rows if r.busbw_GBps is not None]
        return statistics.fmean(bws) if bws else None


@dataclass(frozen=True)
class Tiers:
    """The fabric of N nodes of per_node devices: `intra` the in-node ring, `inter` the
    across-node tier of forecast.hierarchical_time (None: measured on one node only).
    As a StepModel: StepModel(..., fabric=intra, internode=inter, per_node=per_node)."""
    intra: fc.Fabric
    inter: fc.Fabric | None
    per_node: int
    nodes_measured: int
    source: str

    def allreduce_time(self, size_bytes: float, nodes: int, per_node: int | None = None) -> float:
        """Seconds for one all-reduce of size_bytes on `nodes` nodes of per_node devices."""
        g = per_node or self.per_node
        if nodes > 1 and self.inter is None:
            raise ValueError(f"{self.source}: no across-node tier (measured on one node); "
                             f"read a multi-node sweep to forecast {nodes} nodes")
        return fc.hierarchical_time(size_bytes, nodes, g, self.intra, self.inter) if nodes > 1 \
            else fc.ring_time(size_bytes, g, self.intra)


# ---------------------------------------------------------------- reading

def read_sweep(path, *, ranks: int | None = None, hosts: int | None = None,
               placement: str = "in_place") -> Sweep:
    """The all-reduce sweep in `path` (format detected). ranks/hosts: where the file does
    not say (a pasted table without its Rank lines; this project's result, which records
    rank 0's host only); a value that contradicts the file raises FabricFileError."""
    p = Path(path)
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, not {placement!r}")
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise MissingFabricFile(f"{p}: no such file; {EXPECTED}") from None
    except OSError as e:
        raise FabricFileError(f"{p}: cannot be read ({e.strerror or e}); {EXPECTED}") from None
    try:
        return _read(p, data, ranks, hosts, placement)
    except FabricFileError:
        raise
    except Exception as e:   # a parser fault must still reach the user as one line naming the file
        raise FabricFileError(f"{p}: could not be read as an all-reduce sweep ({type(e).__name__}: {e}); "
                              f"{EXPECTED}") from e


def _read(p: Path, data: bytes, ranks, hosts, placement) -> Sweep:
    if not data.strip():
        raise FabricFileError(f"{p}: the file is empty; {EXPECTED}")
    if b"\x00" in data[:65536]:
        raise FabricFileError(f"{p}: a binary file, not text; {EXPECTED}")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise FabricFileError(f"{p}: not UTF-8 text (a binary file?); {EXPECTED}") from None
    head = text.lstrip()
    if head.startswith("{") or (head.startswith("[") and _is_json(head)):   # "[1,0]<stdout>:" is a table
        return _read_json(p, text, ranks, hosts, placement)
    return _read_table(p, text, ranks, hosts, placement)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _finish(p, fmt, table, ranks, hosts, per_host, gpu, placement, notes, **kw) -> Sweep:
    """The chosen placement (the other where it is empty), and the layout checks."""
    if not any(table.values()):
        raise FabricFileError(f"{p}: no all-reduce rows found; {EXPECTED}")
    used = placement if table.get(placement) else next(q for q in PLACEMENTS if table.get(q))
    if used != placement:
        notes.append(f"{used.replace('_', '-')} rows (the file has no {placement.replace('_', '-')} column)")
    per_node = None
    if per_host:
        counts = set(per_host.values())
        per_node = counts.pop() if len(counts) == 1 else None
        if per_node is None:
            notes.append(f"hosts hold different numbers of ranks: {dict(per_host)}")
    elif ranks and hosts and ranks % hosts == 0:
        per_node = ranks // hosts
    table = {q: tuple(table.get(q, ())) for q in PLACEMENTS}
    return Sweep(source=str(p), format=fmt, ranks=ranks, hosts=hosts, gpus_per_node=per_node, gpu=gpu,
                 placement=used, table=table, notes=tuple(notes), **kw)


def _given(p, what: str, from_file, given):
    """The file's value, else the caller's; both and different: an error."""
    if from_file is not None and given is not None and int(given) != from_file:
        raise FabricFileError(f"{p}: the file says {what} = {from_file}, the caller {given}; "
                              f"drop the {what}= argument or pass the right file")
    return from_file if from_file is not None else (int(given) if given is not None else None)


# ---------------------------------------------------------------- the printed table

_RANK = re.compile(r"Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s*(.*?)\s*$")
_PREFIXES = [re.compile(x) for x in (
    r"^\s*\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+",   # a log timestamp
    r"^\s*\[\d+,\d+\]<std(?:out|err)>:\s?",                                       # OpenMPI --tag-output
    r"^\s*\d+:\s?",                                                               # srun --label
    r"^\s*[A-Za-z][\w.\-]*:\s+(?=#|\d)",                                          # pdsh/clush host:
    r"^\s*>\s?")]                                                                 # Markdown quote
_ALGO = re.compile(r"NCCL_ALGO\s*=\s*[\"']?([A-Za-z_]+)")   # as the output's command line or env echo states it
_BARE_RANK = re.compile(r"\[\d+\]")      # MPICH/Intel -l: "[0] " before every write, mid-line too
_STAMP = re.compile(r"\d{4}-\d\d-\d\d$|\d\d:\d\d:\d\d$")
_TYPE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")
_NUM = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")
_TIME_COLS = ("time", "cputime")


def _unprefix(line: str) -> str:
    if re.match(r"^\s*\[\d+\]", line):
        line = _BARE_RANK.sub("", line)
    for _ in range(3):   # labels stack: a timestamp, then srun's
        for rx in _PREFIXES:
            new = rx.sub("", line, count=1)
            if new != line:
                line = new
                break
        else:
            break
    return line


def _header_columns(body: str) -> list[str] | None:
    """The column names of nccl-tests' header line (`#  size count type redop root time ...`)."""
    names = body.lstrip("#").split()
    if len(names) >= 6 and names[:3] == ["size", "count", "type"] and "busbw" in names:
        return names
    return None


@dataclass
class _Layout:
    """Where a row's fields are: the prefix columns, then per placement (time, algbw, busbw, wrong, extra...)."""
    prefix: list
    group: int        # columns per placement

    @classmethod
    def from_header(cls, names: list[str]) -> "_Layout":
        names = [n for n in names if n != "timestamp"]
        first = next(i for i, n in enumerate(names) if n in _TIME_COLS)
        rest = names[first:]
        second = next((i for i, n in enumerate(rest) if i > 0 and n in _TIME_COLS), len(rest))
        return cls(names[:first], second)

    @classmethod
    def guess(cls, tokens: list[str]) -> "_Layout":
        prefix = ["size", "count", "type"]
        if len(tokens) > 3 and _TYPE.match(tokens[3]):
            prefix.append("redop")
        left = len(tokens) - len(prefix)
        if left in (9, 5):   # root, then 8 (or in-place's 4) numbers
            prefix.append("root")
        return cls(prefix, 4)


def _is_row(tokens: list[str]) -> bool:
    return (len(tokens) >= 7 and tokens[0].isdigit() and tokens[1].isdigit() and bool(_TYPE.match(tokens[2]))
            and all(_NUM.match(t) or t == "N/A" for t in tokens[3:] if not _TYPE.match(t)))


def _num(tok: str) -> float | None:
    if tok == "N/A":
        return None
    v = float(tok)
    return None if math.isnan(v) else v


def _unstamp(tokens: list[str]) -> list[str]:
    """A row without -S 1's "YYYY-mm-dd HH:MM:SS" at its end."""
    while tokens and _STAMP.match(tokens[-1]):
        tokens = tokens[:-1]
    return tokens


def _parse_row(p, lineno, tokens, layout: _Layout, time_scale: float):
    """(key, {placement: Row}) of one table row; a row of the wrong width is an error."""
    n0, g = len(layout.prefix), layout.group
    body = tokens[n0:]
    if len(body) == 2 * g:
        groups = {"out_of_place": body[:g], "in_place": body[g:]}
    elif len(body) == g:      # no out-of-place body (nccl-tests prints blanks there)
        groups = {"in_place": body}
    else:
        raise FabricFileError(f"{p}:{lineno}: a table row has {len(tokens)} columns where its header gives "
                              f"{n0 + 2 * g} ({' '.join(layout.prefix)} + 2 x {g}); {EXPECTED}, whole rows as "
                              "printed")
    fields = dict(zip(layout.prefix, tokens))
    size = int(fields["size"])
    out = {}
    for q, (t, alg, bus, *rest) in groups.items():
        out[q] = Row(size, float(t) * time_scale, _num(alg), _num(bus), _num(rest[0]) if rest else None)
    return (fields.get("type"), fields.get("redop")), out


def _scan(p: Path, text: str) -> dict:
    """The table's pieces: rank lines, header, units, rows (with line numbers), summary."""
    s = {"ranks": {}, "rank_lines": 0, "layout": None, "units": None, "rows": [], "avg": None,
         "program": None, "headers": 0, "cputime": False}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = _unprefix(raw)
        body = line.strip()
        if not body or "NCCL INFO" in body or "NCCL WARN" in body:
            continue
        m = _RANK.search(body)
        if m and body.lstrip("# ").startswith("Rank"):
            s["rank_lines"] += 1
            s["ranks"].setdefault(int(m.group(1)), []).append((m.group(2), m.group(3)))
            continue
        names = _header_columns(body)
        if names:
            s["headers"] += 1
            s["layout"] = _Layout.from_header(names)
            s["cputime"] = "cputime" in names
            continue
        if "(B)" in body and "(elements)" in body:
            s["units"] = "ms" if "(ms)" in body else "us"
            continue
        if (m := re.search(r"Avg bus bandwidth\s*:\s*(\S+)", body)):
            s["avg"] = _num(m.group(1)) if _NUM.match(m.group(1)) else None
            continue
        if (m := re.search(r"Collective test starting:\s*(\S+)", body)):
            s["program"] = m.group(1)
            continue
        tokens = _unstamp(body.split())
        if not body.startswith("#") and _is_row(tokens):
            s["rows"].append((lineno, tokens))
    return s


def _time_scale(p, s) -> float:
    """Seconds per unit of the time column: the header's (us) or (ms); without it, the unit
    for which size / time matches algbw (us: bytes / (time x algbw) = 1e3)."""
    if s["units"]:
        return 1e-6 if s["units"] == "us" else 1e-3
    ratios = []
    for _, tokens in s["rows"]:
        lay = s["layout"] or _Layout.guess(tokens)
        t, alg = tokens[len(lay.prefix)], tokens[len(lay.prefix) + 1]
        if _NUM.match(t) and _NUM.match(alg) and float(alg) >= 1 and float(t) > 0:
            ratios.append(int(tokens[0]) / (float(t) * float(alg)))
    if ratios and abs(math.log10(statistics.median(ratios)) - 6) < 0.5:
        return 1e-3
    return 1e-6


def _pick_group(rows_by_key: dict, notes: list):
    """float/sum where a file holds several types or ops (-d all, -o all), else the first."""
    keys = list(rows_by_key)
    key = ("float", "sum") if ("float", "sum") in rows_by_key else keys[0]
    if len(keys) > 1:
        notes.append(f"{len(keys)} type/op groups ({', '.join('/'.join(filter(None, k)) for k in keys)}); "
                     f"read {'/'.join(filter(None, key))}")
    return key, rows_by_key[key]


def _ranks_from_ratio(table) -> int | None:
    """n from busbw / algbw = 2(n-1)/n (all-reduce), on rows with algbw >= 1 GB/s."""
    r = [x.busbw_GBps / x.algbw_GBps for rows in table.values() for x in rows
         if x.algbw_GBps and x.algbw_GBps >= 1 and x.busbw_GBps is not None]
    if not r:
        return None
    ratio = statistics.median(r)
    if not 0.9 < ratio < 2:
        return None
    n = round(2 / (2 - ratio))
    return n if abs(2 * (n - 1) / n - ratio) < 0.02 * ratio else None


def _ranks(p, table, ranks: int | None, source: str, notes: list) -> int:
    """The ranks the file says (or the caller gave), else from busbw/algbw; checked."""
    if ranks is None:
        ranks = _ranks_from_ratio(table)
        if ranks is None:
            raise FabricFileError(f"{p}: no {source}, and busbw/algbw does not give the ranks; pass ranks=")
        notes.append(f"{ranks} ranks from busbw/algbw = 2(n-1)/n (no {source})")
    _check_allreduce(p, table, ranks)
    return ranks


def _check_allreduce(p, table, ranks: int):
    """busbw / algbw must be all-reduce's 2(n-1)/n: all_gather and reduce_scatter give
    (n-1)/n, sendrecv and broadcast 1."""
    r = [x.busbw_GBps / x.algbw_GBps for rows in table.values() for x in rows
         if x.algbw_GBps and x.algbw_GBps >= 1 and x.busbw_GBps is not None]
    if r and ranks > 1:
        want, got = 2 * (ranks - 1) / ranks, statistics.median(r)
        if abs(got - want) > 0.03 * want:
            raise FabricFileError(f"{p}: busbw/algbw is {got:.3f}, not all-reduce's 2(n-1)/n = {want:.3f} at "
                                  f"{ranks} ranks: not all_reduce_perf output (another collective?); {EXPECTED}")


def _read_table(p: Path, text: str, ranks, hosts, placement) -> Sweep:
    s = _scan(p, text)
    if s["program"] and "all_reduce" not in s["program"]:
        raise FabricFileError(f"{p}: the output of {s['program']}, not all_reduce_perf; {EXPECTED}")
    if not s["rows"]:
        what = "the table's header but no data rows (truncated?)" if s["headers"] else "no all-reduce rows found"
        raise FabricFileError(f"{p}: {what}; {EXPECTED}")
    if s["headers"] > 1:
        raise FabricFileError(f"{p}: {s['headers']} result tables (several runs, or processes that each ran alone: "
                              f"nccl-tests built without MPI=1?); pass one run's output")
    repeated = sorted(r for r, seen in s["ranks"].items() if len(seen) > 1)
    if repeated:
        raise FabricFileError(f"{p}: rank {repeated[0]} is listed {len(s['ranks'][repeated[0]])} times: the "
                              "processes ran as separate jobs (nccl-tests built without MPI=1, or a launcher "
                              "without MPI wire-up); pass the output of one job over all ranks")
    scale, notes = _time_scale(p, s), []
    by_key: dict = {}
    for lineno, tokens in s["rows"]:
        key, rows = _parse_row(p, lineno, tokens, s["layout"] or _Layout.guess(tokens), scale)
        for q, row in rows.items():
            by_key.setdefault(key, {q: [] for q in PLACEMENTS})[q].append(row)
    (dtype, redop), table = _pick_group(by_key, notes)
    if s["cputime"]:
        notes.append("time is CPU time (-C 1), not the operation's latency")
    ranks = _ranks(p, table, _given(p, "ranks", len(s["ranks"]) or None, ranks), "Rank lines", notes)
    per_host: dict = {}
    for seen in s["ranks"].values():
        per_host[seen[0][0]] = per_host.get(seen[0][0], 0) + 1
    hosts = _given(p, "hosts", len(per_host) or None, hosts)
    if hosts is None:
        hosts = 1
        notes.append("one host assumed (no Rank lines); pass hosts= for a multi-node run")
    gpus = sorted({g for seen in s["ranks"].values() for _, g in seen if g})
    stated = sorted(set(_ALGO.findall(text)))
    if len(stated) > 1:
        notes.append(f"NCCL_ALGO stated more than once ({', '.join(stated)}); none taken")
    return _finish(p, TABLE, table, ranks, hosts, per_host, " + ".join(gpus) or None, placement, notes,
                   hostnames=tuple(per_host), dtype=dtype, redop=redop, avg_busbw_GBps=s["avg"],
                   nccl_algo=stated[0] if len(stated) == 1 else None)


# ---------------------------------------------------------------- JSON

def _read_json(p: Path, text: str, ranks, hosts, placement) -> Sweep:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise FabricFileError(f"{p}: not valid JSON (line {e.lineno}: {e.msg}; truncated?); {EXPECTED}") from None
    if isinstance(doc, dict) and isinstance(doc.get("results"), list):
        return _read_nccl_json(p, doc, ranks, hosts, placement)
    if isinstance(doc, dict) and isinstance(doc.get("metrics"), dict) and costmodel.allreduce_rows(doc["metrics"]):
        return _read_dpscale(p, doc, ranks, hosts, placement)
    if isinstance(doc, dict) and doc.get("experiment") == "allreduce" and doc.get("status") != "ok":
        raise FabricFileError(f"{p}: an all-reduce result with status {doc.get('status')!r}, no sweep: "
                              f"{doc.get('reason') or 'no reason recorded'}; pass one with status ok")
    raise FabricFileError(f"{p}: JSON of another shape (neither nccl-tests' -J output, with a 'results' list, nor "
                          f"a dpscale all-reduce result, with metrics.table); {EXPECTED}")


def _jnum(v) -> float | None:
    if v is None or (isinstance(v, str) and v.strip().lower() in ("nan", "n/a", "")):
        return None
    return float(v)


def _read_nccl_json(p: Path, doc: dict, ranks, hosts, placement) -> Sweep:
    args = doc.get("args") or []
    prog = Path(str(args[0])).name if args else ""
    if prog and "all_reduce" not in prog:
        raise FabricFileError(f"{p}: the JSON of {prog}, not all_reduce_perf; {EXPECTED}")
    notes, by_key = [], {}
    for res in doc["results"]:
        if not isinstance(res, dict) or "size" not in res:
            raise FabricFileError(f"{p}: a 'results' entry without a size; {EXPECTED}")
        key = (res.get("type"), res.get("redop"))
        tab = by_key.setdefault(key, {q: [] for q in PLACEMENTS})
        for q in PLACEMENTS:
            body = res.get(q)
            if isinstance(body, dict):
                t = body.get("time", body.get("cpu_time"))
                if "cpu_time" in body and "time" not in body and "CPU time" not in " ".join(notes):
                    notes.append("time is CPU time (-C 1), not the operation's latency")
                tab[q].append(Row(int(res["size"]), float(t) * 1e-6, _jnum(body.get("alg_bw")),
                                  _jnum(body.get("bus_bw")), _jnum(body.get("nwrong"))))
    if not by_key:
        raise FabricFileError(f"{p}: nccl-tests JSON with no results (the run stopped early?); {EXPECTED}")
    (dtype, redop), table = _pick_group(by_key, notes)
    cfg = doc.get("config") or {}
    devices = [d for d in cfg.get("devices") or [] if isinstance(d, dict)]
    per_proc = int(cfg.get("nthreads") or 1) * int(cfg.get("ngpus") or 1)
    ranks = _ranks(p, table, _given(p, "ranks", len(devices) * per_proc if devices else None, ranks),
                   "devices in config", notes)
    per_host: dict = {}
    for d in devices:   # each entry is one process: its first rank of nthreads x ngpus
        per_host[d.get("hostname")] = per_host.get(d.get("hostname"), 0) + per_proc
    hosts = _given(p, "hosts", len(per_host) or None, hosts) or 1
    gpus = sorted({str(d.get("device_info")) for d in devices if d.get("device_info")})
    summary = doc.get("average_bus_bandwidth") or doc.get("average_bus_bandwidith") or {}   # v2.17.3-8's typo
    avg = summary.get("bandwidth", summary.get("bandwidith"))
    return _finish(p, NCCL_JSON, table, ranks, hosts, per_host, " + ".join(gpus) or None, placement, notes,
                   hostnames=tuple(per_host), dtype=dtype, redop=redop, avg_busbw_GBps=_jnum(avg))


def _read_dpscale(p: Path, doc: dict, ranks, hosts, placement) -> Sweep:
    m, notes = doc["metrics"], []
    table = {q: [Row(int(r["bytes"]), r.get("time_us_median", r.get("time_us")) / 1e6, r.get("algbw_GBps"),
                     r.get("busbw_GBps"), r.get("wrong")) for r in rows]
             for q, rows in costmodel.allreduce_rows(m).items()}
    if doc.get("status") not in (None, "ok"):
        notes.append(f"the result's status is {doc.get('status')!r}: {doc.get('reason')}")
    run = doc.get("runtime") or {}
    k = doc.get("k") or run.get("world_size")
    ranks = _given(p, "ranks", int(k) if k else None, ranks)
    if ranks is None:
        raise FabricFileError(f"{p}: a dpscale result without k; pass ranks=")
    if hosts is None:
        notes.append("one host assumed: a dpscale result records rank 0's host only; pass hosts= for a "
                     "multi-node run")
    gpu = run.get("device") or (doc.get("fingerprint") or {}).get("gpu_model")
    return _finish(p, DPSCALE, table, ranks, int(hosts or 1), {}, gpu, placement, notes,
                   hostnames=(run["hostname"],) if run.get("hostname") else (),
                   avg_busbw_GBps=m.get("avg_busbw_GBps"))


# ---------------------------------------------------------------- the fabric

def fitted_rows(sweep: Sweep) -> tuple[list, list]:
    """(rows a fit may use, rows left out): a row whose #wrong counts wrong elements (an
    integer >= 1; older releases' `error` column is a maximum error, far below 1) timed
    a corrupted transfer, and a zero time is no measurement."""
    wrong = [r for r in sweep.rows if r.wrong is not None and r.wrong >= 1]
    return [r for r in sweep.rows if r.time_s > 0 and r not in wrong], wrong


def fabric_tiers(sweep: Sweep, intra: fc.Fabric | None = None, *,
                 min_bytes: float = fc.DDP_FIRST_BUCKET_BYTES) -> Tiers:
    """The forecast's fabric from a sweep's rows of min_bytes and up (all rows where fewer
    than two are). The default, 1 MiB, is DDP's first bucket, the smallest payload the
    forecast asks about, and where this project's own sweep starts: nccl-tests' 8 B to
    64 KiB rows are launch latency and NCCL's LL protocol, which two parameters cannot
    fit together with the bandwidth-bound rows (tests/test_fabric_file.py shows the misfit).

    One host: intra = forecast.fit_fabric at k = ranks (`intra` must be None).
    N > 1 hosts of G = sweep.gpus_per_node: the across-node tier, fitted to what the
    file's times leave after the in-node ring of `intra`; without `intra`, the in-node
    part is neglected (the returned intra is free: alpha 0, beta infinite) and the
    across-node tier carries the whole time. Raises ValueError where the sweep cannot
    give a tier (one rank, uneven hosts, the in-node ring alone slower than the file)."""
    rows, wrong = fitted_rows(sweep)
    window = [r for r in rows if r.bytes >= min_bytes]
    span = f"{min_bytes / 2**20:g} MiB and up" if min_bytes and len(window) >= 2 else "every payload"
    span += f"; {len(wrong)} row(s) with #wrong > 0 left out" if wrong else ""
    rows = window if len(window) >= 2 else rows
    if not rows:
        raise ValueError(f"{sweep.source}: no rows with a positive time to fit")
    S, t = np.array([r.bytes for r in rows], float), np.array([r.time_s for r in rows], float)
    what = (f"{sweep.format} {sweep.source} ({sweep.ranks} ranks on {sweep.hosts} host(s), {sweep.placement}, "
            f"{span})")
    if sweep.ranks < 2:
        raise ValueError(f"{sweep.source}: one rank all-reduces nothing; a fabric needs a sweep over 2 or more")
    if sweep.hosts <= 1:
        if intra is not None:
            raise ValueError(f"{sweep.source}: a one-host sweep is itself the intra-node tier; pass intra=None")
        fab = fc.fit_fabric(list(S), list(t), sweep.ranks, f"intra-node ring fitted to {what}")
        return Tiers(fab, None, sweep.ranks, 1, fab.source)
    G, N = sweep.gpus_per_node, sweep.hosts
    if not G:
        raise ValueError(f"{sweep.source}: the hosts hold different numbers of ranks; the two-tier model needs "
                         "the same number on every node")
    if G == 1:   # one device per node: the whole all-reduce crosses nodes
        intra = intra or fc.Fabric(0.0, math.inf, 1, "one device per node: no intra-node part")
        how = "one device per node, no intra-node part"
    elif intra is None:
        intra = fc.Fabric(0.0, math.inf, G, "intra-node part neglected (no intra-node tier given): the "
                          "across-node tier carries the whole measured time, an upper bound on its own cost")
        how = "intra-node part neglected"
    else:
        how = f"intra-node ring ({intra.source or 'given'}) subtracted"
    whole = G == 1 or intra.beta_Bps == math.inf   # nothing in the node to subtract
    algo, why = nccl_algorithm(sweep) if whole else ("", "")
    source = f"across-node tier of {N} nodes x {G} fitted to {what}; {how}" + (f"; NCCL's {algo}: {why}" if algo else "")
    inter = fc.fit_whole(S, t, N, G, source, algo) if whole else fc.fit_internode(S, t, N, G, intra, source)
    return Tiers(intra, inter, G, N, inter.source)


def nccl_algorithm(sweep: Sweep) -> tuple[str, str]:
    """(algorithm, why) NCCL ran the sweep's large payloads with (model.nccl_algorithm):
    for nccl-tests' outputs only (a dpscale result may be gloo's: ("", why))."""
    if sweep.format not in (TABLE, NCCL_JSON):
        return "", f"a {sweep.format}: not read as NCCL's"
    return fc.nccl_algorithm(sweep.hosts, sweep.gpus_per_node or 0, sweep.nccl_algo)


def predicted_times(tiers: Tiers, sweep: Sweep) -> np.ndarray:
    """The tiers' time (s) for each of the sweep's payloads, at the sweep's own layout."""
    return np.array([tiers.allreduce_time(s, sweep.hosts, sweep.gpus_per_node or sweep.ranks) for s in sweep.bytes])
