#!/bin/bash
# A GPU run longer than one device call (each call stops at 10 minutes): tools/offline-gpu/run.sh
# started in its own session, so it outlives the call while the machine stays warm, and
# followed by later calls.
#   bash tools/lab/run_bg.sh start [snakemake --config args]   # starts it, then waits as `wait`
#   bash tools/lab/run_bg.sh wait                              # follows it for up to WAIT_S (570) s
# Each call copies into $OUT what run.sh has written so far (smk.log; results.tgz once it
# ended) and its own lines, and says whether the run has ended. KS, TARGETS and
# DPSCALE_GIT_COMMIT as for run.sh; the run's own limit is LIMIT_S (3000). RUNNER: the
# script started (default tools/offline-gpu/run.sh; tools/lab/cpu_standin.sh takes the same
# arguments and also leaves forecast.txt and forecast.json).
OUT=${OUT:-.}; BG=/tmp/dpscale-bg
if [ "$1" = start ]; then
  shift; rm -rf $BG; mkdir -p $BG; date +%s > $BG/t0
  OUT=$BG setsid nohup bash -c 'bash '"${RUNNER:-tools/offline-gpu/run.sh}"' "$@" > '$BG'/run.out 2>&1; echo $? > '$BG'/rc' \
    run_bg "${LIMIT_S:-3000}" "$@" < /dev/null > /dev/null 2>&1 &
fi
end=$(( $(date +%s) + ${WAIT_S:-570} ))
while [ ! -f $BG/rc ] && [ "$(date +%s)" -lt $end ]; do sleep 5; done
if [ -f $BG/rc ]; then echo "ended rc=$(cat $BG/rc) after $(( $(date +%s) - $(cat $BG/t0) )) s"
else echo "still running after $(( $(date +%s) - $(cat $BG/t0) )) s"; grep -E "steps \(" $BG/smk.log | tail -2; fi
cp $BG/run.out $BG/smk.log $BG/forecast.* $OUT/ 2>/dev/null; [ -f $BG/results.tgz ] && cp $BG/results.tgz $OUT/
tail -40 $BG/run.out
