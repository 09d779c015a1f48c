#!/bin/bash
# A GPU run of the pipeline on a machine without network, as used for reference/h200:
#   [KS='[1,2]'] [TARGETS='...'] [DPSCALE_GIT_COMMIT=sha] bash tools/offline-gpu/run.sh SECONDS [snakemake args]
# installs Snakemake from .whl/ (`../shared/tools/device-wheels.sh .whl $(grep -v '^#'
# tools/offline-gpu/wheels.txt)`: Snakemake and the extra packages listed there, less the wheels
# the image has and pulp, 16 MB that only the ILP scheduler imports: hence --scheduler greedy;
# the four Fashion-MNIST .gz files travel in .fmnist/, found by data.local_dir), runs
# `snakemake TARGETS` (default: report) for at most SECONDS, prints its wall time and
# one line per result, and leaves everything as $OUT/results.tgz. A copy of the tree
# without .git names its commit through DPSCALE_GIT_COMMIT (dpscale.provenance).
export PYTHONUNBUFFERED=1
OUT=${OUT:-.}
mkdir -p /tmp/bin; command -v python >/dev/null || ln -sf "$(command -v python3)" /tmp/bin/python; export PATH=/tmp/bin:$PATH
source "$(dirname "$0")/site.sh"
[ -d .fmnist ] && set -- "$@" "data={source: auto, local_dir: $PWD/.fmnist}"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; env | grep -E "^(NCCL|NVSHMEM|TORCH_SYMM)" | sort | tr '\n' ' '; echo
echo "$ snakemake --cores 16 --scheduler greedy ${TARGETS:-report} --config ks=${KS:-[1]} ${*:2}"
t0=$(date +%s)
timeout -s INT --kill-after=30 "$1" snakemake --cores 16 --scheduler greedy ${TARGETS:-report} --config "ks=${KS:-[1]}" "${@:2}" > $OUT/smk.log 2>&1
echo "snakemake rc=$? after $(( $(date +%s) - t0 )) s"; grep -E "steps \(|Error|error:|Nothing to be done|failed" $OUT/smk.log | tail -6
python3 tools/offline-gpu/summary.py
tar czf $OUT/results.tgz results/runs results/fingerprint.json results/data/*.json results/model results/report logs .snakemake/log 2>/dev/null; ls -la $OUT
