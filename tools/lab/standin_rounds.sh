#!/bin/bash
# The CPU stand-in in interleaved rounds: round 1 runs FIRST_TARGETS (the inputs: probes,
# sweeps, and the throughput points), every later round TARGETS only (the throughput
# points again, one launch each), until BUDGET_S has gone; each round a fresh copy of the
# tree (tools/lab/cpu_standin.sh), so k = 1, 2, 4, 8 are measured side by side in every
# window of the host instead of one k's launches in a row (issue #30: this box's vCPUs
# change speed from one minute to the next; README, "The 16-core CPU stand-in").
#   FIRST_TARGETS='...' TARGETS='...' OUT=dir [ROUND_S=130] bash tools/lab/standin_rounds.sh BUDGET_S [--config args]
# Leaves $OUT/round<i>/results.tgz and all of them in $OUT/results.tgz; pool them here with
# tools/lab/pool_rounds.py.
set -u
OUT=${OUT:?set OUT}; end=$(( $(date +%s) + $1 )); shift; r=0
while :; do
  left=$(( end - $(date +%s) )); [ $r -gt 0 ] && [ $left -lt ${ROUND_S:-130} ] && break
  r=$((r + 1)); targets=$([ $r = 1 ] && echo "${FIRST_TARGETS:-$TARGETS}" || echo "$TARGETS")
  echo "round $r: $(date -u +%H:%M:%S), $left s left"
  TARGETS="$targets" OUT="$OUT/round$r" bash "$(dirname "$0")/cpu_standin.sh" "$left" "$@" > "$OUT/round$r.out" 2>&1
  grep -E "snakemake rc|ok  |failed" "$OUT/round$r.out" | cut -c1-150
done
(cd "$OUT" && tar czf results.tgz round*/results.tgz round*.out)
