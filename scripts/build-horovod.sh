#!/usr/bin/env bash
# Build (or reuse) a Horovod wheel for the installed PyTorch, then install it.
#
# Which Horovod you get:
#   - NCCL + Gloo ("nccl" variant) when the installed PyTorch is a CUDA build and nvcc is found
#     ($CUDA_HOME/bin, /usr/local/cuda/bin or PATH): GPU collectives over NCCL, as a GPU cluster needs;
#   - Gloo only ("gloo" variant) otherwise: CPU ranks, the embedded default.
#   SCALELAB_HOROVOD_VARIANT=gloo|nccl forces one. Neither builds MPI support (Horovod runs on Gloo).
# Why a script: Horovod's last release (0.28.1) ships only as a source distribution that current PyTorch
# and toolchains cannot build as is; the patches are those of ../shared/recipes/horovod-build.md (C++17)
# and horovod-gpu-build.md (CMake 4's policy minimum, headers gcc 13 no longer includes, C++17 for the
# CUDA kernels, NCCL from PyTorch's nvidia-nccl wheel). Each wheel is cached under its own key (horovod,
# torch, python, variant and CUDA architectures), so later runs and CI with a warm cache take seconds.
# A cold Gloo build took 3 min 15 s on 2 cores (2026-11-26, a Xeon with AVX-512; up to 12 min on slower ones);
# NCCL about 2 minutes on 16 cores (the recipe).
#
# Usage: scripts/build-horovod.sh            build if needed, then install
#        SCALELAB_WHEEL_CACHE=DIR ...        where wheels are cached (default ~/.cache/scalelab/wheels)
#        HOROVOD_BUILD_CUDA_CC_LIST=90 ...   CUDA architectures for the nccl variant (default: the visible
#                                            GPUs', else 70,75,80,86,89,90)
set -euo pipefail

PY=${PYTHON:-python3}
LOCK=$(cd "$(dirname "$0")/.." && pwd)/requirements.lock
[ -f "$LOCK" ] && CONSTRAINT=(--constraint "$LOCK") || CONSTRAINT=()
HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
CACHE=${SCALELAB_WHEEL_CACHE:-$HOME/.cache/scalelab/wheels}
say() { echo "build-horovod: $*"; }

# One import of PyTorch for both (each costs about 2 s of CPU; this runs before every test run).
torch_info=$("$PY" -c 'import torch; print(torch.__version__.replace("+", "_"), torch.version.cuda or "-")') || {
  echo "build-horovod: PyTorch is not installed for $PY; run scripts/install.sh" >&2; exit 1; }
torch_v=${torch_info% *}
torch_cuda=${torch_info#* }
[ "$torch_cuda" = - ] && torch_cuda=""
py_v=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
NVCC=""
for c in "${CUDA_HOME:-/nonexistent}/bin/nvcc" /usr/local/cuda/bin/nvcc "$(command -v nvcc || true)"; do
  [ -n "$c" ] && [ -x "$c" ] && { NVCC=$c; break; }
done
variant=${SCALELAB_HOROVOD_VARIANT:-$([ -n "$torch_cuda" ] && [ -n "$NVCC" ] && echo nccl || echo gloo)}
case "$variant" in
  gloo) ;;
  nccl) [ -n "$torch_cuda" ] || { echo "build-horovod: the nccl variant needs a CUDA build of PyTorch (this one is $torch_v)" >&2; exit 1; }
        [ -n "$NVCC" ] || { echo "build-horovod: the nccl variant needs nvcc (set CUDA_HOME)" >&2; exit 1; } ;;
  *) echo "build-horovod: SCALELAB_HOROVOD_VARIANT must be gloo or nccl, not '$variant'" >&2; exit 1 ;;
esac
[ -n "$torch_cuda" ] && [ "$variant" = gloo ] && say "PyTorch is a CUDA build but no nvcc was found: building Gloo only (no GPU collectives); set CUDA_HOME to build NCCL"

