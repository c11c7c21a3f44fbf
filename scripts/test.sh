#!/usr/bin/env bash
# Second command of the README (and what CI runs through .ci/run): install what is missing, then run the
# whole test suite. Arguments go to pytest:
#   bash scripts/test.sh                 everything (what CI runs)
#   bash scripts/test.sh -m "not slow"   the fast subset for day-to-day work (about 5 minutes on 2 cores: docs/benchmarks.md)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python-env.sh
# .ci/run has just installed into a new virtualenv and says so (SCALELAB_JUST_INSTALLED=1): the check, which
# takes about 5 s when nothing is missing, is not repeated there.
[ "${SCALELAB_JUST_INSTALLED:-}" = 1 ] || scripts/install.sh
# The bytecode of what the suite's Python processes import, written once (scripts/bytecode.py says why).
"$PY" scripts/bytecode.py || echo "test: some bytecode could not be written; the suite runs, more slowly" >&2
# And whatever a test's processes import that the script did not foresee (boto3's clients, Dask's workers,
# Inductor), written by the first process that imports it rather than compiled again by every one: on this
# project's machines PYTHONDONTWRITEBYTECODE=1 would stop that. Only the suite's processes see this.
unset PYTHONDONTWRITEBYTECODE
# On SCALELAB_TEST_WORKERS pytest-xdist workers (default 3 on CI's two cores; 0 runs in this process, as plain
# pytest does). A test's time is mostly processes it started and waits for (ranks' start-up, rendezvous, Slurm,
# moto, heartbeats): with two workers the cores were 73 % busy, and a third worker filled part of that
# (pytest 23 min 32 s against 24 min 54 s, docs/benchmarks.md, 2026-12-01). They share one Slurm cluster
# (tests/conftest.py, slurm_cluster); no test groups are set, so `--dist loadgroup` hands the tests out one by one.
workers=${SCALELAB_TEST_WORKERS:-3}
# Waiting OpenMP threads sleep rather than spin on the busy cores (tests/conftest.py says why; set here too so
# that the workers' own PyTorch reads it before anything imports it).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
exec "$PY" -m pytest -q -n "$workers" --dist loadgroup "$@"
