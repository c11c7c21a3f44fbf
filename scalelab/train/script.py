"""`python -m scalelab.train.script RUN_DIR`: a rank that runs the user's own code (`launch --script/--module`).

Every backend starts this where it would start the built-in trainer (`python -m scalelab.train RUN_DIR`),
under the same starter (scalelab/core/launch.py: one process, torchrun's environment, horovodrun), so
the script finds what it expects: `init_process_group()` reads RANK, WORLD_SIZE, MASTER_ADDR...;
`hvd.init()` reads Horovod's. This runner, in the same process as the script:

1. writes the rank's `start` record (the script's name as the model, the engine, the layout, the
   machine), or a `resume` event when the run directory already holds this rank's records;
2. activates `scalelab.track` (scalelab/train/track.py) so the script's calls record into RUN_DIR;
3. handles SIGTERM/SIGUSR1/SIGINT and the launcher watch (the launcher killed, even by SIGKILL): a script that
   asks `track.should_stop()` gets True and stops itself; one that never asks is ended at once (143). The
   signalled rank leaves a note (RUN_DIR/records/stop-rank-R.json) for its peers: a rank that got no signal
   and left through the script's stop agreement records, as the built-in trainer's peers do, that it was
   interrupted (no signal of its own) and exits 143, so every rank's `end` says the same and the launcher
   reads a signal to one rank as a stop of the run (CANCELLED), not a crash. A script's own handler of a stop
   signal is called by the runner's, which stays installed and records the stop first (`StopSignals`); the
   same stop signal again within REPEAT_S is swallowed;
4. runs the script as `__main__` (runpy: `python train.py ARGS`, or `python -m MODULE ARGS`), its folder
   first on sys.path, its arguments in sys.argv;
5. records how it ended (`end` event: reason, exit status, wall time) and, for a failure, one `error`
   record the launcher shows as the run's one line (the traceback stays in the rank's log); a stop signal
   that arrives once the script has returned (torchrun stopping the ranks left after a peer exited 143) no
   longer cuts that short;
6. joins the script's non-daemon threads, runs its atexit handlers and flushes the files it left open
   (`end_as_python_would`; children still running past the limit are ended), then leaves without the
   interpreter's teardown, as the trainer does.

No PyTorch is imported here: the script imports what it uses.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from scalelab.core.errors import ScalelabError, shell_word
from scalelab.core.procs import LAUNCHER_ENV, started_at, watched
from scalelab.core.provenance import machine, software, version
from scalelab.core.records import (RecordWriter, gave_up_records, lost_a_peer, rank_from_env, read_records,
                                   record_error, records_path)
from scalelab.core.spec import Spec, read_spec
from scalelab.train import track

SCRIPT_DIR_ENV = "SCALELAB_SCRIPT_DIR"  # where the script's folder is on this node, when not where it was launched
RESUME_ENV = "SCALELAB_TRACK_RESUME"  # STEP:SECONDS of the launches before, where their records are elsewhere (AWS)
INTERRUPTED = 143
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)  # as the built-in trainer's (scalelab/train/loop.py)
WATCH_EVERY_S = 2.0  # as the built-in trainer's launcher watch (scalelab/train/loop.py)
WATCH_GRACE_S = 25.0
_STOP_NUMBERS = frozenset(int(s) for s in STOP_SIGNALS)
REPEAT_S = 5.0  # a stop signal again within this of its first is the same stop (`StopSignals`)


def target(spec: Spec) -> tuple[Path, str]:
    """(the folder put first on sys.path, the script's path or the module's name) on this node."""
    folder = Path(os.environ.get(SCRIPT_DIR_ENV) or spec.script_dir or os.getcwd())
    if spec.script:
        script = Path(spec.script)
        inside = script.relative_to(spec.script_dir) if spec.script_dir and script.is_absolute() else Path(script.name)
        return folder, str(folder / inside)
    return folder, str(spec.module)


def previous_steps(run_dir: Path, rank: int) -> tuple[int, float, bool]:
    """(last step, training seconds, whether there were records) of this rank's earlier launches: from its records
    here, or, where they are not (a fresh AWS instance continuing a run), as RESUME_ENV says (`STEP:SECONDS`)."""
    path = records_path(run_dir, rank)
    if not path.exists():
        said = os.environ.get(RESUME_ENV, "").split(":")
        if len(said) == 2 and said[0].isdigit():
            return int(said[0]), float(said[1] or 0), True
        return 0, 0.0, False
    recs = read_records(path, [], tolerant=True)
    steps = [r for r in recs if r["kind"] == "step"]
    ends = [r for r in recs if r.get("event") == "end" and isinstance(r.get("elapsed_s"), (int, float))]
    elapsed = float(ends[-1]["elapsed_s"]) if ends else sum(float(r["step_s"]) for r in steps[1:])
    return (steps[-1]["step"] if steps else 0), elapsed, True


def start_records(run_dir: Path, spec: Spec, rank: int, world: int) -> tuple[RecordWriter, int, float]:
    """This rank's writer with its `start` record (and `resume` event); the step and time it continues from."""
    last, elapsed, before = previous_steps(run_dir, rank)
    out = RecordWriter(run_dir, rank, world)
    env = os.environ
    local = env.get("LOCAL_RANK") or env.get("HOROVOD_LOCAL_RANK") or "0"
    ran = target(spec)[1] if spec.script else None  # the path on this node (a pod's mount, an instance's copy)
    out.write("start", run_id=Path(run_dir).name, model=spec.script_label, script=ran, module=spec.module,
              script_args=list(spec.script_args), engine=spec.engine.name, nodes=spec.nodes,
              gpus_per_node=spec.gpus_per_node, local_rank=int(local) if local.isdigit() else 0,
              resumed_from_step=last if before else None, unit=track._unit,
              **machine(None), **(software(version("torch") or "") if rank == 0 else {}))
    if before:
        out.event("resume", step=last)
    return out, last, elapsed


