"""A run's lifecycle, the same on every backend: submit it, follow it to the end, summarise it.

`execute` = `submit` + `follow`. They are separate so that a sweep on a queueing backend (Slurm) can
submit every layout first and then follow each in turn.

`wait` is the one follow loop: it polls the backend (`Backend.poll`, more often at first, backing
off to the backend's `poll_interval_s`), lets it do its terminal work (`Backend.finish`) and records
how the run ended in launch.json. `stopping_runs` is the one interruption path: while runs are
submitted or followed, SIGINT, SIGTERM and SIGHUP all raise `Interrupted` (the Ctrl-C path), and
whatever leaves the block early - a signal or an error - cancels every run it holds that has not
ended, so nothing keeps running (or costing) behind the user's back.

A launcher owns the run directories it submits and follows (`owning`, scalelab/core/lock.py): a second
launcher of a live run is refused, and so is a resume while processes of an earlier launch still run
(`refuse_if_live`). A run started with `--detach` (`start_detached`) is followed by nobody: `settle`,
called by `launch status`, records its end once its processes are gone. docs/reliability.md says
what each interruption does.

When a run fails, the one-line message comes from the ranks' `error` records, never from log text;
without such records, the rank that stopped without a word is named, else the end of the logs shown.

A followed run whose ranks stop writing records (a hung rank: the others wait in its collective forever, and
Gloo's timeouts do not end a wait for a peer that never enters it) is ended by the follow loop after its stall
timeout (`stall_check`, --stall-timeout-min): through the one interruption path, as FAILED, with one line that
says how long no rank wrote anything and where each rank last was.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator


from scalelab.core.errors import RunCancelled, RunFailed, ScalelabError, shell_word
from scalelab.core.lock import RunBusy, RunLock, owner_of
from scalelab.core.records import error_messages, rank_files, read_errors
from scalelab.core.rundir import (
    CANCELLED,
    COMPLETED,
    FAILED,
    PENDING,
    RUNNING,
    TERMINAL,
    UNKNOWN,
    RunPaths,
    read_state,
    record_state,
    run_state,
    update_state,
    write_json,
)
from scalelab.core.spec import STALL_TIMEOUT_MIN, Spec, save_spec
from scalelab.core.terminal import make_console
from scalelab.core.trajectory import record_trajectory
from scalelab.core.writes import RunWriteError, WriteError, full_note, refuse_run_dir_links
from scalelab.launcher.backend import (
    STOP_NOW,
    Backend,
    RankEnd,
    RunStatus,
    has_checkpoint,
    no_checkpoint_advice,
    rank_ends,
    rank_tag,
    silent_ranks,
    stopped_on_a_signal,
)
from scalelab.launcher.pricing import fleet_rate

err_console = make_console(stderr=True)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
FIRST_POLL_S = 0.1     # the first polls come quickly (a short run, a fast failure), then back off
UNKNOWN_GRACE_S = 60.0  # a backend that cannot tell the state this long (a busy controller) ends the follow
INTERRUPTED = "interrupted; every process of the run was stopped"


class RunStalled(RunFailed):
    """The followed run wrote no record past its stall timeout (`stall_check`): raised inside `wait`, so that
    `stopping_runs` stops it (the cancel path: nothing is left running) as FAILED with this reason."""


class Interrupted(KeyboardInterrupt):
    """A stop signal reached the launcher while it held runs; the launcher exits 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.resume: Path | None = None  # what `launch resume` continues: the outermost directory owned

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


# ---- one owner per run directory ------------------------------------------------------------------


@contextmanager
def owning(run_dir: Path) -> Iterator[RunLock]:
    """Hold `run_dir` for this launcher (scalelab/core/lock.py): a second launcher of it is refused, a dead
    owner's lock is taken over. An interruption inside names the directory to resume."""
    try:
        with RunLock(run_dir) as lock:
            yield lock
    except Interrupted as exc:
        exc.resume = Path(run_dir)  # an outer owner (the sweep) overwrites it: it is what to resume
        raise


def refuse_if_live(backend: Backend, run_dir: Path) -> None:
    """Before new ranks start in `run_dir`: none of an earlier launch may still run (detached, or its
    launcher killed and the ranks not yet stopped), or two launches would write one directory."""
    if not RunPaths(run_dir).launch.exists():
        return
    live = backend.busy(run_dir)
    if live:
        raise RunBusy(f"{run_dir} is still running ({live}) with no launcher following it; stop it with "
                      f"`launch cancel {shell_word(run_dir)}` (its ranks checkpoint), then `launch resume {shell_word(run_dir)}`")


def detaching(backend: Backend) -> Backend:
    """The backend set to render and send requests for runs no launcher follows (`--detach`)."""
    if not backend.detachable:
        raise ScalelabError(f"--detach: runs of the {backend.name} backend are followed to their end by their "
                            "launcher (docs/reliability.md, Detached runs); run it without --detach")
    backend.detached = True
    return backend


# ---- submit ---------------------------------------------------------------------------------------


def submit(backend: Backend, spec: Spec, *run_dirs: Path) -> None:
    """Save the spec into the run directory and send exactly the request `--dry-run` prints.

    Several run directories: repeats of one spec, sent together where the backend can (a job array).
    """
    for run_dir in run_dirs:
        save_spec(spec, run_dir)
        record_trajectory(spec, run_dir)  # what the next `launch resume` compares its spec with
    launched = time.time()
    try:
        for request in backend.submit_dryrun_batch(spec, list(run_dirs)):
            backend.schedule(request)
    except RunBusy:  # refused because an earlier launch still runs: its state stays what it is
        raise
    except BaseException as exc:  # the backend removed what it had started; say how this launch ended
        for run_dir in run_dirs:
            if RunPaths(run_dir).launch.exists():
                state = CANCELLED if isinstance(exc, KeyboardInterrupt) else FAILED
                _try_write(lambda d=run_dir, e=exc: record_state(d, state, str(e) or repr(e)))  # keep the first error
        raise
    rate = fleet_rate(spec)  # `launch ls` shows the cost so far from it
    extra = {"usd_per_hour": rate} if rate is not None else {}
    if spec.steps is not None:  # what a later `launch resume` compares spec.json's steps with
        extra["launched_steps"] = spec.steps
    if spec.epochs is not None:  # and its epochs
        extra["launched_epochs"] = spec.epochs
    for run_dir in run_dirs:  # error records older than `launched` belong to an earlier launch
        update_state(run_dir, launched=launched, **extra)


