"""The results contract: one JSON per measurement, written atomically.

Every artifact holds `experiment`, `variant`, `k`, `status` (ok | hung | failed |
skipped, with `reason` when not ok), `metrics` (names carry units), `config`,
`fingerprint`, `backend`, `data` (provenance), UTC timestamps and, from a measurement,
`code` (the dpscale version, git commit and dirty flag, and the digest of the
experiment's modules: dpscale.provenance). schemas/result.schema.yaml publishes the
contract; make_result checks every result against it before anything writes one, and
load_result every result it reads (jsonschema: a dependency, as Snakemake's own).

Every writer seals what it writes (`save`: a `digest`, the sha256 of the result's JSON
without it), and every reader checks the seal (`audit`, `load_result`): a result that was
deleted, truncated, made invalid or edited by hand is never read as a number. The
workflow measures such a result again (dpscale.plan.replan), the report refuses to be
built from one, and the end of a run names it.
"""
from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpscale import provenance, registry

STATUSES = ("ok", "hung", "failed", "skipped")

REQUIRED = ("experiment", "variant", "k", "status", "metrics", "config",
            "fingerprint", "backend", "started_utc", "finished_utc")
SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "result.schema.yaml"


def job_label(experiment: str, variant: str, k) -> str:
    """"ddp_weak/cached/k2": how a job is named in logs, reasons and plans (and where
    its files are: dpscale.layout)."""
    return f"{experiment}/{variant}/k{k}"