RUN_ID_ENV = "TORCHELASTIC_RUN_ID"  # torchrun's run id, which scripts name their output folders by


def set_run_id(spec: Spec, run_dir: Path) -> None:
    """TORCHELASTIC_RUN_ID of a torchrun-started script (`ddp`, `ps`; Slurm's srun-started ranks too): the run's
    own id, its directory's name, with its sweep's where it is a sweep's layout (`1x2` is a layout of many sweeps),
    as AWS names a run (`cloud_run_id`, the name of its directory on the instances). Why: torchrun's static
    rendezvous (`--master-addr`, how launch starts it) sets it to "none" for every run, so scripts that name their
    output folder by it wrote every run into the same one. The same on `launch resume`, unlike torchrun's fresh id
    per call: a resume continues the run (its records, its `track.checkpoint_dir`), so the script finds its own
    output folder again; another run, layout or repeat gets another id."""
    from scalelab.core.engines import TORCHRUN
    from scalelab.core.launch import starter_of
    from scalelab.core.rundir import is_sweep

    if starter_of(spec.engine.name).name != TORCHRUN:
        return
    parent = run_dir.parent
    os.environ[RUN_ID_ENV] = f"{parent.name}-{run_dir.name}" if parent.name and is_sweep(parent) else run_dir.name


def install_stop(launcher: str | None, run_dir: Path, rank: int) -> StopSignals:
    """SIGTERM/SIGUSR1/SIGINT: `track.should_stop()` turns True, or, for a script that never asks, it ends (143);
    a script that installs its own handler gets its handler called instead (`StopSignals`). Either way the
    rank records the stop and leaves its stop note in `run_dir` first (`note_stop`: its peers read it at their
    end). The launcher watch sends this process SIGTERM when the launcher is gone."""
    stops = StopSignals(run_dir, rank)
    for sig in STOP_SIGNALS:
        signal.signal(sig, stops)
    if launcher and (who := watched(launcher)) is None:
        print(f"scalelab: warning: {LAUNCHER_ENV}={launcher!r} is not PID:START; the launcher is not watched",
              file=sys.stderr, flush=True)
    elif launcher:
        threading.Thread(target=_watch, args=who, name="launcher-watch", daemon=True).start()
    return stops


