"""Per-rank structured records: the one writer (ranks) and the one reader (launcher, reports).

Layout and record format: docs/records.md. Reading is strict: a record line that is not JSON is an
error naming the file and line (a report over silently skipped lines would lie), except a truncated
*last* line of a rank that was killed mid-write, which is dropped with a warning.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from core.errors import RecordError
from core.rundir import RunPaths
from core.spec import Spec, read_spec

try:  # orjson parses records about 5x faster; the standard library is the fallback
    import orjson

    _loads = orjson.loads
    _DecodeError: tuple[type[Exception], ...] = (orjson.JSONDecodeError,)
except ImportError:  # pragma: no cover
    _loads = json.loads
    _DecodeError = (json.JSONDecodeError,)



@dataclass
class RunRecords:
    """Everything recorded by one run, as DataFrames by kind (empty frames when absent)."""

    run_dir: Path
    spec: Spec
    start: pd.DataFrame
    steps: pd.DataFrame
    val: pd.DataFrame
    events: pd.DataFrame
    warnings: list[str] = field(default_factory=list)

    @property
    def ranks(self) -> int:
        return int(self.start["world"].max()) if len(self.start) else 0


def record_files(run_dir: Path) -> list[Path]:
    files = sorted(RunPaths(Path(run_dir)).records.glob("rank-*.jsonl"), key=lambda p: int(p.stem.split("-")[1]))
    if not files:
        raise RecordError(
            f"{run_dir} has no records (records/rank-*.jsonl); the run did not start training - see {run_dir}/logs"
        )
    return files


def read_records(path: Path, warnings: list[str]) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    out = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = _loads(line)
        except _DecodeError:
            if i == len(lines) and not raw.endswith(b"\n"):
                warnings.append(f"{path}:{i}: dropped a truncated last line (the rank was killed while writing)")
                continue
            raise RecordError(
                f"corrupt record at {path}:{i} (not a JSON object); fix or delete that line, or re-run"
            ) from None
        if not isinstance(rec, dict) or "kind" not in rec:
            raise RecordError(f"corrupt record at {path}:{i} (no 'kind' field); fix or delete that line, or re-run")
        out.append(rec)
    return out


def load_run(run_dir: str | Path) -> RunRecords:
    """Read a run directory's spec and every rank's records."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RecordError(f"run directory not found: {run_dir}")
    spec = read_spec(run_dir)
    warnings: list[str] = []
    by_kind: dict[str, list[dict[str, Any]]] = {"start": [], "step": [], "val": [], "event": []}
    for path in record_files(run_dir):
        for rec in read_records(path, warnings):
            by_kind.setdefault(rec["kind"], []).append(rec)
    frames = {k: pd.DataFrame.from_records(v) for k, v in by_kind.items()}
    return RunRecords(run_dir, spec, frames["start"], frames["step"], frames["val"], frames["event"], warnings)


# ---- the writer: one JSON object a line, one file per rank ------------------------------------


def records_path(run_dir: Path, rank: int) -> Path:
    return RunPaths(Path(run_dir)).rank_records(rank)


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
