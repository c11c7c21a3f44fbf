"""`launch status` of an ended run shows the state its launcher recorded, not the scheduler's word for that end.

A Slurm job whose rank 1 got SIGTERM and stopped with a checkpoint exits 143: sacct says FAILED, while the
launcher, reading the ranks' records, recorded CANCELLED ("rank 1 got SIGTERM, and every rank stopped at step
N"); `launch status` printed FAILED. A stand-in backend answers as sacct did: no Slurm cluster is needed to
check the rule, which is the runner's, the same for every backend.
"""

from __future__ import annotations

import json
from pathlib import Path

from scalelab.launcher.backend import RunStatus
from scalelab.launcher.runner import settle


class _Scheduler:
    def __init__(self, state: str, detail: str) -> None:
        self.answer = RunStatus(state, detail)

    def status(self, run_dir: Path) -> RunStatus:
        return self.answer


def _run(tmp_path: Path, state: str, detail: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "launch.json").write_text(json.dumps({"state": state, "detail": detail, "run_dir": str(run)}))
    return run



def test_a_cancelled_run_stays_cancelled_whatever_sacct_says(tmp_path) -> None:
    run = _run(tmp_path, "CANCELLED", "rank 1 got SIGTERM, and every rank stopped at step 4 with a checkpoint")
    st = settle(_Scheduler("FAILED", "Slurm job 7 FAILED on node[1-2]"), run)
    assert (st.state, st.detail) == ("CANCELLED", "rank 1 got SIGTERM, and every rank stopped at step 4 with a checkpoint")


def test_a_run_still_going_is_the_schedulers(tmp_path) -> None:
    """A run a launcher holds while it resumes it (its launch.json still says an old end): what runs now is the
    scheduler's to say. Not held, the recorded end stands (an ended run's state cannot change)."""
    from scalelab.core.lock import RunLock

    run = _run(tmp_path, "CANCELLED", "old")
    with RunLock(run):
        assert settle(_Scheduler("RUNNING", "Slurm job 8 RUNNING"), run).state == "RUNNING"
    assert settle(_Scheduler("RUNNING", "Slurm job 8 RUNNING"), run).state == "CANCELLED"
