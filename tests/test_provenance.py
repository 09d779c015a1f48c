"""What a change reruns, derived from the imports (dpscale.provenance): each
measurement rule's params value is the digest of the modules its job reaches, so a
change to what one of them does reruns exactly the experiments that import it.
(tests/test_workflow.py shows Snakemake rerunning on that params change.)"""
from __future__ import annotations

import shutil

import pytest
from hypothesis import given, settings, strategies as st

from dpscale import provenance, registry


@pytest.fixture
def package(tmp_path):
    """A copy of the package to change."""
    pkg = tmp_path / "dpscale"
    shutil.copytree(provenance.PACKAGE, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return pkg


def digests(pkg) -> dict[str, str]:
    """Each experiment's code digest (its rule's params value), read from `pkg`."""
    out = {}
    for exp in registry.EXPERIMENTS.values():
        mods = provenance.closure((registry.FAMILY_JOB[exp.family], exp.entry.partition(":")[0]), pkg)
        out[exp.name] = provenance.source_digest(mods, pkg)
    return out


def changed(pkg, module: str, edit) -> set[str]:
    before = digests(pkg)
    path = provenance.module_path(module, pkg)
    path.write_text(edit(path.read_text()))
    provenance.imports_of.cache_clear()
    return {name for name, d in digests(pkg).items() if d != before[name]}


def test_the_real_package_gives_the_registry_its_sources():
    assert digests(provenance.PACKAGE) == {e.name: provenance.source_digest(e.sources)
                                            for e in registry.EXPERIMENTS.values()}
    probe = registry.get("ddp_comm_probe").sources
    assert "dpscale.measure.torch_ddp" in probe   # torch_comm builds the model with build_ddp
    assert not any(m.startswith("dpscale.lab") for e in registry.EXPERIMENTS.values() for m in e.sources)


def test_a_change_to_the_ddp_code_reruns_the_probe_too(package):
    hit = changed(package, "dpscale.measure.torch_ddp", lambda s: s + "\nTIMING_FIX = 1\n")
    assert {"ddp_weak", "ddp_strong", "ddp_comm_probe", "fsdp"} <= hit
    assert not any(name.startswith("jax") for name in hit), hit


def test_a_lab_change_or_a_comment_reruns_nothing(package):
    assert changed(package, "dpscale.lab.triton_bn", lambda s: s + "\nEXPERIMENT = 2\n") == set()
    assert changed(package, "dpscale.measure.torch_comm", lambda s: s + "\n# a comment\n") == set()


def test_a_new_import_joins_the_digest(package):
    """A measurement that starts importing a module depends on it from then on."""
    assert changed(package, "dpscale.measure.jax_weak",
                   lambda s: s.replace("from __future__ import annotations\n",
                                       "from __future__ import annotations\nfrom dpscale.lab import triton_bn\n", 1)) \
        == {"jax_weak"}
    hit = changed(package, "dpscale.lab.triton_bn", lambda s: s + "\nEXPERIMENT = 3\n")
    assert hit == {"jax_weak"}


# Fragments a module is made of: docstrings (which the digest ignores), imports of every
# form (which the closure reads), code, comments.
FRAGMENTS = ['"""A docstring."""', "import os", "import os.path as p, sys", "from . import x",
             "from ..a.b import c, d", "from dpscale import results", "X = 1  # a comment",
             'def f():\n    """Its docstring."""\n    from .y import z\n    return z',
             "class C:\n    '''Doc.'''", "Y = 'text'", "# only a comment"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=8), st.binary(max_size=64))
def test_the_parse_cache_gives_what_a_fresh_parse_gives(parts, junk):
    """A digest through the cache between processes (dpscale.provenance._parsed) is the
    digest of a fresh parse, whether the entry is new, kept, damaged by hand or cannot be
    written at all; an edit is never answered with the entry of the text before it."""
    import json
    import os
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as tmp:
        mod = Path(tmp) / "m.py"
        mod.write_text("\n".join(parts) + "\n")
        fresh = provenance._parse(mod.read_bytes())
        env = os.environ.get("XDG_CACHE_HOME")
        try:
            os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")
            for _ in range(2):   # written, then read back
                provenance._MEMO.clear()
                assert provenance._parsed(mod) == fresh
            entries = list((Path(tmp) / "cache").rglob("*.json"))
            assert len(entries) == 1 and not list((Path(tmp) / "cache").rglob("*.tmp"))
            kept = json.loads(entries[0].read_text())
            edited = {**kept, "value": [kept["value"][0] + "W = 0\n", kept["value"][1]]}
            for damaged in (junk, json.dumps(edited).encode()):
                entries[0].write_bytes(damaged)   # damaged, or edited by hand: parsed again
                provenance._MEMO.clear()
                assert provenance._parsed(mod) == fresh
            mod.write_text(mod.read_text() + "Z = 2\n")   # an edit: a new key, not the old entry
            assert provenance._parsed(mod) == provenance._parse(mod.read_bytes()) != fresh
            (Path(tmp) / "file").write_text("")
            os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "file")   # not a folder: no cache, same answer
            provenance._MEMO.clear()
            assert provenance._parsed(mod) == provenance._parse(mod.read_bytes())
        finally:
            provenance._MEMO.clear()
            if env is None:
                os.environ.pop("XDG_CACHE_HOME", None)
            else:
                os.environ["XDG_CACHE_HOME"] = env


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=5), st.binary(max_size=64))
def test_a_stored_value_is_what_its_computation_gives_for_these_files(values, junk):
    """dpscale.provenance.stored: computed once for the same code and files, again for a
    changed file, and again where its entry was damaged; always what compute() returns."""
    import os
    import tempfile
    from pathlib import Path
    calls = []

    def compute(path):
        def f():
            calls.append(1)
            xs = [float(x) for x in path.read_text().split()]
            return {"n": len(xs), "sum": sum(xs), "rows": [[1, 2.5]]}
        return f
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "t.csv"
        data.write_text(" ".join(map(repr, values)))
        env = os.environ.get("XDG_CACHE_HOME")
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")
        try:
            want = compute(data)()
            calls.clear()
            for _ in range(2):
                assert provenance.stored("t", ("dpscale.results",), [data], compute(data)) == want
            assert len(calls) == 1
            data.write_text(data.read_text() + " 1.0")
            assert provenance.stored("t", ("dpscale.results",), [data], compute(data)) == compute(data)() != want
            for entry in (Path(tmp) / "cache").rglob("t-*.json"):
                entry.write_bytes(junk)
            calls.clear()
            assert provenance.stored("t", ("dpscale.results",), [data], compute(data)) == compute(data)()
            assert len(calls) == 2
        finally:
            if env is None:
                os.environ.pop("XDG_CACHE_HOME", None)
            else:
                os.environ["XDG_CACHE_HOME"] = env
