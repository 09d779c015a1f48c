#!/bin/bash
# Follows a run that tools/lab/detach.sh started: waits until it ends or SECONDS pass,
# printing Snakemake's progress and the newest heartbeat of each job's log every minute,
# then copies what the run has written so far (smk.log, run.log; results.tgz once it
# ended; else partial.tgz of the results and logs so far) to $OUT.   bash tools/lab/await.sh SECONDS
t0=$(date +%s); last=0
while [ ! -f /tmp/gpu-out/rc ] && [ $(( $(date +%s) - t0 )) -lt "$1" ]; do
  sleep 5
  if [ $(( $(date +%s) - last )) -ge 60 ]; then
    last=$(date +%s)
    echo "--- $(date -u +%T): $(grep -E 'steps \(' /tmp/gpu-out/smk.log 2>/dev/null | tail -1)"
    for f in $(ls -t /tmp/wd/logs/*/*/k*.log 2>/dev/null | head -2); do echo "$f: $(grep -v '^\[default0\]:\[W' "$f" | tail -1 | cut -c1-160)"; done
  fi
done
if [ -f /tmp/gpu-out/rc ]; then echo "ended rc=$(cat /tmp/gpu-out/rc)"; cat /tmp/gpu-out/run.log
else echo "still running after $1 s"   # what is done so far comes back, in case no later call does
  (cd /tmp/wd && tar czf "${OUT:-.}/partial.tgz" results/runs logs .snakemake/log 2>/dev/null); fi
cp /tmp/gpu-out/* "${OUT:-.}/" 2>/dev/null; ls -la "${OUT:-.}"
