#!/usr/bin/env bash
# Re-resolve every dependency of every extra and write requirements.lock (a constraints file: pins only).
#   scripts/lock.sh                          after changing a range in pyproject.toml
#   scripts/lock.sh --upgrade                newest versions the ranges allow
#   scripts/lock.sh --upgrade-package NAME   one package
# Why uv: it resolves the whole set in seconds (pip's resolver backtracked for an hour on s3fs/aiobotocore/
# botocore, issue #24), and `--universal` writes one file with markers for every Python >= 3.11 and
# platform. The file is a plain constraints file, so pip uses it too: pip install -c requirements.lock -e .[dev]
# PyTorch is pinned here (TORCH_VERSION) but installed first by install.sh, so a CUDA or CPU build already
# present is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python-env.sh
UV_VERSION=$(sed -n 's/^UV_VERSION=//p' scripts/install.sh)
"$PY" -m uv --version 2>/dev/null | grep -q " $UV_VERSION" || "$PY" -m pip install -q "uv==$UV_VERSION"
TORCH_VERSION=$(sed -n 's/^TORCH_VERSION=\${TORCH_VERSION:-\(.*\)}$/\1/p' scripts/install.sh)
pins=$(mktemp) && trap 'rm -f "$pins"' EXIT
echo "torch==$TORCH_VERSION" >"$pins"
"$PY" -m uv pip compile --quiet pyproject.toml --extra dev --extra k8s --extra prep --universal --python-version 3.11 \
  --constraint "$pins" --no-header --output-file requirements.lock "$@"
sed -i '1i # Every dependency of scalelab and its extras, resolved by scripts/lock.sh (uv pip compile --universal).\n# A constraints file: pip install -c requirements.lock -e ".[dev]"   (scripts/install.sh does this with uv)' requirements.lock
echo "lock: wrote requirements.lock ($(grep -c '==' requirements.lock) pins)"
