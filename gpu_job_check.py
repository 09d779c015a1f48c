"""Scratch (not committed): real jobs on the lent GPU, results copied to $OUT."""
import json, os, shutil, subprocess, sys, time
from pathlib import Path
sys.path[:0] = [str(Path("tests").resolve()), str(Path("src").resolve())]
import numpy as np
import conftest as c
from dpscale.plan import fingerprint

out = Path(os.environ["OUT"])
root = Path("/tmp/gdata"); root.mkdir(exist_ok=True)
c.data.fetch(root, "synthetic", [])
x, y = c.data.synthetic(256, seed=0); xt, yt = c.data.synthetic(64, seed=1)
arrays = {"train_x": c.data.resize_split(x, 16), "train_y": y.astype(np.int64),
          "test_x": c.data.resize_split(xt, 16), "test_y": yt.astype(np.int64)}
c.data.write_cache(arrays, {"source": "synthetic", "origin": "tests"}, root / "fmnist_16px.npz", root / "fmnist_16px.json")
c.write_json_atomic(root / "flops_16px.json", c.model_flops_record(16))
fp = fingerprint.probe()
print("fp", {k: fp.get(k) for k in ("gpu_count", "gpu_model", "driver")}, flush=True)
BUSY = ("import time, torch\nx = torch.randn(4096, 4096, device='cuda:0')\nprint('busy', flush=True)\n"
        "t0 = time.time()\nwhile time.time() - t0 < 300:\n    x = x @ x\n    x = x / x.norm()\n    torch.cuda.synchronize()\n")
for name, exp, variant, proto, busy in (("ddp_alone", "ddp_weak", "cached", {"launches": 2}, False),
                                        ("ddp_busy", "ddp_weak", "cached", {"launches": 1}, True),
                                        ("jax_alone", "jax_weak", "device", {"launches": 2}, False)):
    spec = c.make_spec(root, exp, 1, variant, proto=proto, fp=fp)
    other = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True) if busy else None
    if other:
        print("other:", other.stdout.readline().strip(), other.pid, flush=True)
    t0 = time.time()
    try:
        rc, res, log = c.run_job(spec, Path(f"/tmp/gjobs/{name}"), timeout=300)
    finally:
        if other:
            other.kill(); other.wait()
    print(name, "rc", rc, "took", round(time.time() - t0, 1), "status", res and res["status"], res and res.get("reason"), flush=True)
    if res:
        m = res["metrics"]
        print("  ", {k: m.get(k) for k in ("samples_per_s", "samples_per_s_launches", "samples_per_s_ci95",
              "samples_per_s_ci95_covers", "samples_per_s_within_ci95")}, flush=True)
        print("   gpu_state flags", (res.get("gpu_state") or {}).get("flags"), (res.get("gpu_state") or {}).get("absent"), flush=True)
        (out / f"{name}.json").write_text(json.dumps(res, indent=1))
    else:
        print(log[-3000:])
