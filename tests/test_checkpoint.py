"""Checkpoints are data, belong to one spec, and a failed write keeps the previous one.

- A planted checkpoint whose pickle would run a command is refused on `launch resume` with one line,
  and the command does not run (loading uses `weights_only=True`).
- A checkpoint of another spec is refused naming what differs.
- A full filesystem: the write fails naming the filesystem and its free bytes, removes its temporary
  file and leaves the previous checkpoint loadable. On a real small filesystem (a tmpfs the test mounts,
  skipped where mounting is not allowed) and with the fault injected (runs everywhere).
"""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest
import torch

from tests.conftest import launch, launched_once, only_run_dir
from scalelab.train.checkpoint import (
    CHECKPOINT_NAME,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)

TINY = ["--data", "task", "--warmup-steps", "1", "--prefetch", "1", "--engine", "single", "--checkpoint-every", "2"]
TWO_STEPS = [*TINY, "--steps", "2"]


@pytest.fixture(scope="module")
def nmt_run(tmp_path_factory):
    """A finished 2-step nmt-tiny run with its checkpoint, made once in the pytest run (conftest's made_once);
    tests copy it before changing anything."""
    return launched_once(tmp_path_factory, "checkpoint", "--model", "nmt-tiny", *TWO_STEPS)


def _copy(run, tmp_path):
    dest = tmp_path / run.name
    shutil.copytree(run, dest)
    return dest


def _as_cancelled(run):
    """Record a finished run CANCELLED, so that `launch resume` goes on to its checkpoint: a COMPLETED
    run with no step left to run is a no-op that reads nothing (issue #37)."""
    info = json.loads((run / "launch.json").read_text())
    (run / "launch.json").write_text(json.dumps({**info, "state": "CANCELLED"}))
    return run


def _assert_one_line_error(proc, *phrases):
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    for phrase in phrases:
        assert phrase in proc.stderr, proc.stderr


