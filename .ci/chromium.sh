#!/usr/bin/env bash
# Make a headless Chromium available for tests/test_browser.py (which fails under
# CI=true without one). Uses an existing browser if there is one; otherwise installs
# Debian's `chromium` package with apt (Debian images; on Ubuntu runners, whose
# chromium-browser is a snap stub, google-chrome is normally preinstalled and found).
# Prints the path to use; export CHROMIUM=<path> if it is not /usr/bin/chromium.
set -euo pipefail

for exe in "${CHROMIUM:-}" /usr/bin/chromium chromium google-chrome google-chrome-stable chromium-browser; do
  [ -n "$exe" ] || continue
  if path=$(command -v "$exe" 2>/dev/null) && "$path" --version >/dev/null 2>&1; then
    echo "chromium: $path ($("$path" --version 2>/dev/null))"
    exit 0
  fi
done

if ! command -v apt-get >/dev/null 2>&1; then
  echo "no chromium and no apt-get: install Chromium or Chrome and set CHROMIUM=<path>" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
echo "chromium: $(command -v chromium) ($(chromium --version 2>/dev/null))"
