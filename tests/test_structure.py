"""The code's shape, checked: no import circles in the package, imports only down its
floors (scripts/ and rules/ on top, lab/ reached by no pipeline code), no dynamic import
but the registry's and the figure index's, every experiment's entry in measure/ and its
digest free of plan/, run/, standin/ and lab/, short functions everywhere, markup only in
templates, and light imports where the workflow is parsed. Each check is a function of a
tree, and each is shown to catch the mutation it exists for."""
from __future__ import annotations

import ast
import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

from dpscale import provenance, registry

PACKAGE = ROOT / "src" / "dpscale"
REPORT = PACKAGE / "report"
HTML_TAG = re.compile(r"</?(a|b|i|p|br|hr|div|span|table|thead|tbody|tr|td|th|caption|img|figure|figcaption|"
                      r"section|nav|header|h[1-6]|ul|ol|li|pre|code|em|strong|style|script|html|head|body|"
                      r"meta|title|dl|dt|dd)\b[^<>]*>", re.I)


def graph() -> dict[str, frozenset[str]]:
    """Every dpscale module and the dpscale modules it imports (dpscale.provenance's
    walk: the same one that decides what a change reruns)."""
    return {name: provenance.imports_of(name) for name in provenance.package_modules()}


# The package's floors, lowest first: a module imports only from its own floor or
# those below. Root modules are the ground floor, but for the command line on top;
# scripts/ and rules/ (with the Snakefile) stand above them all, and may not reach lab/.
# The stand-in machines sit beside running one job, one floor up: they run jobs, and
# nothing that runs a job or reports one reaches them.
LAYERS = ("ground", "data", "model", "analysis", "plan", "measure", "run", "standin", "report", "lab", "cli")
# Where a module may be imported by name at run time (importlib): the registry's entry
# points and the figure index's per-chapter modules. Anywhere else it would hide an
# import from the digest walk (dpscale.provenance reads import statements).
DYNAMIC_IMPORTS = {"registry.py", "report/figures/__init__.py"}
DYNAMIC = ("import_module", "__import__", "spec_from_file_location", "exec_module", "run_module", "run_path")
LONGEST = 60


def layer(module: str) -> str:
    parts = module.split(".")
    if module == "dpscale.cli":
        return "cli"
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else "ground"


