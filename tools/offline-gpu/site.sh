# Sourced by the GPU tools: what the image lacks, into /tmp/site, then on PYTHONPATH.
# The .whl/ wheels (Snakemake, the extra packages of tools/offline-gpu/wheels.txt, and their
# dependencies) unless Snakemake and the rich logger plugin are there already,
# and every .whl/*.tar.xz: a package too big for the 64 MB carry limit travels as a
# trimmed site-packages tree (nvidia-cudnn-frontend without its attention and GEMM
# kernels, which conv graphs never import; tools/offline-gpu/cudnn_frontend_tree.sh makes it).
python3 -c "import snakemake, snakemake_logger_plugin_rich" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -1
mkdir -p /tmp/site; for t in .whl/*.tar.xz; do [ -f "$t" ] && tar xJf "$t" -C /tmp/site; done
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