class StopSignals:
    """The rank's handler of the stop signals, kept installed while the script runs whatever the script installs.

    Why: a script that installed its own SIGTERM handler (set a flag, save, `sys.exit(0)`) replaced the runner's,
    so a `launch cancel` or Ctrl-C was recorded as a completed run (its `end`: completed, exit 0), `launch resume`
    refused it, and a Slurm pre-emption warning (USR1) handled by the script never requeued the job. So, during
    the script, `signal.signal` and `signal.getsignal` of a stop signal are this object's (`wrap`): the script's
    handler is kept here and `getsignal` returns it, and on a signal the runner records the stop (`track._stopped`,
    the stop note) and then calls it, or ignores the signal where the script said SIG_IGN; without one, the
    runner's own action (`should_stop()`, else exit 143). The rank's `end` then says interrupted (143), as torchrun's
    agent would count a stop it was asked for; the script's own save stands and `launch resume` runs it again.

    A repeat of the same signal within REPEAT_S of its first is swallowed: a cancel signals every process of the
    run and torchrun's agent forwards its own SIGTERM to its ranks, so each rank got two, and the second raised
    SystemExit(143) inside the script's `finally:` cleanup (or called its handler twice)."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.run_dir, self.rank, self.me = run_dir, rank, os.getpid()
        self.script: dict[int, Any] = {}  # the script's own handler of a stop signal (a callable or SIG_IGN)
        self.first: dict[int, float] = {}  # monotonic time of each stop signal's first delivery
        # this handler's frame while the script's handler runs (None outside it): the script's handler may call
        # the one it replaced (`getsignal`'s), and a signal may be delivered inside it (`_delivered_inside`)
        self.calling: FrameType | None = None
        self.originals: tuple[Any, Any] | None = None  # signal.signal, signal.getsignal while wrapped

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if not self._quieted():  # a process the script forked (a multiprocessing or DataLoader worker)
            return self._in_a_child(signum, frame)
        if self.calling is not None and not self._delivered_inside(frame):  # the script's handler chained to it
            return self._runner_action(signum, track._state.stop_asked)
        now = time.monotonic()
        if now - self.first.get(signum, -REPEAT_S) < REPEAT_S:
            return  # the same stop again (the cancel's and torchrun's agent's): not into the script's cleanup
        self.first[signum] = now
        asked = track._stopped(signum)
        note_stop(self.run_dir, self.rank, signum)
        handler = self.script.get(signum)
        if handler is signal.SIG_IGN:
            return
        if not callable(handler) or handler is signal.default_int_handler:
            return self._runner_action(signum, asked)
        before, self.calling = self.calling, sys._getframe()
        try:
            handler(signum, frame)
        finally:
            self.calling = before

    def _delivered_inside(self, frame: FrameType | None) -> bool:
        """Whether a call made while the script's handler runs is a signal delivered inside it (`frame`, the frame
        the signal interrupted, runs above this handler's own), not the script calling the handler it replaced (it
        passes the frame it was given, or None). Why: of the cancel's SIGTERM and torchrun's agent's, the second
        came while the script's handler ran and was taken for its call: the rank exited 143 before the script's save
        (a CI run of stop 67). Delivered inside, it is a repeat like any other. The limit: a script whose handler
        passes its own frame (`sys._getframe()`) instead of the one it was given looks like a delivery; within
        REPEAT_S its call is then swallowed, so it should pass the frame it got (or None), as the idiom does."""
        while frame is not None:
            if frame is self.calling:
                return True
            frame = frame.f_back
        return False

    def _quieted(self) -> bool:
        """False in a forked child; in the rank, torch's DataLoader SIGCHLD handler replaced first of all. Why: the
        stop ends the DataLoader's workers too, and their SIGCHLD ran torch's handler inside this one ("DataLoader
        worker ... killed by signal: Terminated"), the rank's end then a failure. Where a SIGCHLD already pending
        with the stop runs it at this handler's first call (before the handler is replaced), that error is the
        stop's, not the script's, and the replacement is made again."""
        while True:
            try:
                if os.getpid() != self.me:
                    return False
                quiet_worker_deaths()
                return True
            except RuntimeError as exc:
                if not _STOPPED_WORKER.search(str(exc)):
                    raise

    @staticmethod
    def _runner_action(signum: int, asked: bool) -> None:
        """Without a handler of the script's: `should_stop()` says it (the script asked), else the rank ends."""
        if not asked:
            raise SystemExit(INTERRUPTED)

    def _in_a_child(self, signum: int, frame: FrameType | None) -> None:
        """A forked child inherited this handler: it runs what plain Python's child would (the script's handler,
        or the signal's default); the signal is its own, not a stop of the rank (no note, no record)."""
        handler = self.script.get(signum)
        if handler is signal.SIG_IGN:
            return
        if callable(handler):
            handler(signum, frame)
            return
        (self.originals[0] if self.originals else signal.signal)(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def wrap(self) -> None:
        """From now on until `unwrap`, the script's `signal.signal`/`getsignal` of a stop signal go through here."""
        self.originals = (signal.signal, signal.getsignal)
        signal.signal, signal.getsignal = self.set_handler, self.get_handler

    def unwrap(self) -> None:
        if self.originals:
            signal.signal, signal.getsignal = self.originals
            self.originals = None

    def _ours(self, signum: Any) -> int | None:
        """`signum` as a stop signal of this rank's, while wrapped in the rank's process; else None."""
        try:
            sig = int(signum)
        except (TypeError, ValueError):
            return None
        return sig if self.originals and sig in _STOP_NUMBERS and os.getpid() == self.me else None

    def set_handler(self, signum: Any, handler: Any) -> Any:
        """`signal.signal` as the script sees it: a stop signal's handler is kept (this one stays installed) and
        the one it replaces is returned; any other signal is Python's own."""
        sig = self._ours(signum)
        if sig is None:
            return (self.originals[0] if self.originals else signal.signal)(signum, handler)
        if not callable(handler) and handler not in (signal.SIG_DFL, signal.SIG_IGN):
            raise TypeError("signal handler must be signal.SIG_IGN, signal.SIG_DFL, or a callable object")
        self.originals[0](sig, self)  # what Python checks (the main thread) is checked here too
        before = self.script.pop(sig, self)
        if handler is not self and handler is not signal.SIG_DFL:  # SIG_DFL, or this one back: the runner's action
            self.script[sig] = handler
        return before

    def get_handler(self, signum: Any) -> Any:
        """`signal.getsignal` as the script sees it: a stop signal's is the script's own (else this runner's)."""
        sig = self._ours(signum)
        if sig is None:
            return (self.originals[1] if self.originals else signal.getsignal)(signum)
        return self.script.get(sig, self)


DATALOADER_MODULE = "torch.utils.data"  # where torch's SIGCHLD handler of DataLoader workers is defined


def _child_ended(signum: int, frame: FrameType | None) -> None:
    """SIGCHLD's handler once the DataLoader's is quieted: nothing (as the default). A Python handler, not SIG_DFL:
    a SIGCHLD already pending when the handler changed then finds one (with SIG_DFL, CPython printed "OSError:
    Signal 17 ignored due to race condition")."""


# torch's SIGCHLD handler's error for a DataLoader worker ended by a stop signal (`signal.strsignal`'s names)
_STOPPED_WORKER = re.compile(r"DataLoader worker \(pid \d+\) is killed by signal: (Terminated|Interrupt|Hangup)")


def quiet_worker_deaths(any_handler: bool = False) -> None:
    """SIGCHLD handled by nothing (`_child_ended`) where torch's DataLoader handler has it (`any_handler`: any
    Python handler but this one).

    Why: that handler raises "DataLoader worker (pid N) is killed by signal: Terminated" in whatever code the rank
    runs when a worker dies. A stop (`launch cancel`, Ctrl-C, SIGTERM) ends the workers with their rank, so every
    rank printed that traceback: in the DataLoader's `__del__`, or through the runner's own exit path
    (`end_as_python_would`, `flush_open_files`), which it cut short. Called on the rank's stop signal, and once the
    script has returned (`any_handler`): the runner then ends the script's leftover children itself. A worker that
    dies on its own while the script runs on is still the script's error (torch finds it dead at its next fetch)."""
    try:
        handler = signal.getsignal(signal.SIGCHLD)
        if callable(handler) and handler is not _child_ended and (
                any_handler or str(getattr(handler, "__module__", "")).startswith(DATALOADER_MODULE)):
            signal.signal(signal.SIGCHLD, _child_ended)
    except (ValueError, OSError, TypeError, AttributeError):  # not the main thread, or no SIGCHLD: nothing to quiet
        pass


def stop_note(run_dir: Path, rank: int) -> Path:
    """RUN_DIR/records/stop-rank-R.json: rank R got a stop signal in this launch (its runner removes an older one
    at its start). Beside the records, as shared as they are: the run directory on local and Slurm nodes, the
    runs volume on Kubernetes, one instance's directory on AWS (where its bootstrap tells instances apart)."""
    return records_path(run_dir, rank).with_name(f"stop-rank-{rank}.json")


def note_stop(run_dir: Path, rank: int, signum: int) -> None:
    """Leave this rank's stop note, before `track.should_stop()` can turn True on it, so before its peers can
    leave through the script's stop agreement and look for it (`stopped_peer`). Called in the signal handler:
    its own file (no record writer that the interrupted code may be inside), and never an exception into the
    script; a note that cannot be written leaves its peers' end records as they were."""
    path = stop_note(run_dir, rank)
    state = track._state
    try:
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"rank": rank, "signal": int(signum), "step": state.step,
                                   "cause": state.stop_cause, "time": time.time()}))
        os.replace(tmp, path)
    except Exception:  # noqa: BLE001 - a signal handler: nothing may escape into the script
        pass


