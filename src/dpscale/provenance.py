"""What code produced a number: the project's version, the git commit (with a
dirty flag) and a digest of the modules an experiment's measurement runs.

Cheap and import-light: the workflow calls it on every parse, the workers once per job.

The digest is what makes an old number stale. It hashes each module's syntax tree
with docstrings removed (ast.unparse), so a change to a comment, a docstring or the
formatting keeps the results, and a change to what the code does reruns them. It is
a params value of every measurement rule (rules/measure.smk); the commit is not,
since a commit that touches only the README must not rerun a GPU job.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parents[1]


COMMAND_VAR = "DPSCALE_SNAKEMAKE_COMMAND"


def export_command(argv: list[str]) -> None:
    """Hand the Snakemake command line to the jobs (the report names it). Through the
    environment, not a params value: the same report built by another command line
    must not rerun."""
    os.environ[COMMAND_VAR] = shlex.join(["snakemake", *argv[1:]])


# Options that make a run do less than the plan, or force what they name: a rerun that
# must measure drops them, those of NARROWING with their values (each takes the words
# after it up to the next option, as Snakemake's argparse parsed them).
NARROWING = ("--allowed-rules", "--until", "-U", "--omit-from", "-O", "--forcerun", "-R")
NARROWING_FLAGS = ("--dry-run", "--dryrun", "-n", "--touch", "-t", "--forceall", "-F")


def rerun_command(force: str | None = None, env: dict | None = None) -> str:
    """The command that measures again what this run left: the run's own command line
    (its profile, config files and --config kept: a cluster run stays one, a changed
    protocol stays changed) without NARROWING's options, plus `--forcerun force`. Without
    the run's command (outside a workflow run), the README's."""
    cmd = (env if env is not None else os.environ).get(COMMAND_VAR)
    words = shlex.split(cmd) if cmd else ["snakemake", "--cores", "1", "report"]
    out, dropping = [], False
    for w in words:
        if w.startswith("-"):
            name = w.split("=", 1)[0]
            dropping = name in NARROWING and "=" not in w   # its values follow as words
            if name in NARROWING + NARROWING_FLAGS:
                continue
        elif dropping:
            continue
        out.append(w)
    return shlex.join(out + (["--forcerun", force] if force else []))


def project_version() -> str:
    try:
        return metadata.version("dpscale")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


# Parsing the package is most of a workflow parse's own CPU (about 1 s of 2 on the 2-core
# machine: the report's digest reads 91 modules, and every job's result names its own), so
# what a module's syntax gives, its normalised text and its import statements, is kept
# between processes, keyed like __pycache__ but by content: the sha256 of the file's bytes,
# of this module's own bytes (the normalisation) and of the Python version (ast.unparse's
# output is the interpreter's). An entry is a pure function of its key, so a copy of the
# tree elsewhere (a test's folder, a clone) reuses it, and an edit is a new key. A cache
# that cannot be read or written is the same as none: the file is parsed again.
_SELF = Path(__file__).read_bytes()


def user_cache(env: dict | None = None) -> Path:
    """$XDG_CACHE_HOME/dpscale, else ~/.cache/dpscale: the user's cache folder (the parses
    and stored values below, and the compilation caches' default: plan.config.resolve_cache)."""
    env = os.environ if env is None else env
    return Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME") or "~").expanduser() / ".cache") / "dpscale"


_MEMO: dict[str, tuple[str, tuple]] = {}


def _parsed(path: Path) -> tuple[str, tuple]:
    """(the module's code with docstrings removed, ast.unparse'd; its import statements as
    ("import", names) and ("from", level, module, names)), for the file's bytes now."""
    body = path.read_bytes()
    key = hashlib.sha256(_SELF + b"\0" + sys.version.encode() + b"\0" + body).hexdigest()
    if key in _MEMO:
        return _MEMO[key]
    entry = user_cache() / "provenance" / key[:2] / f"{key}.json"
    try:
        normalised, imports = _kept(entry)
        out = normalised, tuple((i[0], *(tuple(x) if isinstance(x, list) else x for x in i[1:])) for i in imports)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        out = _parse(body)
        _keep(entry, list(out))
    _MEMO[key] = out
    return out