def label_of(path: str | os.PathLike) -> str:
    """"results/runs/ddp_weak/cached/k2.json" (any root) -> "ddp_weak/cached/k2"."""
    p = Path(path)
    return f"{p.parent.parent.name}/{p.parent.name}/{p.name.removesuffix('.json')}"


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write `data` to `path` so that readers see the old file or the new one,
    never half of either: a temp file in the same folder, fsync, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes 0600 whatever the umask; a result on a shared box or cluster
        # filesystem is read by colleagues and web servers, as any file the user writes.
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _umask() -> int:
    """The process's umask, read without setting it where Linux shows it (os.umask can
    only be read by changing it, which races with files other threads create)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=False, default=_jsonable) + "\n")


def _jsonable(x: Any) -> Any:
    # numpy scalars and arrays, Paths: everything else is a bug worth seeing.
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    raise TypeError(f"not JSON-serialisable: {type(x).__name__}")


# ---------------------------------------------------------------- paths in a record
# A record (a result, plan.json, the data's provenance, the stand-in's link.json) names
# a path inside its run folder relative to it, the user's home as ~, and the project's
# checkout relative to the run folder: it reads the same wherever the folder is moved or
# kept, and holds nothing of the machine that wrote it. The run folder is the working
# directory of the process that writes the record: Snakemake's, or the stand-in's
# output folder, which it enters before it runs a job. A reader resolves a path against
# the folder it reads (dpscale.layout.Folder.resolve).

# An absolute path inside a string: at its start, or after a space, a quote, '=' or '('.
_ABSOLUTE = re.compile(r"(?:^|(?<=[\s'\"=(,]))(/[^\s'\",;)]*)")
# What a user typed, kept as typed: rewriting it would change what it says, since its
# paths are relative to wherever it was typed.
TYPED = ("command",)


def _inside(path: str, base: str) -> bool:
    return base != "/" and (path == base or path.startswith(base.rstrip("/") + "/"))


def relative(path: str | os.PathLike, run_dir: str | os.PathLike | None = None) -> str:
    """`path` as a record names it: relative to the run folder when inside it ("." for
    the folder itself) or inside the project's checkout (os.path.relpath: "../.." where
    the checkout lies outside the run folder), "~/..." inside the user's home, else as
    given (a system location: /usr/..., /dev/...)."""
    text = os.fspath(path)
    if not os.path.isabs(text):
        return text
    run = os.path.abspath(run_dir if run_dir is not None else os.getcwd())
    norm = os.path.normpath(text)
    for base in dict.fromkeys((run, os.path.realpath(run), str(provenance.ROOT))):
        if _inside(norm, base):
            return os.path.relpath(norm, base if base != str(provenance.ROOT) else run)
    home = os.path.expanduser("~")
    for base in dict.fromkeys((home, os.path.realpath(home))):
        if _inside(norm, base):
            return "~/" + os.path.relpath(norm, base)
    return text


def portable(obj, run_dir: str | os.PathLike | None = None):
    """A copy of a record (dicts, lists, strings) with every absolute path in it, alone
    or inside a command line, written as `relative` writes it; numbers and what a user
    typed (TYPED keys) untouched."""
    if isinstance(obj, dict):
        return {k: v if k in TYPED else portable(v, run_dir) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(portable(v, run_dir) for v in obj)
    if isinstance(obj, str) and "/" in obj:
        return _ABSOLUTE.sub(lambda m: relative(m.group(1), run_dir), obj)
    return obj


def make_result(*, experiment: str, variant: str, k: int, status: str,
                metrics: dict | None = None, config: dict | None = None,
                fingerprint: dict | None = None, backend: str, reason: str | None = None,
                started_utc: str | None = None, data: dict | None = None,
                **extra: Any) -> dict:
    if experiment not in registry.EXPERIMENTS:
        raise ValueError(f"experiment {experiment!r} is not one of {registry.names()}")
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {STATUSES}")
    if status != "ok" and not reason:
        raise ValueError(f"status {status!r} needs a reason")
    out = {
        "experiment": experiment, "variant": variant, "k": int(k), "status": status,
        "reason": reason, "backend": backend, "metrics": metrics or {},
        "config": config or {}, "fingerprint": fingerprint or {}, "data": data or {},
        "started_utc": started_utc or utc_now(), "finished_utc": utc_now(),
    }
    out.update(extra)
    out = portable(out)   # its paths relative to the run folder
    check_schema(json.loads(json.dumps(out, default=_jsonable)), job_label(experiment, variant, k))
    return out


@functools.cache
def _validator():
    import jsonschema   # imported on first use: the workflow's parse stays light
    import yaml
    schema = yaml.load(SCHEMA.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def check_schema(obj: dict, where: str = "result") -> dict:
    """Check `obj` against schemas/result.schema.yaml; raise ValueError with one line:
    where, the key's path, what is wrong and the schema's word on what belongs there."""
    import jsonschema
    error = jsonschema.exceptions.best_match(_validator().iter_errors(obj))
    if error is None:
        return obj
    path = ".".join(str(p) for p in error.absolute_path) or "top level"
    hint = error.schema.get("description") if isinstance(error.schema, dict) and error.absolute_path else None
    hint = f"; {' '.join(hint.split())}" if hint else ""
    raise ValueError(f"{where}: {path}: {error.message}{hint} (schemas/result.schema.yaml)")


def validate_result(obj: dict, where: str = "result") -> dict:
    """Check the contract; raise ValueError naming the file and the key."""
    missing = [key for key in REQUIRED if key not in obj]
    if missing:
        raise ValueError(f"{where}: missing key(s) {missing}")
    if obj["experiment"] not in registry.EXPERIMENTS:
        raise ValueError(f"{where}: experiment {obj['experiment']!r} not in {registry.names()}")
    if obj["status"] not in STATUSES:
        raise ValueError(f"{where}: status {obj['status']!r} not in {STATUSES}")
    if obj["status"] != "ok" and not obj.get("reason"):
        raise ValueError(f"{where}: status {obj['status']!r} without a reason")
    if not isinstance(obj["metrics"], dict):
        raise ValueError(f"{where}: metrics must be an object")
    return check_schema(obj, where)


# ---------------------------------------------------------------- the seal

SEAL_OF = "the result's JSON without `digest`: keys sorted, separators ',' and ':', UTF-8"
# What an audit finds: sound, or why the file cannot be read as the number it claims.
SOUND, MISSING, UNREADABLE, ALTERED, UNSEALED = "sound", "missing", "unreadable", "altered", "unsealed"


def digest_of(obj: dict) -> str:
    """sha256 of a result's canonical JSON without its `digest` key. Canonical, so that
    the seal survives a reader's round trip (json floats print as their repr)."""
    body = {key: v for key, v in obj.items() if key != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_jsonable)
    return hashlib.sha256(text.encode()).hexdigest()


def seal(result: dict) -> dict:
    """The result as it will be read back (numpy scalars as numbers), with its digest."""
    plain = json.loads(json.dumps(result, default=_jsonable))
    plain["digest"] = {"sha256": digest_of(plain), "of": SEAL_OF}
    return plain


def save(path: str | os.PathLike, result: dict) -> dict:
    """Write a result, sealed, atomically: the one way a result reaches the disk."""
    sealed = seal(result)
    write_json_atomic(path, sealed)
    return sealed


@dataclass(frozen=True)
class Audit:
    """What a result file holds now: `state` is sound, missing, unreadable, altered or
    unsealed; `reason` says why it is not sound; `digest` and `status` when it is."""
    path: str
    state: str
    reason: str | None = None
    digest: str | None = None
    status: str | None = None

    @property
    def sound(self) -> bool:
        return self.state == SOUND

    def line(self) -> str:
        return f"{self.path}: {self.state}: {self.reason}"


