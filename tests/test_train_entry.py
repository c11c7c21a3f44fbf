"""`python -m scalelab.train`, the ranks' entry point, given what a user might type by hand: `--help` prints
its usage, and a path that is not a run directory is one line and exit 2, with nothing made there (it used to
make PATH/records/ for the error record of a run that does not exist)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scalelab.train", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_help_prints_the_usage_and_makes_nothing(tmp_path: Path) -> None:
    done = _train(["--help"], tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m scalelab.train RUN_DIR"), done
    assert list(tmp_path.iterdir()) == []


def test_a_path_that_is_no_run_directory_is_one_line_and_makes_nothing(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for target in ("nowhere", "empty"):
        done = _train([target], tmp_path)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done
        assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "is not a run directory" in done.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["empty"]
