#!/usr/bin/env bash
# Real Fashion-MNIST for the smoke DAG and the data tests: Debian's
# dataset-fashion-mnist puts the four files under /usr/share/datasets/fashion-mnist,
# where data.source auto finds them (CI reaches package registries only, not the
# dataset's mirrors). Idempotent; says what it did.
set -euo pipefail
dir=/usr/share/datasets/fashion-mnist
if [ -f "$dir/t10k-labels-idx1-ubyte.gz" ]; then
  echo "fashion-mnist: $dir ($(dpkg-query -W -f '${Package} ${Version}' dataset-fashion-mnist 2>/dev/null || echo 'not from dpkg'))"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "no apt-get: the pipeline downloads Fashion-MNIST from its mirrors, or uses the labelled synthetic stand-in" >&2
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends dataset-fashion-mnist
echo "fashion-mnist: $dir ($(dpkg-query -W -f '${Package} ${Version}' dataset-fashion-mnist))"
