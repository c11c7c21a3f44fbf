"""`from scalelab import track`: what a user's own training script records (issue 34).

Four calls, each a no-op outside a launch, so the script runs alone unchanged:

    track.unit("tokens")                 # what `items` counts (default "samples"); optional
    track.step(items=n, loss=x)          # after each optimizer step: the items this rank processed
    if track.validation(loss=v): break   # a validation loss; True once --loss-threshold is reached
    if track.should_stop(): save(); break  # SIGTERM, `launch cancel`, a pre-emption notice, the launcher gone

and two values: `track.checkpoint_dir` (RUN_DIR/checkpoint/, where to save so that `launch resume` finds
it; None outside a launch) and `track.resumed` (True when this launch continues a run that saved there).

What is written are the built-in trainer's own records (scalelab/core/records.py's `step`, `val` and
`event` kinds, through its one writer), so reports, `plan`, `cost`, `ls` and progress read a script's run
as any other: a step's time is the interval since the previous call; the first of every (re)start runs from
the script's start, so it holds the script's setup (imports, the rendezvous, building the model): it is
always warm-up and not counted in the training time (time to the threshold), and the first `--warmup-steps`
steps after every (re)start are warm-up as for the trainer. `items` go into both `samples` and `words`
(the unit is said in a `unit` event). No PyTorch is imported here.

The runner (scalelab/train/script.py) activates this module before the script starts; a script started
any other way finds it inactive.
"""

from __future__ import annotations

import math
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalelab.core.errors import ScalelabError
from scalelab.core.rundir import CHECKPOINT_DIR  # RUN_DIR/checkpoint/: the script's own checkpoint files

# Test aid, read by the built-in trainer (scalelab/train/loop.py) as well: STEP[:RANK]: wait after that step for
# a stop signal, so that a signal sent once the records show the step lands on it, however fast the steps are
HOLD_AT_STEP_ENV = "SCALELAB_HOLD_AT_STEP"
#: What a report says of a script run that recorded no steps.
HOW_TO_RECORD = ("to measure it, add `from scalelab import track` to the script and call `track.step(items=N, "
                 "loss=x)` after each optimizer step (and `track.validation(loss=v)` for time to a loss threshold); "
                 "see examples/own-script/")


class TrackError(ScalelabError):
    """A `track` call with a value no step can have (negative, NaN): the run stops with this one line."""


class _State:
    """The run this process records for (None outside a launch)."""

    writer: Any = None  # scalelab.core.records.RecordWriter of this rank
    warmup_steps: int = 0
    loss_threshold: float | None = None
    step: int = 0  # the last step recorded (continues over resumes)
    started_at: int = 0  # the step this launch started after
    last: float = 0.0  # perf_counter of the previous call (or of the script's start)
    elapsed: float = 0.0  # training time: the sum of the step times since the first launch
    reached: dict[str, Any] | None = None
    validations: int = 0  # `validation` calls in this launch (none: a --loss-threshold could not be judged)
    stepped: bool = False  # a step was recorded in this launch
    stop_asked: bool = False  # the script has called should_stop(): a stop signal is left to it
    stop: int | None = None  # the stop signal received, if any
    stop_cause: str | None = None
    error: str | None = None  # the script's uncaught exception, in one line (scalelab/train/script.py)
    error_at: str | None = None  # FILE:LINE where it was raised, in the user's code
    error_cut: bool = False  # its message had more lines than the error's one: the traceback says them
    peer_lost: bool = False  # that exception is a collective failing after another rank died
    hold_at: str | None = None  # HOLD_AT_STEP_ENV's value (a test aid)


_state = _State()
checkpoint_dir: Path | None = None
resumed: bool = False
_unit = "samples"


def active() -> bool:
    """True inside a launch (the runner activated this module), False when the script runs alone."""
    return _state.writer is not None


def unit(name: str) -> None:
    """Name what `items` counts ("tokens", "images", ...); said in the start record. Call it before the first step."""
    global _unit
    if not isinstance(name, str) or not name.strip():
        raise TrackError(f"track.unit takes a name such as \"tokens\", got {name!r}")
    _unit = name.strip()
    if active():
        _state.writer.event("unit", unit=_unit)


MAX_COUNT = 2**53  # the largest whole number a float64 (a record read back by pandas) holds exactly


