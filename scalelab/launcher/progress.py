"""Live progress from rank 0's records: steps, words/s and loss while a run trains.

It reads the same structured records the reports use (never log text), tailing
RUN_DIR/records/rank-0.jsonl with the one record reader (`core.records.RecordTail`). On a terminal
it draws a rich progress bar; elsewhere (CI, a pipe) it prints a plain line about every 10% of the
run so logs stay short.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from scalelab.core.records import RecordTail
from scalelab.core.rundir import RunPaths


class RunProgress:
    def __init__(self, run_dir: Path, total_steps: int | None, label: str, console: Console | None = None) -> None:
        self.records = RecordTail(RunPaths(Path(run_dir)).rank_records(0))
        self.total = total_steps
        self.label = label
        self.console = console or Console(stderr=True)
        self.step = 0
        self.world = 1
        self.workers: int | None = None  # ranks with data (ps server ranks have none); None: every rank
        self.words_per_s: float | None = None
        self.loss: float | None = None
        self.val_loss: float | None = None
        self.threshold_step: int | None = None  # the step whose validation reached the loss threshold
        self._last_plain = -1
        self.live = self.console.is_terminal
        self._progress = None
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=self.console, transient=False,
            )
            self._task = self._progress.add_task(label, total=total_steps, info="starting ranks...")

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
        for rec in self.records.read():
            self.world = rec.get("world", self.world)
            if rec["kind"] == "start":
                share, batch = rec.get("batch_this_rank"), rec.get("global_batch")
                self.workers = batch // share if share and batch else None
            elif rec["kind"] == "step":
                self.step = rec["step"]
                self.loss = rec["loss"]
                if not rec["warmup"] and rec["step_s"] > 0:
                    # rank 0's view; the report uses the slowest rank (docs/records.md)
                    self.words_per_s = rec["words"] * (self.workers or self.world) / rec["step_s"]
            elif rec["kind"] == "val":
                self.val_loss = rec["val_loss"]
            elif rec["kind"] == "event" and rec.get("event") == "threshold":
                self.threshold_step = rec.get("step")
        self._show()

    def info(self) -> str:
        if self.threshold_step is not None:  # the bar stops short of the total: say why
            return f"threshold reached at step {self.threshold_step}" + (f"  val {self.val_loss:.3f}" if self.val_loss is not None else "")
        parts = [f"{self.world} rank(s)"]
        if self.words_per_s is not None:
            parts.append(f"{self.words_per_s:,.0f} words/s")
        if self.loss is not None:
            parts.append(f"loss {self.loss:.3f}")
        if self.val_loss is not None:
            parts.append(f"val {self.val_loss:.3f}")
        return "  ".join(parts)

    def _show(self) -> None:
        if self._progress:
            self._progress.update(self._task, completed=self.step, info=self.info())
            return
        if not self.total:
            return
        decile = self.step * 10 // self.total
        if self.threshold_step is not None and self._last_plain != "threshold":
            self._last_plain = "threshold"
            print(f"[{self.label}] step {self.step}/{self.total}  {self.info()}", file=sys.stderr, flush=True)
        elif self.threshold_step is None and decile != self._last_plain and self.step:
            self._last_plain = decile
            print(f"[{self.label}] step {self.step}/{self.total}  {self.info()}", file=sys.stderr, flush=True)
