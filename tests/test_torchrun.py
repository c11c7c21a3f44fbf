"""scalelab.core.torchrun: PyTorch's torchrun agent, leaving without the interpreter's teardown once it is done.

Run for real: the agent starts two ranks (small Python programs, not the trainer) with torchrun's own rendezvous.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from scalelab.core.net import free_port

# Imported by every Python process the test starts (sitecustomize on PYTHONPATH): the agent (the one without
# a RANK of its own) touches a marker file if its interpreter's teardown runs atexit handlers.
MARK_TEARDOWN = """
import atexit, os
def _mark():
    if "RANK" not in os.environ:
        open(os.path.join(os.environ["TEARDOWN_MARKS"], f"agent-{os.getpid()}"), "w").close()
atexit.register(_mark)
"""


def _torchrun(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(MARK_TEARDOWN)
    env = {**os.environ, "PYTHONPATH": f"{site}:{ROOT}", "TEARDOWN_MARKS": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "scalelab.core.torchrun", *args], capture_output=True, text=True,
                          timeout=180, cwd=tmp_path, env=env)


def _ranks(tmp_path: Path, program: str) -> list[str]:
    (tmp_path / "rank.py").write_text(program)
    return ["--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={free_port()}", "--tee=3",
            f"--log-dir={tmp_path / 'logs'}", str(tmp_path / "rank.py")]


def test_it_runs_the_ranks_and_exits_without_the_interpreters_teardown(tmp_path: Path) -> None:
    """Both ranks run and their lines come back tagged; the agent exits 0 and its atexit handlers never ran."""
    done = _torchrun(tmp_path, *_ranks(tmp_path, "import os; print('hello from rank', os.environ['RANK'])"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hello from rank 0" in done.stdout and "hello from rank 1" in done.stdout, done.stdout
    assert not list(tmp_path.glob("agent-*")), "the agent ran the interpreter's teardown instead of os._exit"


@pytest.mark.slow  # 5.6-6.7 s in the full suite: two agents that start their ranks and fail
def test_a_failed_rank_is_torchruns_failure_and_a_bad_flag_its_usage(tmp_path: Path) -> None:
    """A rank exiting 3: the agent exits 1 with torchrun's ChildFailedError report naming the rank and its status
    (what the launcher reads: scalelab.launcher.backend.reported_exits); an unknown flag: torchrun's usage, exit 2."""
    from scalelab.launcher.backend import reported_exits

    failed = _torchrun(tmp_path, *_ranks(tmp_path, "import os, sys; sys.exit(3 if os.environ['RANK'] == '1' else 0)"))
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "ChildFailedError" in failed.stderr and reported_exits(failed.stderr) == {1: 3}, failed.stderr[-3000:]
    bad = _torchrun(tmp_path, "--no-such-flag", "x.py")
    assert bad.returncode == 2 and "usage: torchrun" in bad.stderr, bad.stderr
