#!/usr/bin/env bash
# Install everything scalelab needs into the current Python (a virtualenv if one is active):
# PyTorch (the CPU build at hand on these machines), the project with its test extras, and
# Horovod built from source with PyTorch + Gloo (cached; see scripts/build-horovod.sh).
# Idempotent: a second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
quiet() { "$@" 2>&1 | grep -v -e '^WARNING: Location' -e 'Running pip as the' || true; }

if ! $PY -c 'import torch' 2>/dev/null; then
  echo "install: PyTorch"
  quiet $PY -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
fi
echo "install: scalelab and its dependencies"
quiet $PY -m pip install -q -e ".[dev]"
$PY -c 'import launcher, train, costs' || { echo "install: scalelab did not install" >&2; exit 1; }
scripts/build-horovod.sh

# Chromium for the test that opens the HTML report in a real headless browser (tests/test_html_report.py
# skips with a reason where it is missing); only where apt-get can install as root.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "install: chromium (headless, for the HTML report test)"
  apt-get install -y -q chromium >/dev/null 2>&1 || echo "install: chromium not installed; the browser test will skip" >&2
fi
