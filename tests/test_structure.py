"""The code's shape, checked: no import circles in the package, short functions in
the report, markup only in templates, and light imports where the workflow is parsed."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

from dpscale import provenance

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
# those below. Root modules are the ground floor, but for the command line on top.
LAYERS = ("ground", "data", "model", "analysis", "plan", "measure", "run", "report", "lab", "cli")


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
    analysis, planning, running a job, the measurements, the report, the lab (code no
    pipeline variant runs) and the command line. Nothing imports from a floor above."""
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


def test_no_report_function_needs_scrolling():
    long = []
    for path in REPORT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 60:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, long


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
    assert not any(m.startswith(("dpscale.measure", "dpscale.lab", "dpscale.run")) for m in outside), outside
