"""Which tests the fast subset (`-m "not slow"`) should leave to the full suite, read from a full run's JUnit file.

    bash scripts/test.sh --junitxml=/tmp/suite.xml          # the whole suite, as CI runs it
    python scripts/slow-tests.py /tmp/suite.xml [--over-s 6]

Why: the fast subset is the day-to-day run and has to stay near 5 minutes on 2 cores (issue 36), while tests
keep being added; a test function is `slow` when any of its cases took `--over-s` seconds or more in the full
suite (three workers on 2 cores, so about half that alone). The marker is set by hand in the test file
(`@pytest.mark.slow`): this lists the unmarked functions over the bar and exits 1 when there are any, and
lists (without failing) marked ones that ran under a third of it: a test marked for what it needs (the
Slurm cluster, Chromium) rather than for its time stays marked. Run it from the repository root.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def function_times(junit: str) -> dict[str, list[float]]:
    """file::function -> the seconds of each of its cases."""
    times: dict[str, list[float]] = defaultdict(list)
    for case in ET.parse(junit).iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        times[f"{path}::{case.get('name', '').split('[')[0]}"].append(float(case.get("time") or 0))
    return times


def fast_functions() -> set[str]:
    """The functions `-m "not slow"` collects now."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                          "-m", "not slow"], capture_output=True, text=True, check=False).stdout
    return {line.split("[")[0] for line in out.splitlines() if "::" in line}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("junit", help="the JUnit XML of a full run (pytest --junitxml=...)")
    ap.add_argument("--over-s", type=float, default=6.0, help="a case this long in the full suite makes its function slow")
    args = ap.parse_args()
    times, fast = function_times(args.junit), fast_functions()
    unmarked = sorted((max(t), f) for f, t in times.items() if f in fast and max(t) >= args.over_s)
    quick = sorted((max(t), f) for f, t in times.items() if f not in fast and max(t) < args.over_s / 3)
    for longest, f in reversed(unmarked):
        print(f"mark slow: {f} ({longest:.1f} s)")
    for longest, f in quick:
        print(f"marked slow, quick in that run (marked for its time, or for what it needs?): {f} ({longest:.1f} s)")
    fast_s = sum(sum(t) for f, t in times.items() if f in fast)
    print(f"the fast subset's tests took {fast_s:.0f} s of test time in that run (about a third of it on three workers)")
    return 1 if unmarked else 0


if __name__ == "__main__":
    sys.exit(main())