def clear_stop_note(run_dir: Path, rank: int) -> None:
    """Remove this rank's note of an earlier launch (a resumed run), before its script can take part in a stop."""
    try:
        stop_note(run_dir, rank).unlink(missing_ok=True)
    except OSError:
        pass


def stopped_peer(run_dir: Path, rank: int, world: int, since: float) -> int | None:
    """The first other rank of this launch that got a stop signal (its note is there, written at or after `since`,
    this rank's start), or None. Asked by a rank that got none and whose script returned: it left through the
    script's stop agreement (`track.should_stop()` True on that peer), or the peer's signal came after its last
    step (the peer then records an interruption all the same, and so this rank does). Why `since`: a peer removes
    its note of an earlier launch only when it starts, and a resumed rank 0 that ended before rank 1 had started
    took rank 1's note of the launch before as a stop of this one (exit 143, and horovodrun ended rank 1)."""
    for peer in range(world):
        note = stop_note(run_dir, peer)
        if peer != rank and note.is_file() and _written_at(note) >= since:
            return peer
    return None


def _written_at(note: Path) -> float:
    """When a stop note was written: its `time` (the peer's clock, as this rank's `since`), else its mtime."""
    try:
        return float(json.loads(note.read_text())["time"])
    except (OSError, ValueError, KeyError, TypeError):
        try:
            return note.stat().st_mtime
        except OSError:
            return float("-inf")


