"""Where a run's files live, written down once, and how a record names a path.

A run's working folder (Snakemake's working directory; `working()`):

    results/runs/<experiment>/<variant>/k<k>.json   one measurement (result_path)
    results/fingerprint.json                        this machine's hardware and software
    results/model/, results/data/                   the model's FLOPs; the data and its provenance (*.json)
    results/roofline.json                           a per-layer profile, where one was made (tools/lab/)
    results/runs/<experiment>/<variant>/k<k>.failures, .attempt-<n>   its attempts (dpscale.plan.replan)
    results/report/                                 the report, plan.json (what was planned) among it
    logs/<experiment>/<variant>/k<k>.log            the job's log (+ .ranks/, .rank<r>.log: log_path)

A kept machine, reference/<name>/ (`dpscale keep`, the two-node stand-in; `kept()`):
the same, results/ flattened into the folder and the plan beside the results:

    runs/, fingerprint.json, plan.json, model/, data/*.json, roofline.json, logs/, report/

A record names the paths of its run folder relative to it (dpscale.results.portable:
the results contract); a reader resolves them against the folder it reads the record
from (`Folder.resolve`), where a kept machine has flattened results/.

Light (the stdlib and the results contract): the workflow imports this when it is
parsed. No measurement imports it: where a run keeps its files is no part of what a
number is measured with, so a change here reruns nothing (tests/test_structure.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dpscale.results import job_label

# A kept machine's entries, and the working folder's under results/
RUNS_DIR = "runs"
FINGERPRINT = "fingerprint.json"
PLAN = "plan.json"
MODEL_DIR = "model"
DATA_DIR = "data"
ROOFLINE = "roofline.json"
LOGS_DIR = "logs"
REPORT_DIR = "report"
EARLIER_DIR = "earlier"   # a kept machine's earlier measurements: earlier/<label>/<experiment>/<variant>/k<k>.json
RESULT_GLOB = "*/*/k*.json"   # a result under runs/

# The working folder (paths as the rules write them: relative to Snakemake's working directory)
RESULTS = "results"
RUNS = f"{RESULTS}/{RUNS_DIR}"
FINGERPRINT_PATH = f"{RESULTS}/{FINGERPRINT}"
DATA = f"{RESULTS}/{DATA_DIR}"
MODEL = f"{RESULTS}/{MODEL_DIR}"
REPORT = f"{RESULTS}/{REPORT_DIR}"
LOGS = LOGS_DIR

# A result's fields that name files of its run (the job's log, its ranks', the flight
# recorder's dumps): what a reader resolves against the folder it reads the result from.
PATH_FIELDS = ("log", "rank_logs", "nccl_traces")


def result_path(experiment: str, variant: str, k, root: str = RUNS) -> str:
    """Where a measurement's result lives (k may be a wildcard, "{k}"):
    <root>/<experiment>/<variant>/k<k>.json."""
    return f"{root}/{job_label(experiment, variant, k)}.json"


def attempt_stamp(result: str, n) -> str:
    """k<k>.attempt-<n> beside a result: the empty file that stands for its n-th attempt
    (dpscale.plan.replan; n may be a wildcard). Not a result: the glob k*.json misses it."""
    return str(Path(result).with_suffix(f".attempt-{n}"))


def machine_stamp(digest: str, root: str = RESULTS) -> str:
    """The empty file that stands for the machine the workflow was parsed on (its
    fingerprint's digest): an input of results/fingerprint.json (rules/report.smk)."""
    return f"{root}/machine-{digest}.stamp"


def report_key_path(key: str, root: str = REPORT) -> str:
    """The report's output named after what it was built for (dpscale.plan.replan.report_key)."""
    return f"{root}/key-{key}.txt"


def log_path(experiment: str, variant: str, k, root: str = LOGS) -> str:
    """The job's log (k may be a wildcard); its rank logs sit beside it (<log>.ranks/, .rank<r>.log)."""
    return f"{root}/{job_label(experiment, variant, k)}.log"


@dataclass(frozen=True)
class Folder:
    """One machine's files: a run's working folder, or a kept machine."""
    root: Path
    flat: bool          # a kept machine: results/ flattened into root, the plan beside the results

    def _at(self, name: str) -> Path:
        return self.root / name if self.flat else self.root / RESULTS / name

    runs = property(lambda self: self._at(RUNS_DIR))
    fingerprint = property(lambda self: self._at(FINGERPRINT))
    model = property(lambda self: self._at(MODEL_DIR))
    data = property(lambda self: self._at(DATA_DIR))
    roofline = property(lambda self: self._at(ROOFLINE))
    report = property(lambda self: self._at(REPORT_DIR))
    plan = property(lambda self: self.root / PLAN if self.flat else self.report / PLAN)
    logs = property(lambda self: self.root / LOGS_DIR)
    earlier = property(lambda self: self.root / EARLIER_DIR)

    def has_results(self) -> bool:
        return self.runs.is_dir()

    def resolve(self, recorded: str) -> Path:
        """A path as a record names it (relative to its run folder, ~ for the home, or
        absolute where it lay outside both), where it is now in this folder."""
        p = Path(recorded).expanduser()
        if p.is_absolute():
            return p
        if self.flat and p.parts[:1] == (RESULTS,):   # results/... of the run it was kept from
            p = Path(*p.parts[1:]) if len(p.parts) > 1 else Path(".")
        return self.root / p


def working(root: str | os.PathLike = ".") -> Folder:
    """A run's working folder: results/ and logs/ under it."""
    return Folder(Path(root), flat=False)


def kept(root: str | os.PathLike) -> Folder:
    """A kept machine, reference/<name>/ (or the stand-in's output folder)."""
    return Folder(Path(root), flat=True)


def of_runs(runs_dir: str | os.PathLike) -> Folder:
    """The folder a runs/ folder belongs to: results/runs of a working folder, or a kept machine's runs/."""
    parent = Path(runs_dir).parent
    return working(parent.parent) if parent.name == RESULTS else kept(parent)


def is_kept(folder: str | os.PathLike) -> bool:
    """A folder that holds a kept machine (its runs/, or at least its fingerprint)."""
    k = kept(folder)
    return k.runs.is_dir() or k.fingerprint.exists()
