"""Full, read-only and forbidden filesystems where the launcher and the ranks write (issue #12, item 6
and 7): one line naming the file, its filesystem and the fix; no half-written file left; the ranks of a
run stopped even when its state cannot be written. Real small tmpfs mounts (skipped where mounting is
not allowed); the bad-input table (tests/test_bad_inputs.py) runs the CLI against the same kinds."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import fill, launch, needs_horovod
from scalelab.core.errors import ScalelabError
from scalelab.core.lock import RunLock
from scalelab.core.records import RecordWriter
from scalelab.core.rundir import PENDING, RUNNING, new_run_dir, read_state, start_state, write_json
from scalelab.core.spec import Spec, read_spec, save_spec
from scalelab.core.writes import WriteError
from scalelab.launcher.backend import Backend, RunStatus
from scalelab.launcher.local import LocalBackend
from scalelab.launcher.runner import cancel, wait


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_a_run_directory_on_a_read_only_filesystem_is_one_line(small_fs) -> None:
    ro = small_fs(64 * 1024, read_only=True)
    with pytest.raises(WriteError) as info:
        new_run_dir(ro / "runs", "x")
    message = str(info.value)
    assert "read-only" in message and str(ro) in message and "--runs-dir" in message


def test_the_lock_on_a_full_filesystem_leaves_no_owner_file(small_fs) -> None:
    full = small_fs(64 * 1024)
    run = full / "run"
    run.mkdir()
    fill(full)
    with pytest.raises(WriteError, match=f"filesystem at {full} is full"):
        RunLock(run).acquire()
    assert list(run.iterdir()) == [], "a failed lock left owner.json or its temporary file"


def test_state_files_keep_the_old_version_and_leave_no_temporary_file(small_fs) -> None:
    full = small_fs(64 * 1024)
    run = full / "run"
    run.mkdir()
    save_spec(Spec(model="nmt-tiny", steps=7), run)
    write_json(run / "launch.json", {"state": "RUNNING"})
    fill(full)
    with pytest.raises(WriteError, match="is full"):
        save_spec(Spec(model="nmt-tiny", steps=9, name="a-much-longer-name-" * 300), run)
    with pytest.raises(WriteError, match="launch.json: the filesystem at .* is full"):
        write_json(run / "launch.json", {"state": "COMPLETED", "detail": "x" * 100_000})
    assert read_spec(run).steps == 7
    assert json.loads((run / "launch.json").read_text()) == {"state": "RUNNING"}
    assert _leftovers(run) == []


def test_state_files_keep_their_mode(tmp_path: Path) -> None:
    """launch.json and spec.json are readable by others as with a plain open() (umask), not mkstemp's 0600;
    a file made private by its owner stays private when rewritten."""
    old = os.umask(0o022)
    try:
        write_json(tmp_path / "launch.json", {"a": 1})
        save_spec(Spec(model="nmt-tiny"), tmp_path)
        assert stat.S_IMODE((tmp_path / "launch.json").stat().st_mode) == 0o644
        assert stat.S_IMODE((tmp_path / "spec.json").stat().st_mode) == 0o644
        os.chmod(tmp_path / "launch.json", 0o640)
        write_json(tmp_path / "launch.json", {"a": 2})
        assert stat.S_IMODE((tmp_path / "launch.json").stat().st_mode) == 0o640
    finally:
        os.umask(old)


def test_records_on_a_full_filesystem_name_it(small_fs) -> None:
    full = small_fs(64 * 1024)
    writer = RecordWriter(full / "run", rank=1, world=2)
    fill(full)
    try:
        with pytest.raises(WriteError) as info:
            for step in range(10_000):  # line-buffered: the first line that needs a new block fails
                writer.event("note", step=step)
    finally:
        writer.close()
    message = str(info.value)
    assert "rank-1.jsonl" in message and f"filesystem at {full} is full" in message and "launch resume" in message


def _fake_rank(run: Path) -> subprocess.Popen:
    """A process with a rank's command line (`-m scalelab.train RUN_DIR`), as `launch cancel` finds them."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "-m", "scalelab.train", str(run)])