def _parse(body: bytes) -> tuple[str, tuple]:
    tree = ast.parse(body)
    imports = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports.append(("import", tuple(a.name for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            imports.append(("from", node.level, node.module or "", tuple(a.name for a in node.names)))
    for node in ast.walk(tree):
        first = getattr(node, "body", None)
        if (isinstance(first, list) and first and isinstance(first[0], ast.Expr)
                and isinstance(first[0].value, ast.Constant) and isinstance(first[0].value.value, str)):
            node.body = first[1:] or [ast.Pass()]
    return ast.unparse(tree), tuple(imports)


def _kept(entry: Path):
    """The value _keep wrote; an error where there is none, or it is damaged or edited by
    hand (its own sha256 no longer matches)."""
    got = json.loads(entry.read_text())
    if hashlib.sha256(json.dumps(got["value"]).encode()).hexdigest() != got["sha256"]:
        raise ValueError(entry)
    return got["value"]


def _keep(entry: Path, value) -> None:
    """Written whole or not at all (a temporary file renamed), with its sha256; never an error."""
    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=entry.parent, suffix=".tmp", delete=False) as f:
            tmp = f.name
            json.dump({"value": value, "sha256": hashlib.sha256(json.dumps(value).encode()).hexdigest()}, f)
        os.replace(tmp, entry)
    except OSError:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _normalised(path: Path) -> str:
    return _parsed(path)[0]


def module_path(name: str, package: Path = PACKAGE) -> Path:
    """The file of a dotted dpscale module ("dpscale.measure.torch_ddp", or a package)."""
    rel = Path(*name.split(".")[1:])
    pkg = package / rel / "__init__.py"
    return pkg if pkg.exists() else (package / rel).with_suffix(".py")


@functools.cache
def package_modules(package: Path = PACKAGE) -> frozenset[str]:
    """Every module of the package, dotted ("dpscale.run.watchdog")."""
    out = set()
    for p in package.rglob("*.py"):
        parts = (package.name,) + p.relative_to(package).with_suffix("").parts
        out.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return frozenset(out)


@functools.cache
def imports_of(name: str, package: Path = PACKAGE) -> frozenset[str]:
    """The dpscale modules `name` imports, at the top or inside a function, absolute
    or relative (`from . import x` imports the module x when there is one)."""
    known = package_modules(package)
    path = module_path(name, package)
    anchor = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for stmt in _parsed(path)[1]:
        if stmt[0] == "import":
            out |= set(stmt[1])
        else:
            _, level, base, names = stmt
            if level:
                parts = anchor.split(".")
                base = ".".join(parts[: len(parts) - level + 1] + ([base] if base else []))
            out |= {f"{base}.{a}" if f"{base}.{a}" in known else base for a in names}
    return frozenset(m for m in out if m in known and m != name)


# Declarations, not code a number depends on: what a job takes from the registry
# (protocol, variant options, env) reaches it through its spec, itself a params value.
# Walking into it would rerun every measurement when an experiment is added.
NOT_CODE = frozenset({"dpscale.registry"})


def closure(roots, package: Path = PACKAGE, skip: frozenset[str] = NOT_CODE) -> tuple[str, ...]:
    """The dpscale modules `roots` reach through their imports (themselves included),
    sorted, leaving out `skip`: what a job or the report runs. The staleness lists
    derive from this, so no list is kept by hand (a hand-kept one went wrong both ways)."""
    seen, todo = set(), [r for r in roots if r in package_modules(package) and r not in skip]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += [n for n in imports_of(m, package) if n not in skip and n not in seen]
    return tuple(sorted(seen))


def source_digest(modules: tuple[str, ...], package: Path = PACKAGE) -> str:
    """sha256 (16 hex digits) of the named dpscale modules' code, docstrings and comments aside."""
    h = hashlib.sha256()
    for name in sorted(modules):
        h.update(name.encode() + b"\0" + _normalised(module_path(name, package)).encode() + b"\0")
    return h.hexdigest()[:16]


def stored(name: str, roots: tuple[str, ...], files: list[Path], compute, libraries=("numpy", "scipy")):
    """compute()'s value (JSON: lists come back as lists), kept between processes beside the
    parses (_parsed): keyed by `name`, the code that computes it (the source digest of what
    `roots` import), the bytes of every file it reads, and the versions of Python and of
    `libraries`. For a computation on committed inputs that every report repeats (the E(B)
    check on the public tables, 2.4 CPU-s); an entry that cannot be read is computed again."""
    h = hashlib.sha256(f"{name}\0{source_digest(closure(roots, skip=frozenset()))}\0{sys.version}".encode())
    for lib in libraries:
        try:
            h.update(f"\0{lib} {metadata.version(lib)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"\0{lib} none".encode())
    for f in sorted(files):
        h.update(b"\0" + str(f.name).encode() + b"\0" + f.read_bytes())
    entry = user_cache() / "stored" / f"{name}-{h.hexdigest()}.json"
    try:
        return _kept(entry)
    except (OSError, ValueError, KeyError, TypeError):
        value = json.loads(json.dumps(compute()))   # what a later read gives, also the first time
        _keep(entry, value)
        return value


def report_modules(package: Path = PACKAGE) -> tuple[str, ...]:
    """The dpscale modules outside the report package that the report reaches."""
    inside = [m for m in package_modules(package) if m.startswith(f"{package.name}.report")]
    reached = closure(inside, package, skip=frozenset())   # the registry's texts are drawn
    return tuple(m for m in reached if not m.startswith(f"{package.name}.report"))


def report_digest() -> str:
    """sha256 (16 hex digits) of what draws the report: the report package's code (as
    source_digest reads it), its templates and prose, and the modules it imports. The
    report rule's params value: a fixed figure or reworded prose rebuilds the report,
    and reruns no measurement."""
    h = hashlib.sha256(source_digest(report_modules()).encode())
    folder = PACKAGE / "report"
    for p in sorted(f for f in folder.rglob("*") if f.is_file() and "__pycache__" not in f.parts):
        body = _normalised(p) if p.suffix == ".py" else p.read_text()
        h.update(str(p.relative_to(folder)).encode() + b"\0" + body.encode() + b"\0")
    return h.hexdigest()[:16]


def _git(*args: str) -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def git_state() -> dict:
    """{"commit": sha or None, "dirty": bool or None, "source": where it came from}.

    A copy of the tree without .git (a GPU machine that was sent the working tree)
    can name its commit through DPSCALE_GIT_COMMIT (and DPSCALE_GIT_DIRTY=1)."""
    if os.environ.get("DPSCALE_GIT_COMMIT"):
        return {"commit": os.environ["DPSCALE_GIT_COMMIT"],
                "dirty": os.environ.get("DPSCALE_GIT_DIRTY", "0") not in ("0", "", "false"),
                "source": "DPSCALE_GIT_COMMIT"}
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "source": f"no git repository at {ROOT}"}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status), "source": "git"}


def code_record(modules: tuple[str, ...]) -> dict:
    """What every result carries about the code that measured it."""
    return {"version": project_version(), **git_state(), "sources": sorted(modules),
            "sources_sha256": source_digest(modules)}
