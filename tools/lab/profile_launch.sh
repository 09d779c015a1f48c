#!/bin/bash
# Where a launch's seconds go, sampled: py-spy (its wheel in .diag/) records every
# process of one Snakemake job (watchdog, torchrun, ranks, inductor's compile workers),
# idle frames included, as collapsed stacks per process:
#   bash tools/lab/profile_launch.sh NAME TARGET [snakemake --config args]
# leaves $OUT/NAME.speedscope.json (tools/lab/spy_stages.py reads it) and NAME.json, NAME.log.
# --nonblocking: the sampled processes are never paused, so the timing stays the job's.
OUT=${OUT:-.}
python3 -m pip install -q --no-index --no-deps --target /tmp/spy .diag/py_spy-*.whl >/dev/null 2>&1
name=$1 target=$2; shift 2
[ -d .fmnist ] && set -- "$@" "data={source: auto, local_dir: $PWD/.fmnist}"
t0=$(date +%s.%N)
/tmp/spy/bin/py-spy record --idle --nonblocking --subprocesses --threads --format speedscope -r 100 -o "$OUT/$name.speedscope.json" -- \
  snakemake --cores 16 --scheduler greedy "$target" --config 'ks=[1]' "$@" > "$OUT/$name.smk.log" 2>&1
echo "$name: rc=$? $(python3 -c "import time;print(round(time.time()-$t0,1))") s"
cp "$target" "$OUT/$name.json" 2>/dev/null
log=$(python3 -c "import sys;p=sys.argv[1].split('/');print(f'logs/{p[2]}/{p[3]}/{p[4][:-5]}.log')" "$target")
cp "$log" "$OUT/$name.log" 2>/dev/null
