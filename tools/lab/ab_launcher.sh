#!/bin/bash
# One chip, one spec: the answer's k=1 series (ddp_weak cached, 2 launches each: the device time left) launched
# as the pipeline launches it now (the worker alone under the watchdog) and under
# torchrun --standalone --nproc-per-node=1 (as before 7aa3da0), interleaved A B A B, so
# that a difference between the two launchers is told apart from the chip's drift.
#   bash tools/lab/ab_launcher.sh        (on the GPU machine; .whl/ and .fmnist/ carried)
export PYTHONUNBUFFERED=1
mkdir -p /tmp/bin; command -v python >/dev/null || ln -sf "$(command -v python3)" /tmp/bin/python; export PATH=/tmp/bin:$PATH
source "$(dirname "$0")/../offline-gpu/site.sh"
OUT=${OUT:-/tmp/ab}; mkdir -p $OUT
R=results/runs/ddp_weak/cached/k1.json
snakemake --cores 16 --scheduler greedy $R --config 'ks=[1]' 'scales={paper: {launches: 2}}' "data={source: auto, local_dir: $PWD/.fmnist}" > $OUT/smk.log 2>&1 || { tail -20 $OUT/smk.log; exit 1; }
SPEC=$(sed -n 's/^\[watchdog\] \$ .*torch_worker.py --spec \(.*\) --result .*/\1/p' logs/ddp_weak/cached/k1.log | head -1)
cp $R $OUT/A1.json; cp logs/ddp_weak/cached/k1.log $OUT/A1.log
run() {  # label, then "torchrun" or nothing
  local res=/tmp/ab_$1/k1.json; rm -rf /tmp/ab_$1; mkdir -p /tmp/ab_$1
  if [ "$2" = torchrun ]; then
    python3 scripts/watchdog.py --spec "$SPEC" --result $res --rank-logs /tmp/ab_$1/k1.log.ranks -- \
      torchrun --standalone --nproc-per-node=1 --log-dir /tmp/ab_$1/k1.log.ranks --redirects 3 --tee 3 \
      scripts/torch_worker.py --spec "$SPEC" --result $res > $OUT/$1.log 2>&1
  else
    python3 scripts/watchdog.py --spec "$SPEC" --result $res --rank-logs /tmp/ab_$1/k1.log.ranks > $OUT/$1.log 2>&1
  fi
  cp $res $OUT/$1.json
}
run B1 torchrun; run A2; run B2 torchrun
python3 - $OUT <<'PY'
import json, sys
for n in ("A1", "B1", "A2", "B2"):
    m = json.load(open(f"{sys.argv[1]}/{n}.json"))["metrics"]
    print(n, "worker alone" if n[0] == "A" else "torchrun", [round(x) for x in m["samples_per_s_launches"]],
          "start_s", m.get("start_s_launches"), "launch_s", m.get("launch_s_launches"))
PY
