#!/usr/bin/env bash
# Install everything scalelab needs, from the lock (requirements.lock), into the Python chosen by
# scripts/python-env.sh (PYTHON=, else the active virtualenv, else the project's .venv):
#   1. uv (pinned), the installer: it resolves and installs the locked set in seconds;
#   2. PyTorch, if missing: torch==$TORCH_VERSION (the CPU build where pip is configured with one at hand);
#   3. scalelab itself (editable) with its test extras, every version constrained by requirements.lock;
#   4. Horovod, built from its source release (scripts/build-horovod.sh; cached wheel);
#   5. a check, run outside the source tree, that `scalelab` imports from the installed package and the
#      `launch` command runs.
# Any failed step stops here with the installer's own message and a non-zero exit. A second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python-env.sh
UV_VERSION=0.13.9
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
export PIP_DISABLE_PIP_VERSION_CHECK=1 UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1

step=""
trap 'rc=$?; [ $rc -eq 0 ] || echo "install: FAILED (exit $rc) while: $step; nothing after it was installed" >&2' EXIT
begin() { step=$1; echo "install: $1"; }

begin "uv $UV_VERSION (the installer) into $PY"
"$PY" -m uv --version 2>/dev/null | grep -q " $UV_VERSION" || "$PY" -m pip install -q "uv==$UV_VERSION"
uv() { "$PY" -m uv "$@"; }

# pip's configured wheel folders (this machine kind keeps the CPU build of PyTorch in one): uv reads no pip.conf.
links=()
for d in ${PIP_FIND_LINKS:-$("$PY" -m pip config get global.find-links 2>/dev/null || true)}; do
  [ -d "$d" ] && links+=(--find-links "$d")
done

if ! "$PY" -c 'import torch' 2>/dev/null; then
  begin "PyTorch $TORCH_VERSION"
  uv pip install -q --python "$PY" "${links[@]}" "torch==$TORCH_VERSION"
fi

begin "scalelab and its dependencies (requirements.lock)"
uv pip install -q --python "$PY" "${links[@]}" --constraint requirements.lock -e ".[dev]"

begin "Horovod (scripts/build-horovod.sh)"
scripts/build-horovod.sh

begin "checking the installed package from outside the source tree"
[ -x "$PY_BIN/launch" ] || { echo "install: the launch command is missing from $PY_BIN" >&2; exit 1; }
(cd "$(mktemp -d)" && "$PY" -c 'import scalelab.launcher.cli, scalelab.train.loop' && "$PY_BIN/launch" --help >/dev/null)
echo "install: done; scalelab $("$PY" -c 'import importlib.metadata as m; print(m.version("scalelab"))') in $("$PY" -c 'import sys; print(sys.prefix)') (launch: $PY_BIN/launch)"
step=""

# Chromium for the test that opens the HTML report in a real headless browser (tests/test_html_report.py
# skips with a reason where it is missing); only where apt-get can install as root. Optional: not a failure.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "install: chromium (headless, for the HTML report test; optional)"
  apt-get install -y -q chromium >/dev/null 2>&1 || echo "install: chromium not installed; the browser test will skip" >&2
fi
