"""A records file that is a directory (or a FIFO): one line naming it in status, logs, report and resume.

`launch status` and `launch logs` read the rank files through RecordTail, `launch report` the launcher's
events file through `launcher_events`: both were IsADirectoryError tracebacks, while `rank_files` (resume)
already named the directory in one line.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scalelab.core.errors import RecordError
from scalelab.core.records import RecordTail, read_records
from scalelab.core.trajectory import launcher_events


def _records(tmp_path: Path) -> Path:
    records = tmp_path / "run" / "records"
    records.mkdir(parents=True)
    return records


@pytest.mark.parametrize("make", ["dir", "fifo"])
def test_a_rank_file_that_is_not_a_file_is_one_error_naming_it(tmp_path, make) -> None:
    path = _records(tmp_path) / "rank-0.jsonl"
    path.mkdir() if make == "dir" else os.mkfifo(path)
    for read in (lambda: RecordTail(path).read(), lambda: read_records(path, [])):
        with pytest.raises(RecordError, match=r"rank-0\.jsonl is .*, not a records file; remove it"):
            read()


def test_the_launchers_events_file_as_a_directory_is_one_error_naming_it(tmp_path) -> None:
    (_records(tmp_path) / "launcher-events.jsonl").mkdir()
    with pytest.raises(RecordError, match=r"launcher-events\.jsonl is a directory, not the launcher's events file"):
        launcher_events(tmp_path / "run")


def test_missing_files_are_still_no_records(tmp_path) -> None:
    records = _records(tmp_path)
    assert RecordTail(records / "rank-0.jsonl").read() == []
    assert launcher_events(tmp_path / "run") == []
