"""Live progress from the ranks' records: step of total, loss, words/s and ETA while a run trains.

One reader (`RunWatch`) serves every view of a running run: the launcher's progress bar, `launch logs
-f` in a second terminal, `launch status` and `launch ls`. It tails every RUN_DIR/records/rank-R.jsonl
with the one record reader (`core.records.RecordTail`), never log text, so a detached run, or one
on Slurm, Kubernetes or AWS whose records are mirrored back, shows the same figures.

Words/s is the reports' definition (docs/records.md, "Throughput formula"): over the measured
(non-warm-up, non-profiled) steps, the words of every worker rank over the sum of each step's slowest
rank. A step counts once every worker has recorded it, so the bar never shows rank 0's own, faster
figure (it showed 47,696 words/s above a table saying 22,510).

A run whose ranks stop recording mid-training (a rank hung in the script, in a collective or on a dead
filesystem) is said to have stalled (`RunWatch.silence`) once no rank still running has written any record for longer than
`stall_after_s`: max(STALL_FLOOR_S, STALL_FACTOR x the median step time), counted from the ranks' own `time`
fields, only after a step was recorded since the latest start (setup, the rendezvous and a queue do not count),
by the ranks that have not recorded their end. The line then says how long and where each rank last was, and no ETA (which froze at
its last value: "step 30/200 ... ETA 4s" for five minutes). The launcher ends such a run after
--stall-timeout-min (scalelab/launcher/runner.py's `stall_check`).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from scalelab.core.errors import ScalelabError
from scalelab.core.records import RecordTail, rank_files
from scalelab.core.rundir import ACTIVE, CANCELLED, FAILED, RunPaths
from scalelab.core.spec import Spec, read_spec


def duration(seconds: float | None) -> str:
    """A duration short enough for a status line: 45s, 12m05s, 3h07m."""
    if seconds is None:
        return "—"
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@dataclass
class Snapshot:
    """Where a run is, from its records: what `launch status`, `ls` and `logs -f` print."""

    step: int = 0
    total: int | None = None
    loss: float | None = None
    val_loss: float | None = None
    words_per_s: float | None = None
    eta_s: float | None = None
    threshold_step: int | None = None
    ended: str | None = None  # how the run ended once every rank recorded its end (`RunWatch.ended`)
    unit: str = "words"  # what words_per_s counts: a --script run's own unit (`track.unit`: images, samples)
    queued: str | None = None  # the backend's word while the run waits in its queue (a requeue): no ETA then
    stalled: str | None = None  # "no step for 5m10s (since step 30; ...)": no rank recorded anything for long
    # the run went past the total it was given (a --script run's --steps only sets the bar's total; the script
    # decides its length): the total shown grows with the step, as "at least" ("60/60+")
    over: bool = False

    def steps(self) -> str:
        """"40/200", or "40" when the total is not known; "60/60+" past the given total while the run goes on."""
        if not self.total:
            return str(self.step)
        return f"{self.step}/{self.total}" + ("+" if self.over and not self.ended else "")

    def line(self) -> str:
        """One line: step 40/200  loss 3.210  val 3.105  12,345 words/s  ETA 1m10s."""
        parts = [f"step {self.steps()}"]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.3f}")
        if self.val_loss is not None:
            parts.append(f"val {self.val_loss:.3f}")
        if self.words_per_s is not None:
            parts.append(f"{self.words_per_s:,.0f} {self.unit}/s")
        if self.threshold_step is not None:
            parts.append(f"threshold reached at step {self.threshold_step}")
        elif self.ended:
            parts.append(f"ended ({self.ended})")
        elif self.queued:
            parts.append(f"queued: {self.queued}")
        elif self.stalled:
            parts.append(self.stalled)
        elif self.eta_s is not None:
            parts.append(f"ETA {duration(self.eta_s)}")
        return "  ".join(parts)

    def parts(self) -> list[tuple[int, str]]:
        """The line's parts after the step, each with its rank of need (0 first): what a narrow bar keeps."""
        out = []
        if self.loss is not None:
            out.append((0, f"loss {self.loss:.3f}"))
        if self.val_loss is not None:
            out.append((3, f"val {self.val_loss:.3f}"))
        if self.words_per_s is not None:
            out.append((2, f"{self.words_per_s:,.0f} {self.unit}/s"))
        if self.threshold_step is not None:
            out.append((1, f"threshold reached at step {self.threshold_step}"))
        elif self.ended:
            out.append((1, f"ended ({self.ended})"))
        elif self.queued:
            out.append((1, f"queued: {self.queued}"))
        elif self.stalled:
            out.append((0, self.stalled))
        elif self.eta_s is not None:
            out.append((1, f"ETA {duration(self.eta_s)}"))
        return out

    def as_of(self, state: str | None) -> "Snapshot":
        """The snapshot agreeing with the run's `state` (launch.json or the backend): a run still going has not
        ended, whatever a rank that returned recorded; a failed run failed, whatever its other ranks recorded
        (stopped by their agent: interrupted); a cancelled one whose ranks did not all record an end was cancelled.
        Why: `launch status` said "RUNNING ... ended (completed)" while rank 1 hung after rank 0 returned, and
        "FAILED ... ended (interrupted)" for rank 1's sys.exit(3)."""
        ended = (None if state in ACTIVE else "failed" if state == FAILED
                 else "cancelled" if state == CANCELLED and self.ended is None else self.ended)
        stalled = self.stalled if state is None or state in ACTIVE else None  # an ended run is not stalled
        return replace(self, ended=ended, stalled=stalled)  # a copy: the watch's own goes on from its records

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "total_steps": self.total, "loss": self.loss, "val_loss": self.val_loss,
                "words_per_s": self.words_per_s, "eta_s": self.eta_s, "threshold_step": self.threshold_step,
                "ended": self.ended, "unit": self.unit, "stalled": self.stalled}