def _watch(pid: int, start: str) -> None:
    while started_at(pid, start):
        time.sleep(WATCH_EVERY_S)
    print(f"scalelab: its launcher (pid {pid}) is gone: asking the script to stop", file=sys.stderr, flush=True)
    track._state.stop_cause = f"its launcher (pid {pid}) is gone"
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(WATCH_GRACE_S)
    print(f"scalelab: the script did not stop {WATCH_GRACE_S:.0f} s after the launcher was gone: exiting",
          file=sys.stderr, flush=True)
    state = track._state
    if state.writer is not None:  # why it exits, as the built-in trainer's ranks record it (scalelab/train/loop.py)
        gave_up_records(state.writer, f"its launcher (pid {pid}) is gone", state.step, WATCH_GRACE_S,
                        elapsed_s=state.elapsed)
    os._exit(INTERRUPTED)


def run_code(spec: Spec) -> int:
    """Run the script or module as `__main__`; its exit status (an uncaught exception: 1, traceback logged)."""
    folder, what = target(spec)
    name = Path(what).name if spec.script else what
    if spec.script and not Path(what).is_file():
        raise ScalelabError(f"script {what} is not there on this node ({os.uname().nodename})")
    sys.path.insert(0, str(folder))
    sys.argv = [what, *spec.script_args]
    try:
        if spec.script:
            runpy.run_path(what, run_name="__main__")
        else:
            runpy.run_module(what, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return int(exc.code or 0)
        print(exc.code, file=sys.stderr, flush=True)  # sys.exit("message"), as Python does
        said = " ".join(str(exc.code).split())  # and in the one-line error: it said only "exited with status 1"
        track._state.error = f"{name} exited with status 1: " + (said if len(said) <= 200 else said[:199] + "…")
        return 1
    except track.TrackError:
        raise
    except ImportError as exc:
        if spec.module and getattr(exc, "name", None) == spec.module.split(".")[0]:
            raise ScalelabError(f"--module {spec.module}: no such module under {folder} ({exc})") from None
        return _raised(name, folder)
    except BaseException:  # noqa: BLE001 - the script's own error: its traceback goes to the log
        return _raised(name, folder)
    return 0


def _raised(name: str, folder: Path) -> int:
    exc = sys.exc_info()[1]
    traceback.print_exception(type(exc), exc, _scripts_frames(exc.__traceback__))
    sys.stderr.flush()
    said, where, cut = one_line_message(exc)  # an `assert` without a message: no dangling ": "
    track._state.error = f"{name} raised {type(exc).__name__}{where}" + (f": {said}" if said else "")
    track._state.error_cut = cut
    track._state.error_at = _raised_at(exc, folder)
    track._state.peer_lost = lost_a_peer(exc)  # a collective failing after a peer died
    return 1


#: How torch's DataLoader re-raises a worker's exception in the rank (torch/_utils.py, ExceptionWrapper.reraise):
#: "Caught ValueError in DataLoader worker process 1.\nOriginal Traceback (most recent call last):\n...".
WRAPPED_TRACEBACK = "Original Traceback (most recent call last):"
MESSAGE_MAX = 300  # characters of an exception's message in the one-line error


def one_line_message(exc: BaseException) -> tuple[str, str, bool]:
    """(the exception's message in one line, where it was caught when that is not the rank itself: " in DataLoader
    worker process 1", whether lines were left out). Why: the run's error is one line (the README says so), and a
    message of several lines (a DataLoader worker's exception, which carries the worker's whole traceback;
    load_state_dict's list of mismatched sizes) made the launcher's line, and `launch report`'s, a block; the full
    traceback stays in the rank's log. A wrapped worker traceback gives its last line ("ValueError: bad index 37",
    the worker's own exception) and the worker it came from; any other message its first line, and the next too
    where the first only announces it ("Error(s) in loading state_dict for Linear:")."""
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) <= 1:
        said, where, cut = (lines[0] if lines else ""), "", False
    elif WRAPPED_TRACEBACK in text:
        said, cut = lines[-1], True
        said = said.removeprefix(f"{type(exc).__name__}: ")
        caught = lines[0].rstrip(".")
        prefix = f"Caught {type(exc).__name__} "
        where = " " + caught.removeprefix(prefix) if caught.startswith(prefix) else ""
    else:
        said, where = lines[0], ""
        if said.endswith(":"):
            said = f"{said} {lines[1]}"
        cut = len(lines) > (2 if lines[0].endswith(":") else 1)
        said += " …" if cut else ""
    if len(said) > MESSAGE_MAX:
        said, cut = said[:MESSAGE_MAX - 1] + "…", True
    return said, where, cut


