#!/bin/bash
# The README's command 1 on a lent GPU machine, exactly as a user types it, measured whole
# by Snakemake's own elapsed time (issue #43: at most ten minutes on one H200). What the
# machine lacks comes the way the README's "GPU use" says for a machine without network:
# Debian's Fashion-MNIST files where that package puts them (the carried .fmnist/), the
# wheels installed with pip --no-index, the project with --no-deps. Then, in a copy of the
# tree (a fresh clone has no results/), in its own process session so it outlives one
# 10-minute device call:
#
#     snakemake --cores 1 report
#
#   DPSCALE_GIT_COMMIT=sha bash tools/lab/readme_run.sh start [WAIT_S]   # sets up, starts, follows
#   bash tools/lab/readme_run.sh wait [WAIT_S]                           # a later call: follows, then
#       copies the run's log, Snakemake's, the results and the report (results.tgz) to $OUT
set -u
RUN=/tmp/readme-run WD=/tmp/readme-clone OUT=${OUT:-.}
if [ "$1" = start ]; then
  rm -rf "$RUN" "$WD"; mkdir -p "$RUN" /usr/share/datasets/fashion-mnist
  cp .fmnist/*.gz /usr/share/datasets/fashion-mnist/   # what `bash tools/fashion-mnist.sh` installs there
  cp -a . "$WD" && rm -rf "$WD/results" "$WD/logs" "$WD/.snakemake" "$WD/.fmnist"
  cd "$WD"
  bash tools/fashion-mnist.sh
  python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | tail -2
  python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
  echo "$ snakemake --cores 1 report   (in $WD, commit ${DPSCALE_GIT_COMMIT:-?}, started $(date -u +%T))"
  setsid nohup bash -c "cd $WD && snakemake --cores 1 report > $RUN/smk.log 2>&1; echo \$? > $RUN/rc" \
    < /dev/null > /dev/null 2>&1 &
  cd - > /dev/null
fi
t0=$(date +%s)
while [ ! -f "$RUN/rc" ] && [ $(( $(date +%s) - t0 )) -lt "${2:-540}" ]; do
  sleep 15
  echo "$(date -u +%T) $(grep -E 'steps \(' "$RUN/smk.log" 2>/dev/null | tail -1) | $(grep -E '^(localrule|rule) ' "$RUN/smk.log" | tail -1)"
done
if [ -f "$RUN/rc" ]; then
  echo "ended rc=$(cat "$RUN/rc")"; grep -E "Elapsed time|steps \(|Nothing to be done" "$RUN/smk.log" | tail -3
  (cd "$WD" && tar czf "$OUT/results.tgz" --exclude=results/data --exclude="*.ranks" results logs .snakemake/log 2>/dev/null)
  tail -60 "$RUN/smk.log" > "$OUT/smk-tail.log"; cp "$RUN/smk.log" "$OUT/" 2>/dev/null
else
  echo "still running after ${2:-540} s"
fi
