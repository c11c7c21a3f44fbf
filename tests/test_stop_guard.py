"""The stop guard (scalelab/train/stop_guard.py) on its own, in a small process: a main thread blocked in native
code that goes on through signals (a timed lock of a mutex it holds, as a Gloo or Horovod wait does) still leaves
promptly on SIGTERM or SIGINT, its stop recorded first; and it is left alone where it must be - a main thread that
runs its handler, SIGUSR1 (Slurm's warning: the step must finish), a step that is long but as long as the steps
before it, the checkpoint write (`busy`), a script's own handler, a signal to a child it forked, the guard turned
off. Each case is a few seconds; the real ranks blocked in Gloo and Horovod are tests/test_blocked_stop.py's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from scalelab.train.stop_guard import BOUND_ENV, EXIT_STATUS

FLOOR_S = 0.5  # the guard's bound in these processes (SCALELAB_BLOCKED_STOP_S)

# The process: the rank's handler of the three stop signals (the flag, as scalelab/train/loop.py's), the guard,
# then what sys.argv[2] says its main thread does. `native(s)`: s seconds in native code that goes on through
# signals (pthread_mutex_timedlock of a mutex this thread holds: glibc retries the wait after a signal, as Gloo's
# and Horovod's waits do), with the GIL released (ctypes), so that no Python handler can run meanwhile.
PROCESS = r"""
import ctypes, os, signal, sys, threading, time
from pathlib import Path
from scalelab.train import stop_guard
from scalelab.train.stop_guard import guard

out, what = Path(sys.argv[1]), sys.argv[2]
flag = []

def handler(signum, frame):
    guard.acknowledged(signum)
    flag.append(signum)

def leave(signum, waited):
    (out / "left").write_text(f"{signum} {waited:.2f}")
    if what == "leave-hangs":
        threading.Event().wait()

stops = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
for s in stops:
    signal.signal(s, handler)
stop_guard.LEAVE_S = 1.0
print("installed", guard.install({s: handler for s in stops}, leave), flush=True)

libc = ctypes.CDLL(None)
mutex = ctypes.create_string_buffer(64)  # zeros: PTHREAD_MUTEX_INITIALIZER (a normal mutex) on glibc
libc.pthread_mutex_lock(mutex)

class Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]

def native(seconds):
    until = time.time() + seconds
    libc.pthread_mutex_timedlock(mutex, ctypes.byref(Timespec(int(until), int(until % 1 * 1e9))))

def ready():
    (out / "ready").write_text(str(os.getpid()))

def wait_for_flag(seconds=20):
    deadline = time.monotonic() + seconds
    while not flag and time.monotonic() < deadline:
        time.sleep(0.02)
    print("flag", flag, flush=True)

if what in ("blocked", "leave-hangs"):
    ready()
    native(60)
elif what == "python":
    ready()
    wait_for_flag()
    time.sleep(4 * float(os.environ["SCALELAB_BLOCKED_STOP_S"]))  # past the bound: the guard must not act
elif what == "steps":  # steps of 1 s in native code: the bound is 2 s, and a 1.5 s step finishes
    for _ in range(4):
        native(1.0)
        guard.stepped()
    ready()
    native(1.5)
    wait_for_flag()
elif what == "busy":
    with guard.busy():
        ready()
        native(2.5)
    wait_for_flag()
elif what == "own-handler":
    signal.signal(signal.SIGTERM, lambda signum, frame: flag.append(-signum))
    ready()
    native(2.5)
    wait_for_flag()
elif what == "fork":
    child = os.fork()
    if child == 0:
        time.sleep(30)
        os._exit(0)
    (out / "child").write_text(str(child))
    ready()
    native(2.5)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    print("the parent went on", flush=True)
