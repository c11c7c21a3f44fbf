#!/usr/bin/env bash
# Second command of the README (and what CI runs): install what is missing, then run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
PY=${PYTHON:-python3}
exec $PY -m pytest -q "$@"
