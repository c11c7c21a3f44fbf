"""A prep run's (or prep sweep's) row in `launch ls` and `launch status`, beside the training runs.

Why: `launch prep` writes its run directories under the same runs directory, and `launch ls` left them out, so
a prep that failed overnight, or the throughput of the last one, could only be found by listing the folder.
Read from what the prep wrote (prep.json, its records, summary.json), never from its log text. Kept apart from
`prep.report` so that `launch ls` imports no pandas.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from scalelab.core.errors import RecordError, ScalelabError
from scalelab.core.rundir import member_name, read_json
from scalelab.launcher.inventory import COLUMNS, group_row
from scalelab.prep.records import RECORDS, load_records
from scalelab.prep.request import PREP_FILE, read_request

SUMMARY = "summary.json"


def inventory_row(path: Path, now: float | None = None) -> dict[str, Any]:
    """The row of a prep run, or of a prep sweep with its runs as `layouts`; a missing or corrupt prep.json is
    a ScalelabError (the listing shows the directory as UNREADABLE, saying why)."""
    request = _request(path)
    if "sweep" not in request:
        return _run_row(path, request, now)
    runs = [_run_row(path / name, _request(path / name), now) if (path / name / PREP_FILE).is_file()
            else {**dict.fromkeys(COLUMNS), "name": name, "path": str((path / name).absolute()), "kind": "prep",
                  "backend": request.get("backend"), "layout": name, "state": "NEW"}
            for name in request["sweep"]]
    row = group_row(path, "prep", runs)
    row.update(layout=_workers(sorted({r["workers"] for r in runs if r.get("workers")})) or None, steps=None)
    return row


def _request(path: Path) -> dict[str, Any]:
    """prep.json as `launch prep` writes it (an object; a sweep's run names plain names in it), else a RecordError
    the listing shows as UNREADABLE: a list, a number or `"sweep": 5` broke `launch ls` with a traceback, and a
    name such as ".." listed the runs directory's parent."""
    request = read_request(path)
    sweep = request.get("sweep", []) if isinstance(request, dict) else None
    if not isinstance(sweep, list) or not all(member_name(name) for name in sweep):
        raise RecordError(f"{path / PREP_FILE} is not what `launch prep` writes (an object, a sweep's runs by name); "
                          "re-run launch prep, or remove the directory")
    return request


def _run_row(path: Path, request: dict[str, Any], now: float | None) -> dict[str, Any]:
    """COMPLETED with its lines/s once summary.json is written; FAILED or CANCELLED (interrupted) as its last
    failure record says; else INCOMPLETE: preparing still, or stopped without a word (killed)."""
    state, rate = _state(path)
    workers = request.get("workers")
    workers = workers if isinstance(workers, int) and not isinstance(workers, bool) else None  # a hand edit's
    marks = [p for p in (path / SUMMARY, path / RECORDS, path / PREP_FILE) if p.exists()]
    return {**dict.fromkeys(COLUMNS), "name": path.name, "path": str(path.absolute()), "kind": "prep",
            "backend": request.get("backend"), "layout": _workers([workers]), "state": state,
            "workers": workers, "words_per_s": rate, "unit": "lines",
            "age_s": (now or time.time()) - marks[0].stat().st_mtime if marks else None}


def _state(path: Path) -> tuple[str, float | None]:
    if (path / SUMMARY).is_file():
        try:
            return "COMPLETED", read_json(path / SUMMARY, "summary", dict).get("lines_per_s")
        except ScalelabError:
            return "COMPLETED", None
    try:
        failures = [r for r in load_records(path) if r.get("kind") == "failure"]
    except ScalelabError:
        failures = []
    if failures:
        return ("CANCELLED" if failures[-1].get("error") == "interrupted" else "FAILED"), None
    return "INCOMPLETE", None


def _workers(counts: list[Any]) -> str:
    """"2 workers", "1,2,4 workers"."""
    counts = [str(c) for c in counts if c]
    return f"{','.join(counts)} worker{'s' if counts != ['1'] else ''}" if counts else ""
