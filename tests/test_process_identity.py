"""A process's identity (scalelab/core/procs.py) where the wall clock moves under it.

Linux states the boot time in whole seconds of the wall clock (/proc/stat's `btime`), and psutil's
`create_time()` adds it, so a process's start read twice differs by a second whenever `btime` steps. On the
CI machine of 2026-12-01 the wall clock gained 5 ms a second on the boot clock: `btime` stepped every 200 s,
and a rank whose launcher was alive took it for gone ("its launcher (pid N) is gone") and stopped the run.
Identity now rests on the start in seconds since boot, with the boot's id; older records still compare by
wall-clock start."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import psutil
import pytest

from scalelab.core import procs
from scalelab.core.procs import ProcessRef, started_at, steady_start, watch_value, watched

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: the steady start is Linux's")


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _wall_clock_stepped(monkeypatch: pytest.MonkeyPatch, by_s: float) -> None:
    """psutil's boot time (and so every create_time) moved by `by_s`, as when /proc/stat's btime steps."""
    real = psutil._pslinux.boot_time  # what psutil's create_time() adds
    monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: real() + by_s)


def test_the_steady_start_is_the_kernels_and_does_not_move(sleeper, monkeypatch) -> None:
    first = steady_start(sleeper.pid)
    wall = psutil.Process(sleeper.pid).create_time()
    _wall_clock_stepped(monkeypatch, 1.0)
    assert psutil.Process(sleeper.pid).create_time() == pytest.approx(wall + 1.0)  # what fooled the watch
    assert steady_start(sleeper.pid) == first
    assert 0 < steady_start(os.getpid()) <= first
    assert steady_start(2**22 + 12345) is None  # no such process


@pytest.mark.parametrize("step_s", [1.0, -1.0, 30.0])
def test_a_recorded_process_stays_alive_when_the_wall_clock_steps(sleeper, monkeypatch, step_s) -> None:
    ref = ProcessRef.of(sleeper.pid)
    value = watch_value(sleeper.pid)
    _wall_clock_stepped(monkeypatch, step_s)
    assert ref.alive()
    assert ProcessRef.from_dict(ref.to_dict()).alive()  # as read back from launch.json / owner.json
    assert started_at(*watched(value))


def test_another_start_or_another_boot_is_another_process(sleeper) -> None:
    ref = ProcessRef.of(sleeper.pid)
    assert ref.steady_start_s is not None and ref.boot
    assert not dataclasses.replace(ref, steady_start_s=ref.steady_start_s + 0.01).alive()  # one tick later: pid reused
    assert not dataclasses.replace(ref, boot="another-boot").alive()  # recorded before a reboot
    pid, start = watched(watch_value(sleeper.pid))
    assert not started_at(pid, f"{float(start) + 0.01:.6f}")
    sleeper.kill()
    sleeper.wait()
    assert not ref.alive() and not started_at(pid, start)


def test_records_without_a_steady_start_compare_by_wall_clock(sleeper) -> None:
    """launch.json and owner.json written before this change: pid, start_time, cmdline, host."""
    ref = ProcessRef.of(sleeper.pid)
    old = {k: v for k, v in ref.to_dict().items() if k not in ("steady_start_s", "boot")}
    assert ProcessRef.from_dict(old).alive()
    assert not ProcessRef.from_dict({**old, "start_time": old["start_time"] - 100}).alive()
    wall = f"{sleeper.pid}:w{ref.start_time:.2f}"  # the watch's form where there is no steady start
    assert started_at(*watched(wall))


@pytest.mark.parametrize("value", ["", "12", "x:1.0", "12:abc", "12:wabc"])
def test_a_malformed_watch_value_is_refused(value) -> None:
    assert watched(value) is None


def test_the_boot_id_is_read_once_and_names_this_boot() -> None:
    assert procs.boot_id() == procs.BOOT_ID.read_text().strip()
