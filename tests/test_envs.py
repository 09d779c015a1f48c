"""envs/*.yaml hold what their rules import (`snakemake --sdm conda` builds a job's
environment from its rule's `conda:` file alone). Pure: no conda, no Snakemake.

For each rule in rules/*.smk: its env (the `conda:` directive; a measurement rule,
one per registry experiment, takes its family's), the code it runs (the scripts its
shell names, a measurement's worker script as dpscale.run.command starts it, and the
dpscale modules those reach: dpscale.provenance.closure), and the third-party
top-level names that code imports (an AST walk). Every one must be in the env, by
its package name (IMPORT_TO_PACKAGE).
"""
from __future__ import annotations

import ast
import functools
import re
import sys
from pathlib import Path

import pytest
import yaml

from dpscale import provenance, registry
from dpscale.run import command

ROOT = Path(__file__).resolve().parents[1]
# import name -> the package that provides it, where they differ
IMPORT_TO_PACKAGE = {"yaml": "pyyaml", "PIL": "pillow", "pynvml": "nvidia-ml-py", "jaxlib": "jaxlib",
                     "cudnn": "nvidia-cudnn-frontend"}
# An import inside a function that another family's jobs run, not this env's: what a
# module shared by several rule families imports lazily so that each pays only for its
# own. (env, module, import) -> why. Each entry must still be a lazy import there.
LAZY_ELSEWHERE = {
    ("torch", "dpscale.model.models", "flax"): "the JAX model, built by JAX jobs only",
    ("torch", "dpscale.model.models", "jax"): "the JAX model, built by JAX jobs only",
    ("torch", "dpscale.run.command", "jax"): "jax.distributed, joined by a multi-node JAX job only",
    ("jax", "dpscale.model.models", "torch"): "the torch model and its FLOP count (the model_flops rule)",
    ("jax", "dpscale.measure.timing", "torch"): "CUDA events, for a torch device only",
    ("report", "dpscale.model.models", "torch"): "the models themselves: the report reads only their docs",
    ("report", "dpscale.model.models", "flax"): "the models themselves: the report reads only their docs",
    ("report", "dpscale.model.models", "jax"): "the models themselves: the report reads only their docs",
}


@functools.cache
def third_party(path: Path) -> tuple[set[str], set[str]]:
    """(top-level names imported at module level, those imported only inside a function)."""
    top, lazy = set(), set()

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            names = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and not child.level:
                names = [child.module]
            (lazy if in_function else top).update(n.split(".")[0] for n in names)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text()), False)
    keep = lambda names: {n for n in names if n not in sys.stdlib_module_names and n not in ("dpscale", "__future__")}
    return keep(top), keep(lazy) - keep(top)


@functools.cache
def dpscale_imports(path: Path) -> set[str]:
    """The dpscale modules a script imports (`from dpscale.x import y`: dpscale.x and, when
    a module, dpscale.x.y)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dpscale"):
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("dpscale")}
    return out & provenance.package_modules()


def rule_blocks(text: str):
    """(conda value, shell text) of each rule of a .smk file."""
    for block in re.split(r"^\s*rule\b", text, flags=re.M)[1:]:
        conda = re.search(r"conda:\s*\n\s*(f?\"[^\"]+\")", block)
        shell = re.search(r"shell:\s*\n((?:\s+f?([\"']).*\2\n?)+)", block)
        yield (conda.group(1) if conda else None), (shell.group(1) if shell else "")


def rules() -> list[tuple[str, list[Path], tuple[str, ...]]]:
    """(env, scripts, extra dpscale roots) of every rule, a measurement rule once per experiment."""
    out = []
    for smk in sorted((ROOT / "rules").glob("*.smk")):
        for conda, shell in rule_blocks(smk.read_text()):
            if conda is None:
                continue
            scripts = [ROOT / "scripts" / s for s in re.findall(r"\{params\.scripts(?::q)?\}/(\w+\.py)", shell)]
            if "{_exp.family}" in conda:   # rules/measure.smk: one rule per registry experiment
                for exp in registry.EXPERIMENTS.values():
                    cmd = command.worker_command({"experiment": exp.name, "k": 1}, "r.json", "r.ranks")
                    worker = [Path(c) for c in cmd if c.endswith(".py")]
                    out.append((exp.family, scripts + worker, exp.sources))
            elif scripts or "python" in shell:
                out.append((Path(conda.strip('f"')).stem, scripts, ()))
            # else a rule that runs no Python (the stamps' `touch`): nothing to import
    return out


def env_packages(env: str) -> set[str]:
    spec = yaml.safe_load((ROOT / "envs" / f"{env}.yaml").read_text())
    deps = []
    for d in spec["dependencies"]:
        deps += d["pip"] if isinstance(d, dict) else [d]
    return {re.split(r"[=<>!~\[ ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}


def needed(env: str, scripts: list[Path], roots: tuple[str, ...]) -> dict[str, str]:
    """{package: the file that imports it} for the code a rule of `env` runs."""
    modules = provenance.closure(set(roots).union(*(dpscale_imports(s) for s in scripts)), skip=frozenset())
    files = [(s.name, s) for s in scripts] + [(m, provenance.module_path(m)) for m in modules]
    out = {}
    for name, path in files:
        top, lazy = third_party(path)
        for imp in top | {i for i in lazy if (env, name, i) not in LAZY_ELSEWHERE}:
            out.setdefault(IMPORT_TO_PACKAGE.get(imp, imp).lower(), name)
    return out


RULES = rules()
ENVS = sorted({env for env, _s, _r in RULES})


def test_every_env_of_a_rule_exists_and_every_env_is_used():
    assert {"torch", "jax", "report"} <= set(ENVS)
    assert {p.stem for p in (ROOT / "envs").glob("*.yaml")} == set(ENVS)
    assert all(scripts for env, scripts, _r in RULES), "a rule that runs Python but names no script"


@pytest.mark.parametrize("env", ENVS)
def test_env_holds_what_its_rules_import(env):
    want = {}
    for e, scripts, roots in RULES:
        if e == env:
            want.update(needed(env, scripts, roots))
    have = env_packages(env)
    missing = {pkg: who for pkg, who in want.items() if pkg not in have}
    assert not missing, (f"envs/{env}.yaml lacks {sorted(missing)}, imported by "
                         + ", ".join(f"{who} ({pkg})" for pkg, who in sorted(missing.items()))
                         + ": add them under pip:, pinned")


def test_the_walk_sees_what_it_must():
    report = {p for e, s, r in RULES if e == "report" for p in needed(e, s, r)}
    assert {"jinja2", "docutils", "matplotlib", "pandas", "pyyaml", "jsonschema"} <= report
    torch = {p for e, s, r in RULES if e == "torch" for p in needed(e, s, r)}
    assert {"torch", "torchvision", "pillow", "numpy"} <= torch and "flax" not in torch
    jax = {p for e, s, r in RULES if e == "jax" for p in needed(e, s, r)}
    assert {"jax", "flax", "optax"} <= jax and "torch" not in jax


def test_each_lazy_exemption_is_still_a_lazy_import():
    for env, module, imp in LAZY_ELSEWHERE:
        top, lazy = third_party(provenance.module_path(module))
        assert imp in lazy and imp not in top, f"{module} no longer imports {imp} lazily: drop it from LAZY_ELSEWHERE"
        assert env in ENVS