def test_cancel_stops_the_ranks_when_the_state_cannot_be_written(small_fs) -> None:
    """A disk that filled mid-run: cancel cannot record CANCELLED, and stops every process anyway."""
    full = small_fs(64 * 1024)
    run = full / "run"
    run.mkdir()
    save_spec(Spec(model="nmt-tiny"), run)
    start_state(run, backend="local", state=RUNNING, processes=[], host=socket.gethostname())
    rank = _fake_rank(run)
    try:
        time.sleep(0.3)
        fill(full)
        with pytest.raises(WriteError) as info:
            cancel(LocalBackend({"stop_grace_s": 5}), run)
        assert rank.wait(timeout=30) is not None, "the rank still runs"
    finally:
        rank.kill()
        rank.wait()
    message = str(info.value)
    assert "was stopped" in message and f"filesystem at {full} is full" in message
    assert read_state(run)["state"] == RUNNING  # what could not be written; `launch status` settles it later


class _Following(Backend):
    """A backend whose run is RUNNING until cancelled: the follow loop's view, with cancel recorded."""

    name = "following"

    def __init__(self) -> None:
        super().__init__({})
        self.cancelled: list[Path] = []

    def submit_dryrun(self, spec, run_dir):  # never sent in these tests
        raise NotImplementedError

    def schedule(self, request):
        raise NotImplementedError

    def status(self, run_dir: Path) -> RunStatus:
        return RunStatus(RUNNING, "training")

    def logs(self, run_dir: Path) -> str:
        return ""

    def cancel(self, run_dir: Path) -> str | None:
        self.cancelled.append(run_dir)
        return "stopped 2 processes; none left"


def _full_run(small_fs, **state) -> tuple[Path, Path]:
    """A run directory with launch.json (`state`) on a 64 KiB filesystem, then the filesystem filled."""
    full = small_fs(64 * 1024)
    run = full / "run"
    run.mkdir()
    start_state(run, **state)
    fill(full)
    return full, run



def test_a_disk_full_while_following_stops_the_run_and_names_the_filesystem(small_fs) -> None:
    full, run = _full_run(small_fs, backend="following", state=PENDING)
    backend = _Following()
    with pytest.raises(WriteError, match=f"launch.json: the filesystem at {full} is full"):
        wait(backend, run)  # PENDING -> RUNNING cannot be recorded
    assert backend.cancelled == [run], "the run was left running"


