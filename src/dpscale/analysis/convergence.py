"""Convergence tables: samples (or epochs) to a target accuracy per seed and global batch,
read from MLPerf's published Reference Convergence Points or from a plain CSV, into one
tidy structure (Table) that the statistical-efficiency model (stateff) reads as points.

Two formats:

- MLPerf Training/HPC RCP JSON (github.com/mlcommons/logging, mlperf_logging/rcp_checker/
  <ruleset>_<version>/rcps_<benchmark>.json): an object of entries, each
  {"Benchmark": name, "BS": global batch, "Hyperparams": {...}, "Epochs to converge":
  [one value per seed]} ("samples to converge" for the benchmarks MLPerf counts in samples).
- CSV with a header `batch,seed,samples` or `batch,seed,epochs` (one row per seed); an
  empty value, `inf` or `nan` says the seed did not reach the target (censored). Lines
  starting '#' are comments, but for two fields: `# benchmark: NAME` (which tables are one
  family: convergence_check) and `# note: TEXT` (kept with the table, printed with it).
  to_csv writes a Table in this form, so a table read from MLPerf's JSON can be kept as
  a CSV that reads back to the same Table (the project keeps its public tables so).

Epochs and samples differ by a constant factor (the epoch's samples) at every batch, so
E(B)'s shape, relative errors and coverage are the same in either unit; a table in epochs
keeps epochs unless samples_per_epoch is given.

Bad input raises ConvergenceInputError with one line naming the file, the key and the fix.
"""
from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

RCP_UNITS = {"Epochs to converge": "epochs", "samples to converge": "samples"}
# MLPerf Training 3.1's Stable Diffusion RCPs count optimizer steps under "Epochs to
# converge": MLPerf's own checker reads `step_num` for ruleset 3.1.0 and `samples_count`
# after (rcp_checker.py, read_submission_file), and the values say so (5000 steps at
# batch 512 and 2500 at 1024 are the same 2.56M samples). Read as epochs, E(B) would be
# fitted to steps, which fall with B. Keyed as MLPerf keys it: (ruleset folder, benchmark).
RCP_STEPS = {("training_3.1.0", "sd")}
# The benchmarks whose "Epochs to converge" MLPerf's checker reads from `samples_count`
# (rcp_checker.py, read_submission_file): their values are samples, labelled so here.
# A label only: the check is the same in either unit.
RCP_SAMPLES = {"llama2_70b_lora", "flux1", "llama31_405b", "llama31_8b", "gpt_oss_20b", "deepseekv3_671b",
               "qwen35_397b_grpo"}
CSV_UNITS = ("samples", "epochs")
CSV_FIELDS = ("benchmark", "note")
# MLPerf's folder names (training_4.0.0, hpc_3.0.0): a table kept under one is named
# `<folder>/<file>`, since every version has a file of the same name.
RULESET = re.compile(r"[a-z]+_\d+(\.\d+)+")
NOT_REACHED = ("", "inf", "+inf", "nan", "none")


class ConvergenceInputError(ValueError):
    """A convergence table that cannot be read: the message is one line naming the file,
    the key or value, and the fix."""


@dataclass(frozen=True)
class Table:
    """Per global batch, the per-seed samples (or epochs) to target; None = the seed did
    not reach it. `batches` ascending; `unit` "samples" or "epochs"."""
    name: str
    benchmark: str
    unit: str
    per_batch: dict[int, tuple[float | None, ...]]
    source: str
    fmt: str
    notes: tuple[str, ...] = field(default=())

    @property
    def batches(self) -> list[int]:
        return sorted(self.per_batch)

    def points(self) -> dict[int, list[float | None]]:
        """The {batch: [per-seed value]} that stateff.fit_batch_model and holdout read."""
        return {b: list(self.per_batch[b]) for b in self.batches}


def _fail(path, key: str, problem: str, fix: str):
    raise ConvergenceInputError(f"{path}: {key}: {problem}; {fix}")