"""


def start(tmp_path: Path, what: str, bound_s: float = FLOOR_S) -> subprocess.Popen:
    script = tmp_path / "process.py"
    script.write_text(PROCESS)
    env = {**os.environ, "PYTHONPATH": str(ROOT), BOUND_ENV: str(bound_s)}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), what], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the process did not get ready: {proc.communicate()}")
        time.sleep(0.02)
    time.sleep(0.2)  # inside its native call
    return proc


def ended(proc: subprocess.Popen, timeout: float = 30) -> tuple[int, str, str, float]:
    """(exit status, stdout, stderr, seconds it took from now)."""
    began = time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err, time.monotonic() - began


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_main_thread_blocked_in_native_code_leaves_after_the_bound_with_its_stop_recorded(tmp_path, sig):
    proc = start(tmp_path, "blocked")
    proc.send_signal(sig)
    code, out, err, took = ended(proc)
    assert code == EXIT_STATUS and "installed True" in out, (out, err)
    assert FLOOR_S * 0.9 < took < 10, took  # the native call would have taken 60 s
    signum, waited = (tmp_path / "left").read_text().split()
    assert int(signum) == sig and float(waited) >= FLOOR_S
    assert f"{signal.Signals(sig).name} came" in err and "native code" in err, err


def test_a_leave_that_hangs_does_not_keep_the_rank(tmp_path):
    proc = start(tmp_path, "leave-hangs")
    proc.send_signal(signal.SIGTERM)
    code, out, err, took = ended(proc)
    assert code == EXIT_STATUS and (tmp_path / "left").exists() and took < 10, (out, err, took)


def test_a_main_thread_in_python_takes_the_stop_itself(tmp_path):
    proc = start(tmp_path, "python")
    proc.send_signal(signal.SIGTERM)
    code, out, err, _ = ended(proc)
    assert code == 0 and f"flag [{int(signal.SIGTERM)}]" in out, (out, err)
    assert not (tmp_path / "left").exists()


def test_sigusr1_waits_for_the_step_however_long_it_is_blocked(tmp_path):
    """Slurm's warning before a time limit: the step in progress must finish and checkpoint."""
    proc = start(tmp_path, "blocked")
    proc.send_signal(signal.SIGUSR1)
    time.sleep(6 * FLOOR_S)
    alive = proc.poll() is None
    proc.send_signal(signal.SIGTERM)  # then the limit's SIGTERM: guarded
    code, out, err, _ = ended(proc)
    assert alive, (out, err)
    assert code == EXIT_STATUS and (tmp_path / "left").read_text().split()[0] == str(int(signal.SIGTERM)), (out, err)


@pytest.mark.parametrize("what", [
    pytest.param("steps", id="a-step-as-long-as-the-steps-before"),
    pytest.param("busy", id="the-checkpoint-write"),
    pytest.param("own-handler", id="a-scripts-own-handler"),
])
def test_native_code_the_stop_must_wait_for_is_not_cut(tmp_path, what):
    proc = start(tmp_path, what)
    proc.send_signal(signal.SIGTERM)
    code, out, err, _ = ended(proc)
    assert code == 0 and not (tmp_path / "left").exists(), (out, err)
    assert f"flag [{-int(signal.SIGTERM) if what == 'own-handler' else int(signal.SIGTERM)}]" in out, (out, err)


def test_a_signal_to_a_child_the_rank_forked_is_not_taken_for_the_ranks(tmp_path):
    """The child (a DataLoader or multiprocessing worker) drops the wakeup pipe at the fork: its SIGTERM reaches its
    own handler only, and the parent, blocked in native code meanwhile, goes on."""
    proc = start(tmp_path, "fork")
    os.kill(int((tmp_path / "child").read_text()), signal.SIGTERM)
    code, out, err, _ = ended(proc)
    assert code == 0 and "the parent went on" in out and not (tmp_path / "left").exists(), (out, err)


def test_the_guard_can_be_turned_off(tmp_path):
    proc = start(tmp_path, "blocked", bound_s=0)
    proc.send_signal(signal.SIGTERM)
    time.sleep(4 * FLOOR_S)
    alive = proc.poll() is None
    proc.kill()
    _, out, err, _ = ended(proc)
    assert alive and "installed False" in out, (out, err)
