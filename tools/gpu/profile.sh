#!/bin/bash
# Where a training step's time goes on one GPU (not part of the pipeline): the
# PyTorch variants (compile, DDP, batch, CUDA graphs, no batch norm) with a kernel
# breakdown, then the tuned JAX step at three batch sizes with one from a trace.
# Run from the project root on the GPU machine: bash tools/gpu/profile.sh [torch_s] [jax_s]
# (seconds each half may spend; results in $OUT when set, else the current folder).
export PYTHONUNBUFFERED=1
OUT=${OUT:-.}
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
python3 -c "import torch, jax; print(torch.__version__, torch.backends.cudnn.version(), jax.__version__)"
timeout -s INT 330 python3 tools/gpu/profile_torch_step.py "${1:-270}" > "$OUT/torch_step.log" 2>&1; echo "torch rc=$?"
grep -v "^\[rank0\]:W\|Warning\|warn" "$OUT/torch_step.log" | head -120
timeout -s INT 200 python3 tools/gpu/profile_jax_step.py "${2:-150}" > "$OUT/jax_step.log" 2>&1; echo "jax rc=$?"
grep -v "^W1\|Warning\|warn" "$OUT/jax_step.log" | head -80
