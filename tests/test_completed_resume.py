"""`launch resume` of a COMPLETED run changes nothing unless spec.json asks for more steps than it was
launched for (scalelab/launcher/runner.py `nothing_to_resume`): a run that stopped at its loss threshold
is not run again from scratch, one whose records are damaged is refused naming the file, a --script
run says that its script decides its own length. And `launch cancel` of a run that had ended writes
nothing (a read-only runs directory is no error)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import launch

THRESHOLD_RUN = ("run", "--model", "nmt-tiny", "--engine", "single", "--data", "task", "--steps", "30",
                 "--val-every", "2", "--val-batches", "1", "--loss-threshold", "100", "--name", "thr", "-y")


@pytest.fixture(scope="module")
def threshold_run(tmp_path_factory) -> Path:
    """A run that stopped at its loss threshold at step 2 of 30 (no checkpoint: no --checkpoint-every)."""
    where = tmp_path_factory.mktemp("threshold")
    proc = launch(*THRESHOLD_RUN, "--runs-dir", str(where / "runs"), cwd=where)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (where / "runs").iterdir()
    return run


def _copy(run: Path, to: Path) -> Path:
    shutil.copytree(run, to, symlinks=True)
    return to


def _tree(run: Path) -> dict[str, str]:
    """Every file of the run directory and a hash of its bytes."""
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file()}


def _one_error_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return proc.stderr


def test_a_run_that_stopped_at_its_threshold_is_not_run_again(threshold_run, tmp_path) -> None:
    """Before: spec.steps 30 > 2 steps done was taken for `steps` raised since, and the run ran again from
    its first step (no checkpoint), a second start..end in rank-0.jsonl, launch.json and summary.json
    rewritten."""
    run = _copy(threshold_run, tmp_path / "run")
    before = _tree(run)
    proc = launch("resume", str(run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = " ".join(proc.stdout.split())
    assert f"run {run} is COMPLETED already (threshold reached at step 2); nothing to resume" in said, said
    assert "raise `steps`" not in said  # not what would have made it run longer
    assert _tree(run) == before

    state = json.loads((run / "launch.json").read_text())
    assert state["launched_steps"] == 30
    del state["launched_steps"]  # a run launched before that record: its threshold end still decides
    (run / "launch.json").write_text(json.dumps(state))
    proc = launch("resume", str(run), cwd=tmp_path)
    assert proc.returncode == 0 and "threshold reached at step 2" in proc.stdout, proc.stderr[-3000:]


def test_raised_steps_without_a_checkpoint_are_refused_before_anything_runs(threshold_run, tmp_path) -> None:
    """Steps raised in spec.json: the run would train on from its checkpoint; without one it would start
    again from step 1, so it is one error line and nothing changes."""
    run = _copy(threshold_run, tmp_path / "run")
    spec = json.loads((run / "spec.json").read_text())
    (run / "spec.json").write_text(json.dumps({**spec, "steps": 40}))
    before = _tree(run)
    err = _one_error_line(launch("resume", str(run), cwd=tmp_path))
    assert "has no checkpoint to continue from" in err and "--checkpoint-every" in err, err
    assert _tree(run) == before


@pytest.mark.parametrize("damage", [b"\x8f\x00garbage\xff", b"\x00\x01\n\xfe{not json\n"])
def test_a_completed_run_with_damaged_records_is_refused_naming_the_file(threshold_run, tmp_path, damage) -> None:
    """Before: unreadable records counted as 0 steps done, so every step ran again."""
    run = _copy(threshold_run, tmp_path / "run")
    records = run / "records" / "rank-0.jsonl"
    records.write_bytes(damage + os.urandom(64).replace(b"\n", b""))
    before = _tree(run)
    err = _one_error_line(launch("resume", str(run), cwd=tmp_path))
    assert f"its records {records} are damaged" in err and "nothing was resumed" in err, err
    assert _tree(run) == before


def test_a_completed_script_run_says_its_script_decides_its_length(tmp_path) -> None:
    """The trainer's advice (raise `steps` in spec.json) does nothing for a user's script, which a resume
    only runs again with its original arguments."""
    (tmp_path / "plain.py").write_text("print('done')\n")
    proc = launch("--script", "plain.py", "--engine", "single", "--runs-dir", "runs", "--", "--epochs", "2",
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    before = _tree(run)
    proc = launch("resume", str(run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = " ".join(proc.stdout.split())
    assert "is COMPLETED already (plain.py ran to its end); nothing to resume" in said, said
    assert "run it again with its own arguments" in said and "raise `steps`" not in said, said
    assert _tree(run) == before


def test_cancel_of_a_completed_run_in_a_read_only_runs_directory_is_a_no_op(threshold_run, small_fs,
                                                                           tmp_path) -> None:
    """Before: exit 2, "its state could not be recorded ... read-only", for a run nothing had to stop.
    A real read-only mount (root writes through chmod)."""
    fs = small_fs(16 << 20)
    run = _copy(threshold_run, fs / "runs" / threshold_run.name)
    before = _tree(run)
    subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
    proc = launch("cancel", str(run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = " ".join(proc.stdout.split())
    assert f"{run}: COMPLETED" in said and "nothing to stop" in said, said
    assert _tree(run) == before


def _unsettled(run: Path) -> Path:
    """The run as a detached one whose ranks have ended but that nobody has settled yet: launch.json still
    RUNNING, no summary.json."""
    info = json.loads((run / "launch.json").read_text())
    info["state"], info["detail"] = "RUNNING", "1 processes"
    info.pop("ended", None)
    (run / "launch.json").write_text(json.dumps(info))
    (run / "summary.json").unlink()
    return run


def test_a_cancel_that_comes_after_every_rank_recorded_its_end_leaves_the_run_completed(threshold_run,
                                                                                     tmp_path) -> None:
    """A detached run that had just run its last step (its ranks' `end` records written, its processes gone or
    going) when `launch cancel` ran: it was recorded CANCELLED, with no summary, over records that say it
    completed. The records decide: COMPLETED, with its summary; nothing is left running."""
    from scalelab.core.procs import rank_processes

    run = _unsettled(_copy(threshold_run, tmp_path / "run"))
    proc = launch("cancel", str(run), cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    said = " ".join(proc.stdout.split())
    assert f"{run}: COMPLETED" in said and "before the cancel reached it" in said, said
    info = json.loads((run / "launch.json").read_text())
    assert info["state"] == "COMPLETED" and (run / "summary.json").is_file()
    assert rank_processes(run) == []
    shown = " ".join(launch("status", str(run), cwd=tmp_path).stdout.split())
    assert "COMPLETED" in shown and "CANCELLED" not in shown, shown


def test_a_cancel_of_a_run_whose_rank_recorded_no_end_stays_cancelled(threshold_run, tmp_path) -> None:
    """Only a completed end of every rank turns a cancel into COMPLETED: a rank with no end record is not."""
    run = _unsettled(_copy(threshold_run, tmp_path / "run"))
    records = run / "records" / "rank-0.jsonl"
    records.write_text("".join(line + "\n" for line in records.read_text().splitlines() if '"end"' not in line))
    proc = launch("cancel", str(run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{run}: CANCELLED" in " ".join(proc.stdout.split()), proc.stdout
    assert json.loads((run / "launch.json").read_text())["state"] == "CANCELLED"
    assert not (run / "summary.json").exists()
