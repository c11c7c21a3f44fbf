"""Processes a run started, identified so that a signal never reaches the wrong one.

A pid alone is not an identity: after a crash or a reboot the same number can belong to another
process, and a run directory can be edited by anyone who can write to it. So a run records, for
each process it starts, the pid *with* its start time and command line (`ProcessRef`), and nothing is
signalled unless all three still match. Ranks that outlive their parent (torchrun's workers run in
process groups of their own and are re-parented to pid 1 when the agent dies) are found by the run
directory in their command line.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

import psutil


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
        if now is None:
            return False
        try:
            if psutil.Process(self.pid).status() == psutil.STATUS_ZOMBIE:
                return False
        except psutil.Error:
            return False
        return abs(now.start_time - self.start_time) < 1.0 and now.cmdline == self.cmdline


def run_processes(run_dir: Path) -> list[psutil.Process]:
    """Every live process on this host whose command line names `run_dir` (ranks, agents, launchers)."""
    target = str(Path(run_dir).resolve())
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            if p.pid != os.getpid() and any(target == str(Path(a).resolve()) for a in cmd if a.startswith(("/", "."))):
                if p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
        except (psutil.Error, OSError, ValueError):
            continue
    return found


def signal_all(processes: Iterable[psutil.Process], sig: int) -> None:
    for p in processes:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


def stop_processes(processes: list[psutil.Process], grace_s: float) -> list[int]:
    """SIGTERM, wait up to `grace_s`, SIGKILL what is left; the pids that were still alive after that."""
    signal_all(processes, signal.SIGTERM)
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    signal_all(alive, signal.SIGKILL)
    _, alive = psutil.wait_procs(alive, timeout=5.0)
    return [p.pid for p in alive]


def wait_gone(processes: list[psutil.Process], timeout_s: float) -> list[int]:
    deadline = time.time() + timeout_s
    alive = processes
    while alive and time.time() < deadline:
        _, alive = psutil.wait_procs(alive, timeout=0.2)
    return [p.pid for p in alive]