class _RunsACommand:
    """Pickles as `os.system(command)`: what a planted checkpoint would do when unpickled freely."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.mark.slow
def test_planted_pickle_is_refused_and_does_not_run(nmt_run, tmp_path):
    run = _as_cancelled(_copy(nmt_run, tmp_path))
    marker = tmp_path / "the-planted-code-ran"
    good = torch.load(run / CHECKPOINT_NAME, weights_only=True)
    torch.save({**good, "reached": _RunsACommand(f"touch {marker}")}, run / CHECKPOINT_NAME)

    proc = launch("resume", str(run), cwd=tmp_path)
    _assert_one_line_error(proc, f"checkpoint {run / CHECKPOINT_NAME}", "could run code", "system")
    assert not marker.exists(), "unpickling the checkpoint ran the planted command"


@pytest.mark.slow
def test_checkpoint_of_another_spec_is_refused(nmt_run, tmp_path):
    proc = launch("--model", "rnnlm-tiny", *TWO_STEPS, "--runs-dir", "runs", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = only_run_dir(tmp_path / "runs")
    shutil.copy(nmt_run / CHECKPOINT_NAME, run / CHECKPOINT_NAME)

    proc = launch("resume", str(_as_cancelled(run)), cwd=tmp_path)
    _assert_one_line_error(proc, "belongs to a different run", "model 'rnnlm-tiny' here, 'nmt-tiny' in the checkpoint")


def test_old_format_and_truncated_checkpoints_are_refused(tmp_path):
    model = torch.nn.Linear(2, 2)
    torch.save({"model": model.state_dict(), "step": 3}, tmp_path / CHECKPOINT_NAME)  # format 1: no identity
    with pytest.raises(CheckpointError, match="another version of scalelab"):
        load_checkpoint(tmp_path, {"model": "x"})
    (tmp_path / CHECKPOINT_NAME).write_bytes((tmp_path / CHECKPOINT_NAME).read_bytes()[:100])
    with pytest.raises(CheckpointError, match="truncated or not a checkpoint"):
        load_checkpoint(tmp_path, {"model": "x"})


# ---- a full filesystem ---------------------------------------------------------------------------------

IDENTITY = {"model": "linear"}


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    return model, optimizer


def _save(run_dir, model, optimizer, step):
    return save_checkpoint(run_dir, model, optimizer, identity=IDENTITY, step=step)


def _checkpoint_size(tmp_path) -> int:
    probe = tmp_path / "probe"
    probe.mkdir()
    return _save(probe, *_model_and_optimizer(), step=1).stat().st_size


def _assert_previous_kept(run_dir, error, step):
    assert not (run_dir / "checkpoint.tmp").exists(), "the failed write left its temporary file"
    assert "the previous checkpoint is kept" in str(error)
    assert load_checkpoint(run_dir, IDENTITY)["step"] == step


def test_full_disk_keeps_the_previous_checkpoint(tmp_path, small_fs):
    size = _checkpoint_size(tmp_path)
    fs = small_fs(int(size * 1.5))  # room for one checkpoint, not for a second beside it
    model, optimizer = _model_and_optimizer()
    _save(fs, model, optimizer, step=1)
    with pytest.raises(CheckpointError) as failed:
        _save(fs, model, optimizer, step=2)
    message = str(failed.value)
    assert f"the filesystem at {fs} is full" in message and "bytes free" in message, message
    assert f"{size:,} bytes needed" in message
    _assert_previous_kept(fs, failed.value, step=1)


def test_full_disk_injected(tmp_path, monkeypatch):
    model, optimizer = _model_and_optimizer()
    _save(tmp_path, model, optimizer, step=1)

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("scalelab.train.checkpoint.os.fsync", disk_full)
    with pytest.raises(CheckpointError, match="the filesystem at .* is full") as failed:
        _save(tmp_path, model, optimizer, step=2)
    monkeypatch.undo()
    _assert_previous_kept(tmp_path, failed.value, step=1)


@pytest.mark.slow
def test_full_disk_during_a_run_is_one_clear_error(tmp_path, small_fs, nmt_run):
    """The whole path: rank 0's write fails at step 4, the run stops with one line naming the
    filesystem, and the step-2 checkpoint is still there for `launch resume`."""
    size = (nmt_run / CHECKPOINT_NAME).stat().st_size  # the size of one nmt-tiny checkpoint
    fs = small_fs(int(size * 1.3) + 48 * 1024)  # one checkpoint and the records fit, two checkpoints do not

    proc = launch("--model", "nmt-tiny", *TINY, "--steps", "6", "--runs-dir", str(fs / "runs"), cwd=tmp_path)
    _assert_one_line_error(proc, f"the filesystem at {fs} is full", "bytes free", "the previous checkpoint is kept")
    run = only_run_dir(fs / "runs")
    assert not (run / "checkpoint.tmp").exists()
    assert torch.load(run / CHECKPOINT_NAME, weights_only=True)["step"] == 2


# ---- planted links (issue #27 item 3) -------------------------------------------------------------


@pytest.mark.parametrize("name", ["checkpoint.tmp", "checkpoint.pt"])
def test_a_checkpoint_is_never_written_through_a_link(tmp_path, name):
    from scalelab.core.writes import LinkError

    victim = tmp_path / "victim"
    victim.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    (run / name).symlink_to(victim)
    model, optimizer = _model_and_optimizer()
    with pytest.raises(LinkError) as exc:
        _save(run, model, optimizer, 3)
    msg = str(exc.value)
    assert str(run / name) in msg and f"rm {run / name}" in msg and "\n" not in msg
    assert victim.read_text() == "precious" and (run / name).is_symlink()


def test_a_linked_checkpoint_is_not_loaded(tmp_path):
    from scalelab.core.writes import LinkError

    model, optimizer = _model_and_optimizer()
    (tmp_path / "other").mkdir()
    _save(tmp_path / "other", model, optimizer, 3)
    run = tmp_path / "run"
    run.mkdir()
    (run / CHECKPOINT_NAME).symlink_to(tmp_path / "other" / CHECKPOINT_NAME)
    with pytest.raises(LinkError, match="symbolic link"):
        load_checkpoint(run, {})


def test_a_damaged_checkpoint_names_what_it_is_and_advice_that_works(tmp_path):
    """A directory is called a directory (was "truncated"); the advice is to restore it or start a new run of the
    same spec, not "delete it to start from scratch" (then `launch resume` refused: steps recorded, no checkpoint)."""
    (tmp_path / "checkpoint.pt").mkdir()
    with pytest.raises(CheckpointError) as found:
        load_checkpoint(tmp_path, {"model": "x"})
    said = str(found.value)
    assert "is a directory, not a checkpoint file" in said and "truncated" not in said, said
    assert f"launch run --spec {tmp_path}/spec.json" in said and "delete it" not in said, said
