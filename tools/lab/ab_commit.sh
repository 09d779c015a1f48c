#!/bin/bash
# One chip, two commits: one k=1 series of the answer (SERIES, default ddp_weak/cached;
# 2 launches per turn) measured by this tree and by an older commit's tree, interleaved A B A B (ROUNDS
# turns each), so that a move of a throughput between two references taken on different
# chips is told apart from a change of the code: on one chip, the same code gives the
# same number or the code moved it.
#   git archive --format=tar.gz -o ab_old.tar.gz OLD_COMMIT          (here: the old tree,
#       untracked and not ignored, so the device call copies it)
#   OLD=OLD_COMMIT NEW=NEW_COMMIT [SERIES=ddp_weak/tuned] [ROUNDS=2] [STOP_AFTER_S=450] \
#       bash tools/lab/ab_commit.sh        (on the GPU machine; .whl/ and .fmnist/ carried)
# STOP_AFTER_S: no turn starts after that many seconds (a device call ends at 600 s), so
# the turns done come back whole; summary.txt is in $OUT as each turn ends.
# Each turn's result JSON, job log and Snakemake log, and one line per turn (summary.txt),
# come back as $OUT/ab_commit.tgz (a device call returns at most 8 files).
export PYTHONUNBUFFERED=1
mkdir -p /tmp/bin; command -v python >/dev/null || ln -sf "$(command -v python3)" /tmp/bin/python; export PATH=/tmp/bin:$PATH
source "$(dirname "$0")/../offline-gpu/site.sh"
DEST=${OUT:-.}; OUT=/tmp/ab_commit; rm -rf $OUT; mkdir -p $OUT; ROUNDS=${ROUNDS:-2}; HERE=$PWD
OLD_TREE=/tmp/ab_old; rm -rf $OLD_TREE; mkdir -p $OLD_TREE; tar xzf ab_old.tar.gz -C $OLD_TREE
SERIES=${SERIES:-ddp_weak/cached}; R=results/runs/$SERIES/k1.json; T0=$(date +%s)
nvidia-smi --query-gpu=uuid,name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
turn() {  # label, tree, commit
  rm -f "$2/$R"
  (cd "$2" && DPSCALE_GIT_COMMIT=$3 snakemake --cores 16 --scheduler greedy $R --config 'ks=[1]' \
     'scales={paper: {launches: 2}}' "data={source: auto, local_dir: $HERE/.fmnist}" > $OUT/$1.smk.log 2>&1) \
    || { echo "$1 failed"; tail -20 $OUT/$1.smk.log; return 1; }
  cp "$2/$R" $OUT/$1.json; cp "$2/logs/$SERIES/k1.log" $OUT/$1.log
  python3 -c "import json,sys; r=json.load(open('$OUT/$1.json')); m=r['metrics']; print('$1 $3', [round(x) for x in m['samples_per_s_launches']], 'per repeat', [round(x) for x in m.get('samples_per_s_repeats') or []], 'sources', r['code'].get('sources_sha256'))" | tee -a $OUT/summary.txt; cp $OUT/summary.txt $DEST/
}
late() { [ $(( $(date +%s) - T0 )) -gt ${STOP_AFTER_S:-100000} ] && echo "no turn after $1: past STOP_AFTER_S"; }
for i in $(seq 1 $ROUNDS); do
  late A$i && break; turn A$i "$HERE" "$NEW" || break
  late B$i && break; turn B$i "$OLD_TREE" "$OLD" || break
done
nvidia-smi --query-gpu=uuid,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee -a $OUT/gpu.txt
tar czf $DEST/ab_commit.tgz -C $OUT .
