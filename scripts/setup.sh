#!/usr/bin/env bash
# First command of the README: install everything (scripts/install.sh: into the active virtualenv, else
# the project's .venv), then run the main job on the embedded default - a small strong-scaling sweep of
# the LSTM translation model (nmt-small, global batch 64) over 1 and 2 local worker processes with Horovod
# over Gloo, ending in a scaling table and a Markdown report with plots (about a minute on 2 cores).
# Extra arguments go to `launch sweep`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python-env.sh
scripts/install.sh
# The bytecode of what `launch`, its agents and its ranks import (scripts/bytecode.py says why): uv installs
# none, and where PYTHONDONTWRITEBYTECODE=1 (this project's machines) Python never writes it, so every later
# process would compile pandas, PyTorch's compiler and scalelab from source again: a two-rank `launch` took
# 2.9x the CPU without it (docs/benchmarks.md, 2026-12-03). A second run, with
# everything up to date, takes about 4 s (it imports the entry modules and compares timestamps).
"$PY" scripts/bytecode.py || echo "setup: some bytecode could not be written; launch works, more slowly" >&2
exec "$PY_BIN/launch" sweep --model nmt-small --engine horovod --workers 1,2 --mode strong \
  --global-batch 64 --steps 30 --warmup-steps 5 "$@"
