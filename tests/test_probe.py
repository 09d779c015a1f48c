"""tools/lab/probe_roofline.py and the package pieces behind it (dpscale.lab.layer_profile,
dpscale.lab.tuned_probe), on the CPU: the lead's device minutes go to measuring, not to typos."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, env_with_src

from dpscale.lab import layer_profile, tuned_probe
from dpscale.analysis import roofline
from dpscale.model.models import torch_resnet18


def test_every_layer_gets_its_forward_and_backward_time():
    torch.manual_seed(0)
    model = torch_resnet18()
    x, y = torch.randn(2, 1, 16, 16), torch.randint(0, 10, (2,))

    def step():
        model.zero_grad(set_to_none=True)
        with torch.autograd.profiler.record_function("loss"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
    step()
    got = layer_profile.profile_step(model, step, 1, device=False)
    assert got["_unattributed_s"] < 0.05 * got["_total_s"]
    layers = got["layers"]
    for c in roofline.all_convs(16):   # every conv and its BatchNorm ran both ways
        assert layers[c.name]["forward_s"] > 0 and layers[c.name]["backward_s"] > 0, c.name
    assert layers["0"]["backward_s"] > 0 and layers["resnet_block1.0"]["backward_s"] > 0   # ReLU, add
    rows = layer_profile.table(got, 2, 16, 790e12, 4.3e12)
    by = {r["layer"]: r for r in rows}
    assert by["0"]["binds"] == "memory" and by["resnet_block1.0.conv1"]["time_ms"] > 0
    assert "fraction_of_bound" in by["resnet_block2.0.bn1"] and "loss" in by


def test_loss_check_reads_differences_against_the_first_loss():
    ok = tuned_probe.loss_check([2.3, 2.0, 0.01], [2.3, 2.01, 0.02])
    assert ok["loss_ok"] and ok["loss_rel_diff_steps"][2] == pytest.approx(0.01 / 2.3)
    assert not tuned_probe.loss_check([2.3, 2.0], [2.3, 3.0])["loss_ok"]


@pytest.mark.slow
@pytest.mark.multiproc
def test_probe_runs_end_to_end_at_smoke_size(tmp_path):
    cmd = [sys.executable, str(ROOT / "tools/lab/probe_roofline.py"), "--smoke", "--out", str(tmp_path),
           "--variants", "base,all,stem_direct,nonsense"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env_with_src(), timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    st = json.loads((tmp_path / "probe_roofline.json").read_text())["stages"]
    assert [r["fusion"] for r in st["roofline"]] == list(roofline.FUSIONS)
    assert [t["model"] for t in st["layers"]] == ["base", "all"]
    variants = {r["name"]: r for r in st["variant"]}
    assert "KeyError" in variants["nonsense"]["error"]   # a bad variant is reported, the rest still run
    for name in ("base", "all", "stem_direct"):
        assert variants[name]["samples_per_s_median"] > 0 and len(variants[name]["losses"]) == 20
    assert variants["all"]["model"]["stem"] == "Im2colStem" and variants["stem_direct"]["model"]["stem"] == "DirectStem"
    assert variants["all"]["model"]["parameters"] == variants["base"]["model"]["parameters"] - 3904
    assert "loss_ok" in variants["all"] and "variant" in p.stdout and "probe done" in p.stdout


def test_layers_sort_into_kinds():
    kinds = {name: layer_profile.kind(name) for name in ("0", "1", "2", "resnet_block2.0.conv3",
                                                         "resnet_block2.0.bn1", "resnet_block2.0", "fc.1")}
    assert kinds == {"0": "conv", "1": "batchnorm", "2": "relu/add", "resnet_block2.0.conv3": "conv",
                     "resnet_block2.0.bn1": "batchnorm", "resnet_block2.0": "relu/add", "fc.1": "other"}