def test_the_package_has_no_import_circle():
    g = graph()
    state: dict[str, int] = {}

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(g[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2
    for name in sorted(g):
        if name not in state:
            visit(name, [name])
    assert g["dpscale.report"] and g["dpscale.report.figures"], "the graph was read"


def upward(g: dict) -> list[str]:
    return [f"{m} ({layer(m)}) imports {n} ({layer(n)})" for m, ns in g.items() for n in sorted(ns)
            if LAYERS.index(layer(n)) > LAYERS.index(layer(m))]


def test_imports_only_run_down_the_layers():
    """registry, results, provenance and data on the ground; then the models, the
    analysis, planning, the measurements, running a job, the stand-in machines, the
    report, the lab (code no pipeline variant runs) and the command line. Nothing
    imports from a floor above."""
    up = upward(graph())
    assert not up, up
    assert {layer(m) for m in graph()} == set(LAYERS), "every floor is in use, and no module outside them"


def test_the_layer_check_sees_an_upward_import(tmp_path):
    """The check above, on a package where the analysis imports a measurement: it must see it."""
    pkg = tmp_path / "dpscale"
    for f, body in {"__init__.py": "", "analysis/__init__.py": "", "measure/__init__.py": "",
                    "analysis/stats.py": "def f():\n    from dpscale.measure import job\n",
                    "measure/job.py": "from ..analysis import stats\n"}.items():
        (pkg / f).parent.mkdir(parents=True, exist_ok=True)
        (pkg / f).write_text(body)
    g = {m: provenance.imports_of(m, pkg) for m in provenance.package_modules(pkg)}
    assert g["dpscale.measure.job"] == {"dpscale.analysis.stats"}   # relative, at the top: down, fine
    assert upward(g) == ["dpscale.analysis.stats (analysis) imports dpscale.measure.job (measure)"]
    # running one job never reaches the stand-in machines, which run jobs
    assert upward({"dpscale.run.watchdog": {"dpscale.standin.netns"},
                   "dpscale.standin.twonode": {"dpscale.run.watchdog"}}) == [
        "dpscale.run.watchdog (run) imports dpscale.standin.netns (standin)"]


def long_functions(folder: Path) -> list[str]:
    long = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > LONGEST:
                    long.append(f"{path.relative_to(folder)}:{node.lineno} {node.name} ({n} lines)")
    return long


def test_no_function_needs_scrolling():
    """The package and the scripts the rules call (their logic is the package's; what is
    left of them is as short)."""
    for folder in (PACKAGE, ROOT / "scripts"):
        assert not long_functions(folder), long_functions(folder)


# A commit or a working session named where a reader meets the code: the dated report
# under docs/measurements/ and the changelog name them, the code cites the report. A
# commit is 7 to 40 hex digits with a digit and a letter among them. Not one: an md5 of
# exactly 32 digits (the data's published checksums, dpscale.data.fetch, which the code
# must hold); a sha256 is 64 digits and never matches.
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")
SESSION = re.compile(r"\bsession\s+\d+", re.I)
MD5_DIGITS = 32


def dated_names(root: Path) -> list[str]:
    """Commits and sessions named in README.md, the Snakefile, src/, rules/ and scripts/."""
    files = [root / "README.md", root / "Snakefile"] + [
        p for d in ("src", "rules", "scripts") for p in sorted((root / d).rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".png", ".svg")]
    found = []
    for path in files:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            names = [t for t in COMMIT.findall(line) if re.search(r"\d", t) and re.search(r"[a-f]", t)
                     and len(t) != MD5_DIGITS] + SESSION.findall(line)
            found += [f"{path.relative_to(root)}:{n}: {name}" for name in names]
    return found


def test_no_commit_or_session_is_named_outside_the_reports():
    assert not dated_names(ROOT), dated_names(ROOT)


def dynamic_imports(package: Path) -> list[str]:
    """Every run-time import by name (importlib, __import__, runpy) outside DYNAMIC_IMPORTS."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel in DYNAMIC_IMPORTS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name in ("importlib", "importlib.util", "runpy")]
            elif isinstance(node, ast.ImportFrom) and node.module in ("importlib", "importlib.util", "runpy"):
                names = [f"{node.module}.{a.name}" for a in node.names if a.name != "metadata"]
            elif isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                names = [name] if name in DYNAMIC else []
            found += [f"{rel}:{node.lineno} {n}" for n in names]
    return found


def test_no_dynamic_import_outside_the_registry_and_the_figure_index():
    assert not dynamic_imports(PACKAGE), dynamic_imports(PACKAGE)


def top_layer_imports(root: Path) -> list[str]:
    """dpscale modules that scripts/, rules/ and the Snakefile import from lab/ (the top
    layer may import any floor but the lab: no pipeline step runs lab code)."""
    bad = []
    for path in [root / "Snakefile", *sorted((root / "rules").glob("*.smk")), *sorted((root / "scripts").glob("*.py"))]:
        text = path.read_text()
        mods = re.findall(r"^\s*import (dpscale[\w.]*)", text, re.M)
        for base, names in re.findall(r"^\s*from (dpscale[\w.]*) import ([\w, ]+)", text, re.M):
            mods += [f"{base}.{n.split(' as ')[0].strip()}" for n in names.split(",")]
        bad += [f"{path.relative_to(root)} imports {m}" for m in mods if m.startswith("dpscale.lab")]
    return sorted(set(bad))


def test_scripts_and_rules_import_no_lab_module():
    assert not top_layer_imports(ROOT), top_layer_imports(ROOT)


def entries_outside_measure() -> list[str]:
    return [f"{e.name}: {e.entry}" for e in registry.EXPERIMENTS.values()
            if not e.entry.startswith("dpscale.measure.")]


def digest_breaches(experiments=None) -> list[str]:
    """Modules of plan/, run/, standin/ or lab/, or the files' layout, in an experiment's
    digest (its worker imports them): where a run keeps its files is not what it measures with."""
    return [f"{e.name}: {m}" for e in (experiments or registry.EXPERIMENTS.values()) for m in e.sources
            if m.startswith(("dpscale.plan", "dpscale.run", "dpscale.standin", "dpscale.lab"))
            or m == "dpscale.layout"]


def test_every_entry_is_a_measurement_and_no_digest_holds_the_planner_supervisor_or_lab():
    assert not entries_outside_measure(), entries_outside_measure()
    assert not digest_breaches(), digest_breaches()
    assert len(registry.get("ddp_weak").sources) <= 13, registry.get("ddp_weak").sources


def _tree_copy(tmp_path: Path) -> Path:
    """A copy of the package, scripts/ and rules/ to mutate (sources only)."""
    root = tmp_path / "repo"
    shutil.copytree(PACKAGE, root / "src" / "dpscale", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "scripts", root / "scripts")
    shutil.copytree(ROOT / "rules", root / "rules")
    shutil.copy(ROOT / "Snakefile", root / "Snakefile")
    return root


def test_each_check_catches_its_mutation(tmp_path, monkeypatch):
    """The mutations the checks exist for: an importlib import of lab/ from measure/, a
    script importing lab/, a registry entry naming a lab module, a 61-line function in
    measure/, and a worker importing the planner. The unmutated copy passes each check."""
    root = _tree_copy(tmp_path)
    pkg = root / "src" / "dpscale"
    assert not dynamic_imports(pkg) and not top_layer_imports(root) and not long_functions(pkg)
    job = pkg / "measure" / "torch_job.py"
    job.write_text(job.read_text() + "\nimport importlib\nPROBE = importlib.import_module('dpscale.lab.tuned_probe')\n")
    assert [f for f in dynamic_imports(pkg) if f.startswith("measure/torch_job.py")], "importlib in measure/"
    script = root / "scripts" / "resize.py"
    script.write_text(script.read_text() + "\nfrom dpscale.lab import kernel_table  # noqa\n")
    assert top_layer_imports(root) == ["scripts/resize.py imports dpscale.lab.kernel_table"]
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    (pkg / "measure" / "long.py").write_text(f"def f():\n{body}\n")
    assert long_functions(pkg) == ["measure/long.py:1 f (61 lines)"]
    (root / "scripts" / "long.py").write_text(f"def f():\n{body}\n")
    assert long_functions(root / "scripts") == ["long.py:1 f (61 lines)"]
    lab_entry = dataclasses.replace(registry.get("fsdp"), entry="dpscale.lab.tuned_probe:fixed_batches")
    monkeypatch.setitem(registry.EXPERIMENTS, "fsdp", lab_entry)
    assert entries_outside_measure() == ["fsdp: dpscale.lab.tuned_probe:fixed_batches"]
    monkeypatch.undo()
    worker = pkg / "measure" / "torch_job.py"
    worker.write_text(worker.read_text() + "\nfrom dpscale.plan import cluster  # noqa\n")
    mods = provenance.closure(("dpscale.measure.torch_job",), pkg)
    assert "dpscale.plan.cluster" in mods and digest_breaches([_Exp("ddp_weak", mods)]) == [
        "ddp_weak: dpscale.layout", "ddp_weak: dpscale.plan.cluster", "ddp_weak: dpscale.plan.fingerprint"], mods


def test_the_dated_names_check_sees_a_commit_and_a_session_and_not_a_checksum(tmp_path):
    root = _tree_copy(tmp_path)
    (root / "README.md").write_text("Run it.\n")
    clean = dated_names(root)
    torch_ddp = root / "src" / "dpscale" / "measure" / "torch_ddp.py"
    torch_ddp.write_text(torch_ddp.read_text() + "\n# 2.5 s at 5a04905 (Session 42)\n")
    (root / "rules" / "common.smk").write_text((root / "rules" / "common.smk").read_text()
                                               + "# measured at commit 7aa3da0f on one H200\n")
    (root / "scripts" / "resize.py").write_text((root / "scripts" / "resize.py").read_text()
                                                + '# md5 "8d4fb7e6c68d591d4c3dfef9ec88bf0d", 1234567, deadbeef\n')
    (root / "README.md").write_text("Run it (in session 3 at caf8e87).\n")
    new = [f.split(": ", 1)[1] for f in dated_names(root) if f not in clean]
    assert new == ["caf8e87", "session 3", "5a04905", "Session 42", "7aa3da0f"], new


@dataclasses.dataclass
class _Exp:
    name: str
    sources: tuple


def test_no_markup_is_built_in_python_strings():
    found = []
    for path in REPORT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and HTML_TAG.search(node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:60]!r}")
    assert not found, found
    assert HTML_TAG.search('<td class="x">') and not HTML_TAG.search("<experiment>/<variant>/k<k>.json")


def test_what_the_workflow_imports_when_parsed_is_light():
    """The dpscale modules the Snakefile and rules import load no plotting or ML library."""
    sources = [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))]
    mods = set()
    for p in sources:
        for base, names in re.findall(r"^from (dpscale[\w.]*) import (\([^)]*\)|[^\n]*)", p.read_text(), re.M):
            names = [re.sub(r" as \w+", "", n).strip(" ()\n") for n in names.split(",") if n.strip(" ()\n")]
            mods |= {f"{base}.{n}" for n in names} if base == "dpscale" else {base}
    mods = sorted(mods)
    assert "dpscale.report.chapters" in mods and "dpscale.registry" in mods, mods
    code = ("import sys; sys.path.insert(0, 'src'); " + "; ".join(f"import {m}" for m in mods)
            + "; print(sorted(m for m in ('matplotlib', 'pandas', 'torch', 'jax', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_the_report_digest_covers_what_the_report_imports():
    """The modules whose change rebuilds the report are the ones the report package
    reaches by its imports: the registry and the statistics, no measurement code."""
    outside = set(provenance.report_modules())
    assert {"dpscale.registry", "dpscale.analysis.stats", "dpscale.results"} <= outside, outside
    assert not any(m.startswith(("dpscale.measure", "dpscale.lab", "dpscale.run", "dpscale.standin"))
                   for m in outside), outside


def digests_changed_by(tmp_path: Path, rel: str) -> set[str]:
    """The experiments whose code digest changes when a constant is appended to `rel`."""
    root = _tree_copy(tmp_path / rel.replace("/", "_"))
    pkg = root / "src" / "dpscale"
    def digests():
        return {e.name: provenance.source_digest(provenance.closure(
            (registry.FAMILY_JOB[e.family], e.entry.partition(":")[0]), pkg), pkg) for e in registry.EXPERIMENTS.values()}
    before = digests()
    (pkg / rel).write_text((pkg / rel).read_text() + "\nUNRELATED_CONSTANT = 1\n")
    after = digests()
    return {name for name in before if before[name] != after[name]}


def test_an_edit_reruns_exactly_the_experiments_that_run_the_module(tmp_path):
    """The planner, the supervisor, the stand-in machines, the files' layout, the data
    stage's download and the lab: no experiment.
    The DDP measurements' module: every torch experiment that imports it, nothing else
    (tests/test_workflow.py shows a changed digest is a planned rerun)."""
    for rel in ("plan/cluster.py", "run/command.py", "standin/twonode.py", "layout.py", "data/fetch.py",
                "data/resize.py", "lab/tuned_probe.py"):
        assert digests_changed_by(tmp_path, rel) == set(), rel
    runs_ddp = {e.name for e in registry.EXPERIMENTS.values() if "dpscale.measure.torch_ddp" in e.sources}
    assert runs_ddp >= {"ddp_weak", "ddp_strong", "ddp_comm_probe", "allreduce", "fsdp"}
    assert digests_changed_by(tmp_path, "measure/torch_ddp.py") == runs_ddp


# Inside analysis/, the same rule one level down (issue #55): its ground (single modules
# the packages read: statistics, the cost model, MLPerf's scoring), then its packages
# (stateff: statistical efficiency and the E(B) model's own error; forecast), then the
# modules that check a model on data (convergence, probe, roofline), on top.
ANALYSIS_FLOORS = ({"stats", "costmodel", "tta"}, {"stateff", "forecast"})


def analysis_floor(module: str) -> int:
    part = module.split(".")[2] if module.count(".") >= 2 else ""
    return next((i for i, f in enumerate(ANALYSIS_FLOORS) if part in f), len(ANALYSIS_FLOORS))


def analysis_upward(g: dict) -> list[str]:
    """Arrows up inside analysis/, and arrows between its packages (each stands alone)."""
    out = []
    for m, ns in g.items():
        if not m.startswith("dpscale.analysis."):
            continue
        for n in sorted(x for x in ns if x.startswith("dpscale.analysis.")):
            fm, fn = analysis_floor(m), analysis_floor(n)
            across = fm == fn == 1 and m.split(".")[2] != n.split(".")[2]
            if fn > fm or across:
                out.append(f"{m} imports {n}")
    return out


def test_analysis_imports_only_run_downward_inside_it():
    assert not analysis_upward(graph())


def test_the_analysis_check_catches_an_arrow_up():
    """The old place of batch_misfit: outside stateff, read by stateff, reading stateff."""
    g = {"dpscale.analysis.stateff.model_choice": frozenset({"dpscale.analysis.batch_misfit"}),
         "dpscale.analysis.batch_misfit": frozenset({"dpscale.analysis.stateff.batch_model"}),
         "dpscale.analysis.forecast.fit": frozenset({"dpscale.analysis.stateff.common"})}
    assert sorted(analysis_upward(g)) == ["dpscale.analysis.forecast.fit imports dpscale.analysis.stateff.common",
                                          "dpscale.analysis.stateff.model_choice imports dpscale.analysis.batch_misfit"]
