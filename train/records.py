"""Per-rank structured records: one JSON object a line (format in docs/records.md).

Each rank appends to its own file, so no rank waits for another to log and a crash loses at most the
line being written; the reports read these files, never log text. Lines are flushed as they are
written so that the launcher can show live progress by reading rank 0's file.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any


def records_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "records" / f"rank-{rank}.jsonl"


class RecordWriter:
    """Appends records for one rank; `time` and the rank's identity are added to every record."""

    def __init__(self, run_dir: Path, rank: int, world: int) -> None:
        path = records_path(run_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.rank, self.world = rank, world
        self._file = path.open("a", buffering=1)  # line-buffered: a reader never sees half a record

    def write(self, kind: str, **fields: Any) -> None:
        record = {"kind": kind, "rank": self.rank, "world": self.world, "time": time.time(), **fields}
        self._file.write(json.dumps(record, default=_jsonable, allow_nan=False) + "\n")

    def event(self, event: str, **fields: Any) -> None:
        self.write("event", event=event, **fields)

    def close(self) -> None:
        self._file.close()


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)
