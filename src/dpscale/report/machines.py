"""The machines a report sets side by side, and what was planned on each.

A Machine is one set of results: this run (the workflow's planned targets, read
from results/runs), a reference machine kept as reference/<name>/ (dpscale keep),
or the book's published numbers (reference/book_4090.yaml). Every planned job is in
`results`: the JSON it wrote, or a record with status "not run" when it left none,
so that figures and tables mark it instead of dropping it.
"""
from __future__ import annotations

import collections
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from dpscale import layout, provenance, registry, results as contract

NOT_RUN = "not run"
STATUSES = contract.STATUSES + (NOT_RUN,)
TARGET = re.compile(r"([a-z][a-z0-9_]*)/([a-z][a-z0-9_]*)/k(\d+)\.json$")
Key = tuple[str, str, int]


def parse_target(path: str) -> Key:
    m = TARGET.search(str(path).replace("\\", "/"))
    if not m:
        raise ValueError(f"{path}: not a result path of the form <experiment>/<variant>/k<k>.json")
    return m.group(1), m.group(2), int(m.group(3))


def not_run(key: Key, reason: str) -> dict:
    e, v, k = key
    return {"experiment": e, "variant": v, "k": k, "status": NOT_RUN, "reason": reason, "metrics": {},
            "config": {}, "fingerprint": {}, "data": {}, "backend": None, "started_utc": None,
            "finished_utc": None}


@dataclass(eq=False)   # compared and hashed by identity: one object per machine
class Machine:
    key: str                        # "current", a reference folder's name, or "book"
    kind: str                       # current | reference | book
    label: str                      # "this run", the folder's name, "book"
    fingerprint: dict
    results: dict = field(default_factory=dict)      # (experiment, variant, k) -> result
    plan: list | None = None        # planned keys; None when the plan was not recorded
    plan_info: dict = field(default_factory=dict)    # command, config hash, commit of the plan
    source: str = ""
    errors: list = field(default_factory=list)       # unreadable files, with the reason
    alerts: list = field(default_factory=list)       # what else a reader must see first (a refused data copy)
    not_planned: list = field(default_factory=list)  # results not measured as this run's plan asks (replan.not_this_plan)
    book: dict | None = None
    profile: dict | None = None     # a per-layer profile kept beside the results (roofline.json)
    derived: dict = field(default_factory=dict, repr=False)   # memo(): what is computed from results

    def memo(self, key, compute):
        """compute(), once per key: a value derived from the results, which do not
        change once loaded (numbers.scaling: every table cell, figure and note of a
        series reads the same rows). Callers read it and do not change it."""
        if key not in self.derived:
            self.derived[key] = compute()
        return self.derived[key]

    def get(self, experiment: str, variant: str, k: int) -> dict | None:
        return self.results.get((experiment, variant, int(k)))

    def series(self, experiment: str, variant: str) -> dict[int, dict]:
        return {k: r for (e, v, k), r in sorted(self.results.items()) if e == experiment and v == variant}

    def variants(self, experiment: str) -> list[str]:
        exp = registry.EXPERIMENTS.get(experiment)
        declared = exp.variant_names() if exp else []
        found = {v for (e, v, _k) in self.results if e == experiment}
        return [v for v in declared if v in found] + sorted(found - set(declared))

    def ks(self, experiment: str | None = None) -> list[int]:
        return sorted({k for (e, _v, k) in self.results if experiment in (None, e)})

    def all(self, experiment: str | None = None) -> list[dict]:
        return [r for (e, _v, _k), r in sorted(self.results.items()) if experiment in (None, e)]

    def counts(self) -> dict[str, int]:
        c = collections.Counter(r["status"] for r in self.results.values())
        return {s: c.get(s, 0) for s in STATUSES}

    @property
    def scale(self) -> str:
        if self.kind == "book":
            return (self.book or {}).get("machine", {}).get("scale", "paper")
        scales = collections.Counter((r.get("config") or {}).get("scale") for r in self.results.values())
        scales.pop(None, None)
        return scales.most_common(1)[0][0] if scales else "unknown"

    @property
    def backends(self) -> list[str]:
        return sorted({r.get("backend") for r in self.results.values() if r.get("backend")})

    @property
    def gpu(self) -> bool:
        return bool(self.fingerprint.get("gpu_count")) or any(b in ("nccl", "xla-gpu") for b in self.backends)

    @property
    def hardware(self) -> str:
        """'4x RTX 4090', '8x H200 (NV18)', 'CPU x2 (AMD EPYC)'."""
        if self.kind == "book" and (self.book or {}).get("machine", {}).get("label"):
            return self.book["machine"]["label"].removeprefix("book: ")
        fp = self.fingerprint
        if fp.get("gpu_count"):
            link = fp.get("interconnect")
            return (f"{fp['gpu_count']}x {short_gpu(fp.get('gpu_model'))}"
                    + (f" ({link})" if link and link != "none" else ""))
        cpu = (fp.get("cpu_model") or "CPU").split(" @")[0]
        return f"CPU x{fp.get('cpu_count') or '?'} ({cpu})"

    @property
    def name(self) -> str:
        """Legend label: who, what hardware, what scale."""
        return f"{self.label}: {self.hardware}, {self.scale}"

    @property
    def unit(self) -> str:
        """What the book calls 'GPU(s)', honestly named on CPU stand-ins."""
        if self.gpu:
            return "GPU(s)"
        return "host device(s)" if self.backends == ["xla-cpu"] else "CPU process(es)"

    def data_sources(self) -> list[str]:
        return sorted({(r.get("data") or {}).get("source") for r in self.results.values()
                       if (r.get("data") or {}).get("source")})

    def dates(self) -> tuple[str | None, str | None]:
        starts = [r["started_utc"] for r in self.results.values() if r.get("started_utc")]
        ends = [r["finished_utc"] for r in self.results.values() if r.get("finished_utc")]
        return (min(starts, default=None), max(ends, default=None))

    def planned_by(self) -> str:
        """The command that made the plan; a kept plan rebuilt after the fact says so (how:
        plan_info["reconstructed"], which the provenance shows as a note of its own)."""
        text = self.plan_info.get("command") or ("this report's plan" if self.plan is not None else "not recorded")
        return f"{text} (plan reconstructed after the fact)" if self.plan_info.get("reconstructed") else text

    def commits(self) -> list[str]:
        """The code versions its results were measured with."""
        out = set()
        for r in self.results.values():
            if r["status"] == NOT_RUN or self.kind == "book":
                continue
            code = r.get("code")
            if not code:
                out.add("code not recorded (an older result)")
            elif code.get("commit"):
                out.add(f"commit {code['commit'][:10]}{' (dirty)' if code.get('dirty') else ''}")
            else:
                out.add(f"dpscale {code.get('version')}, commit unknown")
        return sorted(out)


