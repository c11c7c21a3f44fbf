"""Processes a run started, identified so that a signal never reaches the wrong one.

A pid alone is not an identity: after a crash or a reboot the same number can belong to another
process, and a run directory can be edited by anyone who can write to it. So a run records, for
each process it starts, the pid *with* its start time and command line (`ProcessRef`), and nothing is
signalled unless all of them still match. Ranks that outlive their parent (torchrun's workers run in
process groups of their own and are re-parented to pid 1 when the agent dies) are found by the run
directory in their command line (`run_processes`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import psutil

# `PID:START_TIME` of the launcher that supervises a run's ranks: they stop when it is gone (scalelab/train/loop.py).
LAUNCHER_ENV = "SCALELAB_LAUNCHER"
SAME_START_S = 1.0  # start times compared with this tolerance (they are kept in clock ticks, as floats)


@dataclass(frozen=True)
class ProcessRef:
    """A process as it was when recorded: enough to tell it from a later process with its pid."""

    pid: int
    start_time: float
    cmdline: tuple[str, ...]
    host: str

    @classmethod
    def of(cls, pid: int) -> "ProcessRef | None":
        """The reference of a live process, or None if it is gone."""
        try:
            p = psutil.Process(pid)
            return cls(pid, p.create_time(), tuple(p.cmdline()), socket.gethostname())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None

    @classmethod
    def of_child(cls, pid: int, argv: Sequence[str]) -> "ProcessRef | None":
        """The reference of a child this process started with `argv` and has not reaped yet.

        Its command line is taken from `argv`, which is what /proc shows once it runs its program, not
        read back: a child that already exited (a node that only starts ranks of its own, on a slow
        machine) is a zombie whose command line can no longer be read (CI, 2026-11-28), and one read just
        after the fork can still show its parent's. Its start time can be read either way, and its pid
        stays ours until it is reaped."""
        try:
            return cls(pid, psutil.Process(pid).create_time(), tuple(argv), socket.gethostname())
        except psutil.Error:
            return None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cmdline": list(self.cmdline)}

    @classmethod
    def from_dict(cls, raw: Any) -> "ProcessRef | None":
        """From run state; anything malformed is None (never a process to signal)."""
        try:
            return cls(int(raw["pid"]), float(raw["start_time"]), tuple(str(a) for a in raw["cmdline"]),
                       str(raw["host"]))
        except (KeyError, TypeError, ValueError):
            return None

    def alive(self) -> bool:
        """True only if this very process runs: same host, same pid, same start time, same command."""
        if self.host != socket.gethostname():
            return False
        now = ProcessRef.of(self.pid)
        return now is not None and now.cmdline == self.cmdline and started_at(self.pid, self.start_time)

    def process(self) -> psutil.Process | None:
        """The live process this refers to, or None when it is gone (or another process has its pid)."""
        try:
            return psutil.Process(self.pid) if self.alive() else None
        except psutil.Error:
            return None


def started_at(pid: int, start_time: float) -> bool:
    """True while process `pid` runs and is the one that started at `start_time` (not a reused pid).

    Cheap enough to call every few seconds: ranks use it to watch their launcher.
    """
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - start_time) < SAME_START_S and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def names_dir(cmdline: Sequence[str], run_dir: Path, after: Sequence[str] = ()) -> bool:
    """True when an absolute argument of `cmdline` is `run_dir` (preceded by the arguments `after`)."""
    target = Path(run_dir).resolve()
    n = len(after)
    for i, arg in enumerate(cmdline):
        if i >= n and os.path.isabs(arg) and Path(arg).name == target.name and tuple(cmdline[i - n:i]) == tuple(after):
            try:
                if Path(arg).resolve() == target:
                    return True
            except (OSError, RuntimeError):
                continue
    return False


#: How every backend starts the trainer: `python -m scalelab.train RUN_DIR` (the one package name, so nothing in
#: the caller's working directory can shadow it), and how the ranks of a run are told from other processes.
TRAINER: tuple[str, str] = ("-m", "scalelab.train")
#: How the ranks of a `--script` / `--module` run start: `python -m scalelab.train.script RUN_DIR`, which runs the
#: user's code in the same process (scalelab/train/script.py) so that `scalelab.track` records for it.
SCRIPT_RUNNER: tuple[str, str] = ("-m", "scalelab.train.script")
#: What a rank's command line names before its run directory, either kind of run.
RANK_PROGRAMS: tuple[tuple[str, str], ...] = (TRAINER, SCRIPT_RUNNER)


def names_run(cmdline: Sequence[str], run_dir: Path) -> bool:
    """True when `cmdline` is a rank of `run_dir` (or an agent starting one): the trainer or the script runner."""
    return any(names_dir(cmdline, run_dir, program) for program in RANK_PROGRAMS)


def rank_processes(run_dir: Path) -> list[psutil.Process]:
    """Every live process of this host that is a rank of `run_dir` (or torchrun/horovodrun starting one)."""
    found: dict[int, psutil.Process] = {}
    for program in RANK_PROGRAMS:
        for p in run_processes(run_dir, program):
            found.setdefault(p.pid, p)
    return list(found.values())


def tool_path(name: str) -> str | None:
    """A console script such as `horovodrun`: the one installed beside this Python first (a virtualenv used
    without activating it, as `venv/bin/launch ...`), then the PATH's; None when neither has it."""
    here = Path(sys.executable).parent
    return shutil.which(name, path=os.pathsep.join([str(here), os.environ.get("PATH", "")]))


