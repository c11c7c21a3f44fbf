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


def test_a_failed_runs_detail_names_the_failing_rank_before_peers_stopped_by_sigterm(tmp_path: Path) -> None:
    """torchrun reports a worker it stopped as -15, horovodrun and Slurm as 143: either way the rank that
    failed by itself comes first. CI saw "rank 0 exited with status -15; rank 1 exited with status 3" of a
    run whose rank 1 exited 3 (stop 63), because only 143 was taken for a stopped peer."""
    from scalelab.launcher.backend import ranks_exits_detail
    for stopped in (-15, 143):
        run = tmp_path / str(stopped)
        run.mkdir()
        (run / "launch.json").write_text(json.dumps({"state": "FAILED", "rank_exits": {"0": stopped, "1": 3}}))
        assert ranks_exits_detail(run, [1]) == f"rank 1 exited with status 3; rank 0 exited with status {stopped}"
    killed = tmp_path / "killed"  # a rank killed outright is a cause, not a stopped peer: rank order stays
    killed.mkdir()
    (killed / "launch.json").write_text(json.dumps({"state": "FAILED", "rank_exits": {"0": -9, "1": 3}}))
    assert ranks_exits_detail(killed, [1]) == "rank 0 exited with status -9; rank 1 exited with status 3"
