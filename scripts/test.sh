#!/usr/bin/env bash
# Second command of the README (and what CI runs through .ci/run): install what is missing, then run the
# whole test suite. Arguments go to pytest:
#   bash scripts/test.sh                 everything (what CI runs)
#   bash scripts/test.sh -m "not slow"   the fast subset for day-to-day work (under 5 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python-env.sh
scripts/install.sh
exec "$PY" -m pytest -q "$@"
