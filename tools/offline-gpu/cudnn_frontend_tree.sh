#!/bin/bash
# nvidia-cudnn-frontend for the GPU image (Python 3.12, no network) as a trimmed
# site-packages tree in .whl/, which tools/offline-gpu/run.sh and probe_fp16.sh unpack into
# /tmp/site. Why not the wheel: it is 11.6 MB (48 MB unpacked), and with the Snakemake
# wheels and the four Fashion-MNIST files the carry passes the device's 64 MB limit.
# What goes: the attention, GEMM and MoE kernel packages and the C++ headers, which a
# conv + genstats graph never imports (`import cudnn` loads them lazily); 1.8 MB left.
#   bash tools/offline-gpu/cudnn_frontend_tree.sh [VERSION]   (run where the package registry is)
set -euo pipefail
v=${1:-1.32.0}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pip download -q --no-deps "nvidia-cudnn-frontend==$v" --python-version 3.12 --only-binary=:all: -d "$tmp"
mkdir "$tmp/tree" && (cd "$tmp/tree" && unzip -q "$tmp"/nvidia_cudnn_frontend-*.whl)
for d in sdpa gemm linear_attention deepseek_sparse_attention gated_attention_block moe_ep \
         block_sparse_attention flex_attention hstu QSA native_sparse_attention; do
    rm -rf "$tmp/tree/cudnn/$d"
done
rm -rf "$tmp/tree/include"
mkdir -p .whl && tar cJf ".whl/nvidia-cudnn-frontend-$v-slim.tar.xz" -C "$tmp/tree" .
ls -la ".whl/nvidia-cudnn-frontend-$v-slim.tar.xz"
