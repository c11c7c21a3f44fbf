"""`launch cancel SWEEP` on the test Slurm cluster: every layout's job stops, and each is recorded CANCELLED.

A Slurm sweep queues every layout at once and follows one at a time, recording RUNNING only for the layout it
follows. Before:
- after SIGKILL of the sweep launcher, `launch cancel SWEEP` picked the layouts by that recorded state and
  cancelled 1x1 only: 1x2's job stayed in squeue, and a second cancel said "no layout is running";
- a cancel from another shell while the launcher followed 1x1 left 1x2 recorded FAILED ("the launcher stopped
  following it: run .../1x1 was cancelled"), though Slurm said CANCELLED, and the sweep failed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, launch, only_run_dir
from tests.test_slurm_cluster import TINY, in_queue, processes_of

pytestmark = pytest.mark.slow  # a two-layout sweep on the cluster each

LAYOUTS = ("1x1", "1x2")


def _sweep(tmp_path: Path, exclusive: bool = False) -> tuple[subprocess.Popen, Path]:
    """A 2-layout sweep in the background; it and its directory once both layouts' ranks trained 2 steps (each on
    whole nodes: --exclusive), or, without --exclusive, once 1x1 trained 2 steps and 1x2 waits for it in the queue
    (`--dependency=singleton`: the layouts of a sweep run one after another)."""
    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", "sweep", *TINY, "--engine", "ddp",
                             "--workers", "1,2", "--steps", "100000", "--checkpoint-every", "200", "-y",
                             "--runs-dir", str(runs), *(["--exclusive"] if exclusive else [])],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240

    def ready(sweep: Path) -> bool:
        if exclusive:
            return all(_steps(sweep / n) >= 2 for n in LAYOUTS)
        return _steps(sweep / "1x1") >= 2 and (sweep / "1x2" / "launch.json").exists()

    while not (runs.is_dir() and any(runs.iterdir()) and ready(only_run_dir(runs))):
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended early: {proc.communicate()}")
        if time.time() > deadline:
            proc.kill()
            pytest.fail("the layouts did not both train within 240 s")
        time.sleep(0.5)
    return proc, only_run_dir(runs)


def _steps(run: Path) -> int:
    path = run / "records" / "rank-0.jsonl"
    return path.read_text().count('"kind": "step"') if path.exists() else 0


def _jobs(sweep: Path) -> dict[str, str]:
    return {name: json.loads((sweep / name / "launch.json").read_text())["job_id"] for name in LAYOUTS}


def _state(run: Path) -> dict:
    return json.loads((run / "launch.json").read_text())


def _scancel(jobs: dict[str, str]) -> None:
    subprocess.run(["scancel", *jobs.values()], capture_output=True)  # leave nothing behind a failed assertion


def test_cancel_of_a_sweep_whose_launcher_was_killed_stops_every_layouts_job(slurm_cluster, tmp_path: Path) -> None:
    """Without --exclusive: 1x1 runs, 1x2 waits in the queue for it; the cancel stops both."""
    proc, sweep = _sweep(tmp_path, exclusive=False)
    jobs = _jobs(sweep)
    assert _steps(sweep / "1x2") == 0, "1x2 trained while 1x1 ran: the layouts of a sweep must not overlap"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    try:
        assert all(in_queue(job) for job in jobs.values()), "Slurm keeps both jobs with their launcher gone"
        status = launch("status", str(sweep), cwd=tmp_path)  # 1x2 waits for 1x1: the layout's note says why
        assert f"note: 1x2: queued: Slurm job {jobs['1x2']} PENDING (Dependency)" in status.stdout, status.stdout
        cancelled = launch("cancel", str(sweep), cwd=tmp_path)
        assert cancelled.returncode == 0, cancelled.stderr
        for name, job in jobs.items():
            assert in_queue(job) == [], f"layout {name}'s job {job} is still in squeue: {cancelled.stdout}"
            assert _state(sweep / name)["state"] == "CANCELLED", (name, _state(sweep / name))
            assert processes_of(sweep / name, job) == []
        again = launch("cancel", str(sweep), cwd=tmp_path)
        assert again.returncode == 0 and "no layout is running" in again.stdout, again
    finally:
        _scancel(jobs)


def test_cancel_of_a_followed_sweep_records_every_layout_cancelled(slurm_cluster, tmp_path: Path) -> None:
    """1x1 followed and running, 1x2 queued behind it: both end CANCELLED. Not with --exclusive: whole nodes wait
    for every other test's job on the shared cluster to leave them (CI: over 240 s)."""
    proc, sweep = _sweep(tmp_path, exclusive=False)
    jobs = _jobs(sweep)
    try:
        cancelled = launch("cancel", str(sweep), cwd=tmp_path)
        assert cancelled.returncode == 0, cancelled.stderr
        _, err = proc.communicate(timeout=240)
        for name, job in jobs.items():
            assert in_queue(job) == [], f"layout {name}'s job {job} is still in squeue"
            info = _state(sweep / name)
            assert info["state"] == "CANCELLED", (name, info)
        said = [line for line in err.splitlines() if line.startswith("launch: error:")]
        assert proc.returncode == 1 and len(said) == 1 and "the sweep was cancelled at layout 1x1" in said[0], err[-3000:]
        assert f"launch resume {sweep}" in said[0] and "Traceback" not in err
    finally:
        proc.kill()
        _scancel(jobs)


def test_the_runs_stopped_with_a_followed_run_are_cancelled_only_when_it_was() -> None:
    """A followed layout cancelled (`RunCancelled`) stops the others CANCELLED; one that failed leaves them FAILED,
    even where another layout had been cancelled on its own (it was recorded CANCELLED, and the crash called the
    rest "cancelled with the sweep")."""
    from scalelab.core.errors import RunCancelled, RunFailed
    from scalelab.launcher.runner import _why_stopped

    assert _why_stopped(RunCancelled("run R was cancelled: by launch cancel"))[0] == "CANCELLED"
    assert _why_stopped(RunFailed("rank 1: boom"))[0] == "FAILED"
    assert _why_stopped(KeyboardInterrupt("SIGINT"))[0] == "CANCELLED"
