#!/bin/bash
# Kill Snakemake's main process alone (SIGKILL, not its process group: what the OOM
# killer or a closed terminal does) during a GPU measurement, then watch the job's
# processes and the GPU's compute processes for 15 s; then the plain rerun.
#   bash tools/gpu/kill_main.sh [TARGET]      (default: the tuned DDP job at k=1)
# Prints one line per second: the job's processes still alive, and nvidia-smi's
# compute processes. Needs Snakemake (tools/gpu/run.sh installs it from .whl/).
set -u
TARGET=${1:-results/runs/ddp_weak/tuned/k1.json}
WORK=${WORK:-/tmp/kill_main}   # its own working folder: the main run's results stay as they are
CFG=(--config 'ks=[1]' 'data={source: synthetic}')
SMK=(snakemake -s "$PWD/Snakefile" -d "$WORK" --cores 16)
mkdir -p "$WORK"; rm -f "$WORK/$TARGET"
setsid "${SMK[@]}" "$TARGET" "${CFG[@]}" > "${OUT:-.}/kill_main_smk.log" 2>&1 &
sleep 2; MAIN=$(pgrep -of "snakemake -s $PWD/Snakefile -d $WORK")   # the main process, not a job's shell
echo "snakemake main pid $MAIN; waiting for a rank of torch_worker.py on the GPU"
for _ in $(seq 600); do
  nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -q . && break
  sleep 0.5
done
sleep 3
echo "GPU compute processes before the kill:"; nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
echo "job processes before the kill:"; pgrep -af "watchdog.py|torchrun|torch_worker.py" | cut -c1-120
kill -9 "$MAIN"; echo "$(date +%T) SIGKILL to $MAIN (snakemake main) only"
for i in $(seq 15); do
  sleep 1
  job=$(pgrep -f "watchdog.py|torchrun|torch_worker.py" | tr '\n' ' ')
  gpu=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ' ')
  printf '%2d s after: job processes [%s]  GPU compute processes [%s]\n' "$i" "$job" "$gpu"
done
echo "nvidia-smi 15 s after the kill:"; nvidia-smi
echo "--- the plain rerun:"
"${SMK[@]}" "$TARGET" "${CFG[@]}" > "${OUT:-.}/kill_main_rerun.log" 2>&1; echo "rerun rc=$?"
grep -E "stale lock|steps \(|Error" "${OUT:-.}/kill_main_rerun.log" | tail -4
python3 -c "import sys, json; sys.path.insert(0, 'src'); from dpscale.results import load_result; r = load_result('$WORK/$TARGET'); print('result', r['status'], round(r['metrics'].get('samples_per_s', 0)), 'samples/s')"