key="horovod-${HOROVOD_VERSION}-torch-${torch_v}-${py_v}"
if [ "$variant" = nccl ]; then
  CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST:-$("$PY" -c '
import torch
caps = sorted({"%d%d" % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}) if torch.cuda.is_available() else []
print(",".join(caps) or "70,75,80,86,89,90")')}
  key="$key-nccl-sm${CC_LIST//,/_}"
fi
dest="$CACHE/$key"

if "$PY" - "$variant" <<PYEOF 2>/dev/null
import sys, horovod, horovod.torch as hvd
assert horovod.__version__ == "$HOROVOD_VERSION" and hvd.gloo_built()
assert sys.argv[1] != "nccl" or hvd.nccl_built()
PYEOF
then
  say "horovod $HOROVOD_VERSION ($variant) already installed"; exit 0
fi

build() {
  say "building $key (cached in $dest; gloo: 3-12 minutes on 2 cores)"
  "$PY" -m pip install -q "${CONSTRAINT[@]}" numpy cloudpickle psutil pyyaml packaging cffi setuptools wheel
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  "$PY" -m pip download -q --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION"
  tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
  src="$work/horovod-$HOROVOD_VERSION"
  # C++17, as upstream did on main (horovod/horovod#3998): PyTorch's headers need it.
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  local -a env=(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1
                HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo MAKEFLAGS=-j"$(nproc)"
                CMAKE_POLICY_VERSION_MINIMUM=3.5)  # CMake 4 refuses the bundled projects' old minimum
  # gcc 13 no longer pulls these headers in transitively (harmless on gcc 12).
  env+=(CXXFLAGS="${CXXFLAGS:-} -include string -include cstdint -include stdexcept -include memory -include algorithm -include functional -include limits -include cstring")
  if [ "$variant" = nccl ]; then
    sed -i 's/set(CMAKE_CUDA_STANDARD 11)/set(CMAKE_CUDA_STANDARD 17)/' "$src/horovod/common/ops/cuda/CMakeLists.txt"
    sed -i 's/-std=c++11/-std=c++17/g' "$src/CMakeLists.txt"
    nccl=$("$PY" -c "import importlib.util as u; print(list(u.find_spec('nvidia.nccl').submodule_search_locations)[0])") || {
      echo "build-horovod: PyTorch's NCCL wheel (nvidia-nccl-cu*) is not installed" >&2; return 1; }
    mkdir -p "$work/nccl-lib" && ln -sf "$nccl/lib/libnccl.so.2" "$work/nccl-lib/libnccl.so"
    env+=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$(dirname "$(dirname "$NVCC")")"
          HOROVOD_NCCL_INCLUDE="$nccl/include" HOROVOD_NCCL_LIB="$work/nccl-lib" HOROVOD_NCCL_LINK=SHARED
          HOROVOD_BUILD_CUDA_CC_LIST="$CC_LIST"
          LDFLAGS="${LDFLAGS:-} -Wl,-rpath,$nccl/lib")  # Horovod's library finds libnccl.so.2 without LD_LIBRARY_PATH
  fi
  mkdir -p "$CACHE" && rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  (cd "$src" && env "${env[@]}" "$PY" -m pip wheel --no-build-isolation --no-deps -w "$dest.tmp" . >"$dest.build.log" 2>&1) || {
    echo "build-horovod: build failed; the last lines of $dest.build.log:" >&2
    tail -30 "$dest.build.log" >&2; return 1; }
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
}

ls "$dest"/horovod-*.whl >/dev/null 2>&1 || build
"$PY" -m pip install -q --no-deps --force-reinstall "$dest"/horovod-*.whl
"$PY" -m pip install -q "${CONSTRAINT[@]}" cloudpickle psutil pyyaml packaging cffi
say "installed $(ls "$dest"/horovod-*.whl)"
"$(dirname "$PY")/horovodrun" --check-build 2>/dev/null | sed -n '/Available Frameworks/,$p' | sed 's/^/build-horovod:   /' || true