def audit(path: str | os.PathLike) -> Audit:
    """Read a result file and check its seal and the contract, never raising."""
    p = str(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return Audit(p, MISSING, "no file")
    except (OSError, UnicodeDecodeError) as e:
        return Audit(p, UNREADABLE, f"cannot be read ({e})")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return Audit(p, UNREADABLE, f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}: "
                                    "truncated or overwritten)")
    if not isinstance(obj, dict):
        return Audit(p, UNREADABLE, f"holds a JSON {type(obj).__name__}, not a result")
    seal_ = obj.get("digest")
    if not isinstance(seal_, dict) or not isinstance(seal_.get("sha256"), str):
        return Audit(p, UNSEALED, "it carries no digest (written by hand, or by a dpscale older than the seal), "
                                  "so nothing shows it is what was measured")
    if seal_["sha256"] != digest_of(obj):
        return Audit(p, ALTERED, "its content does not match its digest (edited by hand, or damaged)")
    try:
        validate_result(obj, p)
    except ValueError as e:
        return Audit(p, UNREADABLE, f"not a result of this contract ({e})")
    return Audit(p, SOUND, None, seal_["sha256"], obj["status"])


def load_result(path: str | os.PathLike) -> dict:
    """A result, checked: its seal and the contract. ValueError names the file and why."""
    a = audit(path)
    if a.state == MISSING:
        raise FileNotFoundError(f"{path}: no such result")
    if not a.sound:
        raise ValueError(a.line())
    return json.loads(Path(path).read_text())


def data_provenance(meta: dict) -> dict:
    """What every result records about its data, from the resize cache's sidecar JSON."""
    return {"source": meta["source"], "origin": meta.get("origin"),
            "image_size": meta["image_size"], "cache_sha256": meta["sha256"]}


def write_result(spec: dict, path: str | os.PathLike, metrics: dict, started_utc: str,
                 runtime: dict, gpu_state: dict | None = None) -> dict:
    """A measurement's result, from its job spec: status from metrics['_status']
    (a check beside a timing may fail it), data provenance from the cache's sidecar,
    and on a GPU the devices' state (dpscale.measure.gpustate; no key on a CPU)."""
    status, reason = metrics.pop("_status", ("ok", None))
    meta_path = spec.get("inputs", {}).get("cache_meta")
    data = (data_provenance(json.loads(Path(meta_path).read_text()))
            if meta_path and Path(meta_path).exists() else {})
    result = make_result(experiment=spec["experiment"], variant=spec["variant"], k=spec["k"],
                         status=status, reason=reason, metrics=metrics, config=spec["config"],
                         fingerprint=spec["fingerprint"], backend=spec["backend"],
                         started_utc=started_utc, data=data, runtime=runtime, env=spec.get("env", {}),
                         code=provenance.code_record(registry.get(spec["experiment"]).sources),
                         **({"gpu_state": gpu_state} if gpu_state is not None else {}),
                         **({"launch": dict(spec["launch"])} if spec.get("launch") else {}))
    return save(path, result)


# ---------------------------------------------------------------- failed attempts

def failures_path(result: str | os.PathLike) -> Path:
    """Beside results/runs/<exp>/<variant>/k<k>.json, k<k>.failures: one line per
    failed attempt, appended by the watchdog, and per result found missing, damaged or
    altered by the planner (dpscale.plan.replan); never rewritten."""
    return Path(result).with_suffix(".failures")


def record_failure(result: str | os.PathLike, reason: str) -> None:
    with open(failures_path(result), "a") as f:
        f.write(f"{utc_now()} {' '.join(reason.split())}\n")


def failed_attempts(result: str | os.PathLike) -> int:
    """How many attempts at this result failed so far (0 when none did)."""
    try:
        with open(failures_path(result)) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def failure_summary(paths) -> str | None:
    """One line per planned result that holds no number (failed, hung), for the end
    of a run; None when every one holds a number."""
    rows = []
    for path in paths:
        try:
            r = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        if r.get("status") in ("failed", "hung"):
            log = f" (log {r['log']})" if r.get("log") else ""
            rows.append(f"  {job_label(r['experiment'], r['variant'], r['k'])} {r['status']}: {r.get('reason')}{log}")
    if not rows:
        return None
    return (f"{len(rows)} measurement(s) failed or hung; a plain rerun retries the failed ones "
            "(a hung one is a result: --forcerun its rule to try again):\n" + "\n".join(rows))


def last_failure(result: str | os.PathLike) -> str | None:
    """The reason of the record at `result` when it is a failed attempt, else None."""
    if not failures_path(result).exists():
        return None
    try:
        r = json.loads(Path(result).read_text())
    except (OSError, ValueError):
        return None
    return r.get("reason") if r.get("status") == "failed" else None