def _raised_at(exc: BaseException, folder: Path) -> str | None:
    """FILE:LINE of the raise in the user's code (its last frame under the script's folder; a SyntaxError's own
    place), the file relative to that folder; None where no frame is the user's."""
    places = [(f.filename, f.lineno) for f in traceback.extract_tb(exc.__traceback__)]
    if isinstance(exc, SyntaxError) and exc.filename:
        places.append((exc.filename, exc.lineno))
    mine = [(Path(file), line) for file, line in places if Path(file).is_relative_to(folder) and not _installed(file)]
    return f"{mine[-1][0].relative_to(folder)}:{mine[-1][1]}" if mine else None


def _installed(file: str) -> bool:
    """A file of an installed package (a virtualenv inside the project: .venv/lib/.../site-packages/torch/...), not
    the user's code, though under the script's folder."""
    parts = Path(file).parts
    return "site-packages" in parts or "dist-packages" in parts or Path(file).is_relative_to(sys.prefix)


def _scripts_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the script's own first frame on: the runner's and runpy's frames before it are not the
    user's, and `python train.py` shows none of them (a SyntaxError, raised in runpy, keeps its file and line)."""
    while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>")
                              or Path(tb.tb_frame.f_code.co_filename).name == "runpy.py"):
        tb = tb.tb_next
    return tb


