"""Run-directory ownership and process identity (issue #12 items 3 and 4): a live owner is refused,
a dead or planted one is not trusted, and a pid is signalled only when it is still the same process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalelab.core.lock import OWNER_FILE, RunBusy, RunLock, owner_of
from scalelab.core.procs import ProcessRef, run_processes, stop_processes


def _sleeper(*args: str) -> subprocess.Popen:
    """A process that sleeps, returned once it runs its own program: just after the fork its command line is
    its parent's, or empty (CI, 2026-11-27: a ProcessRef taken then named no command line)."""
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *args])
    deadline = time.monotonic() + 30
    while "time.sleep(60)" not in " ".join(psutil.Process(proc.pid).cmdline()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc


def test_a_live_owner_is_refused_with_how_to_stop_it(tmp_path: Path) -> None:
    with RunLock(tmp_path):
        assert owner_of(tmp_path) is not None
        with pytest.raises(RunBusy, match="launch cancel"):
            RunLock(tmp_path).acquire()
    assert not (tmp_path / OWNER_FILE).exists()
    assert owner_of(tmp_path) is None


def test_a_dead_owner_is_taken_over(tmp_path: Path) -> None:
    proc = _sleeper()
    ref = ProcessRef.of(proc.pid)
    proc.kill()
    proc.wait()
    (tmp_path / OWNER_FILE).write_text(json.dumps(ref.to_dict()))
    with RunLock(tmp_path) as lock:
        assert json.loads((tmp_path / OWNER_FILE).read_text())["pid"] == os.getpid()
        assert lock.held


@pytest.mark.parametrize("planted", [
    {"pid": 1, "start_time": 0.0, "cmdline": ["init"], "host": socket.gethostname()},  # pid reuse / planted
    "not json at all",
    {"pid": "x"},
])
def test_a_planted_or_corrupt_lock_is_not_trusted(tmp_path: Path, planted) -> None:
    (tmp_path / OWNER_FILE).write_text(planted if isinstance(planted, str) else json.dumps(planted))
    with RunLock(tmp_path):
        pass


def test_a_lock_of_another_host_names_that_host(tmp_path: Path) -> None:
    ref = ProcessRef.of(os.getpid())
    raw = {**ref.to_dict(), "host": "elsewhere-42"}
    (tmp_path / OWNER_FILE).write_text(json.dumps(raw))
    with pytest.raises(RunBusy, match="elsewhere-42"):
        RunLock(tmp_path).acquire()


def test_process_identity_survives_pid_reuse_checks() -> None:
    proc = _sleeper()
    try:
        ref = ProcessRef.of(proc.pid)
        assert ref.alive()
        assert not ProcessRef(ref.pid, ref.start_time - 100, ref.cmdline, ref.host).alive()
        assert not ProcessRef(ref.pid, ref.start_time, ("other",), ref.host).alive()
        assert ProcessRef.from_dict({"pid": "1; rm -rf /"}) is None
    finally:
        proc.kill()
        proc.wait()
    assert not ref.alive()


def test_processes_of_a_run_are_found_by_their_run_directory_even_when_orphaned(tmp_path: Path) -> None:
    run = tmp_path / "run-1"
    run.mkdir()
    # a parent that starts a child in its own session and exits: the child is re-parented
    code = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', "
            f"{str(run)!r}], start_new_session=True)")
    subprocess.run([sys.executable, "-c", code], check=True)
    time.sleep(0.5)
    found = run_processes(run)
    assert len(found) == 1 and found[0].ppid() != os.getpid()
    assert stop_processes(found, grace_s=5) == (0, [])
    assert run_processes(run) == []


def test_the_run_processes_are_those_that_name_the_run_after_the_trainer(tmp_path: Path) -> None:
    from scalelab.core.procs import names_dir

    run = tmp_path / "run-1"
    run.mkdir()
    assert names_dir(["python", "-m", "scalelab.train", str(run)], run, ("-m", "scalelab.train"))
    assert names_dir(["python", "-m", "scalelab.train", str(tmp_path / "." / "run-1")], run, ("-m", "scalelab.train"))
    assert not names_dir(["launch", "resume", str(run)], run, ("-m", "scalelab.train"))  # a launcher is not a rank
    assert not names_dir(["python", "-m", "scalelab.train", str(run) + "-2"], run, ("-m", "scalelab.train"))
    assert not names_dir(["python", "-m", "scalelab.train", "run-1"], run)  # relative: resolved against whose cwd?
    rank = _sleeper("-m", "scalelab.train", str(run))
    bystander = _sleeper(str(run))
    try:
        time.sleep(0.3)
        assert [p.pid for p in run_processes(run, ("-m", "scalelab.train"))] == [rank.pid]
        assert {p.pid for p in run_processes(run)} == {rank.pid, bystander.pid}
    finally:
        for proc in (rank, bystander):
            proc.kill()
            proc.wait()