def run_processes(run_dir: Path, after: Sequence[str] = ()) -> list[psutil.Process]:
    """Every live process on this host whose command line names `run_dir` (after `after`, if given).

    `after` narrows the match to the run's own processes: `("-m", "scalelab.train")` finds the ranks, torchrun's
    agents and horovodrun, but not a `launch resume RUN_DIR` or an editor that has the directory open.
    """
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid != os.getpid() and names_dir(p.info["cmdline"] or [], run_dir, after) and running(p):
                found.append(p)
        except (psutil.Error, OSError, ValueError):
            continue
    return found


def running(p: psutil.Process) -> bool:
    """Alive and not a zombie (a zombie is dead, only not yet reaped by its parent)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def family(processes: Iterable[psutil.Process]) -> list[psutil.Process]:
    """`processes` and every live process they started, each once, parents first."""
    out: dict[int, psutil.Process] = {}
    for p in processes:
        try:
            for q in [p, *p.children(recursive=True)]:
                if running(q):
                    out.setdefault(q.pid, q)
        except psutil.Error:
            continue
    return list(out.values())


def signal_all(processes: Iterable[psutil.Process], sig: int) -> None:
    for p in processes:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


def wait_gone(processes: list[psutil.Process], timeout_s: float, reap: Any = None) -> list[psutil.Process]:
    """Wait up to `timeout_s` for `processes` to end; the ones still running. `reap()` is called on each
    round, so that the caller's own children are waited for (else they stay zombies)."""
    deadline = time.monotonic() + timeout_s
    alive = [p for p in processes if running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        if reap is not None:
            reap()
        alive = [p for p in alive if running(p)]
    return alive


def stop_processes(processes: list[psutil.Process], grace_s: float, reap: Any = None) -> tuple[int, list[int]]:
    """SIGTERM, wait up to `grace_s`, SIGKILL what is left and wait for it.

    Returns how many needed SIGKILL and the pids still running after that (a process in
    uninterruptible sleep, or one of another user).
    """
    signal_all(processes, signal.SIGTERM)
    alive = wait_gone(processes, grace_s, reap)
    signal_all(alive, signal.SIGKILL)
    left = wait_gone(alive, 5.0, reap)
    return len(alive), [p.pid for p in left]