# ---- the one interruption path ---------------------------------------------------------------------


@contextmanager
def _signals(handler: Callable[[int, object], None]) -> Iterator[None]:
    """`handler` for the stop signals inside the block, the previous handlers after (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach only the main thread; a follow loop in another thread is stopped by its caller
        return
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    lost = _LostInterrupts(sys.unraisablehook)
    sys.unraisablehook = lost.hook
    try:
        yield
    finally:
        try:
            signum = lost.close()
        finally:
            sys.unraisablehook = lost.previous
            for sig, old in previous.items():
                signal.signal(sig, old)
        if signum is not None:  # dropped, and the block ended before it came again: it stops the block's caller
            raise Interrupted(signum)


class _LostInterrupts:
    """An unraisablehook that sends a stop signal again when Python had to drop its `Interrupted`: the signal
    arrived while a garbage collector's callback ran (Dask's scheduler, in `launch prep`, keeps one), or a
    `__del__`, where an exception cannot propagate. Why: Ctrl-C of a prep was then lost (with an "Exception
    ignored" traceback) and the prep ran on. The signal comes again from a thread a moment later, so that it lands
    in ordinary code; never after `close` (the block's end), which hands back the one still to come. Other dropped
    exceptions go to the hook before."""

    def __init__(self, previous: Callable[[Any], object]) -> None:
        self.previous = previous
        self._lock = threading.Lock()
        self._pending: int | None = None
        self._closed = False

    def hook(self, unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, Interrupted):
            self.previous(unraisable)
            return
        with self._lock:
            self._pending = unraisable.exc_value.signum
        threading.Timer(0.01, self._send_again).start()

    def _send_again(self) -> None:
        with self._lock:
            if self._closed or self._pending is None:
                return
            signum, self._pending = self._pending, None
            os.kill(os.getpid(), signum)

    def close(self) -> int | None:
        """The signal that was dropped and not yet sent again, if any; none is sent after this."""
        with self._lock:
            self._closed = True
            signum, self._pending = self._pending, None
        return signum


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """Inside, SIGTERM and SIGHUP raise `Interrupted` as Ctrl-C does, for a command that holds no run a backend
    cancels (`launch prep`: the `with` blocks it is in close its Dask cluster and record why it stopped). Why:
    SIGTERM ended such a command at once, with no word, no record (its prep left INCOMPLETE) and multiprocessing's
    "leaked semaphore objects" warning; it now exits 143 as a stopped `launch run` does."""
    with _signals(_raise_interrupted):
        yield


def _keep_stopping(signum: int, frame: object) -> None:
    """A stop signal while the runs are stopped: the first one ends any wait for a checkpoint
    (STOP_NOW); the stop itself goes on, so that nothing is left running."""
    name = signal.Signals(signum).name
    if not STOP_NOW.is_set():
        STOP_NOW.set()
        print(f"launch: {name} again: not waiting for a checkpoint any longer; stopping everything of the run now "
              "(nothing is left running)", file=sys.stderr, flush=True)
    else:
        print(f"launch: {name} again: already stopping everything of the run without a checkpoint; a few seconds",
              file=sys.stderr, flush=True)


@contextmanager
def stopping_runs(backend: Backend, run_dirs: list[Path]) -> Iterator[list[Path]]:
    """While inside, the stop signals raise `Interrupted`; leaving early cancels the runs not ended.

    `run_dirs` may grow inside the block (a sweep adds each run as it submits it). A run is cancelled
    as CANCELLED after a signal, as FAILED (with the error) after any other exception.
    """
    with _signals(_raise_interrupted):
        try:
            yield run_dirs
        except BaseException as exc:
            STOP_NOW.clear()  # only a signal during this stop cuts its waits short
            done = _stopped_for(exc)  # stopped by an inner block already (`wait` inside `submitted`)
            with _signals(_keep_stopping):  # a second Ctrl-C must not leave half-cancelled cloud resources
                _stop_live(backend, [d for d in run_dirs if d not in done], exc)
            done.update(run_dirs)
            raise


def _stopped_for(exc: BaseException) -> set[Path]:
    """The run directories stopped already on the way of `exc` (kept on it, and on the exceptions it was
    raised from): an outer `stopping_runs` leaves them alone. Why: a run whose launch.json could not be
    written (a full disk) is not recorded as ended, so the outer block cancelled it a second time and said
    the same warning twice."""
    done: set[Path] = set()
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        one = stack.pop()
        if one is None or id(one) in seen:
            continue
        seen.add(id(one))
        done |= getattr(one, "_scalelab_stopped", set())
        stack += [one.__cause__, one.__context__]
    try:
        exc._scalelab_stopped = done  # type: ignore[attr-defined]
    except AttributeError:  # an exception type that takes no attributes: stopped again at worst
        pass
    return done


def _stop_live(backend: Backend, run_dirs: list[Path], exc: BaseException) -> None:
    state, detail = _why_stopped(exc)
    for run_dir in run_dirs:
        if run_dir in _ENDED_UNRECORDED:  # ended by itself (`wait`): nothing to stop, its end said once already
            continue
        try:
            if RunPaths(run_dir).launch.exists() and read_state(run_dir).get("state") not in TERMINAL:
                cancel(backend, run_dir, detail, state)
        except WriteError as problem:  # stopped, but its state could not be written: the message says so
            print(f"launch: warning: {problem}", file=sys.stderr, flush=True)
        except Exception as problem:  # noqa: BLE001 - cancel the others whatever this one says
            print(f"launch: warning: could not stop {run_dir} ({problem}); `launch cancel {shell_word(run_dir)}` retries",
                  file=sys.stderr, flush=True)


def _why_stopped(exc: BaseException) -> tuple[str, str]:
    """(state, detail) for the runs `_stop_live` stops on the way of `exc`: CANCELLED after a stop signal, and
    after the run followed was cancelled (`RunCancelled`: `launch cancel SWEEP` from another shell; the sweep
    launcher stops on the layout it follows, and the user asked for the others to stop too); FAILED, with the
    error, otherwise (a layout that failed while another was cancelled on its own leaves the rest FAILED).
    Why: the cancel of a followed sweep recorded its other layouts FAILED ("the launcher stopped following it")."""
    if isinstance(exc, RunStalled):  # the follow loop ended a run that stalled: why, in its own words
        return FAILED, exc.reason
    if isinstance(exc, KeyboardInterrupt):
        return CANCELLED, f"interrupted ({exc.args[0] if exc.args else 'SIGINT'} to the launcher)"
    if isinstance(exc, RunCancelled):  # the followed run was cancelled; one that failed leaves the others FAILED
        return CANCELLED, f"cancelled with the sweep: {exc.reason}"
    return FAILED, f"the launcher stopped following it: {str(exc) or repr(exc)}"


def cancel(backend: Backend, run_dir: Path, detail: str = "cancelled", state: str = CANCELLED) -> RunStatus:
    """Mark the run ended (so a launcher following it elsewhere takes it as cancelled), then stop it.

    The status returned carries what the backend checked ("stopped 3 processes; none left") when it says.
    The ranks are stopped even when launch.json cannot be written (a full or read-only disk): the
    write's error is raised after, saying that the run was stopped all the same. A run that had ended
    already is left as recorded (`_ended_already`): nothing was running, so nothing needs writing.
    """
    if read_state(run_dir).get("state") in TERMINAL:
        return _ended_already(backend, run_dir)
    asked = time.time()
    unrecorded = _try_write(lambda: record_state(run_dir, state, detail))
    checked = backend.cancel(run_dir)  # also for a run that ended: it frees whatever may be left
    fields = {"stopped": checked} if checked else {}
    fields["ended"] = time.time()  # when it had stopped, not when it was asked to
    done = _completed_first(run_dir, asked)
    if done:  # every rank had recorded its end: the records decide, not the cancel that came too late
        fields.update(state=COMPLETED, detail=done)
    unrecorded = unrecorded or _try_write(lambda: update_state(run_dir, **fields))
    if done and not unrecorded and not RunPaths(run_dir).summary.exists():
        unrecorded = _try_write(lambda: write_summary(run_dir))
    if unrecorded:
        raise WriteError(f"run {run_dir} was stopped ({checked or state}), but its state could not be recorded: "
                         f"{unrecorded}")
    info = read_state(run_dir)
    said = "; ".join(part for part in (done, checked) if part)
    return RunStatus(info.get("state", state), said or info.get("detail", ""))


# How far a rank's clock may run ahead of the launcher's (another node: NTP keeps them within milliseconds): an end
# recorded that little after the cancel was asked for still came first. A script's own save on the stop signal
# records an interrupted end anyway (scalelab/train/script.py's StopSignals), so this guards clocks only.
CLOCK_SLACK_S = 1.0


def _completed_first(run_dir: Path, asked: float) -> str:
    """How the run completed ('every rank recorded its end at step 400, before the cancel reached it') when,
    with its processes stopped, every rank of its launch had recorded a completed end (`ended_by_records`:
    no error, no silent rank, not stopped on a signal) before the cancel was asked for (`asked`); else ''.
    Why: a cancel of a detached run that had just run its last step recorded it CANCELLED, with no summary,
    over records that say it completed. Why only ends before `asked`: a script that handles the stop signal
    itself (saves and exits 0) or ignores it records a completed end after the cancel, and that run was
    recorded COMPLETED (`launch resume` then refused it); a stop the launcher asked for is a cancel."""
    from scalelab.launcher.backend import ended_by_records

    try:
        since = read_state(run_dir).get("launched")
        ended = ended_by_records(run_dir, since)
        ends = rank_ends(run_dir, since)
        clean = all(r.end and r.end.get("reason") != "failed" and r.end.get("exit_code") in (None, 0)
                    and float(r.end.get("time", asked)) < asked + CLOCK_SLACK_S  # ranks' clocks: NTP's
                    for r in ends)  # a script's `end` of a failure says so
    except (ScalelabError, OSError, TypeError, ValueError):  # records that cannot be read: the cancel stands
        return ""
    return f"{ended.detail}, before the cancel reached it" if ended and ended.state == COMPLETED and clean else ""


def _ended_already(backend: Backend, run_dir: Path) -> RunStatus:
    """`launch cancel` of a run recorded as ended: its backend still frees whatever may be left (a stray
    process, a cloud resource), but launch.json keeps how the run ended and is not written, so that a
    completed run in a read-only runs directory is no error."""
    checked = backend.cancel(run_dir)
    info = read_state(run_dir)
    return RunStatus(info.get("state", UNKNOWN), "it had ended already" + _left_over(checked))


def _left_over(checked: object) -> str:
    """What a cancel of an ended run found, after 'it had ended already': "nothing to stop" only where the backend
    stopped nothing (None, or its words begin with "no ...": the local backend's "no process of the run was
    running"). Why: an AWS run recorded ended whose instance still ran was terminated by the cancel, which then
    said "nothing to stop"."""
    if not checked or str(checked).startswith("no "):
        return "; nothing to stop" + (f" ({checked})" if checked else "")
    return f", but not all of it had stopped: {checked}"


def _try_write(write: Callable[[], object]) -> WriteError | None:
    """Run a state write; its WriteError (full or read-only disk) returned instead of raised, so that
    stopping the run goes on."""
    try:
        write()
    except WriteError as exc:
        return exc
    return None


# ---- the one follow loop --------------------------------------------------------------------------

# Runs this launcher saw end (every process gone) whose end launch.json could not take (a full disk): the
# error raised after (`failure`) must not cancel them again and say "was stopped, but its state could not be
# recorded" a second time, of a run that had stopped by itself.
_ENDED_UNRECORDED: set[Path] = set()


def wait(backend: Backend, run_dir: Path, on_tick: Callable[[], None] | None = None,
         stall: Callable[[], str | None] | None = None) -> RunStatus:
    """Follow one run until it ends, let the backend finish it, record the end; return how it ended.

    A signal or an error on the way cancels the run (`stopping_runs`) and propagates; so does a stall (`stall`,
    asked after every poll of a running run: why to end it, or None), as a FAILED run.
    """
    _ENDED_UNRECORDED.discard(run_dir)
    try:
        with stopping_runs(backend, [run_dir]):
            status = ended_as_recorded(run_dir, backend.finish(run_dir, _until_end(backend, run_dir, on_tick, stall)))
            unrecorded = _try_write(lambda: record_state(run_dir, status.state, status.detail))
    except RunStalled as exc:  # stopped by `stopping_runs`: what it stopped, and what continues the run
        stopped = read_state(run_dir).get("stopped")
        said = exc.reason + (f"; {stopped}" if stopped else "")
        raise kept(run_dir, RunFailed(f"run {run_dir} failed: {said}" + resume_hint(run_dir), exc.reason)) from None
    except RunFailed:
        raise
    except WriteError as exc:  # stopped (`stopping_runs`) after it had started: a failed run, exit 1
        raise RunWriteError(str(exc)) from exc
    if unrecorded:  # it ended by itself: nothing to stop; only its end is not written (a full disk)
        _ENDED_UNRECORDED.add(run_dir)
        print(f"launch: warning: run {run_dir} ended ({status.state}), but its end could not be recorded: {unrecorded}; "
              f"`launch status {shell_word(run_dir)}` records it once there is room", file=sys.stderr, flush=True)
        return status
    info = read_state(run_dir)
    return RunStatus(info["state"], info.get("detail", ""))


def ended_as_recorded(run_dir: Path, status: RunStatus) -> RunStatus:
    """`status`, or CANCELLED where the backend saw a failure but every rank recorded that it stopped cleanly
    on a stop signal (one rank signalled: torchrun and horovodrun call their ranks' exit 143 a crash).
    The records decide, never the exit code or the log text."""
    if status.state != FAILED:
        return status
    return stopped_on_a_signal(run_dir, read_state(run_dir).get("launched")) or status


def _until_end(backend: Backend, run_dir: Path, on_tick: Callable[[], None] | None,
               stall: Callable[[], str | None] | None = None) -> RunStatus:
    delay, last, unknown_since = min(FIRST_POLL_S, backend.poll_interval_s), PENDING, None
    while True:
        status = backend.poll(run_dir)
        if on_tick:
            on_tick()
        if status.state == RUNNING and stall is not None and (why := stall()):  # not while it waits in a queue
            raise RunStalled(why)
        recorded = read_state(run_dir).get("state")
        if status.state in TERMINAL:
            return status if recorded not in TERMINAL else RunStatus(recorded, status.detail)
        if status.state == UNKNOWN:  # gone or not answering: ended elsewhere (`launch cancel`), or give up
            unknown_since = unknown_since or time.monotonic()
            if recorded in TERMINAL:
                return RunStatus(recorded, status.detail)
            if time.monotonic() - unknown_since > UNKNOWN_GRACE_S:
                return RunStatus(UNKNOWN, f"no state for {UNKNOWN_GRACE_S:.0f} s: {status.detail}")
        else:
            unknown_since = None
            if status.state != last:  # PENDING -> RUNNING: recorded for `launch status`, polled quickly again
                record_state(run_dir, status.state, status.detail)
                last, delay = status.state, min(FIRST_POLL_S, backend.poll_interval_s)
        time.sleep(delay)
        delay = min(delay * 2, backend.poll_interval_s)


def follow(backend: Backend, spec: Spec, run_dir: Path, label: str | None = None,
           echo: tuple[frozenset[int], dict[str, int]] | None = None):
    """Show progress until the run ends; one clear error if it did not complete; else its summary. `echo`: the
    ranks whose output to show as it comes (`launcher.echo`) and the run directory's file sizes before the launch."""
    from scalelab.launcher.echo import RankEcho
    from scalelab.launcher.progress import RunProgress

    with RunProgress(run_dir, spec.steps, label or run_dir.name, err_console, epochs=spec.epochs) as progress:
        ranks, before = echo or (frozenset(), {})
        lines = RankEcho(backend, run_dir, ranks, before, progress.write_above)

        def tick() -> None:
            progress.poll()
            lines.tick()

        try:
            status = wait(backend, run_dir, on_tick=tick, stall=stall_check(spec, progress.watch))
        finally:
            lines.close()  # what the ranks wrote last (a traceback) before the error that quotes it
    if status.state == CANCELLED:
        raise RunCancelled(cancelled_line(run_dir))
    if status.state != COMPLETED:
        raise kept(run_dir, failure(backend, run_dir, status))
    return summary_of_completed(run_dir)


def stall_timeout_s(spec: Spec) -> float | None:
    """The run's stall timeout in seconds (--stall-timeout-min), None where it has none. Not given: the built-in
    trainer's STALL_TIMEOUT_MIN (it records every step; its validations and checkpoints take minutes at most); off
    for a --script / --module, which may evaluate, preprocess or upload for hours between two `track.step` calls
    (or record no steps at all): only its user knows how long its silences may be."""
    minutes = spec.stall_timeout_min
    if minutes is None:
        minutes = 0.0 if spec.own_code else STALL_TIMEOUT_MIN
    return minutes * 60.0 if minutes else None


def stall_check(spec: Spec, watch) -> Callable[[], str | None] | None:
    """For `wait`: why to end the run now (no rank of it wrote a record for its stall timeout, and for at least
    STALL_FACTOR times its median step time, once it had stepped), else None; None without a stall timeout.
    `watch` is the progress view's RunWatch (launcher/progress.py), polled on every tick before this is asked."""
    limit = stall_timeout_s(spec)
    if limit is None:
        return None

    def check() -> str | None:
        silent = watch.silence()
        if silent is None or silent < watch.stall_after_s(limit):
            return None
        return (f"{watch.stall_line(silent)}: stalled past its stall timeout (--stall-timeout-min "
                f"{limit / 60:g}), so the launcher stopped it")

    return check


def summary_of_completed(run_dir: Path):
    """`write_summary`, where a full or read-only disk is a failed launch (exit 1) that says the run itself
    completed and how to get its summary: its records are whole, `launch report` reads them and `launch status`
    writes summary.json once there is room. Why: it was a refusal's exit 2 and a bare "cannot write" line, as if
    the run had not started."""
    try:
        return write_summary(run_dir)
    except WriteError as exc:
        run = shell_word(run_dir)
        raise RunWriteError(f"run {run_dir} completed, but its summary could not be written: {exc}. Its records "
                            f"are whole: `launch report {run}` shows its figures now, and `launch status {run}` "
                            "writes the summary once there is room") from exc


def kept(run_dir: Path, error: ScalelabError) -> ScalelabError:
    """`error`, why the run failed kept in launch.json (`error`: RunFailed's reason, without the run it names)
    where it is one line (not the tail of the logs): what `launch report` quotes of a run that failed before it
    recorded a step, where its ranks recorded no error of their own (a rank killed by a signal). A launch.json
    that cannot be written leaves the error raised as it is."""
    reason = error.reason if isinstance(error, RunFailed) else str(error)
    if "\n" not in reason:
        _try_write(lambda: update_state(run_dir, error=reason))
    return error


def cancelled_line(run_dir: Path) -> str:
    """What a followed run that was cancelled says: who stopped it and where (`stop_line`), or else whether a
    checkpoint continues it. Why: a cancel that cut the run's first checkpoint write was told "`launch resume`
    continues it from its last checkpoint", with none saved."""
    stopped = stopped_on_a_signal(run_dir, read_state(run_dir).get("launched"))
    if stopped:
        return f"run {run_dir} was cancelled: {stopped.detail}"
    if has_checkpoint(run_dir):
        return f"run {run_dir} was cancelled; `launch resume {shell_word(run_dir)}` continues it from its last checkpoint"
    return f"run {run_dir} was cancelled; " + no_checkpoint_advice(run_dir)


def write_summary(run_dir: Path):
    """summary.json of a completed run, from its records; the summary."""
    from scalelab.analysis.results import summary_or_facts

    summary = summary_or_facts(run_dir)  # a --script run with nothing measured: its wall time, exit status, a note
    write_json(RunPaths(run_dir).summary, summary if isinstance(summary, dict) else summary.to_dict())
    return summary


def settle(backend: Backend, run_dir: Path) -> RunStatus:
    """The run's state now, as `launch status` shows it. A run that ended with no launcher following it
    (detached, or its launcher was killed) gets its end recorded here, and its summary if it completed.

    A recorded end that no launcher holds is returned before the backend is asked: an ended run's state cannot
    change, and it is the launcher's judgement from the ranks' records (cancelled: rank 1 got SIGTERM), not the
    scheduler's word for the same end (Slurm's FAILED for a job whose rank exited 143). Why first: with Slurm
    unreachable, `launch status` of a COMPLETED run printed sacct's errors and "UNKNOWN" after 37 s. A run a
    launcher holds (a resume sending it again, a cancel stopping it) is the scheduler's to say."""
    info = read_state(run_dir)
    owned = owner_of(run_dir)
    if info.get("state") in TERMINAL and not owned:
        if info["state"] == COMPLETED and not RunPaths(run_dir).summary.exists():
            _summary_if_possible(run_dir)
        return RunStatus(info["state"], info.get("detail", ""))
    status = backend.status(run_dir)
    if status.state in TERMINAL and info.get("state") in TERMINAL:  # held, and ended as recorded
        return RunStatus(info["state"], info.get("detail") or status.detail)
    if status.state not in TERMINAL or owned:
        return status
    detail, why = _why_it_failed(backend, run_dir, status) if status.state == FAILED else (status.detail, {})
    ended = record_state(run_dir, status.state, detail, **why)
    if ended == COMPLETED and not RunPaths(run_dir).summary.exists():
        write_summary(run_dir)
    return RunStatus(ended, read_state(run_dir).get("detail", ""))


def _why_it_failed(backend: Backend, run_dir: Path, status: RunStatus) -> tuple[str, dict[str, str]]:
    """(detail, launch.json fields) of a FAILED end nobody followed: the scheduler's word, then why, in the words a
    followed run's error says (`failure`: the ranks' error records, else the rank that went silent), and how to
    continue; `error` keeps why for `launch report`. Why: `launch status` of a detached (or killed-launcher) run
    said only "Slurm job 2434 FAILED on node1" while its rank had recorded that no requeue was left and how to resume."""
    try:
        error = failure(backend, run_dir, status)
    except (ScalelabError, OSError):  # records or logs unreadable: the scheduler's word alone
        return status.detail, {}
    reason = error.reason if isinstance(error, RunFailed) else str(error)
    if "\n" in reason:  # only the tail of its logs says why: pointed to, not copied into launch.json
        return f"{status.detail}; `launch logs {shell_word(run_dir)}` shows why", {}
    detail = status.detail if reason in status.detail else f"{status.detail}: {reason}"  # the local backend's has it
    hint = "" if "launch resume" in detail else resume_hint(run_dir)
    return detail + hint, {"error": reason}


def _summary_if_possible(run_dir: Path) -> None:
    """summary.json of a run recorded COMPLETED whose launcher could not write it (`summary_of_completed`: the
    disk was full). Where it still cannot be written, or its records cannot be summarised, the run's state is
    shown all the same: `launch report` says what is wrong with its records."""
    try:
        write_summary(run_dir)
    except ScalelabError:
        pass


def failure(backend: Backend, run_dir: Path, status: RunStatus) -> ScalelabError:
    """The error for a run that did not complete (`RunFailed`, exit 1): its ranks' own words; else which
    rank stopped without a word (killed, by the signal its exit status names); else the end of its logs.

    Which rank went silent is read from facts, not from the agents' dumps: the rank's `start` record (the
    script's runner and the trainer write one before any user code runs) without an `end` or `error` after it,
    and its exit status as the local backend recorded it (`rank_exits` in launch.json: the one place log text is
    read, torchrun's documented failure summary or horovodrun's `Process R exit with status code N.` line)."""
    since = read_state(run_dir).get("launched")
    errors = sorted(read_errors(run_dir, since=since), key=lambda rec: float(rec.get("time", 0)))
    # a rank's own error first: the errors of ranks whose collective failed because a peer was gone come
    # after the silence of a killed rank (issue #37: not torchrun's or horovodrun's dump, not the echo)
    said = "; ".join(error_messages(rec for rec in errors if not rec.get("peer_lost")))
    if said:
        return RunFailed(said + f" (run directory {run_dir})" + resume_hint(run_dir), said)
    full = full_note(run_dir)
    if full:  # its ranks could not write their error records either; it had started: exit 1
        why = f"{full}; free space there"
        return RunWriteError(f"run {run_dir} {status.state.lower()} ({status.detail}): {why}, then `launch resume "
                             f"{shell_word(run_dir)}` (or run with --runs-dir on a filesystem with room)", why)
    failed = f"run {run_dir} {status.state.lower()} ({status.detail})"
    silent, logs = _silence(backend, run_dir, rank_ends(run_dir, since))
    if silent:  # it names the silent rank and its status; the detail's list would name the peer that lost it too
        return RunFailed(f"run {run_dir} {status.state.lower()}: {silent}", silent)
    if errors:  # only ranks that lost a peer said something
        said = "; ".join(error_messages(errors))
        return RunFailed(said + f" (run directory {run_dir})" + resume_hint(run_dir), said)
    logs = backend.logs(run_dir) if logs is None else logs
    aborted = native_abort(logs)
    if aborted:  # a rank's C++ library gave up (Gloo's rendezvous, a CUDA error): its words, not the agent's dump
        aborted += f" (its full logs: `launch logs {shell_word(run_dir)}`)"
        return RunFailed(f"{failed}: {aborted}" + resume_hint(run_dir), aborted)
    return RunFailed(f"{failed}; last lines of its logs:\n" + tail(logs, 25))


def _silence(backend: Backend, run_dir: Path, ranks: list[RankEnd]) -> tuple[str | None, str | None]:
    """(the line on the ranks that stopped without a word, the logs where they were read): of a run whose ranks
    trained; of one with no step, where a rank that wrote its `start` record then went silent (a --script that
    records no steps, killed by SIGKILL), unless a rank's C++ library said why it aborted (its words say more than
    SIGABRT). Why: such a rank's run ended in the last 25 lines of torchrun's ChildFailedError dump. A rank that
    never started (a rendezvous that failed, an import error) is left to the logs, which hold its traceback."""
    if any(r.last_step for r in ranks):
        return silent_ranks(run_dir, ranks), None
    if not any(r.end is None and not r.errors for r in ranks):
        return None, None
    logs = backend.logs(run_dir)
    return (None if native_abort(logs) else silent_ranks(run_dir, ranks)), logs


def nothing_to_resume(run_dir: Path, spec: Spec) -> str:
    """Why `launch resume` of RUN_DIR has nothing to do ('' when it has): the run is recorded COMPLETED
    and its spec asks for no step beyond those it was launched for. Why before anything: resuming it
    started the ranks only to stop them, and anything failing on the way (a damaged checkpoint) recorded
    the finished run FAILED; a run that stopped at its loss threshold, or whose records cannot be read,
    was run again from its first step. A spec whose `steps` were raised since (spec.json edited) resumes,
    its checkpoint read here first, so that an unreadable or missing one is refused before the run's
    state or files change."""
    if run_state(run_dir) != COMPLETED:
        return ""
    step, reason = _script_end(run_dir) if spec.own_code else completed_end(run_dir)
    if spec.own_code:  # the script decides its own length: a resume would only run it again, from its start
        ended = _how_it_ended(step, reason) if reason == "threshold" else f"{spec.script_label} ran to its end"
        return (f"run {run_dir} is COMPLETED already ({ended}); nothing to resume, nothing "
                f"changed: `launch report {shell_word(run_dir)}` reports it. Its script decides its own length: to train "
                f"longer, run it again with its own arguments (`launch run {'--script' if spec.script else '--module'} "
                f"{shell_word(spec.script_label)} ... -- ARGS`), a new run")
    if _steps_raised(run_dir, spec, step, reason):
        _checkpoint_to_continue(run_dir, step)
        return ""
    return (f"run {run_dir} is COMPLETED already ({_how_it_ended(step, reason)}); nothing to resume, nothing "
            f"changed: `launch report {shell_word(run_dir)}` reports it" + ("" if reason == "threshold" else
            f"; to train it longer, raise `{'epochs' if reason == 'epochs' else 'steps'}` in its spec.json, then "
            f"`launch resume {shell_word(run_dir)}`"))


def completed_end(run_dir: Path) -> tuple[int, str]:
    """(last step, why it ended: steps, epochs, threshold, completed) of a COMPLETED run, from rank 0's
    records of its last launch. Read strictly: a damaged or missing rank-0.jsonl is one error naming it,
    never 0 steps done (which resumed the finished run from its first step)."""
    from scalelab.core.records import read_records

    path = RunPaths(run_dir).records / "rank-0.jsonl"
    try:
        ends = [r for r in read_records(path, []) if r.get("kind") == "event" and r.get("event") == "end"]
    except (ScalelabError, OSError) as exc:
        ends, problem = [], str(exc)
    else:
        problem = "it holds no `end` record of the run"
    if not ends or not isinstance(ends[-1].get("step"), int):
        raise ScalelabError(f"run {run_dir} is COMPLETED, but its records {path} are damaged ({problem}): how "
                            "far it ran cannot be told, so nothing was resumed (it would run every step again); "
                            "restore that file, or start a new run")
    return ends[-1]["step"], str(ends[-1].get("reason") or "")


def _script_end(run_dir: Path) -> tuple[int, str]:
    """`completed_end` of a --script / --module run, where a missing end record is no damage: a script that
    ended past the runner (os._exit(0), a launcher that exits the process itself) leaves none, and the script
    decides its own length, so COMPLETED is its end (0, ''); a resume runs nothing either way."""
    try:
        return completed_end(run_dir)
    except ScalelabError:
        return 0, ""


def _how_it_ended(step: int, reason: str) -> str:
    return f"threshold reached at step {step}" if reason == "threshold" else f"{step} steps ran"


def _steps_raised(run_dir: Path, spec: Spec, step: int, reason: str) -> bool:
    """Whether spec.json asks for more steps than the run was launched for (`launched_steps` in launch.json,
    recorded by `submit`). A run launched before that record: more than it ran, unless it stopped at its
    loss threshold (it ran fewer than asked, and that was its end)."""
    if spec.epochs is not None:
        return _epochs_raised(read_state(run_dir), spec, step, reason)
    if spec.steps is None:
        return False
    asked = read_state(run_dir).get("launched_steps")
    if isinstance(asked, int) and not isinstance(asked, bool):
        return spec.steps > asked
    return reason != "threshold" and spec.steps > step


def _epochs_raised(state: dict, spec: Spec, step: int, reason: str) -> bool:
    """`_steps_raised` of a run of --epochs: the bound that ended it raised since its launch (its epochs over
    `launched_epochs`; its steps over `launched_steps`, or dropped; at a threshold either), and no --steps that
    ends it where it stopped. A run launched before its epochs were recorded: never (how far they reach is not
    known here), as before."""
    epochs, steps = state.get("launched_epochs"), state.get("launched_steps")
    if not isinstance(epochs, int) or isinstance(epochs, bool) or (spec.steps is not None and spec.steps <= step):
        return False
    more_epochs = spec.epochs > epochs
    more_steps = isinstance(steps, int) and (spec.steps is None or spec.steps > steps)
    return {"epochs": more_epochs, "steps": more_steps}.get(reason, more_epochs or more_steps)


def _checkpoint_to_continue(run_dir: Path, step: int) -> None:
    """Refuse (one line, before anything is written) a resume of a completed run that has no readable
    checkpoint of its end: without one its ranks would start again from step 1, with an older one (saved
    on an interruption, the run then resumed to its end without --checkpoint-every) they would train the
    steps after it again; either appends steps it already has to its records."""
    from scalelab.train.checkpoint import read_checkpoint

    ckpt = read_checkpoint(run_dir)  # CheckpointError, one line, when it is damaged
    if ckpt is None:
        raise ScalelabError(f"run {run_dir} is COMPLETED ({step} steps ran) and has no checkpoint to continue "
                            "from (it ran without --checkpoint-every), so raising its `steps` cannot train it "
                            "longer; start a new run with the steps you want")
    saved = ckpt.get("step") if isinstance(ckpt, dict) else None
    if saved != step:  # e.g. saved on an interruption at step k, then resumed to its end without --checkpoint-every
        raise ScalelabError(f"run {run_dir} is COMPLETED ({step} steps ran), but its checkpoint is of step {saved}, "
                            f"not of its end: going on from it would train steps after {saved} a second time and "
                            "append them to its records, so nothing was resumed; start a new run with the steps "
                            "you want (with --checkpoint-every, a run keeps a checkpoint of its end)")


def refuse_restart(backend: Backend, run_dir: Path, spec: Spec) -> None:
    """Refuse (one line, before anything is written) a resume of a built-in trainer run that recorded steps but
    has no checkpoint (deleted, as the message of a damaged one suggests, or never saved): its ranks would train
    from step 1 again and append those steps to its records a second time, which its reports then count twice.
    A --script keeps its own checkpoints, and a remote backend keeps the run's elsewhere: not checked; nor a run
    that may still be going (its checkpoint may come): the refusal of a live run names what to stop first."""
    if spec.own_code or not backend.checkpoint_here or run_state(run_dir) not in (FAILED, CANCELLED):
        return
    ckpt = RunPaths(run_dir).checkpoint
    if ckpt.is_symlink():
        return  # refused with its own message before anything is written (`refuse_run_dir_links`)
    if os.path.lexists(ckpt):
        _refuse_damaged(run_dir, ckpt)
        return
    steps = recorded_steps(run_dir)
    if steps:
        raise ScalelabError(f"run {run_dir} recorded {steps} step(s) but has no checkpoint ({ckpt} is missing): a "
                            "resume would train from step 1 again and add those steps to its records a second time, "
                            f"so nothing was resumed; start a new run of the same spec instead: launch run --spec "
                            f"{shell_word(RunPaths(run_dir).spec)}")


MODEL_FIELDS = ("model", "model_args", "rnn")  # the --allow-changed fields that can change the model's tensors


def refuse_model_change(run_dir: Path, spec: Spec, changed: dict[str, list[Any]]) -> None:
    """Refuse (one line, before anything is written or started) a resume whose allowed changes (`check_resume`:
    field -> [before, now]) give the model other tensors than the checkpoint holds: `--allow-changed model_args`
    with another hidden size. Why here: the ranks found it after they had started, the run went from CANCELLED
    to FAILED, their message was a line per tensor, and its advice (delete the checkpoint) was refused next. The
    models before and after are built on PyTorch's meta device and compared; a change that keeps every shape
    (another dropout) goes ahead."""
    fields = [k for k in MODEL_FIELDS if k in changed]
    ckpt = RunPaths(run_dir).checkpoint
    if not fields or spec.own_code or not ckpt.is_file():
        return
    from scalelab.train.checkpoint import model_shapes, shape_changes
    from scalelab.train.models import PRESETS

    now = {"model": spec.model, "model_args": spec.model_args, "rnn": spec.rnn}
    before = {**now, **{k: changed[k][0] for k in fields}}
    if before["model"] not in PRESETS or not isinstance(before["model_args"], dict):
        return  # not a model this version builds: the ranks' own check says what does not fit
    differ = shape_changes(model_shapes(**before), model_shapes(**now))
    if differ:
        what = "; ".join(f"{k} {changed[k][0]!r} -> {changed[k][1]!r}" for k in fields)
        spec_file = shell_word(RunPaths(run_dir).spec)
        raise ScalelabError(f"run {run_dir} cannot continue from its checkpoint with {what}: the checkpoint holds the "
                            f"model as it was, and {differ}; nothing was started or changed. Put the value"
                            f"{'s' if len(fields) > 1 else ''} back in {spec_file} to resume, or train the new model "
                            f"as a new run: launch run --spec {spec_file}")


def _refuse_damaged(run_dir: Path, ckpt: Path) -> None:
    """Refuse (one line, nothing started or written) a resume from a checkpoint that is no checkpoint: damaged,
    cut, or a directory. Why here: the ranks found it only after they had started, the run's state went from
    CANCELLED to FAILED, and their advice ("delete it to start from scratch") led to the refusal above."""
    from scalelab.train.checkpoint import checkpoint_problem, new_run_advice

    problem = checkpoint_problem(ckpt)
    if problem:
        raise ScalelabError(f"checkpoint {ckpt} {problem}, so run {run_dir} was not resumed (nothing was started or "
                            f"changed): restore it from a copy, then `launch resume {shell_word(run_dir)}`; or "
                            f"{new_run_advice(run_dir)}")


def recorded_steps(run_dir: Path) -> int:
    """How many step records rank 0 wrote (damaged lines skipped: this counts, it does not judge)."""
    from scalelab.core.records import read_records

    path = RunPaths(run_dir).records / "rank-0.jsonl"
    if not path.is_file():
        return 0
    return sum(1 for r in read_records(path, [], tolerant=True) if r.get("kind") == "step")


def resume_hint(run_dir: Path) -> str:
    """'; `launch resume RUN` continues it from its checkpoint' when the run has one to continue from."""
    if RunPaths(run_dir).checkpoint.exists():
        return f"; `launch resume {shell_word(run_dir)}` continues it from its last checkpoint once that is fixed"
    return ""


def execute(backend: Backend, spec: Spec, run_dir: Path, label: str | None = None,
            echo: frozenset[int] = frozenset()):
    """Own the run directory, submit one run and follow it, showing the output of the ranks in `echo`; a stop
    signal at any point cancels it."""
    from scalelab.launcher.echo import sizes_before

    before = sizes_before(run_dir) if echo else {}  # a resume shows only what its own launch writes
    with submitted(backend, spec, run_dir):
        return follow(backend, spec, run_dir, label, (echo, before))


def start_detached(backend: Backend, spec: Spec, run_dir: Path) -> None:
    """Submit one run that no launcher follows (`--detach`): its ranks do not watch this process, which
    returns at once; `launch status` finds them and, once they have ended, records how."""
    detaching(backend)
    with submitted(backend, spec, run_dir):
        pass


@contextmanager
def submitted(backend: Backend, spec: Spec, run_dir: Path) -> Iterator[None]:
    """Inside: the run directory owned, no earlier launch of it running, the run submitted and held
    (a stop signal or an error inside cancels it)."""
    with owning(run_dir):
        refuse_if_live(backend, run_dir)  # before `stopping_runs`, which would cancel what it refuses
        refuse_run_dir_links(run_dir)  # every backend: no write of this launch may follow a planted link
        rank_files(run_dir)  # a resume onto a stray or directory rank file is refused before any rank starts
        with stopping_runs(backend, [run_dir]):
            submit(backend, spec, run_dir)
            yield


_THROWN = re.compile(r"terminate called after throwing an instance of '(?P<type>[^']+)'")
_WHAT = re.compile(r"what\(\):\s*(?P<what>.*)$")


def native_abort(logs: str) -> str:
    """'rank 1 aborted: gloo::IoException: ...' for the first rank whose C++ code threw past its thread and
    aborted (exit 134) in these logs; '' when none did. The rank is the starter's tag on the line
    (`backend.rank_tag`); its `what():` line is the next one with the same tag (ranks aborting together
    interleave their lines); untagged lines name no rank."""
    lines = logs.splitlines()
    for i, line in enumerate(lines):
        thrown = _THROWN.search(line)
        if not thrown:
            continue
        tag = rank_tag(line[:thrown.start()])
        what = next((m["what"] for later in lines[i + 1:i + 12]
                     if (m := _WHAT.search(later)) and rank_tag(later[:m.start()]) == tag), "")
        what = re.sub(r"\[[^\]\s]*\.(?:cc|cpp|h):\d+\]\s*", "", what).strip()  # its source file, once or twice
        rank, local = tag
        who = f"rank {rank}" if rank is not None else f"local rank {local}" if local is not None else "a rank"
        return f"{who} aborted: {thrown['type']}" + (f": {what}" if what else "")
    return ""


def tail(text: str, n: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])
