# Sourced by scripts/setup.sh, install.sh and test.sh: choose the Python everything installs into and runs
# with, and put its bin directory (launch, horovodrun, torchrun) first on PATH.
#   PYTHON=/path/to/python   that interpreter's environment, as given
#   an active virtualenv     its python ($VIRTUAL_ENV)
#   otherwise                the project's own .venv (made here with python3 -m venv the first time), so a
#                            fresh machine's system Python is never changed
# Afterwards: $PY is the interpreter, $PY_BIN its scripts directory.
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
elif [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
  PY=$VIRTUAL_ENV/bin/python
else
  if [ ! -x .venv/bin/python ]; then
    echo "scalelab: making a virtualenv in $(pwd)/.venv (activate it with: . .venv/bin/activate)"
    python3 -m venv .venv || { echo "scalelab: python3 -m venv .venv failed; install python3-venv or set PYTHON=" >&2; exit 1; }
  fi
  PY=$(pwd)/.venv/bin/python
fi
PY_BIN=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))') \
  || { echo "scalelab: $PY does not run; set PYTHON= to a Python 3.11 or newer" >&2; exit 1; }
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "scalelab: $PY is $("$PY" -V 2>&1); scalelab needs Python 3.11 or newer (set PYTHON=)" >&2; exit 1; }
export PATH="$PY_BIN:$PATH"
export PYTHON=$PY
