"""Run directories: where each run's files live, created uniquely and written atomically.

Every path inside a run directory is spelled here once (`RunPaths`), so the launcher, the trainer,
the backends and the reports agree on the layout documented in docs/records.md. State files are
written through a temporary file and a rename: a crash mid-write leaves the previous version, never
half a JSON document.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import RecordError

DEFAULT_RUNS_ROOT = Path("runs")
SPEC_FILE = "spec.json"
LAUNCH_FILE = "launch.json"
SUMMARY_FILE = "summary.json"
RECORDS_DIR = "records"
LOGS_DIR = "logs"


@dataclass(frozen=True)
class RunPaths:
    """The files of one run directory."""

    root: Path

    @property
    def spec(self) -> Path:
        return self.root / SPEC_FILE

    @property
    def launch(self) -> Path:
        return self.root / LAUNCH_FILE

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY_FILE

    @property
    def records(self) -> Path:
        return self.root / RECORDS_DIR

    @property
    def logs(self) -> Path:
        return self.root / LOGS_DIR

    def rank_records(self, rank: int) -> Path:
        return self.records / f"rank-{rank}.jsonl"


def new_run_dir(root: Path, name: str) -> Path:
    """A fresh, unique directory `root/name-YYYYmmdd-HHMMSS[-k]`."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "run"
    root.mkdir(parents=True, exist_ok=True)
    for k in range(1000):
        path = root / (f"{base}-{stamp}" + (f"-{k}" if k else ""))
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RecordError(f"cannot create a run directory under {root}")


def write_json(path: Path, data: Any) -> Path:
    """Write `data` as JSON atomically: a temporary file beside `path`, then a rename."""
    path = Path(path)
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_json(path: Path, what: str = "file") -> Any:
    """Read a JSON state file; a missing or corrupt one is a RecordError naming the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RecordError(f"{path} is missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"cannot read {what} {path}: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{what} {path} is corrupt ({exc.msg} at line {exc.lineno}); restore or delete it") from None