def run(run_dir: Path) -> int:
    """One rank: records, the script, its end; the exit status of the rank."""
    started, began = time.perf_counter(), time.time()
    spec = read_spec(run_dir)
    rank, world = rank_from_env()
    out, last, elapsed = start_records(run_dir, spec, rank, world)
    clear_stop_note(run_dir, rank)
    set_run_id(spec, run_dir)
    track._activate(out, run_dir, spec.warmup_steps, spec.loss_threshold, last, elapsed, started)
    stops = install_stop(os.environ.get(LAUNCHER_ENV), run_dir, rank)
    stops.wrap()
    try:
        code = run_code(spec)
    finally:
        stops.unwrap()
    for sig in STOP_SIGNALS:  # the script is done: a signal now (torchrun stopping the ranks left once a peer
        signal.signal(sig, signal.SIG_IGN)  # exited 143, the launcher watch) must not cut its end record short
    quiet_worker_deaths(any_handler=True)  # nor its children's deaths, the runner's own doing from here on
    state = track._state
    # a rank that got no signal itself but whose script returned while a peer had got one: it left through the
    # script's stop agreement, as the built-in trainer's peers do (their `interrupted` has no signal of their own)
    peer = stopped_peer(run_dir, rank, world, began) if state.stop is None and code == 0 and world > 1 else None
    stopped = state.stop is not None or peer is not None
    if stopped and code == 0:
        code = INTERRUPTED  # stopped on request: the launcher counts the run cancelled, not completed
    reason = ("interrupted" if stopped else "threshold" if state.reached else "completed" if code == 0 else "failed")
    if stopped:
        out.event("interrupted", signal=state.stop, step=state.step, **({"cause": state.stop_cause} if state.stop_cause else {}))
    if code != 0 and not (stopped and code == INTERRUPTED):  # 143 with no stop signal: the script's own status
        said = state.error or f"{spec.script_label} exited with status {code}"
        at = f"at {state.error_at}; " if state.error and state.error_at else ""
        # the same words on every rank: said once (`error_messages` takes "--rank R" of a shortened message as such)
        where = (f"its full traceback: launch logs {shell_word(run_dir)} --rank {rank}" if state.error_cut
                 else f"its output: launch logs {shell_word(run_dir)}")
        out.error(f"{said} ({at}{where})", **({"peer_lost": True} if state.peer_lost else {}))
    elif spec.loss_threshold is not None and state.reached is None and not stopped:
        out.event("threshold_not_reached", step=state.step, elapsed_s=state.elapsed, threshold=spec.loss_threshold)
        if not state.validations and rank == 0:
            print(f"scalelab: warning: --loss-threshold {spec.loss_threshold:g} could not be judged: the script recorded "
                  "no validation loss; call `track.validation(loss=v)` after each validation (README: \"Your own training "
                  "script\")", file=sys.stderr, flush=True)
    # `imports_track`: whether the script imported `scalelab.track`, so that a report of a run with no step can tell
    # a script that never used track (add it) from one that skipped its training (resumed from another layout's
    # checkpoint): the advice to add track given to a script that called it was wrong
    out.event("end", step=state.step, reason=reason, elapsed_s=state.elapsed, exit_code=code,
              wall_s=time.perf_counter() - started, imports_track="scalelab.track" in sys.modules)
    out.close()
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m scalelab.train.script RUN_DIR  (started by `launch --script`)", file=sys.stderr)
        return 2
    run_dir = Path(argv[0]).absolute()
    try:
        return run(run_dir)
    except ScalelabError as exc:  # TrackError included: one line, in the log and in an error record
        record_error(run_dir, str(exc))
        return exc.exit_code


AT_EXIT_S = 30.0  # the most the script's threads and atexit handlers get together (the launcher's cancel grace)
HANDLERS_AT_LEAST_S = 5.0  # what the atexit handlers get even after threads that took the whole limit


def end_as_python_would(limit_s: float = AT_EXIT_S) -> None:
    """What the interpreter's exit does for a script, short of its teardown: it joins the script's non-daemon
    threads (`join_threads`), runs the atexit handlers (logging.shutdown, multiprocessing ending the daemonic
    children and joining the others, wandb's, TensorBoard's, the script's own) and flushes every file it left
    open. Why: exit_without_teardown (os._exit) skipped all three, so a script's unclosed metrics file came out
    empty, its atexit file never came, a thread still writing was killed, and its daemon process outlived a
    COMPLETED run; torchrun's ranks do all three. The files are flushed first and the daemonic children ended first
    (`end_daemon_children`), so that a hang loses nothing; the threads, then the handlers get at most `limit_s`
    together (the handlers at least HANDLERS_AT_LEAST_S): one that waits on a peer already gone (a collective
    library's shutdown) must not hold the rank. A handler still running then is most likely multiprocessing's,
    waiting for a non-daemon child that never ends: the rank's remaining child processes are ended
    (`end_children`), so nothing is left running."""
    import atexit

    flush_open_files()
    end_daemon_children()
    deadline = time.monotonic() + limit_s  # one limit for both: a cancel's grace must leave the handlers their turn
    join_threads(limit_s)
    worker = threading.Thread(target=atexit._run_exitfuncs, name="scalelab-atexit", daemon=True)  # CPython's own:
    worker.start()  # each handler's error is printed and the others still run
    worker.join(max(deadline - time.monotonic(), min(HANDLERS_AT_LEAST_S, limit_s)))
    if worker.is_alive():
        ended = end_children()
        print(f"scalelab: the script's exit handlers did not finish within {limit_s:g} s; leaving without them"
              + (f" (ended its {ended} remaining child process{'es' if ended != 1 else ''}: SIGTERM, then SIGKILL)"
                 if ended else ""), file=sys.stderr)
    flush_open_files()


