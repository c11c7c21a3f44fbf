"""`python -m scalelab.aws.deps`: exit 0 when every dependency of the installed scalelab is met, else 1.

The instance's user data installs the shipped wheel with `pip install --force-reinstall --no-deps` (the wheel
keeps its version from build to build, so a plain install beside an earlier one would keep the earlier code),
then runs this; only when something is missing or of a version the wheel does not accept does it run pip again
for the dependencies. One pip call instead of two on an AMI that has them: 1.5 s of CPU per boot against
3.3 s (docs/benchmarks.md, "A process count per test, one pip call per boot, and an sshd race"). Imports nothing of scalelab's but this package
(whose `__init__` imports nothing), so it runs before the dependencies are there.
"""

from __future__ import annotations

import sys
from importlib import metadata


def _requirement_class():
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip vendors packaging; an AMI's Python has one or the other
        from pip._vendor.packaging.requirements import Requirement
    return Requirement


def unmet(distribution: str = "scalelab") -> list[str]:
    """The requirements of `distribution` (extras left out) that the environment does not meet."""
    requirement = _requirement_class()
    missing = []
    for text in metadata.requires(distribution) or []:
        req = requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            missing.append(f"{text} (not installed)")
            continue
        if not req.specifier.contains(version, prereleases=True):
            missing.append(f"{text} ({version} installed)")
    return missing


def main() -> int:
    missing = unmet()
    for line in missing:
        print(f"scalelab: needs {line}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
