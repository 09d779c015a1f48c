#!/bin/bash
# The tuned_fp16 series' checks on one GPU, in one call (not part of the pipeline):
#   bash tools/gpu/probe_fp16.sh [PROBE_SECONDS]
# installs the carried wheels (.whl/: Snakemake for the tests' imports, and
# nvidia-cudnn-frontend, the `cudnn` extra), runs the GPU tests of the fused conv + BN
# statistics (cuDNN's graph against torch, 60 fp16 steps against the unfused step, the
# wrong-axis mutation), then tools/gpu/probe_roofline.py on the fp16 pieces: the fused
# step, the bf16 tuned step it replaces, fp16 alone, fp16 without loss scaling, and the
# per-layer tables of the fused and the bf16 model. Everything lands in $OUT.
export PYTHONUNBUFFERED=1
OUT=${OUT:-.}
source "$(dirname "$0")/site.sh"
export PYTHONPATH=$PWD/src:$PYTHONPATH
python3 -c "import cudnn, torch; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version_string(), 'torch', torch.__version__)"
timeout 180 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_fused_convbn.py 2>&1 | tail -15 | tee $OUT/pytest_fused.log
timeout -s INT --kill-after=20 "${1:-300}" python3 tools/gpu/probe_roofline.py --budget-s $(( ${1:-300} - 20 )) \
    --variants fp16_genstats,all,fp16,fp16_noscale --layers fp16_genstats,all --out $OUT 2>&1 \
    | grep -v '"stage": "layers"' | tail -60
