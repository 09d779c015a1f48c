#!/bin/bash
# The tuned_fp16 series' checks on one GPU, in one call (not part of the pipeline):
#   bash tools/lab/probe_fp16.sh [PROBE_SECONDS]
# installs what the image lacks (tools/offline-gpu/site.sh: Snakemake for the tests' imports, and
# nvidia-cudnn-frontend, the `cudnn` extra), then
#   1. the GPU tests of the fused conv + BN statistics (cuDNN's graph against torch, 60
#      fp16 steps against the unfused step, the wrong-axis mutation);
#   2. tools/lab/cudnn_bwd_fusion_probe.py: cuDNN's other conv + BN fusions (the backward
#      reductions in the dgrad's epilogue, BN apply + ReLU in a conv's prologue), each
#      against the torch pieces it would replace, every plan timed;
#   3. tools/lab/probe_roofline.py on the fp16 pieces (fp16, + the fused statistics,
#      without loss scaling, without BatchNorm), each with its kernel table and the wall
#      its measured convolutions allow (dpscale.lab.kernel_table).
# Everything lands in $OUT; README "The fp16 series" reads these files.
export PYTHONUNBUFFERED=1
OUT=${OUT:-.}
source "$(dirname "$0")/../offline-gpu/site.sh"
export PYTHONPATH=$PWD/src:$PYTHONPATH
python3 -c "import cudnn, torch; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version_string(), 'torch', torch.__version__)"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv
timeout 180 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_fused_convbn.py 2>&1 | tail -15 | tee $OUT/pytest_fused.log
timeout -s INT --kill-after=10 170 python3 tools/lab/cudnn_bwd_fusion_probe.py > $OUT/fusion_probe.jsonl 2> $OUT/fusion_probe.err
cut -c1-600 $OUT/fusion_probe.jsonl
V=fp16_genstats,fp16,fp16_genstats_noscale,fp16_nobn
timeout -s INT --kill-after=20 "${1:-300}" python3 tools/lab/probe_roofline.py --budget-s $(( ${1:-300} - 20 )) \
    --variants $V --layers "" --kernels $V --out $OUT > $OUT/probe.log 2>&1
grep -v '"stage"' $OUT/probe.log | grep -v "^   " | tail -60
