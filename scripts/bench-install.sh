#!/usr/bin/env bash
# How long installing from nothing takes, and how fast `launch --help` answers (issue #24), in brand-new
# virtualenvs under a temporary directory (nothing of yours is touched):
#   scripts/bench-install.sh            warm: the Horovod wheel from ~/.cache/scalelab/wheels
#   scripts/bench-install.sh --cold     cold: an empty wheel cache, so Horovod is built
#   scripts/bench-install.sh --pip      also plain pip without the lock (torch, then ".[dev]"): the ranges'
#                                       resolution time, which backtracked for an hour before the bounds
# Prints one line per figure; docs/benchmarks.md records them with the machine and date.
set -euo pipefail
cd "$(dirname "$0")/.."
cold=0 pip=0
for a in "$@"; do
  case "$a" in --cold) cold=1 ;; --pip) pip=1 ;; *) echo "bench-install: unknown option $a (--cold, --pip)" >&2; exit 2 ;; esac
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
now() { date +%s.%N; }
secs() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$2"; }

python3 -m venv "$work/venv"
[ $cold = 1 ] && export SCALELAB_WHEEL_CACHE="$work/wheels"
t0=$(now)
PYTHON="$work/venv/bin/python" bash scripts/install.sh >"$work/install.log" 2>&1 \
  || { tail -20 "$work/install.log"; echo "bench-install: install.sh failed" >&2; exit 1; }
t1=$(now)
echo "install.sh into a new virtualenv ($([ $cold = 1 ] && echo cold || echo warm) Horovod cache): $(secs "$t0" "$t1") s"

help_times=()
for _ in 1 2 3 4 5 6; do
  a=$(now); (cd "$work" && "$work/venv/bin/launch" --help >/dev/null); b=$(now)
  help_times+=("$(secs "$a" "$b")")
done
echo "launch --help, 6 runs (the first with cold caches): ${help_times[*]} s; median of the last 5: $(printf '%s\n' "${help_times[@]:1}" | sort -n | sed -n 3p) s"

if [ $pip = 1 ]; then
  python3 -m venv "$work/pipvenv"
  a=$(now)
  "$work/pipvenv/bin/pip" install -q "torch==2.13.0" >"$work/pip.log" 2>&1
  b=$(now)
  "$work/pipvenv/bin/pip" install -q ".[dev]" >>"$work/pip.log" 2>&1 || { tail -20 "$work/pip.log"; exit 1; }
  c=$(now)
  echo "plain pip, no lock: torch $(secs "$a" "$b") s, then scalelab[dev] $(secs "$b" "$c") s"
fi
