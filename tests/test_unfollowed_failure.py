"""A run that fails with no launcher following it (`--detach`, or its launcher was killed) says why in `launch status`.

Before, `launch status` recorded the scheduler's word alone ("FAILED Slurm job 2434 FAILED on node1"), while the
rank's error record said why ("the time limit was near ... it was not requeued because --no-requeue was given ...; `launch resume` continues it")
and a followed run printed it. `settle` now records a FAILED end nobody followed with the same words as the
launcher's error (`runner.failure`), on every backend: here a detached local run whose rank raises, and a detached
Slurm run stopped at its time-limit warning with no requeue left.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import launch, only_run_dir
from scalelab.train.loop import HOLD_AT_STEP_ENV, RAISE_AT_STEP_ENV

pytestmark = pytest.mark.slow  # a run each

LOCAL = ["--model", "nmt-tiny", "--engine", "single", "--threads", "1", "--warmup-steps", "1", "--steps", "30",
         "--checkpoint-every", "2", "-y"]


def _status_until_ended(run: Path, cwd: Path, patience_s: float = 240) -> subprocess.CompletedProcess:
    deadline = time.time() + patience_s
    while True:
        status = launch("status", str(run), cwd=cwd)
        assert status.returncode == 0, status.stderr
        if any(word in status.stdout for word in ("FAILED", "COMPLETED", "CANCELLED")):
            return status
        assert time.time() < deadline, f"the run did not end: {status.stdout}"
        time.sleep(1)


def test_a_detached_local_run_that_fails_says_why_in_status(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    started = launch(*LOCAL, "--detach", "--runs-dir", str(runs), cwd=tmp_path, env={RAISE_AT_STEP_ENV: "3:0"})
    assert started.returncode == 0, started.stderr
    run = only_run_dir(runs)
    status = _status_until_ended(run, tmp_path)
    head = status.stdout.splitlines()[0]
    assert "FAILED" in head and "rank 0: RuntimeError: injected fault after step 3" in head, status.stdout
    assert f"launch resume {run}" in head, "the run has a checkpoint: the line says how to continue"
    info = json.loads((run / "launch.json").read_text())
    assert info["state"] == "FAILED" and "injected fault after step 3" in info["error"]
    again = launch("status", str(run), cwd=tmp_path)  # recorded once: the same words afterwards
    assert again.stdout.splitlines()[0] == head


def test_a_detached_slurm_run_stopped_at_its_time_limit_says_why_in_status(slurm_cluster, tmp_path: Path) -> None:
    from tests.test_slurm_cluster import TINY, in_queue, job_of, processes_of

    runs = tmp_path / "runs"
    started = launch(*TINY, "--engine", "ddp", "--steps", "40", "--no-requeue", "--detach", "--runs-dir", str(runs),
                     "-y", cwd=tmp_path, env={HOLD_AT_STEP_ENV: "3"})
    assert started.returncode == 0, started.stderr
    run = only_run_dir(runs)
    job = job_of(run)
    try:
        deadline = time.time() + 240
        while '"step": 3' not in ((run / "records" / "rank-0.jsonl").read_text()
                                  if (run / "records" / "rank-0.jsonl").exists() else ""):
            assert time.time() < deadline, "the job did not reach step 3"
            time.sleep(0.5)
        # what Slurm sends signal_s before the time limit: USR1 to every task; no requeue is allowed
        subprocess.run(["scancel", "--signal=USR1", job], check=True, capture_output=True)
        status = _status_until_ended(run, tmp_path)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    head = status.stdout.splitlines()[0]
    assert f"FAILED Slurm job {job} FAILED" in head, status.stdout
    assert "the time limit was near" in head and "--no-requeue was given" in head and "launch resume" in head, head
    # status reads sacct's FAILED as soon as the job ends; squeue may still show it COMPLETING while slurmd
    # finishes its clean-up (CI's 4-worker run saw it): that is Slurm's, so it gets a bounded wait
    deadline = time.time() + 60
    while (in_queue(job) or processes_of(run, job)) and time.time() < deadline:
        time.sleep(0.5)
    assert in_queue(job) == [] and processes_of(run, job) == []
