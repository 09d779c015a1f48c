#!/bin/bash
# A GPU run longer than one device call (each call stops at 10 minutes): the run.sh
# command started in its own session, so it outlives the call while the machine stays
# warm, and followed by later calls.
#   bash tools/gpu/run_bg.sh start [snakemake --config args]   # starts it, then waits as `wait`
#   bash tools/gpu/run_bg.sh wait                              # follows it for up to WAIT_S (570) s
# Each call leaves in $OUT the run's Snakemake log so far and results.tgz (what run.sh
# leaves), and says whether the run has ended ("ended rc=N after S s") or still runs.
# KS, TARGETS and DPSCALE_GIT_COMMIT as for run.sh; the run's own limit is LIMIT_S (3000).
export PYTHONUNBUFFERED=1
OUT=${OUT:-.}; BG=/tmp/dpscale-bg; mkdir -p $BG
mkdir -p /tmp/bin; command -v python >/dev/null || ln -sf "$(command -v python3)" /tmp/bin/python; export PATH=/tmp/bin:$PATH
source "$(dirname "$0")/site.sh"
if [ "$1" = start ]; then
  shift
  [ -d .fmnist ] && set -- "$@" "data={source: auto, local_dir: $PWD/.fmnist}"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  echo "$ snakemake --cores 16 --scheduler greedy ${TARGETS:-report} --config ks=${KS:-[1]} $*" | tee $BG/command
  date +%s > $BG/t0
  setsid nohup bash -c 'timeout -s INT --kill-after=30 "$0" snakemake --cores 16 --scheduler greedy '"${TARGETS:-report}"' --config "ks='"${KS:-[1]}"'" "${@}" > '$BG'/smk.log 2>&1; echo $? > '$BG'/rc' \
    "${LIMIT_S:-3000}" "$@" < /dev/null > /dev/null 2>&1 &
fi
end=$(( $(date +%s) + ${WAIT_S:-570} ))
while [ ! -f $BG/rc ] && [ "$(date +%s)" -lt $end ]; do sleep 5; done
now=$(date +%s); t0=$(cat $BG/t0)
if [ -f $BG/rc ]; then echo "ended rc=$(cat $BG/rc) after $(( now - t0 )) s"; else echo "still running after $(( now - t0 )) s"; fi
grep -E "steps \(|Error|error:|Nothing to be done|failed" $BG/smk.log | tail -4
cp $BG/smk.log $BG/command $OUT/
[ -f $BG/rc ] && python3 tools/gpu/summary.py
tar czf $OUT/results.tgz results/runs results/fingerprint.json results/data/*.json results/model results/report logs .snakemake/log 2>/dev/null; ls -la $OUT