def test_cli_run_on_a_full_filesystem_leaves_no_run_directory(small_fs, tmp_path: Path) -> None:
    full = small_fs(64 * 1024)
    (full / "runs").mkdir()
    fill(full)
    proc = launch("--steps", "6", "--runs-dir", str(full / "runs"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"filesystem at {full} is full" in " ".join(proc.stderr.split())
    assert list((full / "runs").iterdir()) == [], "a failed start left a run directory or owner.json"
    assert isinstance(WriteError("x"), ScalelabError)


@pytest.mark.parametrize("checkpointed", [True, False])
def test_a_rank_error_names_the_resume_when_a_checkpoint_exists(tmp_path: Path, checkpointed: bool) -> None:
    """A rank's own error (here: the records' disk filled) is the launcher's message, plus `launch resume
    RUN` where the run has a checkpoint to continue from."""
    from scalelab.launcher.runner import failure

    run = tmp_path / "run"
    run.mkdir()
    save_spec(Spec(model="nmt-tiny"), run)
    start_state(run, backend="following", state=RUNNING, launched=time.time() - 1)
    writer = RecordWriter(run, rank=1, world=2)
    writer.error(f"cannot write records {run}/records/rank-1.jsonl: the filesystem at /x is full")
    writer.close()
    if checkpointed:
        (run / "checkpoint.pt").write_bytes(b"PK")
    message = str(failure(_Following(), run, RunStatus("FAILED", "rank 1 exited 2")))
    assert message.startswith("rank 1: cannot write records") and "is full" in message  # one rank of two said it
    assert (f"`launch resume {run}`" in message) == checkpointed


@pytest.mark.slow
def test_a_run_that_failed_without_a_word_on_a_full_disk_names_it(small_fs) -> None:
    """The ranks could not write their error records: the launcher names the full filesystem itself."""
    from scalelab.launcher.runner import failure

    full = small_fs(64 * 1024)
    run = full / "run"
    run.mkdir()
    save_spec(Spec(model="nmt-tiny"), run)
    start_state(run, backend="following", state=RUNNING, launched=time.time() - 1)
    fill(full)
    message = str(failure(_Following(), run, RunStatus("FAILED", "rank 0 exited 2")))
    assert f"the filesystem at {full} is full" in message and f"launch resume {run}" in message


# ---- a disk that fills while the run goes on: one warning, exit 1, the full disk named ---------------


class _Ended(_Following):
    """A backend whose run has ended (failed) by itself: every process gone, nothing left to stop."""

    name = "ended"

    def status(self, run_dir: Path) -> RunStatus:
        return RunStatus("FAILED", "exit codes [1]")


def test_an_end_that_cannot_be_recorded_is_said_once_and_stops_nothing(small_fs, capsys) -> None:
    """The run ended by itself; launch.json cannot take its end: one warning, the end returned (the error
    that follows names the full disk), and the run is not "stopped" again."""
    full, run = _full_run(small_fs, backend="ended", state=RUNNING)
    backend = _Ended()
    status = wait(backend, run)
    assert status.state == "FAILED" and backend.cancelled == []
    err = capsys.readouterr().err
    assert err.count("launch: warning:") == 1 and "could not be recorded" in err and "is full" in err, err
    assert read_state(run)["state"] == RUNNING  # what could not be written; `launch status` settles it later


def test_a_disk_full_while_following_inside_a_launch_is_said_once_and_exits_1(small_fs, capsys) -> None:
    """As `execute` holds it (`stopping_runs` around `wait`): the run is stopped once, its unwritten state is
    one warning (was two: the outer block stopped it again), and the error is a failed run's (exit 1), not a
    refusal before the start (exit 2)."""
    from scalelab.launcher.runner import stopping_runs

    full, run = _full_run(small_fs, backend="following", state=PENDING)
    backend = _Following()
    with pytest.raises(WriteError) as info:
        with stopping_runs(backend, [run]):
            wait(backend, run)
    assert info.value.exit_code == 1 and "is full" in str(info.value)
    assert backend.cancelled == [run], "stopped twice (or never)"
    err = capsys.readouterr().err
    assert err.count("launch: warning:") == 1, err


MANY_STEPS = "from scalelab import track\nfor i in range(100_000):\n    track.step(items=8, loss=1.0 / (i + 1))\n"


@pytest.mark.parametrize("what", [["--script", "many.py"], ["--model", "nmt-tiny", "--steps", "5000"]])
@pytest.mark.slow
def test_a_disk_that_fills_mid_run_is_one_warning_exit_1_and_named_by_status(small_fs, tmp_path: Path,
                                                                            what: list[str]) -> None:
    """The reviewer's run: a 64 KiB runs directory fills with the ranks' records. One warning (its end could not
    be recorded), one error naming the full filesystem, exit 1 (it had started); `launch status` then names the
    full disk, not "killed by a signal, or out of memory?"; no process of the run is left."""
    from scalelab.core.procs import rank_processes

    full = small_fs(64 * 1024)
    (tmp_path / "many.py").write_text(MANY_STEPS)
    proc = launch("run", *what, "--runs-dir", str(full / "runs"), cwd=tmp_path)
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert said.count("launch: warning:") <= 1 and said.count("launch: error:") == 1, proc.stderr
    assert f"the filesystem at {full} is full" in said.split("launch: error:")[1], proc.stderr
    run = [p for p in (full / "runs").iterdir() if p.is_dir()][0]
    assert rank_processes(run) == []
    status = launch("status", str(run), cwd=tmp_path)
    shown = " ".join(status.stdout.split())
    assert "FAILED" in shown and f"the filesystem at {full} is full" in shown, status.stdout + status.stderr
    assert "out of memory" not in shown


class _Completed(_Following):
    """A backend whose run has completed by itself: every process gone, nothing left to stop."""

    name = "completed"

    def status(self, run_dir: Path) -> RunStatus:
        return RunStatus("COMPLETED", "every rank exited 0")


def test_a_run_that_completes_on_a_full_disk_says_so_and_status_writes_its_summary_later(small_fs, capsys) -> None:
    """The disk filled as the run ended: its end and summary cannot be written. One warning, one error of a
    launch that ran (exit 1, was a refusal's exit 2) saying the run completed and how to get its figures; once
    there is room, `launch status`'s settling writes summary.json. Nothing is stopped: nothing runs."""
    from scalelab.core.rundir import COMPLETED, RunPaths
    from scalelab.core.writes import RunWriteError
    from scalelab.launcher.runner import follow, settle

    full, run = _full_run(small_fs, backend="completed", state=RUNNING, launched=time.time() - 5)
    (full / "filler").unlink()
    spec = Spec(script="train.py").validate()
    save_spec(spec, run)
    writer = RecordWriter(run, rank=0, world=1)
    writer.event("end", wall_s=2.5, exit_code=0)
    writer.close()
    fill(full)
    backend = _Completed()
    with pytest.raises(RunWriteError) as info:
        follow(backend, spec, run)
    message = " ".join(str(info.value).split())
    assert info.value.exit_code == 1 and backend.cancelled == []
    assert f"run {run} completed, but its summary could not be written" in message, message
    assert f"the filesystem at {full} is full" in message and f"launch report {run}" in message, message
    assert capsys.readouterr().err.count("launch: warning:") == 1  # its end could not be recorded either
    assert not RunPaths(run).summary.exists()
    (full / "filler").unlink()
    assert settle(backend, run).state == COMPLETED
    assert json.loads(RunPaths(run).summary.read_text())["exit_codes"] == [0]


# ---- a records file that cannot grow (a file size limit, a quota) while the disk has room -------------------


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["ddp", pytest.param("horovod", marks=needs_horovod)])
def test_a_records_file_that_cannot_grow_is_the_launchers_error_in_the_ranks_words(tmp_path: Path, engine: str) -> None:
    """`ulimit -f 150` over the launch (the review's): the ranks' records files stop at 150 KiB (EFBIG) on a disk
    with room (a smaller limit can leave room for the error line once the cut line is dropped). The rank's error record goes beside its file (records/error-rank-R.jsonl), so the launcher's one line and launch.json's
    `error` carry its words ("cannot write records ...: File too large"), not "exited with status 2 ... without an
    end record"."""
    from tests.conftest import ROOT, on_cpu_where_gpus_are_short

    args = on_cpu_where_gpus_are_short(("run", "--model", "nmt-tiny", "--data", "task", "--steps", "400",
                                        "--threads", "1", "--engine", engine, "--gpus-per-node", "2",
                                        "--runs-dir", str(tmp_path / "runs")))
    command = f"ulimit -f 150; exec {sys.executable} -m scalelab.launcher.cli " + " ".join(args)
    proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 1, proc.stderr
    error = said.split("launch: error:")[1]
    assert "cannot write records" in error and "File too large" in error, proc.stderr
    assert "without an end record" not in error, proc.stderr
    run = next(p for p in (tmp_path / "runs").iterdir() if p.is_dir())
    state = read_state(run)
    assert state["state"] == "FAILED" and "File too large" in state.get("error", ""), state  # `launch report` quotes it