def test_a_run_directory_that_cannot_be_written_is_one_clear_error(tmp_path: Path) -> None:
    from scalelab.core.errors import ScalelabError

    with pytest.raises(ScalelabError, match="cannot take the run directory .* must exist and be writable"):
        RunLock(tmp_path / "absent").acquire()


# ---- two launchers at once (owner.json is never seen half written; a stale lock has one heir) --------

_CONTENDER = """
import sys, time
from pathlib import Path
from scalelab.core.lock import RunBusy, RunLock
run, go, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
Path(str(out) + ".ready").touch()  # imported: the test starts the race once all four are here
while not go.exists():
    time.sleep(0.001)
try:
    lock = RunLock(run).acquire()
except RunBusy:
    out.write_text("busy")
else:
    out.write_text("got")
    end = time.monotonic() + 60  # held while the others try (they must see a live owner), until all have
    while sum(p.name.startswith("out-") and "." not in p.name for p in out.parent.iterdir()) < 4 and time.monotonic() < end:
        time.sleep(0.01)
    lock.release()
"""


def _dead_owner() -> dict:
    proc = _sleeper()
    ref = ProcessRef.of(proc.pid)
    proc.kill()
    proc.wait()
    return ref.to_dict()


@pytest.mark.parametrize("round_", range(3))
def test_launchers_racing_for_a_stale_lock_leave_one_owner(tmp_path: Path, round_: int) -> None:
    """Four launchers find one stale owner.json at the same moment: exactly one takes the run."""
    run, go = tmp_path / "run", tmp_path / "go"
    run.mkdir()
    (run / OWNER_FILE).write_text(json.dumps(_dead_owner()))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    outs = [tmp_path / f"out-{i}" for i in range(4)]
    procs = [subprocess.Popen([sys.executable, "-c", _CONTENDER, str(run), str(go), str(out)], env=env) for out in outs]
    deadline = time.monotonic() + 60
    while not all(Path(f"{out}.ready").exists() for out in outs):  # all imported and waiting for the start
        assert time.monotonic() < deadline, "the contenders did not start"
        time.sleep(0.01)
    go.touch()
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    results = sorted(out.read_text() for out in outs)
    assert results == ["busy", "busy", "busy", "got"], results
    assert not (run / OWNER_FILE).exists()
    assert not list(run.glob(".owner.json.*")), "a launcher left its temporary owner file"


def test_owner_file_is_never_seen_empty_or_half_written(tmp_path: Path) -> None:
    """A launcher taking and releasing the lock over and over; every read of owner.json is a whole owner.
    The launcher goes on until the reader has seen the lock held 50 times (or 60 s pass), so a loaded
    machine that schedules the reader rarely still gives it reads to check."""
    stop = tmp_path / "stop"
    run = tmp_path / "run"
    run.mkdir()
    code = ("import sys, time; from pathlib import Path; from scalelab.core.lock import RunLock\n"
            "end = time.monotonic() + 60\n"
            "while not Path(sys.argv[2]).exists() and time.monotonic() < end:\n"
            "    RunLock(Path(sys.argv[1])).acquire().release()\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", code, str(run), str(stop)], env=env)
    seen = 0
    try:
        while proc.poll() is None and seen < 50:
            try:
                text = (run / OWNER_FILE).read_text()
            except FileNotFoundError:
                continue
            assert json.loads(text)["pid"] == proc.pid, f"owner.json read as {text!r}"
            seen += 1
    finally:
        stop.touch()
        proc.wait(timeout=60)
    assert proc.returncode == 0
    assert seen > 0, "the reader never saw the lock held; the test proved nothing"


def test_a_child_that_already_exited_is_still_recorded_by_the_command_it_was_started_with() -> None:
    """A node that only starts ranks and exits can be a zombie before the launcher records it (CI,
    2026-11-28, on the slower machine: `processes` came out empty). Its command line is gone from /proc;
    the reference takes it from the argv it was started with, and its start time from the zombie."""
    argv = [sys.executable, "-c", "pass", "-m", "scalelab.train", "/tmp/some-run"]
    proc = subprocess.Popen(argv)
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    try:
        assert ProcessRef.of(proc.pid) is None  # what the launcher used to record: nothing
        ref = ProcessRef.of_child(proc.pid, argv)
        assert ref is not None and ref.pid == proc.pid and ref.cmdline == tuple(argv)
        assert abs(ref.start_time - time.time()) < 60 and not ref.alive()
    finally:
        proc.wait()
    assert ProcessRef.of_child(proc.pid, argv) is None  # reaped: nothing to refer to