def join_threads(limit_s: float) -> None:
    """Wait, at most `limit_s`, for the script's non-daemon threads, as the interpreter's exit does: the threading
    atexit calls (a ThreadPoolExecutor's shutdown), then a join of every non-daemon thread; here in a daemon thread
    so that the wait has a limit. Not `threading._shutdown` itself: run outside the main thread it also waits for
    the main thread's own lock, held until the interpreter dies, so every rank with a thread waited the whole
    30 s and said its (finished) threads had not finished."""
    def others() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()]

    if not others():
        return
    deadline = time.monotonic() + limit_s

    def shut_down() -> None:
        for call in reversed(list(getattr(threading, "_threading_atexits", []))):
            call()
        for thread in others():
            thread.join(max(0.0, deadline - time.monotonic()))

    waiter = threading.Thread(target=shut_down, name="scalelab-threads", daemon=True)
    waiter.start()
    waiter.join(limit_s)
    left = [t.name for t in others()]
    if left:
        print(f"scalelab: the script's threads {', '.join(left)} did not finish within {limit_s:g} s; leaving "
              "without them", file=sys.stderr)


def end_children(grace_s: float = 5.0) -> int:
    """SIGTERM to every process this rank started and its descendants, SIGKILL to any left after `grace_s`;
    how many there were."""
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    for child in children:
        try:
            child.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(children, timeout=grace_s)
    for child in alive:
        try:
            child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return len(children)


def flush_open_files() -> None:
    """Flush every file object the script left open (what their finalizers would do at exit). Their type is
    tested, not `isinstance` on each object: that asks an object its `__class__`, which warned on every rank
    that imported torch (torch.distributed.reduce_op's FutureWarning)."""
    import gc
    import io

    try:  # the walk itself too: a signal handler of the script's raising in it must not end the rank's exit path
        for obj in gc.get_objects():
            try:
                if issubclass(type(obj), io.IOBase) and not obj.closed and obj.writable():
                    obj.flush()
            except Exception:  # noqa: BLE001 - a broken pipe, a closed fd under it: nothing to save there
                pass
    except Exception:  # noqa: BLE001 - what was flushed is flushed; the rest of the exit goes on
        pass


def end_daemon_children(grace_s: float = 5.0) -> None:
    """SIGTERM to the script's daemonic multiprocessing children, as multiprocessing's exit handler does, then
    SIGKILL to any left after `grace_s`. Why not the handler alone: it waits for them without a limit, and a
    SIGTERM that reaches a child just forked, before its Python has set up its signals, is lost (CPython
    clears pending signals after a fork): most likely why a CI run's rank waited past its exit limit and left
    with its files unflushed."""
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return
    children = [c for c in mp.active_children() if c.daemon]
    for child in children:
        child.terminate()
    for child in children:
        child.join(grace_s)
        if child.is_alive():
            child.kill()
            child.join(grace_s)


if __name__ == "__main__":
    from scalelab.train import exit_without_teardown

    status = main()
    try:
        end_as_python_would()
    except Exception as exc:  # noqa: BLE001 - a handler of the script's raising in the runner's frames: the rank's
        # status is the script's, and no traceback of scalelab's own frames (`quiet_worker_deaths`)
        print(f"scalelab: ending the script's leftovers raised {type(exc).__name__}: {exc}", file=sys.stderr)
    exit_without_teardown(status)  # as the trainer: no interpreter teardown under Gloo's or Horovod's threads