def _batch(path, key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        _fail(path, key, f"global batch {value!r} is not a number", "give a positive whole number of samples")
    try:
        b = float(value)
    except ValueError:
        _fail(path, key, f"global batch {value!r} is not a number", "give a positive whole number of samples")
    if not (math.isfinite(b) and b > 0 and b.is_integer()):
        _fail(path, key, f"global batch {value!r} is not a positive whole number", "give the global batch in samples")
    return int(b)


def _value(path, key: str, value) -> float | None:
    """One seed's value to target: a positive finite number, or None where it did not reach it."""
    if value is None or (isinstance(value, str) and value.strip().lower() in NOT_REACHED):
        return None
    if isinstance(value, bool):
        _fail(path, key, f"value {value!r} is not a number", "give samples/epochs to target, or leave it empty")
    try:
        v = float(value)
    except (TypeError, ValueError):
        _fail(path, key, f"value {value!r} is not a number", "give samples/epochs to target, or leave it empty")
    if math.isnan(v) or math.isinf(v):
        return None
    if v <= 0:
        _fail(path, key, f"value {value!r} is not positive", "give samples/epochs to target (> 0)")
    return v


def _scaled(per_batch: dict, unit: str, samples_per_epoch: float | None, path) -> tuple[dict, str, tuple]:
    if unit != "epochs" or samples_per_epoch is None:
        return per_batch, unit, ()
    if not (samples_per_epoch > 0 and math.isfinite(samples_per_epoch)):
        _fail(path, "samples_per_epoch", f"{samples_per_epoch!r} is not positive", "give the samples of one epoch")
    scaled = {b: tuple(None if v is None else v * samples_per_epoch for v in vs) for b, vs in per_batch.items()}
    return scaled, "samples", (f"epochs x {samples_per_epoch:g} samples per epoch",)


def _rcp_entry(path, name: str, entry) -> tuple[str, int, str, list]:
    """(benchmark, batch, unit, per-seed values) of one RCP entry."""
    if not isinstance(entry, dict):
        _fail(path, name, "entry is not an object", 'give {"Benchmark", "BS", "Epochs to converge": [...]}')
    bench = entry.get("Benchmark")
    if not isinstance(bench, str) or not bench:
        _fail(path, f"{name}.Benchmark", "missing or not a name", "give the benchmark's name, as MLPerf's RCPs do")
    if "BS" not in entry:
        _fail(path, f"{name}.BS", "missing", "give the entry's global batch size")
    b = _batch(path, f"{name}.BS", entry["BS"])
    units = [k for k in RCP_UNITS if k in entry]
    if len(units) != 1:
        _fail(path, name, f"has {len(units)} of the keys {list(RCP_UNITS)}", "give exactly one list of per-seed values")
    vals = entry[units[0]]
    if not isinstance(vals, list) or not vals:
        _fail(path, f"{name}.{units[0]}", "is not a non-empty list", "give one value per seed")
    return bench, b, RCP_UNITS[units[0]], [_value(path, f"{name}.{units[0]}[{i}]", v) for i, v in enumerate(vals)]


def read_rcp(path: str | Path, samples_per_epoch: float | None = None, name: str | None = None,
             ruleset: str | None = None) -> Table:
    """An MLPerf RCP JSON file as a Table (one benchmark, one entry per global batch).
    ruleset: MLPerf's folder name (training_3.1.0, ...; default: the file's folder), which
    says where the values are steps (RCP_STEPS)."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ConvergenceInputError(f"{path}: cannot be read ({e.__class__.__name__}); give a readable file") from None
    except json.JSONDecodeError as e:
        raise ConvergenceInputError(f"{path}: line {e.lineno}: not JSON ({e.msg}); give MLPerf's RCP JSON") from None
    if not isinstance(raw, dict) or not raw:
        _fail(path, "(top level)", "not a non-empty object of RCP entries", "give MLPerf's rcps_<benchmark>.json")
    per_batch, entry_of, benches, units = {}, {}, set(), set()
    for key, entry in raw.items():
        bench, b, unit, vals = _rcp_entry(path, key, entry)
        if b in per_batch:
            _fail(path, f"{key}.BS", f"global batch {b} is also entry {entry_of[b]!r}",
                  "keep one entry per batch (merge the seeds, or split the file)")
        per_batch[b], entry_of[b] = tuple(vals), key
        benches.add(bench)
        units.add(unit)
    for what, seen in (("Benchmark", benches), ("unit", units)):
        if len(seen) > 1:
            _fail(path, what, f"entries disagree ({sorted(seen)})", "give one benchmark and one unit per file")
    bench, unit = benches.pop(), units.pop()
    if (ruleset or path.parent.name, bench) in RCP_STEPS:
        per_batch = {b: tuple(None if v is None else v * b for v in vs) for b, vs in per_batch.items()}
        return Table(name or _default_name(path), bench, "samples", per_batch, str(path), "mlperf-rcp",
                     (f"{ruleset or path.parent.name} {bench}: MLPerf counts steps here; samples = steps x batch",))
    unit = "samples" if bench in RCP_SAMPLES else unit
    per_batch, unit, notes = _scaled(per_batch, unit, samples_per_epoch, path)
    return Table(name or _default_name(path), bench, unit, per_batch, str(path), "mlperf-rcp", notes)


def _default_name(path: Path) -> str:
    """`<ruleset>_<version>/<file>` for a file kept under MLPerf's folder names, else the file name."""
    return f"{path.parent.name}/{path.name}" if RULESET.fullmatch(path.parent.name) else path.name


def _csv_fields(text: str) -> dict[str, list[str]]:
    """The `# benchmark: ...` and `# note: ...` lines of a CSV (other comments are ignored)."""
    out: dict[str, list[str]] = {k: [] for k in CSV_FIELDS}
    for line in text.splitlines():
        m = re.fullmatch(r"\s*#\s*(\w+):\s*(.*?)\s*", line)
        if m and m[1] in out:
            out[m[1]].append(m[2])
    return out


def _csv_rows(path: Path, text: str):
    reader = csv.DictReader(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    cols = [c.strip() for c in (reader.fieldnames or [])]
    units = [u for u in CSV_UNITS if u in cols]
    missing = [c for c in ("batch", "seed") if c not in cols]
    if missing or len(units) != 1:
        _fail(path, "header", f"columns {cols}", "give the columns batch,seed and one of samples or epochs")
    return reader, units[0]


def read_csv(path: str | Path, samples_per_epoch: float | None = None, name: str | None = None,
             benchmark: str | None = None) -> Table:
    """A CSV of `batch,seed,samples` (or `epochs`) rows as a Table; lines starting '#' are
    comments, `# benchmark:` and `# note:` fields (the module's docstring)."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConvergenceInputError(f"{path}: cannot be read ({e.__class__.__name__}); give a readable file") from None
    reader, unit = _csv_rows(path, text)
    per_batch, seen = {}, set()
    for i, row in enumerate(reader, start=2):
        row = {(k or "").strip(): (v or "").strip() for k, v in row.items()}
        b = _batch(path, f"line {i} batch", row["batch"])
        if (b, row["seed"]) in seen:
            _fail(path, f"line {i} seed", f"seed {row['seed']!r} at batch {b} appears twice", "give each seed once")
        seen.add((b, row["seed"]))
        per_batch.setdefault(b, []).append(_value(path, f"line {i} {unit}", row[unit]))
    if not per_batch:
        _fail(path, "rows", "none", "give one row per seed and global batch")
    fields = _csv_fields(text)
    if len(fields["benchmark"]) > 1:
        _fail(path, "# benchmark", f"given {len(fields['benchmark'])} times", "give one benchmark per file")
    per_batch, unit, notes = _scaled({b: tuple(v) for b, v in per_batch.items()}, unit, samples_per_epoch, path)
    return Table(name or _default_name(path), benchmark or next(iter(fields["benchmark"]), path.stem), unit,
                 per_batch, str(path), "csv", tuple(fields["note"]) + notes)


def _csv_value(v: float | None) -> str:
    # repr is the shortest text that reads back to the same float; a whole number is
    # written as one (MLPerf's epochs and samples mostly are)
    return "" if v is None else str(int(v)) if v.is_integer() else repr(v)


def to_csv(t: Table) -> str:
    """t as the CSV read_csv reads back to the same Table (benchmark, unit, per-seed values,
    notes): one row per seed, numbered from 0 in the order given, batches ascending."""
    for text in (t.benchmark, *t.notes):
        if "\n" in text or "\r" in text:
            raise ConvergenceInputError(f"{t.name}: note or benchmark {text!r} has a line break; give one line")
    head = [f"# {t.name} ({t.fmt}), transcribed by dpscale.analysis.convergence.to_csv",
            f"# benchmark: {t.benchmark}", *(f"# note: {n}" for n in t.notes), f"batch,seed,{t.unit}"]
    rows = [f"{b},{i},{_csv_value(v)}" for b in t.batches for i, v in enumerate(t.per_batch[b])]
    return "\n".join(head + rows) + "\n"


def write_csv(t: Table, folder: str | Path) -> Path:
    """to_csv(t) written to folder/<t.name with .csv> (MLPerf's ruleset folder kept); the path."""
    out = Path(folder) / Path(t.name).with_suffix(".csv")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(to_csv(t))
    return out


def read(path: str | Path, samples_per_epoch: float | None = None) -> Table:
    """read_rcp for .json, read_csv for .csv."""
    suffix = Path(path).suffix.lower()
    if suffix == ".json":
        return read_rcp(path, samples_per_epoch)
    if suffix == ".csv":
        return read_csv(path, samples_per_epoch)
    raise ConvergenceInputError(f"{path}: format {suffix or '(none)'!r} is not read; give MLPerf's RCP .json "
                                "or a .csv of batch,seed,samples (or epochs)")
