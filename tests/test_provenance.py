"""What a change reruns, derived from the imports (dpscale.provenance): each
measurement rule's params value is the digest of the modules its job reaches, so a
change to what one of them does reruns exactly the experiments that import it.
(tests/test_workflow.py shows Snakemake rerunning on that params change.)"""
from __future__ import annotations

import shutil

import pytest

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
    provenance._normalised.cache_clear()
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