def short_gpu(model: str | None) -> str:
    if not model:
        return "GPU"
    for pre in ("NVIDIA ", "GeForce ", "Tesla "):
        model = model.replace(pre, "")
    return model.replace(" PCIe", "").replace(" SXM5", "").strip() or "GPU"


def shown(path) -> str:
    """A path as a report names it: relative to the working folder or to the repository
    when it lies inside either, else as given. A report kept in the repository must not
    name the folder of the machine it was built on (reference/h200/..., not /work/...)."""
    p = Path(path)
    if not p.is_absolute():
        return str(p)
    for base in (Path.cwd(), provenance.ROOT):
        if base.resolve() == Path(base.anchor):   # everything is inside /
            continue
        try:
            return str(p.resolve().relative_to(base.resolve()))
        except ValueError:
            continue
    return str(p)


def _read(path: Path, errors: list, folder: layout.Folder) -> dict | None:
    """A result, its files (the job's log, ...) named where they are now in `folder`."""
    try:
        r = contract.load_result(path)
    except (ValueError, OSError) as e:
        errors.append(f"{shown(path)}: {e}")
        return None
    r["_path"] = shown(path)
    for key in layout.PATH_FIELDS:
        if isinstance(r.get(key), str):
            r[key] = shown(folder.resolve(r[key]))
        elif isinstance(r.get(key), list):
            r[key] = [shown(folder.resolve(p)) if isinstance(p, str) else p for p in r[key]]
    return r


def _fingerprint(path: Path, errors: list) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        errors.append(f"{path}: {e}")
        return {}


def load_planned(runs_dir, fingerprint_path, targets: list[str], *, key="current", kind="current",
                 label="this run", plan_info=None, missing_reason=None) -> Machine:
    """The planned targets, each read from runs_dir (a missing one is `not run`)."""
    errors: list = []
    fp = _fingerprint(fingerprint_path, errors)
    plan = [parse_target(t) for t in targets]
    reason = missing_reason or ("planned, but it left no result file: the job has not run "
                                "(interrupted, or an input it needs failed)")
    found, folder = {}, layout.of_runs(runs_dir)
    for e, v, k in plan:
        path = Path(layout.result_path(e, v, k, str(runs_dir)))
        r = _read(path, errors, folder) if path.exists() else None
        found[(e, v, k)] = r if r is not None else not_run((e, v, k), reason)
    return Machine(key=key, kind=kind, label=label, fingerprint=fp, results=found, plan=plan,
                   plan_info=plan_info or {}, source=shown(runs_dir), errors=errors)


