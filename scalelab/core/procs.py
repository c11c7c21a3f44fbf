"""Processes a run started, identified so that a signal never reaches the wrong one.

A pid alone is not an identity: after a crash or a reboot the same number can belong to another
process, and a run directory can be edited by anyone who can write to it. So a run records, for
each process it starts, the pid *with* its start time and command line (`ProcessRef`), and nothing is
signalled unless all of them still match. Ranks that outlive their parent (torchrun's workers run in
process groups of their own and are re-parented to pid 1 when the agent dies) are found by the run
directory in their command line (`run_processes`).
"""

from __future__ import annotations

import functools
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

# `PID:START` of the launcher that supervises a run's ranks (START: `steady_start`): they stop when it is gone
# (scalelab/train/loop.py).
LAUNCHER_ENV = "SCALELAB_LAUNCHER"
SAME_START_S = 1.0  # wall-clock start times (older records, other systems) compared with this tolerance
SAME_TICK_S = 0.005  # steady start times are whole clock ticks (1/100 s): equal, up to float rounding
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@functools.cache
def boot_id() -> str | None:
    """This boot's random id (Linux): a process recorded under another boot is gone, whatever its pid."""
    try:
        return BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def steady_start(pid: int) -> float | None:
    """When process `pid` started, in seconds since boot (/proc/PID/stat's `starttime`, in clock ticks), or None
    off Linux or when it is gone.

    Why not psutil's `create_time()`: that adds the boot time, which Linux states in whole seconds of the wall
    clock (/proc/stat's `btime`), so it moves whenever the wall clock is slewed or stepped. On one CI machine
    the wall clock gained 5 ms a second on the boot clock, `btime` went up by one every 200 s, and a rank that
    compared its launcher's start time read before the step with one read after it took its launcher for gone
    and stopped the run (2026-12-01). Seconds since boot never move.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class ProcessRef:
    """A process as it was when recorded: enough to tell it from a later process with its pid.

    `start_time` is the wall-clock time it started (for people); `steady_start_s` and `boot` are what identify
    it (`steady_start`, `boot_id`), None in records written before they were kept, which are compared by
    `start_time` as before.
    """

    pid: int
    start_time: float
    cmdline: tuple[str, ...]
    host: str
    steady_start_s: float | None = None
    boot: str | None = None

    @classmethod
    def of(cls, pid: int) -> "ProcessRef | None":
        """The reference of a live process, or None if it is gone."""
        try:
            p = psutil.Process(pid)
            return cls(pid, p.create_time(), tuple(p.cmdline()), socket.gethostname(), steady_start(pid), boot_id())
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
            return cls(pid, psutil.Process(pid).create_time(), tuple(argv), socket.gethostname(), steady_start(pid),
                       boot_id())
        except psutil.Error:
            return None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cmdline": list(self.cmdline)}

    @classmethod
    def from_dict(cls, raw: Any) -> "ProcessRef | None":
        """From run state; anything malformed is None (never a process to signal)."""
        try:
            steady = raw.get("steady_start_s")
            return cls(int(raw["pid"]), float(raw["start_time"]), tuple(str(a) for a in raw["cmdline"]),
                       str(raw["host"]), None if steady is None else float(steady),
                       None if raw.get("boot") is None else str(raw["boot"]))
        except (AttributeError, KeyError, TypeError, ValueError):
            return None

    def alive(self) -> bool:
        """True only if this very process runs: same host, same pid, same start, same command."""
        if self.host != socket.gethostname():
            return False
        now = ProcessRef.of(self.pid)
        return now is not None and now.cmdline == self.cmdline and self.started_as(now) and not_a_zombie(self.pid)

    def started_as(self, now: "ProcessRef") -> bool:
        """True when `now` (the live process with this pid) started when this one did."""
        if self.boot is not None and self.steady_start_s is not None and now.steady_start_s is not None:
            return self.boot == now.boot and abs(now.steady_start_s - self.steady_start_s) < SAME_TICK_S
        return abs(now.start_time - self.start_time) < SAME_START_S

    def process(self) -> psutil.Process | None:
        """The live process this refers to, or None when it is gone (or another process has its pid)."""
        try:
            return psutil.Process(self.pid) if self.alive() else None
        except psutil.Error:
            return None


def watch_value(pid: int) -> str:
    """LAUNCHER_ENV's value for process `pid` (`PID:START`): its steady start, where this system has one, else its
    wall-clock start; "" when it is gone."""
    ref = ProcessRef.of(pid)
    if ref is None:
        return ""
    return f"{pid}:{ref.steady_start_s:.6f}" if ref.steady_start_s is not None else f"{pid}:w{ref.start_time:.2f}"


def watched(value: str) -> tuple[int, str] | None:
    """LAUNCHER_ENV's `value` read back as (pid, start) for `started_at`; None when it is not `watch_value`'s form."""
    pid, _, start = value.partition(":")
    try:
        int(pid), float(start.removeprefix("w"))
    except ValueError:
        return None
    return int(pid), start


def started_at(pid: int, start: str) -> bool:
    """True while process `pid` runs and is the one that started at `start` (`watch_value`'s, after the colon):
    not a reused pid. Cheap enough to call every few seconds: ranks use it to watch their launcher."""
    try:
        if start.startswith("w"):
            same = abs(psutil.Process(pid).create_time() - float(start[1:])) < SAME_START_S
        else:
            now = steady_start(pid)
            same = now is not None and abs(now - float(start)) < SAME_TICK_S
        return same and not_a_zombie(pid)
    except (psutil.Error, ValueError):
        return False


def not_a_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
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
