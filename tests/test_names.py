"""Docs that match the code (issue #55): every module, function or class the pages name
with a dotted name (README.md, docs/*.md but the dated reports, the config schema, the
report's prose) resolves in the package, and every repository path they name in
backticks exists. A rename that leaves a page behind fails here."""
from __future__ import annotations

import importlib
import re

import pytest
import yaml

from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "schemas/config.schema.yaml",
         *sorted((ROOT / "src/dpscale/report/prose").rglob("*.rst"))]
FLOORS = ("analysis", "report", "measure", "plan", "run", "standin", "model", "data", "lab")
NAME = re.compile(r"(?<![\w/.-])((?:dpscale\.)?(?:" + "|".join(FLOORS) + r"|stateff|forecast|layout|registry|results"
                  r"|provenance|cli|docblocks|crossings|batch_model|model_choice|over_seeds|batch_misfit)"
                  r"(?:\.[a-z_][A-Za-z0-9_]*)+)\b(?![/-])")
FILES = {"py", "md", "smk", "json", "html", "csv", "sh", "yaml", "txt", "png", "svg", "log", "rst", "j2", "gz"}
# Where a short name is read from: the package, its floors, and the floors' packages.
PREFIXES = (("dpscale",), ("dpscale", "analysis"), ("dpscale", "analysis", "stateff"), ("dpscale", "report"),
            ("dpscale", "analysis", "forecast"), ("dpscale", "standin"), ("dpscale", "plan"), ("dpscale", "run"),
            ("dpscale", "measure"))


def _config_keys() -> set[str]:
    """Every dotted key path of the configuration (data.local_dir, forecast.band_level, ...)."""
    out = set()

    def walk(node, path):
        for k, v in (node.get("properties") or {}).items():
            out.add(".".join(path + [k]))
            walk(v, path + [k])
    walk(yaml.safe_load((ROOT / "schemas/config.schema.yaml").read_text()), [])
    return out


def resolves(name: str) -> bool:
    parts = name.split(".")
    for c in ([parts] if parts[0] == "dpscale" else [list(p) + parts for p in PREFIXES]):
        for i in range(len(c), 1, -1):
            try:
                obj = importlib.import_module(".".join(c[:i]))
            except ImportError:
                continue
            for a in c[i:]:
                if not hasattr(obj, a):
                    break
                obj = getattr(obj, a)
            else:
                return True
            break
    return False


def named() -> list[tuple[str, str]]:
    keys = _config_keys()
    out = []
    for page in PAGES:
        for m in NAME.finditer(page.read_text()):
            n = m.group(1)
            if n.rsplit(".", 1)[-1] in FILES or n in keys or n.removeprefix("dpscale.") in keys:
                continue
            out.append((str(page.relative_to(ROOT)), n))
    return sorted(set(out))


BAD_ON_PURPOSE = {("docs/configuration.md", "data.sauce")}   # the bad-input table's own misspelt key


def test_every_dotted_name_the_pages_give_resolves():
    bad = [f"{page}: {n}" for page, n in named() if not resolves(n) and (page, n) not in BAD_ON_PURPOSE]
    assert not bad, "names the pages give that the package does not have:\n" + "\n".join(bad)


PATH = re.compile(r"`((?:src|tests|tools|docs|reference|schemas|rules|scripts|profiles|envs)/[\w./-]+?)`")


def test_every_repository_path_the_pages_give_exists():
    bad = []
    for page in PAGES:
        for m in PATH.finditer(page.read_text()):
            p = m.group(1).rstrip("/.")
            if any(ch in p for ch in "<>*{") or not p or any(part.isupper() for part in p.split("/")):
                continue
            if not (ROOT / p).exists():
                bad.append(f"{page.relative_to(ROOT)}: {p}")
    assert not bad, "paths the pages give that do not exist:\n" + "\n".join(sorted(set(bad)))


def test_the_check_catches_a_renamed_function(monkeypatch):
    """A function the docs name, renamed: the check fails naming it."""
    from dpscale.analysis.stateff import crossings
    assert resolves("crossings.per_seed")
    monkeypatch.delattr(crossings, "per_seed")
    assert not resolves("crossings.per_seed")
    assert ("docs/time-to-accuracy.md", "crossings.per_seed") in named()
