"""A rank blocked in native code still leaves on a stop signal (`launch cancel`, Ctrl-C, a node shutting down).

A rank's stop signals have Python handlers (scalelab/train/loop.py's `Stop`, the script runner's `install_stop`):
the handler sets a flag and the rank stops at its next step, with a checkpoint. But CPython runs a Python handler
only in the main thread, between two bytecodes: a main thread blocked inside native code - a Gloo all-reduce or a
Horovod op waiting for a peer that is stuck, or waits in another collective - never gets there. A cancel of such a
run took the launcher's whole grace period (30 s) and SIGKILL, where a rank without a handler (torchrun's own
default) dies at once.

The guard: `signal.set_wakeup_fd` makes CPython's C-level handler write every signal's number to a pipe, also
while the main thread is stuck; a daemon thread reads it. After SIGTERM or SIGINT it waits for the main thread to
run the rank's handler (`acknowledged`), at most `bound()`: 5 s, or twice the longest step of this launch where
that is longer, so that a rank in a step, however slow, reaches its flag and stops with a checkpoint as before.
A handler that ran means the main thread is back in Python: the stop is the rank's own from there on and the
guard does nothing more (a rank that then blocks in the stop's own collectives is left to the launcher's grace
and SIGKILL, as before; its peers, if blocked, leave by their own guards, and its collective then fails). A handler
that did not run in time means the main thread is blocked: the guard has the rank's stop recorded (the `leave`
given to `install`: the trainer's `interrupted` event with `blocked_s`, the script runner's note, events and exit
handlers), and the rank exits 143, as after any stop. No checkpoint: one needs every rank's collectives, and this
rank can take part in none. docs/reliability.md ("A rank blocked in a collective") says why each choice.

Left alone:
- SIGUSR1: Slurm's warning before a time limit or a pre-emption, minutes ahead; the step in progress must finish
  and checkpoint, however long it is blocked. The SIGTERM that Slurm sends at the limit itself is guarded.
- the rank's checkpoint write (`busy`): that native code is the stop's own work; the bound starts after it.
- a signal whose handler is no longer the rank's (a script that installed its own SIGTERM handler): the script
  stops as it chose to.
- a process the rank forked (a DataLoader or multiprocessing worker): it drops the pipe at the fork, so a
  signal to it is not taken for one to the rank.

`SCALELAB_BLOCKED_STOP_S` (in the ranks' environment) sets the 5 s; 0 turns the guard off.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

GUARDED = (signal.SIGTERM, signal.SIGINT)  # a cancel, Ctrl-C, a node agent: whoever sent it SIGKILLs after a grace
BOUND_ENV = "SCALELAB_BLOCKED_STOP_S"
BOUND_S = 5.0  # the least time the main thread gets to run the rank's handler
STEP_FACTOR = 2.0  # ... or this many times the longest step of the launch (the step in progress must finish)
LEAVE_S = 15.0  # the most the stop's records and the script's exit handlers get before the rank exits
EXIT_STATUS = 143  # as every stopped rank's (the launcher reads 143 as a stop)
POLL_S = 0.1

Leave = Callable[[int, float], None]  # leave(signal, seconds it waited): records the rank's stop


class StopGuard:
    """One per process (`guard`): the wakeup pipe, its watching thread, and what the rank told it."""

    def __init__(self) -> None:
        self._fds: tuple[int, int] | None = None  # the pipe (read, write); None: not installed here
        self._pid: int | None = None
        self._handlers: dict[int, Any] = {}  # the rank's handler of each guarded signal
        self._acknowledged = threading.Event()  # the main thread ran the rank's handler of a guarded signal
        self._leaving = threading.Event()
        self._leave: Leave | None = None
        self._busy = 0
        self._floor = BOUND_S
        self._last_step: float | None = None
        self._longest = 0.0

    # ---- what the rank calls (its main thread) ------------------------------------------------------

    def install(self, handlers: Mapping[int, Any], leave: Leave | None = None) -> bool:
        """Watch the guarded signals whose handlers (`handlers`: {signal: the rank's handler}) are installed;
        `leave` records the rank's stop when it must leave blocked. Main thread only. False where the guard is
        off (SCALELAB_BLOCKED_STOP_S=0), or where another wakeup fd is set (left as it is)."""
        if leave is not None:
            self._leave = leave
        if self._fds is not None and self._pid == os.getpid():
            self._handlers.update({s: h for s, h in handlers.items() if s in GUARDED})
            return True
        self._floor = bound_from_env()
        if self._floor <= 0:
            return False
        read, write = os.pipe()  # not inherited by a program the rank starts (close-on-exec)
        os.set_blocking(write, False)
        try:
            previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError:  # not the main thread: no guard
            previous = None
        if previous != -1:  # not the main thread, or someone's own fd (an event loop's): theirs stays, no guard
            if previous is not None:
                signal.set_wakeup_fd(previous)
            for fd in (read, write):
                os.close(fd)
            return False
        self._fds, self._pid = (read, write), os.getpid()
        self._handlers = {s: h for s, h in handlers.items() if s in GUARDED}
        threading.Thread(target=self._watch, args=(read,), name="scalelab-stop-guard", daemon=True).start()
        return True

    def set_leave(self, leave: Leave | None) -> None:
        """What records the rank's stop from now on (None: nothing left to record, the rank wrote its end)."""
        self._leave = leave

    def acknowledged(self, signum: int) -> None:
        """Called by the rank's handler: the main thread runs Python, the stop is its own. A handler that runs
        once the guard has decided to leave waits for that exit (so that the rank does not record its stop twice)."""
        if self._pid != os.getpid():
            return
        if self._leaving.is_set():
            threading.Event().wait()
        if signum in GUARDED:
            self._acknowledged.set()

    def stepped(self) -> None:
        """After each step: the bound follows the longest step of the launch (its first, which holds the start-up,
        left out)."""
        now = time.monotonic()
        if self._last_step is not None:
            self._longest = max(self._longest, now - self._last_step)
        self._last_step = now

    @contextmanager
    def busy(self) -> Iterator[None]:
        """A block whose native code is the stop's own work (the checkpoint write): never cut, the bound starts
        after it."""
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1

    def bound(self) -> float:
        """How long the main thread gets to run the rank's handler after a guarded signal."""
        return max(self._floor, STEP_FACTOR * self._longest)

    # ---- the watching thread ------------------------------------------------------------------------

    def _watch(self, fd: int) -> None:
        """Read the signal numbers CPython writes; after a guarded one, wait for the main thread's handler."""
        pending: tuple[int, float, float] | None = None  # (signal, when it came, when the bound started)
        while True:
            waiting = pending is not None and not self._acknowledged.is_set()
            try:
                ready = select.select([fd], [], [], POLL_S if waiting else None)[0]
                data = os.read(fd, 512) if ready else b""
            except OSError:  # the pipe is gone (closed in a forked child): nothing to watch
                return
            if ready and not data:
                return
            if self._acknowledged.is_set():
                continue  # the stop is the main thread's: the pipe is only drained
            if pending is None:
                came = next((b for b in data if b in GUARDED), None)
                if came is not None:
                    now = time.monotonic()
                    pending = (came, now, now)
                continue
            signum, came_at, since = pending
            now = time.monotonic()
            if self._busy:
                pending = (signum, came_at, now)  # the bound counts from the end of the block
            elif now - since >= self.bound():
                if signal.getsignal(signum) != self._handlers.get(signum):
                    self._acknowledged.set()  # the script's own handler has it: its stop is its own
                    continue
                self._leave_blocked(signum, now - came_at)

    def _leave_blocked(self, signum: int, waited: float) -> None:
        """Record the stop (in a thread of its own, at most LEAVE_S: a record write or an exit handler that hangs
        must not keep the rank), then exit."""
        self._leaving.set()
        worker = threading.Thread(target=self._say_and_record, args=(signum, waited), name="scalelab-stop-leave",
                                  daemon=True)
        worker.start()
        worker.join(LEAVE_S)
        os._exit(EXIT_STATUS)

    def _say_and_record(self, signum: int, waited: float) -> None:
        try:
            print(f"scalelab: {signal.Signals(signum).name} came {waited:.1f} s ago and this rank has not come back "
                  "from native code since (blocked in a collective whose peer is stuck or gone?): it leaves now, "
                  "without a checkpoint of this step", file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - a closed or broken stderr: the records still matter
            pass
        leave = self._leave
        try:
            if leave is not None:
                leave(signum, waited)
        except Exception as exc:  # noqa: BLE001 - the rank leaves all the same
            try:
                print(f"scalelab: warning: the stop could not be recorded: {exc}", file=sys.stderr, flush=True)
            except Exception:  # noqa: BLE001
                pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass

    # ---- a forked child ------------------------------------------------------------------------------

    def _forget(self) -> None:
        """In a child the rank forked: drop the pipe (a signal to the child must not reach the rank's watch)."""
        if self._fds is None:
            return
        read, write = self._fds
        self._fds, self._pid, self._leave = None, None, None
        try:
            before = signal.set_wakeup_fd(-1)
            if before not in (write, -1):  # not ours any longer (the script set its own): put it back
                signal.set_wakeup_fd(before)
        except (ValueError, OSError):
            pass
        for fd in (read, write):
            try:
                os.close(fd)
            except OSError:
                pass


def bound_from_env() -> float:
    """SCALELAB_BLOCKED_STOP_S as seconds (0: off); BOUND_S where it is unset or not a number."""
    try:
        return max(0.0, float(os.environ.get(BOUND_ENV, BOUND_S)))
    except ValueError:
        print(f"scalelab: warning: {BOUND_ENV}={os.environ[BOUND_ENV]!r} is not a number of seconds; "
              f"{BOUND_S:g} s it is", file=sys.stderr, flush=True)
        return BOUND_S


guard = StopGuard()
os.register_at_fork(after_in_child=guard._forget)
