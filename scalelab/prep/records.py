"""A prep run directory: prep.json (the request), records/prep.jsonl (one JSON object a line), logs/.

Record kinds (docs/prep.md): `cluster` (start-up time, workers), `worker` (each worker's memory
before any task), `task` (one per task: phase, bytes, lines, samples, tokens, seconds, worker,
host, node, pid, rss_mb, peak_rss_mb), `phase` (each phase's wall time on the driver), `error` (why a prep stopped: its message, the
error's type or "interrupted"). Reports
are computed from these records only, as training reports are from the rank records.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from scalelab.core.errors import RecordError
from scalelab.core.records import (
    INT,
    NUM,
    OPTIONAL,
    STR,
    read_records,
    record_line,
    register_kinds,
)
from scalelab.core.rundir import RECORDS_DIR
from scalelab.core.writes import check_inside, open_inside

# The prep records' schema, checked by the one reader and by `Recorder` (no rank: one driver writes).
register_kinds({
    "cluster": {"startup_s": NUM, "backend": STR, "workers": INT + OPTIONAL},
    "worker": {},
    "phase": {"phase": STR, "tasks": INT, "start": NUM, "end": NUM},
    "task": {"phase": STR, "start": NUM, "end": NUM, "seconds": NUM},
    # not "error": the kinds are one registry with the ranks' records (core.records.KINDS), whose error has no `error`
    "failure": {"message": STR, "error": STR, "time": NUM},
}, common={"kind": STR})

RECORDS = Path(RECORDS_DIR) / "prep.jsonl"


class Recorder:
    """Appends records to RUN_DIR/records/prep.jsonl, line-buffered; `echo` sees each one too."""

    def __init__(self, run_dir: Path, echo: Callable[[dict], None] | None = None) -> None:
        path = Path(run_dir) / RECORDS
        check_inside(run_dir, path)  # a linked records/ (or records file) is refused, never appended through
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = os.fdopen(open_inside(run_dir, path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), "a",
                               buffering=1)
        self.echo = echo

    def __call__(self, record: dict[str, Any]) -> None:
        self._file.write(record_line(record))  # checked against the prep kinds' schema, as every record
        if self.echo is not None:
            self.echo(record)

    def close(self) -> None:
        self._file.close()


def load_records(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / RECORDS
    if not path.is_file():
        raise RecordError(f"{run_dir} has no {RECORDS}: the prep did not start" + logs_hint(run_dir))
    return read_records(path, [])


def logs_hint(run_dir: Path) -> str:
    """"; see RUN_DIR/logs" where a logs folder exists (Slurm workers' logs), else nothing."""
    logs = Path(run_dir) / "logs"
    return f"; see {logs}" if logs.is_dir() else ""
