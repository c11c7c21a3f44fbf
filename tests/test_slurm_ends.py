"""How a failed or hung run ends on the real Slurm cluster, said as on the local backend.

- `launch status` of a failed job names each rank's exit status ("FAILED rank 1 exited with status 3; ..."), as
  the local backend's does (tests/test_own_script_layout_gaps.py), not only "Slurm job 7 FAILED on node1": each
  rank's task records its trainer's exit status (scalelab/slurm/rank.py, slurm/exit-R.jsonl), never read from a
  log. One engine: on Slurm srun starts every rank itself through the same rank function for DDP and Horovod (no
  torchrun or horovodrun between them reports the exits), so the path is the same for both.
- A rank killed by SIGKILL is named by its signal in the launcher's line, as on the local backend
  (tests/test_faults.py), not guessed ("killed by a signal, or out of memory?").
- A hung rank is ended by --stall-timeout-min, FAILED with the line tests/test_stalls.py checks on the local
  backend, which says what was stopped (the job, scancelled, out of the queue) and that nothing is left.

The runs are tiny (1 node, 2 ranks, one thread each); the hung one takes the cluster's KillWait (30 s) to end, since
a rank stuck in a collective never takes SIGTERM's path.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from scalelab.train.loop import HANG_AT_STEP_ENV, KILL_AT_STEP_ENV
from tests.conftest import launch, only_run_dir
from tests.test_own_script_layout_gaps import EXIT_3
from tests.test_stalls import _ended_by_the_stall

SLURM = ["--backend", "slurm", "--engine", "ddp", "--gpus-per-node", "2", "--threads", "1"]
TRAINER = ["--model", "nmt-tiny", "--data", "task", "--global-batch", "16", "--warmup-steps", "1"]


def test_the_exits_of_the_jobs_latest_start_are_read_and_nothing_else(tmp_path: Path) -> None:
    """Of job 7, restarted once: its restart's lines only (not the first start's, not job 6's); a bad line, a
    line of the wrong shape and a planted link are passed over."""
    from scalelab.slurm.backend import task_exits  # here: the cluster tests need no new name to run

    (tmp_path / "slurm").mkdir()
    (tmp_path / "elsewhere.jsonl").write_text(json.dumps({"rank": 2, "job_id": "7", "restart": 1, "exit_code": 9}) + "\n")
    (tmp_path / "slurm" / "exit-2.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    lines = {0: [("6", 0, 1), ("7", 0, 143), ("7", 1, 0)], 1: [("7", 0, 143), ("7", 1, 3)]}
    for rank, rows in lines.items():
        text = "".join(json.dumps({"rank": rank, "job_id": job, "restart": restart, "exit_code": code}) + "\n"
                       for job, restart, code in rows)
        (tmp_path / "slurm" / f"exit-{rank}.jsonl").write_text(text + '{"rank": 1, "job_id": "7", "restart": 1, '
                                                                      '"exit_code": "x"}\n{"cut')
    assert task_exits(tmp_path, "7") == {0: 0, 1: 3}
    assert task_exits(tmp_path, "6") == {0: 1} and task_exits(tmp_path, "8") == {}


def _sacct_state(job: str) -> str:
    return subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"], capture_output=True,
                          text=True).stdout.split()[0]


@pytest.mark.slow  # a real cluster: 10-40 s
def test_status_of_a_failed_slurm_run_says_its_ranks_exit_statuses(slurm_cluster, tmp_path: Path) -> None:
    (tmp_path / "exit3.py").write_text(EXIT_3)
    proc = launch(*SLURM, "--script", "exit3.py", "--runs-dir", "runs", cwd=tmp_path, timeout=300)
    assert proc.returncode == 1 and "rank 1: exit3.py exited with status 3" in proc.stderr, proc.stderr[-3000:]
    run = only_run_dir(tmp_path / "runs")
    first = launch("status", str(run), cwd=tmp_path).stdout.splitlines()[0]
    assert "FAILED rank 1 exited with status 3" in " ".join(first.split()), first
    state = json.loads((run / "launch.json").read_text())
    assert f"(Slurm job {state['job_id']} FAILED" in first, first  # the scheduler's word, after the ranks'
    assert state["rank_exits"]["1"] == 3, state  # what the launcher's failure line reads too


@pytest.mark.slow  # a real cluster: 10-40 s
def test_a_killed_slurm_rank_is_named_by_its_signal(slurm_cluster, tmp_path: Path) -> None:
    proc = launch(*SLURM, *TRAINER, "--steps", "6", "--runs-dir", "runs", cwd=tmp_path, env={KILL_AT_STEP_ENV: "2:1"},
                  timeout=300)
    said = [line for line in proc.stderr.splitlines() if line.startswith("launch")]
    assert proc.returncode == 1 and len(said) == 1, proc.stderr[-3000:]
    assert "rank 1 was killed by SIGKILL (signal 9) after step 2" in said[0] and "rank 0" not in said[0], said
    status = launch("status", str(only_run_dir(tmp_path / "runs")), cwd=tmp_path).stdout
    first = " ".join(status.splitlines()[0].split())
    assert "FAILED rank " in first and "rank 1 exited with status 137" in first, status  # 128 + SIGKILL


@pytest.mark.slow  # a real cluster: 10-40 s
def test_a_hung_slurm_rank_is_ended_by_its_stall_timeout(slurm_cluster, tmp_path: Path) -> None:
    proc = launch(*SLURM, *TRAINER, "--steps", "30", "--checkpoint-every", "3", "--stall-timeout-min", "0.1",
                  "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, env={HANG_AT_STEP_ENV: "5:1"}, timeout=300)
    run = _ended_by_the_stall(proc, tmp_path, 5)  # FAILED with the one line, in launch.json and status; none left
    job = json.loads((run / "launch.json").read_text())["job_id"]
    assert f"stopped Slurm job {job} (scancel); it left the queue, none left" in " ".join(proc.stderr.split())
    assert _sacct_state(job) == "CANCELLED"
    assert f"`launch resume {run}`" in " ".join(proc.stderr.split())  # its step-3 checkpoint continues it
