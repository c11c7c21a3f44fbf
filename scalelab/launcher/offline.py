"""Starting `launch gpu-check` on a machine with no network (scripts/gpu-check.sh): first, what it lacks.

Such a machine installs nothing: it has a PyTorch and whatever else its image holds, and the project's
working tree on PYTHONPATH. Before anything of `launch` is imported (click may be the missing one), this
module looks for every package the check imports, with the standard library alone, and names the missing
ones in one line with the way to carry them as wheels from a machine that has a network. Then it hands the
arguments to `launch gpu-check`.

    python -m scalelab.launcher.offline gpu-check [ARGS]
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

# import name -> distribution, for what `launch gpu-check` and the runs it starts import (torch apart: it
# is the machine's own, never carried). pytest only for the tests step, which fails alone without it.
NEEDED = {"click": "click", "rich": "rich", "yaml": "pyyaml", "numpy": "numpy", "pandas": "pandas",
          "scipy": "scipy", "psutil": "psutil", "cloudpickle": "cloudpickle"}
FOR_TESTS = {"pytest": "pytest"}
LOCK = Path(__file__).resolve().parents[2] / "requirements.lock"


def missing(modules: dict[str, str]) -> list[str]:
    """The distributions of `modules` (import name -> distribution) this interpreter cannot import."""
    out = []
    for name, dist in modules.items():
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(dist)
    return out


def pinned(dist: str, lock: Path = LOCK) -> str:
    """`dist==VERSION` as requirements.lock pins it (one version for every Python), else `dist`."""
    try:
        text = lock.read_text()
    except OSError:
        return dist
    versions = set(re.findall(rf"^{re.escape(dist)}==([^\s;]+)", text, flags=re.MULTILINE | re.IGNORECASE))
    return f"{dist}=={versions.pop()}" if len(versions) == 1 else dist


def carry_message(dists: list[str], lock: Path = LOCK) -> str:
    """One line: what is missing, and how to carry it as wheels (this interpreter's Python version)."""
    names = " ".join(pinned(d, lock) for d in dists)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return (f"gpu-check: missing Python package(s) {', '.join(dists)} in {sys.executable}; this machine installs "
            f"nothing: on one with a network, in the working tree, run `pip download --no-deps --only-binary=:all: "
            f"--python-version {version} --platform manylinux2014_x86_64 -d .whl {names}` (and the same for any "
            f"of their own missing dependencies), carry .whl along, and here run `{Path(sys.executable).name} -m pip "
            f"install --no-index --no-deps .whl/*.whl` (or with --target DIR, then PYTHONPATH=DIR)")


def main(argv: list[str] | None = None) -> int:
    """Refuse in one line (exit 2) where PyTorch or a needed package is missing; else run `launch ARGV`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if missing({"torch": "torch"}):
        print(f"gpu-check: PyTorch is not installed in {sys.executable}; the check installs nothing and uses the "
              "PyTorch it finds: set PYTHON= to the interpreter that has it", file=sys.stderr)
        return 2
    lacking = missing(NEEDED)
    if lacking:
        print(carry_message(lacking), file=sys.stderr)
        return 2
    if missing(FOR_TESTS):
        print(f"gpu-check: note: {carry_message(missing(FOR_TESTS))}; without it only the tests step fails",
              file=sys.stderr)
    from scalelab.launcher.cli import entry

    sys.argv = ["launch", *args]
    entry()
    return 0


if __name__ == "__main__":
    sys.exit(main())
