#!/bin/bash
# tools/lab/start_probe.py under torchrun and without, lazy and eager NCCL, and NCCL's
# own INIT lines with timestamps; then torchrun's agent alone (a script that only
# prints). Each run prints how long its process took after its last line.
cd "$(dirname "$0")/../.."
P=tools/lab/start_probe.py
ts() { date +%s.%N; }
after() { python3 -c "import sys; print(f'  torchrun/python gone {float(sys.argv[2]) - float(sys.argv[1]):.3f} s after end_unix')" "$1" "$2"; }
one() {  # label, command...
  echo "== $1"; shift
  export T0=$(ts); out=$("$@" 2>&1); t1=$(ts); echo "$out" | grep -E "start_probe|NCCL INFO (Init|comm|NCCL version|Bootstrap|ncclCommInit|init)" | head -40
  e=$(echo "$out" | sed -n 's/.*end_unix \([0-9.]*\).*/\1/p' | tail -1); [ -n "$e" ] && after "$e" "$t1"
}
python3 -c "import torch" ; for i in 1 2; do t=$(ts); python3 -c "import torch"; echo "import torch alone: $(python3 -c "print(round($(ts)-$t,3))") s"; done
cat > /tmp/hello.py <<'PY'
import os, time
print("[start_probe] agent and interpreter %.3f s" % (time.time() - float(os.environ["T0"])))
print("[start_probe] end_unix %.3f" % time.time(), flush=True)
PY
for i in 1 2; do one "torchrun, a script that only prints" torchrun --standalone --nproc-per-node=1 /tmp/hello.py; done
for i in 1 2; do one "torchrun, lazy NCCL init" torchrun --standalone --nproc-per-node=1 $P; done
one "torchrun, eager NCCL init" torchrun --standalone --nproc-per-node=1 $P --eager
one "python, no torchrun" env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 python3 $P
one "torchrun, NCCL_DEBUG=INFO" env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,NET NCCL_DEBUG_TIMESTAMP_LEVELS=ALL torchrun --standalone --nproc-per-node=1 $P
one "torchrun, flight recorder on (as the watchdog sets it)" env TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 torchrun --standalone --nproc-per-node=1 $P
one "torchrun, NCCL_NET_PLUGIN=none NCCL_IB_DISABLE=1" env NCCL_NET_PLUGIN=none NCCL_IB_DISABLE=1 torchrun --standalone --nproc-per-node=1 $P
