#!/bin/bash
# The CPU stand-in on a GPU box: the pipeline at smoke scale on gloo ranks (JAX host
# devices), CUDA hidden, pinned to CORES, in a copy of this tree with its own lock
# folder so it can run beside a GPU job; then the forecast and its validation
# (k=8 predicted from k <= 4) from what it measured:
#   [KS='[1,2,4,8]'] [CORES=2-15] OUT=dir bash tools/lab/cpu_standin.sh SECONDS [snakemake --config args]
# Used for issue #22's 16-core validation; results and logs land in $OUT/results.tgz.
set -u
OUT=${OUT:?set OUT to the folder for results.tgz}; mkdir -p "$OUT"
src=$PWD; work=$(mktemp -d /tmp/cpu-standin.XXXX)
cp -a "$src/." "$work/" && cd "$work" && rm -rf results logs .snakemake
export CUDA_VISIBLE_DEVICES="" KS=${KS:-[1,2,4,8]}
TARGETS=${TARGETS:-report} taskset -c "${CORES:-2-15}" bash tools/offline-gpu/run.sh "$1" scale=smoke \
  "locks={dir: $work/locks}" "${@:2}"
PYTHONPATH=$work/src:/tmp/site python3 -m dpscale.cli forecast results --no-book --json "$OUT/forecast.json" > "$OUT/forecast.txt" 2>&1
cat "$OUT/forecast.txt" | head -120