def _number(call: str, field: str, value: Any, whole: bool = False, negative: bool = False) -> float | int:
    """`value` as a plain number, or a TrackError naming the call: NaN and infinity never, below 0 only where
    `negative` (a loss may be, a count may not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "item"):
        raise TrackError(f"{call}({field}={value!r}): {field} must be a number")
    value = value.item() if hasattr(value, "item") else value  # a 0-d tensor or numpy scalar
    finite = isinstance(value, int) or isinstance(value, float) and math.isfinite(value)  # isfinite(10**400) raised
    if not finite or (value < 0 and not negative):
        raise TrackError(f"{call}({field}={value!r}): {field} must be a finite number" + ("" if negative else " >= 0"))
    if whole:
        # `items=10**30` was refused as "items counts items, a whole number" (its float is not exactly it): a
        # count above 2**53 is refused as too big, as records are read back as float64, exact up to 2**53 only
        if isinstance(value, float) and not value.is_integer():
            raise TrackError(f"{call}({field}={value!r}): {field} must be a whole number")
        if abs(value) > MAX_COUNT:
            raise TrackError(f"{call}({field}={value!r}): {field} must be at most 2**53 ({MAX_COUNT:,}), the "
                             "largest whole number the records hold exactly")
        return int(value)
    try:
        return float(value)
    except OverflowError:  # an int past any float
        raise TrackError(f"{call}({field}=...): {field} must be a finite number") from None


def step(items: int, loss: float | None = None, step: int | None = None, lr: float | None = None) -> None:
    """Record one optimizer step of this rank: `items` processed (samples, tokens: see `unit`) and its
    training loss. `step`: its number when the script knows it (after a resume from a checkpoint older
    than the last recorded step); otherwise steps are counted from the last one recorded. `lr`: the learning
    rate of the step, optional (`launch plan` then knows how the runs scaled it)."""
    if not active():
        return
    now = time.perf_counter()
    items = _number("track.step", "items", items, whole=True)
    value = None if loss is None else _number("track.step", "loss", loss, negative=True)
    rate = {} if lr is None else {"lr": _number("track.step", "lr", lr)}
    s = _state
    first = not s.stepped  # the first of this launch: its interval holds the script's setup (imports, rendezvous)
    s.step = int(_number("track.step", "step", step, whole=True)) if step is not None else s.step + 1
    step_s = max(now - s.last, 1e-9)
    s.last, s.stepped = now, True
    s.elapsed += 0.0 if first else step_s  # training time: the setup is the run's start-up, not a step's
    s.writer.write("step", step=s.step, warmup=first or s.step - s.started_at <= s.warmup_steps, step_s=step_s,
                   samples=items, words=items, loss=value, **rate, **_memory())
    if s.hold_at:
        from scalelab.core.records import rank_from_env  # only where the aid is set

        if hold_for_a_stop_signal(s.step, rank_from_env()[0], lambda: s.stop is not None):
            s.last = time.perf_counter()  # the wait is not part of the next step's time


def hold_for_a_stop_signal(step: int, rank: int, stopped: Callable[[], bool]) -> bool:
    """Test aid (the built-in trainer's and a script's): at HOLD_AT_STEP wait, up to 2 minutes, until `stopped()`
    (a stop signal arrived), so that a cancel lands there. `STEP:RANK`: only that rank waits (a signal to that
    one rank); the others wait in the stop agreement. True when it held."""
    if os.environ.get(HOLD_AT_STEP_ENV) not in (str(step), f"{step}:{rank}"):
        return False
    deadline = time.monotonic() + 120
    while not stopped() and time.monotonic() < deadline:
        time.sleep(0.05)
    return True


def validation(loss: float) -> bool:
    """Record a validation loss (pass the same value on every rank, e.g. averaged over them); True from the
    first one at or below --loss-threshold on (the summary records the time and steps to it)."""
    if not active():
        return False
    value = _number("track.validation", "loss", loss, negative=True)
    s = _state
    s.writer.write("val", step=s.step, epoch=0, val_loss=value, elapsed_s=s.elapsed)
    s.validations += 1
    if s.reached is None and s.loss_threshold is not None and value <= s.loss_threshold:
        s.reached = {"step": s.step, "elapsed_s": s.elapsed, "val_loss": value}
        s.writer.event("threshold", **s.reached)
    s.last = time.perf_counter()  # validation is not part of the next step's time
    return s.reached is not None


def should_stop() -> bool:
    """True once a stop was asked: SIGTERM or SIGUSR1 (`launch cancel`, Slurm's pre-emption or time-limit
    warning, an AWS spot notice) or the launcher gone. Save to `checkpoint_dir` and return from training.
    A script that never calls this is stopped by the signal itself (exit 143)."""
    if not active():
        return False
    _state.stop_asked = True
    return _state.stop is not None


def _memory() -> dict[str, Any]:
    """The step record's peak-memory fields: the GPU's where the script uses one, else the peak RSS."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            return {"mem_peak_bytes": int(torch.cuda.max_memory_allocated()), "mem_kind": "cuda_max_allocated"}
    except Exception:  # noqa: BLE001 - memory is a nicety; a step is recorded without it
        pass
    return {"mem_peak_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "mem_kind": "max_rss"}


def _activate(writer: Any, run_dir: Path, warmup_steps: int, loss_threshold: float | None, last_step: int,
              elapsed: float, started: float) -> None:
    """Called by the runner before the script starts: record into `writer` from step `last_step` on."""
    global checkpoint_dir, resumed
    checkpoint_dir = Path(run_dir) / CHECKPOINT_DIR
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    resumed = any(checkpoint_dir.iterdir())
    s = _state
    s.writer, s.warmup_steps, s.loss_threshold = writer, warmup_steps, loss_threshold
    s.step = s.started_at = last_step
    s.elapsed, s.last = elapsed, started
    s.hold_at = os.environ.get(HOLD_AT_STEP_ENV)


def _stopped(signum: int) -> bool:
    """A stop signal reached the rank: True when the script asks `should_stop()` (it then stops itself)."""
    _state.stop = signum  # (the launcher watch sets stop_cause first)
    return _state.stop_asked
