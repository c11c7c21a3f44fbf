#!/usr/bin/env bash
# Issue 15's check on this machine: probe two local "types" that differ (threads per worker) and
# predict layouts of each from the others (scalelab/costs/probe_validation.py; docs/benchmarks.md has the
# figures):
#
#   1. `launch probe --instance-types local-1t,local-2t`: nmt-tiny, synthetic data, weak scaling,
#      1x1, 1x2 and 2x2 of each (an "instance" is 2 workers), PROBE_STEPS measured steps each;
#   2. `python -m scalelab.costs.validation --probe DIR`: each type's 2x2 from its own 1x1 and 1x2 (the
#      planner's scaling models), the other type's 1x2 and 2x2 from one type's runs plus the other's
#      1x1 (speed_basis probe), and the same with the step-time model; errors and 90 % band coverage.
#
#   scripts/validate-probe.sh [RUNS_DIR] [PROBE_STEPS] [MODEL]   (defaults: runs-probe-validate 100 nmt-tiny)
#
# About 4 minutes on 2 shared cores. Prints the load average before and after: the figures mean
# little on a busy machine (two threads per worker on 2 cores are oversubscribed by 4 ranks).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=$(realpath -m "${1:-runs-probe-validate}")
STEPS=${2:-100}
MODEL=${3:-nmt-tiny}
echo "load before: $(cat /proc/loadavg)  ($(date -u +%FT%TZ), $(nproc) cores)"
launch probe --instance-types local-1t,local-2t --model "$MODEL" --probe-steps "$STEPS" --runs-dir "$RUNS" --yes
echo "load after: $(cat /proc/loadavg)  ($(date -u +%FT%TZ))"
PROBE=$(ls -td "$RUNS"/probe-* | head -1)
python -m scalelab.costs.validation --probe "$PROBE" --format markdown
