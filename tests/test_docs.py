"""The pages' number blocks (dpscale.docblocks): every block of README.md and docs/ is
what its command prints now from reference/ and the public data, and a change to one
kept result changes the answer's block until `dpscale docs` regenerates it."""
from __future__ import annotations

import json
import re
import shutil

from conftest import ROOT
from dpscale import cli, docblocks
from dpscale.results import save


def test_every_block_is_what_its_command_prints(capsys):
    assert cli.main(["docs", "--check"]) == 0, capsys.readouterr().out
    blocks = [m.group(2) for p in docblocks.pages(ROOT) for m in docblocks.BLOCK.finditer(p.read_text())]
    assert "dpscale answer reference/h200" in blocks and len(blocks) >= 3


def test_a_changed_result_changes_the_answer_until_regenerated(tmp_path):
    """A copy of the README and reference/h200; one seed of k=2 dropped from its kept
    result (sealed again, as a worker writes it): --check names the README's answer
    block; regenerated, the block holds the new numbers and --check passes."""
    root = tmp_path / "repo"
    (root / "reference").mkdir(parents=True)
    shutil.copy(ROOT / "README.md", root / "README.md")
    shutil.copytree(ROOT / "reference/h200", root / "reference/h200", ignore=shutil.ignore_patterns("report", "logs"))
    assert docblocks.regenerate(root, cli.main, write=False) == []
    before = (root / "README.md").read_text()
    path = root / "reference/h200/runs/ddp_tta/book/k2.json"
    r = json.loads(path.read_text())
    r["metrics"]["runs"] = r["metrics"]["runs"][:-1]
    save(path, {k: v for k, v in r.items() if k != "digest"})
    assert docblocks.regenerate(root, cli.main, write=False) == ["README.md: dpscale answer reference/h200"]
    assert docblocks.regenerate(root, cli.main, write=True) == ["README.md: dpscale answer reference/h200"]
    after = (root / "README.md").read_text()
    k2 = (lambda text: re.search(r"^\s+2  .*$", text.split("BEGIN dpscale answer")[1], re.M).group(0))
    assert k2(before) != k2(after)
    assert docblocks.regenerate(root, cli.main, write=False) == []


def config_rows(page: str):
    """(key, default as written) of every row of a page's tables whose first cell names
    config keys and whose second their defaults, one each: `a.b`, `a.c` | `1`, `2`, or
    `a.b` / `c` | `x` / `y` (a key after the first without a dot shares its parent)."""
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3:
            continue
        keys = re.findall(r"`([a-z_][a-z_.<>|\\]*)`", cells[0])
        values = re.findall(r"`([^`]*)`", cells[1])
        if not keys or len(keys) != len(values):
            continue
        parent = keys[0].rpartition(".")[0]
        for key, value in zip(keys, values):
            yield (key if "." in key or not parent else f"{parent}.{key}"), value


def test_the_defaults_the_pages_state_are_the_schemas():
    """The README's configuration table and docs/cluster.md's state defaults by hand: each
    is the schema's default (schemas/config.schema.yaml holds them, with a description)."""
    import yaml
    schema = yaml.safe_load((ROOT / "schemas/config.schema.yaml").read_text())
    checked = []
    for page in ("README.md", "docs/cluster.md"):
        for key, value in config_rows((ROOT / page).read_text()):
            node = schema
            for part in key.split("."):
                node = (node.get("properties") or {}).get(part)
                if node is None:
                    break
            if node is None or "default" not in node:
                continue   # a profile key, or a key past a placeholder (scales.<scale>)
            assert yaml.safe_load(value) == node["default"], (page, key, value, node["default"])
            checked.append(key)
    for key in ("ks", "scale", "cluster.exclusive", "cluster.cpus_per_gpu", "cluster.mem_mb_per_cpu",
                "data.local_dir", "locks.wait_s"):
        assert key in checked, (key, checked)
