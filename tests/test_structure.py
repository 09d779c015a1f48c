"""The code's shape, checked: no import circles in the package, short functions in
the report, markup only in templates, and light imports where the workflow is parsed."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "src" / "dpscale"
REPORT = PACKAGE / "report"
HTML_TAG = re.compile(r"</?(a|b|i|p|br|hr|div|span|table|thead|tbody|tr|td|th|caption|img|figure|figcaption|"
                      r"section|nav|header|h[1-6]|ul|ol|li|pre|code|em|strong|style|script|html|head|body|"
                      r"meta|title|dl|dt|dd)\b[^<>]*>", re.I)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT / "src").with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every dpscale module `name` imports, at the top or inside a function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:   # `from . import x` imports the module x when there is one
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in out if m in known and m != name}


def test_the_package_has_no_import_circle():
    mods = modules()
    graph = {name: imports_of(name, path, set(mods)) for name, path in mods.items()}
    state: dict[str, int] = {}

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2
    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert graph["dpscale.report"] and graph["dpscale.report.figures"], "the graph was read"


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
    """provenance.REPORT_MODULES, the modules whose change rebuilds the report, are
    exactly the dpscale modules the report package reaches by its imports."""
    from dpscale.provenance import REPORT_MODULES
    mods = modules()
    graph = {name: imports_of(name, path, set(mods)) for name, path in mods.items()}
    seen, todo = set(), [m for m in mods if m.startswith("dpscale.report")]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += graph[m]
    outside = {m.removeprefix("dpscale.") for m in seen if not m.startswith("dpscale.report") and m != "dpscale"}
    assert outside == set(REPORT_MODULES)
