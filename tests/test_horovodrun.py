"""scalelab.core.horovodrun: Horovod's runner, its Gloo check answered by the extension library instead of a
forked `import horovod.torch` (PyTorch). Run for real here: Horovod is built on this machine."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT, horovod_available

pytestmark = pytest.mark.skipif(not horovod_available(), reason="Horovod is not installed")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scalelab.core.horovodrun", *args], capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})


def test_the_library_answers_what_horovods_own_check_answers() -> None:
    from horovod.common.util import gloo_built, mpi_built

    from scalelab.core.horovodrun import built_with

    assert built_with("gloo") == bool(gloo_built())
    assert bool(built_with("mpi")) == bool(mpi_built())


def test_it_starts_the_ranks_and_passes_their_exit_status_without_importing_torch() -> None:
    """Two ranks of a program that prints its Horovod rank; then one that fails: horovodrun's exit status.
    Python's -X importtime on the runner alone (not its ranks) shows no `torch` module."""
    ok = _run("--gloo", "-np", "2", "-H", "localhost:2", sys.executable, "-c",
              "import os; print('rank', os.environ['HOROVOD_RANK'])")
    assert ok.returncode == 0, ok.stderr
    assert "rank 0" in ok.stdout and "rank 1" in ok.stdout
    bad = _run("--gloo", "-np", "1", "-H", "localhost:1", sys.executable, "-c", "raise SystemExit(3)")
    assert bad.returncode != 0
    traced = subprocess.run([sys.executable, "-X", "importtime", "-c",
                             "import sys; sys.argv = ['horovodrun', '--gloo', '-np', '1', '-H', 'localhost:1', 'true'];"
                             "from scalelab.core.horovodrun import main; sys.exit(main())"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert traced.returncode == 0, traced.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in traced.stderr.splitlines() if line.startswith("import time")}
    assert "horovod.runner.launch" in imported
    assert "torch" not in imported and "horovod.torch" not in imported


def test_a_bad_argument_is_horovodruns_usage_error() -> None:
    bad = _run("--no-such-flag")
    assert bad.returncode == 2
    assert "horovodrun" in bad.stderr and "Traceback" not in bad.stderr
