#!/bin/bash
# A measurement beside a second process that keeps the same GPU busy (issue: a shared
# GPU gives a plausible, wrong number): the pipeline must flag it in the result and
# the report. Runs in $1 (a fresh folder), DDP weak (seed, cached) at k=1, one launch.
#   bash tools/lab/busy_run.sh /tmp/busy [SECONDS]
set -u
work=$1; limit=${2:-240}; repo=$PWD
mkdir -p "$work"
python3 - <<'PY' &
import torch, time
a = torch.randn(4096, 4096, device="cuda"); print("busy", flush=True)
while True:
    a = (a @ a).tanh_(); torch.cuda.synchronize(); time.sleep(0.002)
PY
busy=$!
sleep 8
timeout -s INT --kill-after=20 "$limit" snakemake -s "$repo/Snakefile" -d "$work" --cores 16 --scheduler greedy report \
  --config 'ks=[1]' 'experiments=[ddp_weak]' tuned=false 'scales={paper: {launches: 1}}' \
  "data={source: auto, local_dir: $repo/.fmnist}" > "$work/smk.log" 2>&1
echo "busy run: snakemake rc=$?"
kill $busy; wait $busy 2>/dev/null
python3 - "$work" <<'PY'
import json, sys, glob
for p in sorted(glob.glob(f"{sys.argv[1]}/results/runs/*/*/k*.json")):
    r = json.load(open(p)); g = r.get("gpu_state") or {}
    print(p.split("runs/")[1], r["status"], round(r["metrics"].get("samples_per_s", 0)), "samples/s; flags:",
          g.get("flags"), "; other processes:", [(o.get("pid"), o.get("name")) for o in g.get("other_processes", [])][:3])
PY
grep -o "the GPU was [^<]*" "$work/results/report/report.html" | sort | uniq -c