#: A run is said to have stalled when no rank wrote any record for longer than this many seconds and than
#: STALL_FACTOR times its median step time. Why those: the built-in trainer writes a record at least every step;
#: between two, a validation (--val-batches forward passes, 4 by default: about a step) or a checkpoint write
#: (seconds for the models here) takes a few step times, so 20 of them is no ordinary pause, and a minute is
#: above any hiccup of a loaded machine or a shared filesystem; a script's step time (the interval between its
#: `track.step` calls) holds its own evaluations, which the median leaves out. It is a statement of fact only
#: ("no step for 1m05s"); ending the run waits for --stall-timeout-min.
STALL_FLOOR_S = 60.0
STALL_FACTOR = 20.0
STEP_TIMES_KEPT = 200  # the median is over the latest step times (one per step, the slowest rank's)


class RunWatch:
    """Every rank's records, read as they are appended; `snapshot()` says where the run is."""

    def __init__(self, run_dir: Path, steps: int | None = None, epochs: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.total, self.epochs = steps, epochs  # the total: --steps, or the fewer with --epochs (train.loop)
        self.tails: dict[Path, RecordTail] = {}
        self.world = 1
        self.servers: set[int] = set()  # parameter-server ranks: no words, left out as the reports do
        self.pending: dict[int, list[float]] = {}  # step -> what the ranks that recorded it so far say
        self.counted: set[int] = set()
        self.measured = 0  # counted steps that were timed (not warm-up, not profiled)
        self.words = 0.0
        self.seconds = 0.0
        self.snap = Snapshot(total=steps)
        self.started: set[int] = set()  # ranks whose start record is in (they are up and training soon)
        self.ends: dict[int, str] = {}  # rank -> the reason of its `end` record since its latest start
        self.expected: int | None = None  # the ranks the run starts (spec.json), once known
        self.since: float | None = None  # when the run was launched (launch.json), for "starting ranks" lines
        # while the run waits in its backend's queue, the backend's word ("Slurm job 7 PENDING (BeginTime)"): set
        # by whoever asked the backend (`launch status`, `logs -f`; the launcher from launch.json's `queued`)
        self.queued: str | None = None
        # what `stall` judges from: each rank's latest record time and step, whether it recorded a step since its
        # latest start, and the latest step times (rank 0's `step_s`; a server rank's none)
        self.seen: dict[int, float] = {}
        self.last_step: dict[int, int] = {}
        self.stepping: dict[int, bool] = {}
        self.step_times: deque[float] = deque(maxlen=STEP_TIMES_KEPT)
        self.clock = time.time  # what "now" is (a test's fake clock)

    def starting(self) -> str:
        """Where a run is before its first step: "starting ranks: 1 of 2 up (20s)", from the start records
        the ranks write once their engine is up; a detached run's follower saw a bare header for ~45 s. While
        it waits in its queue: "queued: Slurm job 7 PENDING (BeginTime) (20s)" (it said "0 of 1 up")."""
        waited = f" ({duration(time.time() - self.since)})" if self.since else ""
        if self.queued:
            return f"queued: {self.queued}{waited}"
        of = f" of {self.expected}" if self.expected else ""
        return f"starting ranks: {len(self.started)}{of} up{waited}"

    def _files(self) -> list[Path]:
        try:
            return rank_files(self.run_dir)
        except ScalelabError:  # a stray file in records/: the reports name it; progress just reads the others
            return sorted(RunPaths(self.run_dir).records.glob("rank-[0-9]*.jsonl"))

    def poll(self) -> Snapshot:
        """Read what was appended since the last poll; the snapshot after it."""
        for path in self._files():
            tail = self.tails.setdefault(path, RecordTail(path))
            rank = int(path.stem.split("-")[1])
            for rec in tail.read():
                self._take(rank, rec)
        self._count_complete()
        return self.snapshot()

    def _take(self, rank: int, rec: dict[str, Any]) -> None:
        kind = rec.get("kind")
        self.world = int(rec.get("world") or self.world)
        if isinstance(rec.get("time"), (int, float)):
            self.seen[rank] = max(self.seen.get(rank, 0.0), float(rec["time"]))
        if kind == "start":
            self._start(rank, rec)
        elif kind == "step":
            self._step(rank, rec)
        elif rank == 0 and kind == "val":
            self.snap.val_loss = rec.get("val_loss")
        elif rank == 0 and kind == "event" and rec.get("event") == "threshold":
            self.snap.threshold_step = rec.get("step")
        elif rank == 0 and kind == "event" and rec.get("event") == "unit" and rec.get("unit"):
            self.snap.unit = str(rec["unit"])  # `track.unit("images")` in a --script run
        elif kind == "event" and rec.get("event") == "end":
            self.ends[rank] = str(rec.get("reason") or "ended")
            self.snap.ended = self.ended()

    def ended(self) -> str | None:
        """How the run ended by its records, once every rank recorded its end: "failed" where a rank failed, else
        "interrupted" where one was, else rank 0's reason (steps, epochs, threshold, completed); None before.
        Why every rank: a script's rank 0 that returned while rank 1 still ran made the run "ended (completed)"."""
        if any(rank not in self.ends for rank in range(self.world)):
            return None
        reasons = set(self.ends.values())
        return next((worst for worst in ("failed", "interrupted") if worst in reasons), self.ends.get(0))

    def _start(self, rank: int, rec: dict[str, Any]) -> None:
        self.started.add(rank)
        self.stepping[rank] = False  # its setup (imports, the rendezvous) is no stall: judged once it steps
        if rec.get("role") == "server":
            self.servers.add(rank)
        per_epoch = rec.get("steps_per_epoch")
        if rank == 0 and per_epoch and self.epochs:
            self.total = min(self.total or 1 << 62, int(per_epoch) * int(self.epochs))
            self.epochs = None
        self.ends.pop(rank, None)  # a resumed rank trains again
        self.snap.ended = self.ended()
        if rank == 0 and rec.get("unit"):  # a --script run's start says its unit (samples until the script names one)
            self.snap.unit = str(rec["unit"])

    def _step(self, rank: int, rec: dict[str, Any]) -> None:
        step = int(rec["step"])
        self.last_step[rank] = step
        self.stepping[rank] = True
        if rank == 0:
            self.snap.step = step  # rank 0 leads; after a resume it counts on from the checkpoint
            if isinstance(rec.get("step_s"), (int, float)) and not rec.get("warmup"):
                self.step_times.append(float(rec["step_s"]))
        if rank in self.servers or rec.get("role") == "server" or step in self.counted:
            return  # a server has no words or loss; a step run again after a resume is counted once
        # ranks, words, slowest s, loss sum, measured, ranks with a loss (a script's track.step may pass none)
        seen = self.pending.setdefault(step, [0, 0.0, 0.0, 0.0, 1.0, 0])
        seen[0] += 1
        seen[1] += float(rec.get("words") or 0)
        seen[2] = max(seen[2], float(rec.get("step_s") or 0))
        if rec.get("loss") is not None:
            seen[3] += float(rec["loss"])
            seen[5] += 1
        if rec.get("warmup") or rec.get("profiled"):
            seen[4] = 0.0

    def _count_complete(self) -> None:
        """Count the steps every worker has recorded (checked after a whole poll: a server rank's start
        record may be read after the workers' steps). The loss shown is the last complete step's mean
        over the workers that recorded one, as the summary's `final_loss`: none while no step had a loss (a
        script that passes none showed "loss 0.000")."""
        need = max(1, self.world - len(self.servers))
        for step in sorted(s for s, seen in self.pending.items() if seen[0] >= need):
            ranks, words, slowest, loss, measured, losses = self.pending.pop(step)
            self.counted.add(step)
            if losses:
                self.snap.loss = loss / losses
            if measured:
                self.measured += 1
                self.words += words
                self.seconds += slowest

    def snapshot(self) -> Snapshot:
        snap = self.snap
        snap.total = self.total
        # a total the run went past (a script's --steps is only the bar's): at least the step, never "step 60/10"
        snap.over = bool(self.total) and snap.step > self.total
        if snap.over:
            snap.total = snap.step
        snap.words_per_s = self.words / self.seconds if self.seconds > 0 else None
        left = (self.total - snap.step) if self.total and not snap.over else None
        snap.eta_s = left * self.seconds / self.measured if left is not None and self.measured else None
        snap.queued = self.queued
        if self.queued:  # waiting in the queue (a requeue): when it ends is the queue's to say
            snap.eta_s = None
        silent = self.silence()
        snap.stalled = self.stall_line(silent) if silent is not None and silent > self.stall_after_s() else None
        if snap.stalled:  # no ETA from steps that stopped coming
            snap.eta_s = None
        return snap

    def median_step_s(self) -> float:
        """The median of rank 0's latest measured step times (0 before any)."""
        return statistics.median(self.step_times) if self.step_times else 0.0

    def stall_after_s(self, floor_s: float = STALL_FLOOR_S) -> float:
        """How long no rank may record anything before the run is said to have stalled: max(`floor_s`,
        STALL_FACTOR x its median step time); the launcher ends it after max(its stall timeout, the same)."""
        return max(floor_s, STALL_FACTOR * self.median_step_s())

    def silence(self) -> float | None:
        """Seconds since any rank still running (no end record since its start) wrote its latest record, where
        that can mean a stall: a rank stepped since its latest start and the run is not waiting in its backend's
        queue; else None (starting up, ended, queued: no steps are due). A rank that returned while another hangs
        (a script's rank 0 done, rank 1 stuck) leaves the silence to the one still running."""
        live = [rank for rank in self.seen if rank not in self.ends]
        if self.queued or not live or not any(self.stepping.values()):
            return None
        return max(0.0, self.clock() - max(self.seen[rank] for rank in live))

    def stall_line(self, silent: float) -> str:
        """"no step for 5m10s (since step 30; every rank last recorded step 30)", or with the ranks that are
        behind: "... (since step 31; rank 1 last recorded step 30 (5m12s ago), the others step 31)". From records
        alone: which rank hung cannot be told where every rank waits in the same step's collective."""
        lead = max(self.last_step.values(), default=0)
        behind = {r: self.last_step.get(r) for r in range(self.world)
                  if r not in self.servers and self.last_step.get(r, 0) < lead}
        now = self.clock()
        if not behind:
            where = f"every rank last recorded step {lead}"
        else:
            where = ", ".join(f"rank {r} last recorded " + (f"step {s}" if s else "no step") +
                              (f" ({duration(now - self.seen[r])} ago)" if r in self.seen else "")
                              for r, s in sorted(behind.items())) + f", the others step {lead}"
        return f"no step for {duration(silent)} (since step {lead}; {where})"


def watch_run(run_dir: Path, spec: Spec | None = None) -> RunWatch:
    """A RunWatch of a run directory, its total from spec.json (or `spec`, where the caller read it)."""
    spec = spec if spec is not None else read_spec(Path(run_dir))
    watch = RunWatch(run_dir, spec.steps, spec.epochs)
    watch.expected = spec.world
    launched = _launched(Path(run_dir))
    watch.since = launched
    return watch


def _launched(run_dir: Path) -> float | None:
    """When the run was launched, as launch.json says (None before it is written, or unreadable)."""
    value = _launch_info(run_dir).get("launched") or _launch_info(run_dir).get("started")
    return float(value) if isinstance(value, (int, float)) else None


def _launch_info(run_dir: Path) -> dict[str, Any]:
    """launch.json as it is now; {} before it is written, or unreadable."""
    from scalelab.core.rundir import read_state

    try:
        return read_state(run_dir) if RunPaths(run_dir).launch.exists() else {}
    except ScalelabError:
        return {}


def queued_of(run_dir: Path) -> str | None:
    """launch.json's `queued`: the backend's word while the run waits in its queue, as the launcher following it
    keeps it (`slurm.backend.note_queued`); None while it runs."""
    value = _launch_info(run_dir).get("queued")
    return str(value) if value else None


def snapshot_of(run_dir: Path, state: str | None = None, dropped: list[str] | None = None,
                spec: Spec | None = None) -> Snapshot | None:
    """Where a run is now, from all its records, as a run in `state` shows it (`Snapshot.as_of`; None: as the
    records have it); None when it wrote none yet, or nothing to say (no step, not ended). `dropped` gets a
    line for each record line that could not be read (PATH:LINE: what is wrong), which the snapshot leaves out.
    `spec`: the run's where the caller read it already (`launch ls`), else read from spec.json."""
    watch = watch_run(run_dir, spec)
    snap = watch.poll().as_of(state)
    if dropped is not None:
        dropped += [line for tail in watch.tails.values() for line in tail.warnings]
    return snap if watch.tails and (snap.step or snap.ended) else None


#: The bar's width: at least this (else it shows nothing), at most rich's default.
BAR_MIN, BAR_MAX = 10, 40
#: The elapsed-time column (0:01:23), shown where the terminal has room for it after everything else.
ELAPSED_WIDTH = 7


@dataclass
class BarLayout:
    """What the progress bar shows in a terminal `width` columns wide: every piece on one line."""

    description: str
    bar_width: int
    info: str
    elapsed: bool


def short_label(label: str, room: int) -> str:
    """A run's name for the bar: without its -YYYYMMDD-HHMMSS stamp, cut to `room` with an ellipsis in the
    middle: the start is the name the user gave, the end says the engine and layout (what tells a sweep's
    runs apart). Cut from the front, "…scaling-study-ddp-1x2" no longer said which experiment it was."""
    import re

    from scalelab.core.terminal import middle_ellipsis

    return middle_ellipsis(re.sub(r"-\d{8}-\d{6}$", "", label), room)


def fit_bar(width: int, label: str, steps_width: int, parts: list[tuple[int, str]], lead: str = "",
            timed: bool = True) -> BarLayout:
    """Lay the bar out to fit `width` (issue 35: at 80 columns rich squeezed the bar and the step count to
    nothing, at 100 the line was cut): the label at most a quarter of it, the bar 10-40 wide, the step count
    whole, then the info's parts by need (loss, ETA or how it ended, words/s, validation, ranks) as long as
    they fit, in their own order; the elapsed time last. What is left lengthens a name cut in its middle,
    then the bar."""
    width = max(width - 1, 40)  # a line of exactly the terminal's width wraps in some terminals
    description = short_label(label, max(8, width // 4))
    fixed = len(description) + 1 + BAR_MIN + 1 + steps_width + 1  # one space between columns
    ordered = ([(4, lead)] if lead else []) + parts
    keep: set[int] = set()
    for i in sorted(range(len(ordered)), key=lambda i: ordered[i][0]):
        trial = keep | {i}
        if fixed + len("  ".join(ordered[j][1] for j in sorted(trial))) <= width:
            keep = trial
    info = "  ".join(ordered[j][1] for j in sorted(keep))
    used = fixed + len(info)
    elapsed = timed and used + 1 + ELAPSED_WIDTH <= width and len(keep) == len(ordered)
    used += (1 + ELAPSED_WIDTH) if elapsed else 0
    # room left over goes to a cut name first (its middle back), then to the bar
    longer = short_label(label, len(description) + max(0, width - used))
    used += len(longer) - len(description)
    return BarLayout(longer, min(BAR_MAX, BAR_MIN + width - used), info, elapsed)


class RunProgress:
    """The launcher's own view while it follows a run: a rich bar on a terminal; elsewhere (CI, a pipe) a
    plain line about every 10% of the run, so logs stay short."""

    def __init__(self, run_dir: Path, total_steps: int | None, label: str, console: Console | None = None,
                 epochs: int | None = None) -> None:
        self.watch = RunWatch(run_dir, total_steps, epochs)
        self.watch.since = time.time()  # the launcher follows from the start: "starting ranks: 1 of 2 up (12s)"
        try:
            self.watch.expected = read_spec(Path(run_dir)).world
        except (ScalelabError, OSError):
            pass  # no spec.json (a test's bare records): "starting ranks: 1 up"
        self.label = label
        self.console = console or Console(stderr=True)
        self.snap = Snapshot(total=self.watch.total)
        self._last_plain: int | str = -1
        self._last_queued: str | None = None  # the queue text a plain line said last (`_plain_queue`)
        self.live = self.console.is_terminal
        self._streams = (sys.stdout, sys.stderr)  # the real ones: a live bar replaces them with its own
        self._progress = None
        if self.live:
            layout = self.layout()
            self._bar = BarColumn(bar_width=layout.bar_width)
            self._elapsed = TimeElapsedColumn()
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), self._bar, MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"), console=self.console, transient=False,
            )
            self._task = self._progress.add_task(layout.description, total=self.watch.total, info=layout.info)

    def __enter__(self) -> "RunProgress":
        if self._progress:
            self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.poll()
        if self._progress:
            self._progress.stop()

    def poll(self) -> None:
        """Read the records written since the last poll and refresh the display."""
        self.watch.queued = queued_of(self.watch.run_dir)
        self.snap = self.watch.poll()
        self._show()

    def write_above(self, text: str, err: bool = False) -> None:
        """Lines of the run's own (its ranks' output) on stdout, or stderr with `err`: above a live bar, where
        the stream is the terminal, through rich's stand-in for it; else as they are (`launch ... > out.txt`
        keeps them, not the bar)."""
        real = self._streams[err]
        if self._progress is not None and real.isatty():
            real = sys.stderr if err else sys.stdout  # rich's proxy while the bar is live: printed above it
        real.write(text)
        real.flush()

    def _plain_queue(self) -> None:
        """Without a terminal, a line when the run enters its queue, when its reason to wait changes to another
        one (BeginTime -> Priority), and when it leaves (queued -> running): a job held in Slurm's queue printed
        nothing for as long as it waited. A moment without a reason (squeue between two) is no news. A run with a
        recorded step has left its queue, whatever the last look at the queue said: the job may start and take its
        steps between two looks, and its step line came before "out of the queue"."""
        queued = None if self.snap.step or self.snap.ended else self.watch.queued
        if queued == self._last_queued or (queued and self._last_queued and "(" not in queued):
            return
        if queued:
            print(f"[{self.label}] queued: {queued}", file=sys.stderr, flush=True)
        else:
            print(f"[{self.label}] out of the queue: running", file=sys.stderr, flush=True)
        self._last_queued = queued

    def info(self) -> str:
        """The bar's text: the snapshot's line without the step (the bar shows it)."""
        return self.layout().info

    def layout(self) -> BarLayout:
        """The bar laid out for the console's width now (a resized terminal gets its own)."""
        total = self.snap.total or self.watch.total
        steps_width = 2 * len(str(total or self.snap.step or 0)) + 1
        if not self.snap.step:
            return fit_bar(self.console.width, self.label, steps_width, [(0, self.watch.starting())],
                           timed=False)  # "starting ranks: 0 of 2 up (8s)" says the time already
        ranks = f"{self.watch.world} rank{'s' if self.watch.world != 1 else ''}"
        return fit_bar(self.console.width, self.label, steps_width, self.snap.parts(), lead=ranks)

    def _show(self) -> None:
        snap = self.snap
        if self._progress:
            layout = self.layout()
            self._bar.bar_width = layout.bar_width
            columns = list(self._progress.columns)
            if layout.elapsed != (self._elapsed in columns):
                self._progress.columns = tuple(columns + [self._elapsed] if layout.elapsed
                                               else [c for c in columns if c is not self._elapsed])
            self._progress.update(self._task, total=snap.total, completed=snap.step, info=layout.info,
                                  description=layout.description)
            return
        self._plain_queue()
        if not snap.step and self.watch.started and self._last_plain == -1:  # once: the ranks are up
            if self.watch.expected is None or len(self.watch.started) >= self.watch.expected:
                self._last_plain = "started"
                print(f"[{self.label}] {self.watch.starting()}", file=sys.stderr, flush=True)
        if not snap.total:
            return
        # past the given total (a script's own length): a line when it passes it, and one when the run ends
        decile: int | str = f"over {snap.ended}" if snap.over else snap.step * 10 // snap.total
        if snap.threshold_step is not None and self._last_plain != "threshold":
            self._last_plain = "threshold"
            print(f"[{self.label}] {snap.line()}", file=sys.stderr, flush=True)
        elif snap.threshold_step is None and decile != self._last_plain and snap.step:
            self._last_plain = decile
            print(f"[{self.label}] {snap.line()}", file=sys.stderr, flush=True)
