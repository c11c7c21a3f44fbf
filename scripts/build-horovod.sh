#!/usr/bin/env bash
# Build (or reuse) a Horovod wheel for the installed PyTorch, with Gloo and without MPI.
#
# Why a script: Horovod's last release (0.28.1) ships only as a source distribution whose CMake
# files ask for C++14, while PyTorch >= 2.1 headers need C++17. We patch the standard, build once
# (about 10 minutes on 2 cores) and cache the wheel keyed by horovod + torch + python versions, so
# later runs (and CI with a warm cache) install in seconds.
#
# Usage: scripts/build-horovod.sh            build if needed, then install
#        SCALELAB_WHEEL_CACHE=DIR ...        where wheels are cached (default ~/.cache/scalelab/wheels)
set -euo pipefail

PY=${PYTHON:-python3}
HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
CACHE=${SCALELAB_WHEEL_CACHE:-$HOME/.cache/scalelab/wheels}

torch_v=$($PY -c 'import torch; print(torch.__version__.replace("+", "_"))') || {
  echo "build-horovod: PyTorch is not installed for $PY; run: $PY -m pip install torch==2.13.0" >&2; exit 1; }
py_v=$($PY -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
key="horovod-${HOROVOD_VERSION}-torch-${torch_v}-${py_v}"
dest="$CACHE/$key"

if $PY - <<PYEOF 2>/dev/null
import horovod, horovod.torch as hvd
assert horovod.__version__ == "$HOROVOD_VERSION"
assert hvd.gloo_built()
PYEOF
then
  echo "build-horovod: horovod $HOROVOD_VERSION with PyTorch + Gloo already installed"; exit 0
fi

if ! ls "$dest"/horovod-*.whl >/dev/null 2>&1; then
  echo "build-horovod: building $key (about 10 minutes on 2 cores; cached in $dest)"
  $PY -m pip install -q numpy cloudpickle psutil pyyaml packaging cffi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  $PY -m pip download -q --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION"
  tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
  src="$work/horovod-$HOROVOD_VERSION"
  # The one patch: C++17, as upstream did on main (horovod/horovod#3998).
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
    "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  mkdir -p "$dest.tmp"
  (cd "$src" && HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
     HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo \
     MAKEFLAGS=-j"$(nproc)" \
     $PY -m pip wheel --no-build-isolation --no-deps -w "$dest.tmp" . >"$dest.build.log" 2>&1) || {
    echo "build-horovod: build failed; the last lines of $dest.build.log:" >&2
    tail -30 "$dest.build.log" >&2; exit 1; }
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
fi
$PY -m pip install -q --no-deps "$dest"/horovod-*.whl
$PY -m pip install -q cloudpickle psutil pyyaml packaging cffi
echo "build-horovod: installed $(ls "$dest"/horovod-*.whl)"
