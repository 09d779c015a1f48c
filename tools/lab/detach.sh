#!/bin/bash
# A run longer than one device call (10 minutes): copies the tree to /tmp/wd (the device
# re-syncs the repository root at each call) and starts tools/offline-gpu/run.sh there in a new
# process session, which the device keeps alive between calls while the machine stays
# warm (the next call within its idle time); tools/lab/await.sh then follows it.
#   DPSCALE_GIT_COMMIT=sha KS='[1]' TARGETS='...' bash tools/lab/detach.sh SECONDS [snakemake args]
# Writes /tmp/gpu-out (run.sh's smk.log, results.tgz) and /tmp/gpu-out/rc when it ends.
set -e
rm -rf /tmp/wd /tmp/gpu-out; mkdir -p /tmp/gpu-out
cp -a . /tmp/wd
cd /tmp/wd
setsid nohup bash -c 'OUT=/tmp/gpu-out bash tools/offline-gpu/run.sh "$@" > /tmp/gpu-out/run.log 2>&1; echo $? > /tmp/gpu-out/rc' \
  run "$@" < /dev/null > /dev/null 2>&1 &
echo "detached: pid $!, $(date -u +%T), run.sh $*"
