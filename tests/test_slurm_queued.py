"""A run waiting in Slurm's queue is shown as queued, with squeue's reason, not as "starting ranks: 0 of 1 up".

Before, a job held by `--begin` (or queued again after `scontrol requeue`) showed "starting ranks: 0 of 1 up" in
the launcher's bar, `launch status` and `launch logs`, and an ETA once it had steps; without a terminal the
launcher printed nothing while it waited. Now every view says "queued: Slurm job N PENDING (BeginTime)" (no ETA),
and without a terminal the launcher prints a line as the job enters and leaves the queue.
"""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest

from scalelab.launcher.backend import RunStatus
from scalelab.launcher.progress import RunProgress, RunWatch, Snapshot
from tests.conftest import launch, only_run_dir


def test_a_queued_run_before_its_first_step_says_so_not_starting_ranks(tmp_path: Path) -> None:
    watch = RunWatch(tmp_path, steps=10)
    watch.expected = 1
    assert watch.starting().startswith("starting ranks: 0 of 1 up")
    watch.queued = "Slurm job 7 PENDING (BeginTime)"
    assert watch.starting() == "queued: Slurm job 7 PENDING (BeginTime)"


def test_a_queued_run_with_steps_shows_no_eta() -> None:
    snap = Snapshot(step=40, total=100, loss=3.2, eta_s=60.0)
    assert "ETA 1m00s" in snap.line()
    snap.queued = "Slurm job 7 PENDING (Priority)"
    assert "ETA" not in snap.line() and snap.line().endswith("queued: Slurm job 7 PENDING (Priority)")
    assert (1, "queued: Slurm job 7 PENDING (Priority)") in snap.parts()


def test_without_a_terminal_the_launcher_says_when_the_run_enters_and_leaves_the_queue(tmp_path: Path, capsys) -> None:
    from rich.console import Console

    run = tmp_path / "run"
    run.mkdir()
    launch_json = run / "launch.json"
    progress = RunProgress(run, 10, "r", Console(file=io.StringIO(), force_terminal=False))
    for queued in (None, "Slurm job 7 PENDING (BeginTime)", "Slurm job 7 PENDING (BeginTime)", "Slurm job 7 PENDING",
                   "Slurm job 7 PENDING (Priority)", None, None):
        launch_json.write_text(json.dumps({"run_dir": str(run), **({"queued": queued} if queued else {})}))
        progress.poll()
    lines = capsys.readouterr().err.splitlines()
    # a new reason to wait is news; a moment without one (squeue between two, CI 2026-12-07) is not
    assert lines == ["[r] queued: Slurm job 7 PENDING (BeginTime)", "[r] queued: Slurm job 7 PENDING (Priority)",
                     "[r] out of the queue: running"], lines


def test_the_slurm_status_of_a_pending_job_names_squeues_reason(monkeypatch) -> None:
    import scalelab.slurm.backend as sb

    class Watcher:
        queued = {"42": "PENDING"}
        reasons = {"42": "BeginTime"}

        def get_info(self, job_id: str, mode: str = "standard") -> dict[str, str]:
            return {"State": "PENDING"}

    backend = sb.SlurmBackend()
    backend.watcher = Watcher()
    monkeypatch.setattr(sb, "need", lambda *_: None)
    monkeypatch.setattr(sb, "read_state", lambda run_dir: {"job_id": "42"})
    monkeypatch.setattr(backend, "_not_this_run", lambda run_dir, job_id: "")
    assert backend.status(Path("run")) == RunStatus("PENDING", "Slurm job 42 PENDING (BeginTime)")
    Watcher.queued, Watcher.reasons = {"42": "RUNNING"}, {}
    assert backend.status(Path("run")).detail == "Slurm job 42 RUNNING"


def test_squeue_rows_take_the_reason_and_drop_none(monkeypatch) -> None:
    import scalelab.slurm.backend as sb

    out = "7|PENDING|BeginTime\n8|RUNNING|None\n9_1|PENDING|Priority\n10|RUNNING\n"
    monkeypatch.setattr(sb, "_slurm", lambda cmd, timeout=60: subprocess.CompletedProcess(cmd, 0, out, ""))
    assert sb.squeue_rows(["7"]) == {"7": ("PENDING", "BeginTime"), "8": ("RUNNING", ""), "9_1": ("PENDING", "Priority"),
                                     "10": ("RUNNING", "")}
    assert sb.squeue_states(["7"]) == {"7": "PENDING", "8": "RUNNING", "9_1": "PENDING", "10": "RUNNING"}


# ---- on the test cluster ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_held_slurm_job_is_shown_queued_with_its_reason(slurm_cluster, tmp_path: Path) -> None:
    from tests.test_slurm_cluster import TINY, in_queue, job_of

    runs = tmp_path / "runs"
    started = launch(*TINY, "--engine", "ddp", "--steps", "6", "--sbatch-arg=--begin=now+600", "--detach",
                     "--runs-dir", str(runs), "-y", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    run = only_run_dir(runs)
    job = job_of(run)
    try:
        status = launch("status", str(run), cwd=tmp_path)
        lines = status.stdout.splitlines()
        assert f"PENDING Slurm job {job} PENDING (BeginTime)" in lines[0], status.stdout
        assert lines[1].strip().startswith(f"queued: Slurm job {job} PENDING (BeginTime)"), status.stdout
        assert "starting ranks" not in status.stdout
        logs = launch("logs", str(run), cwd=tmp_path)
        assert f"[progress] queued: Slurm job {job} PENDING (BeginTime)" in logs.stdout, logs.stdout
        listed = launch("ls", "--runs-dir", str(runs), cwd=tmp_path, env={"COLUMNS": "200"})
        assert f"note: {run.name}: queued: Slurm job {job} PENDING (BeginTime)" in listed.stdout, listed.stdout
    finally:
        launch("cancel", str(run), cwd=tmp_path)
    assert in_queue(job) == []


@pytest.mark.slow
def test_a_followed_run_without_a_terminal_says_when_it_leaves_the_queue(slurm_cluster, tmp_path: Path) -> None:
    from tests.test_slurm_cluster import TINY, in_queue, job_of

    runs = tmp_path / "runs"
    done = launch(*TINY, "--engine", "ddp", "--steps", "6", "--sbatch-arg=--begin=now+5", "--runs-dir", str(runs),
                  "-y", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run = only_run_dir(runs)
    job = job_of(run)
    said = [line for line in done.stderr.splitlines() if line.startswith(f"[{run.name}]")]
    left = said.index(f"[{run.name}] out of the queue: running")  # once, after every line of its wait
    assert said[0] == f"[{run.name}] queued: Slurm job {job} PENDING (BeginTime)", done.stderr[-3000:]
    waited = said[1:left]  # a later reason to wait (Priority, Resources), each with its reason
    assert all(line.startswith(f"[{run.name}] queued: Slurm job {job} PENDING (") for line in waited), said
    assert len(set(waited)) == len(waited) and "queued" not in " ".join(said[left + 1:]), said
    assert json.loads((run / "launch.json").read_text()).get("queued") is None, "dropped once it ran"
    assert in_queue(job) == []
