#!/usr/bin/env bash
# The GPU check (issue 36): everything of the project that needs an NVIDIA GPU, in one command of at most
# 8 minutes, on a machine that has the working tree and a PyTorch but no network (it installs nothing; no
# Horovod needed). Writes gpu-check.json, gpu-check.md and gpu-check.log into $OUT when it is set, else into
# runs/gpu-check-DATE/ (or --out DIR). Without a CUDA device it says so in one line and exits non-zero.
#   bash scripts/gpu-check.sh                      every step
#   bash scripts/gpu-check.sh --only device,matmul  some steps (launch gpu-check --help lists them)
# Python: $PYTHON, else the project's .venv where there is one, else python3 (the one that holds PyTorch on
# the device machine). The working tree goes first on PYTHONPATH, so an installed scalelab is not used; the
# command runs in the working tree, so a relative --out is taken from there.
# Exit: 0 when every step ran to a result (an out-of-memory run is one), 1 when a step failed, ran past its
# budget or was skipped, 2 when the check could not start. docs/benchmarks.md, "The GPU check".
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
elif [ -x .venv/bin/python ]; then
  PY=.venv/bin/python
else
  PY=python3
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec "$PY" -m scalelab.launcher.offline gpu-check "$@"