def load_found(runs_dir, fingerprint_path, *, key="current", kind="current", label="this run") -> Machine:
    """Every result file under runs_dir, when no plan is known."""
    errors: list = []
    fp = _fingerprint(fingerprint_path, errors)
    found, folder = {}, layout.of_runs(runs_dir)
    for p in sorted(Path(runs_dir).glob(layout.RESULT_GLOB)):
        r = _read(p, errors, folder)
        if r is not None:
            found[(r["experiment"], r["variant"], int(r["k"]))] = r
    return Machine(key=key, kind=kind, label=label, fingerprint=fp, results=found, source=shown(runs_dir),
                   errors=errors)


def load_reference(folder: Path) -> Machine:
    """A kept machine (dpscale.layout.kept): its fingerprint, runs/, plan.json (what that
    run planned), and roofline.json where one was kept (tools/lab/probe_roofline.py's
    per-layer profile)."""
    m = _load_reference(layout.kept(folder))
    m.profile = kept_profile(layout.kept(folder))
    m.alerts += refused_data(layout.kept(folder))
    return m


def kept_profile(folder: layout.Folder) -> dict | None:
    """The per-layer profile kept with a machine's results (its roofline.json), if any."""
    return json.loads(folder.roofline.read_text()) if folder.roofline.exists() else None


def _load_reference(folder: layout.Folder) -> Machine:
    name = folder.root.name
    # a run's results/ read as a machine keeps its plan where the report wrote it (results/report/plan.json)
    plan = next((p for p in (folder.plan, folder.root / "report" / layout.PLAN) if p.exists()), folder.plan)
    if plan.exists():
        info = json.loads(plan.read_text())
        m = load_planned(folder.runs, folder.fingerprint, info["targets"], key=name,
                         kind="reference", label=name, plan_info=info,
                         missing_reason=f"planned ({shown(plan)}), but no result was kept")
        extra = load_found(folder.runs, folder.fingerprint)
        for k, r in extra.results.items():   # kept results outside the plan still count
            m.results.setdefault(k, r)
        return m
    m = load_found(folder.runs, folder.fingerprint, key=name, kind="reference", label=name)
    m.errors.append(f"{shown(folder.plan)}: no plan recorded; the results found are shown as the plan")
    return m


def refused_data(folder: layout.Folder) -> list[str]:
    """The data copies the data stage refused before it found the one it used (its
    source.json's `rejected`: a truncated file, train and test swapped, ...), in words."""
    try:
        prov = json.loads((folder.data / "source.json").read_text())
    except (OSError, ValueError):
        return []
    used = prov.get("origin")
    return [f"Fashion-MNIST in {r.get('folder')} was refused ({r.get('reason')}); the run used "
            f"{used if isinstance(used, str) else ', '.join(used or []) or 'another copy'} instead"
            for r in prov.get("rejected") or []]


def reference_folders(dirs) -> list[Path]:
    out = []
    for d in dirs or []:
        d = Path(d)
        if d.is_dir():
            out += [p for p in sorted(d.iterdir()) if not p.name.startswith(".")   # a keep in progress
                    and layout.is_kept(p)]
    return out


@dataclass
class ReportData:
    machines: list[Machine]          # this run first, then the references, then the book
    build: dict = field(default_factory=dict)   # what built the report: version, commit, command, ...
    notes: list[str] = field(default_factory=list)
    book_rows: list = field(default_factory=list)   # the chapters' rows of the book-comparison table
    derived: dict = field(default_factory=dict)     # values computed once over every machine (memo)

    def memo(self, key, compute):
        """compute(), once per key and report: what every chapter reads of all the machines
        together (every forecast, every time-to-accuracy record). Callers do not change it."""
        if key not in self.derived:
            self.derived[key] = compute()
        return self.derived[key]

    @property
    def measured(self) -> list[Machine]:
        return [m for m in self.machines if m.kind != "book"]

    @property
    def current(self) -> Machine | None:
        return next((m for m in self.machines if m.kind == "current"), None)

    @property
    def book(self) -> Machine | None:
        return next((m for m in self.machines if m.kind == "book"), None)


def _measured_keys(m: Machine) -> set:
    return {(k, r.get("started_utc"), r.get("finished_utc")) for k, r in m.results.items() if r["status"] != NOT_RUN}


def with_references(current: Machine | None, folders: list[Path]):
    """The reference machines, leaving out one that holds exactly this run's results
    (what `dpscale keep` copied): it is shown once, as this run."""
    refs, notes = [], []
    for folder in folders:
        ref = load_reference(folder)
        if current is not None and current.results and _measured_keys(ref) == _measured_keys(current):
            notes.append(f"{folder} holds this run's results (kept by dpscale keep); shown once, as {current.label}")
            continue
        refs.append(ref)
    return refs, notes
