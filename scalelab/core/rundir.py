"""Run directories: where each run's files live, created uniquely and written atomically.

Every path inside a run directory is spelled here once (`RunPaths`), so the launcher, the trainer,
the backends and the reports agree on the layout documented in docs/records.md. State files are
written through a temporary file and a rename: a crash mid-write leaves the previous version, never
half a JSON document.

The run states are defined here once, and `launch.json` (how the run was launched and how it
ended) is changed only through `start_state` / `edit_state` / `update_state` / `record_state`: a
read-modify-write under a lock on the run directory, because two launcher processes may write it at
once (the one following the run and a `launch cancel` from another shell).
"""

from __future__ import annotations

import datetime
import fcntl
import json
import math
import os
import re
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from scalelab.core.errors import RecordError, shell_word
from scalelab.core.writes import WriteError, write_failure, writing

DEFAULT_RUNS_ROOT = Path("runs")
SPEC_FILE = "spec.json"
LAUNCH_FILE = "launch.json"
SUMMARY_FILE = "summary.json"
RECORDS_DIR = "records"
LOGS_DIR = "logs"
CHECKPOINT_FILE = "checkpoint.pt"
CHECKPOINT_DIR = "checkpoint"  # RUN_DIR/checkpoint/: a --script's own checkpoint files (scalelab.track)
SWEEP_FILE = "sweep.json"  # a sweep directory: {"runs": [layout directory names, in sweep order], ...}
STUDY_FILE = "study.json"  # a study directory: {"title": ..., "sweeps": [{"label": variant, "dir": sweep}, ...]}
STUDY_SOURCE = "study.yaml"  # a study directory's copy of the study file it ran, which `launch resume STUDY` reads
GEMM_FILE = "gemm.json"  # seed 003's GEMM study (launcher/study.py): no runs, its timings are its tables

# ---- run states: every backend maps its own (Slurm's, Kubernetes', EC2's) onto these -------------
PENDING = "PENDING"      # queued, instances booting, pods being scheduled
RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
UNKNOWN = "UNKNOWN"      # the backend cannot tell (a controller too busy to answer, an object gone)
ACTIVE = frozenset({PENDING, RUNNING})
TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED})


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

    @property
    def checkpoint(self) -> Path:
        return self.root / CHECKPOINT_FILE

    @property
    def checkpoint_dir(self) -> Path:
        return self.root / CHECKPOINT_DIR

    def rank_records(self, rank: int) -> Path:
        return self.records / f"rank-{rank}.jsonl"


def run_name(name: str) -> str:
    """`name` (a --name, a model) as the one component of a run directory's name: letters, digits and
    `._-` only. Why here, for real and dry runs alike: the name is written into shell scripts (the local
    command, a Slurm batch script, EC2 user data), where a newline or `$(...)` would be a command."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "run"


# A run directory's name is NAME-YYYYmmdd-HHMMSS[-k]: a filesystem name holds 255 bytes, so the name at most
# 200 leaves room for the stamp (and a sweep's or repeat's suffixes). A --name of 300 characters was an
# "OSError: File name too long" traceback (issue #37).
MAX_NAME_BYTES = 200


def name_problem(name: str) -> str:
    """'' for a name that fits a run directory's name; else what is wrong with it, for the message."""
    size = len(run_name(name).encode())
    return (f"is {size:,} characters long; a run name has at most {MAX_NAME_BYTES} (it becomes the run "
            "directory's name, with the date and time added): give a shorter one") if size > MAX_NAME_BYTES else ""


def dryrun_dir(root: Path, name: str) -> Path:
    """The run directory a --dry-run prints (never created): `root/NAME-DRYRUN`, NAME sanitised as a
    real run's is, so the printed request is the one a real run would submit."""
    return Path(root) / f"{run_name(name)}-DRYRUN"


def new_run_dir(root: Path, name: str) -> Path:
    """A fresh, unique directory `root/name-YYYYmmdd-HHMMSS[-k]`; a root that cannot take one (read-only,
    full, not ours) is one line naming it and its filesystem."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = run_name(name)
    if name_problem(name):  # a study's title, a sweep's name: refused before anything is made
        raise RecordError(f"the name {base[:40]}... {name_problem(name)}")
    with writing(root, "a run directory", "or give --runs-dir a directory on a filesystem with room"):
        root.mkdir(parents=True, exist_ok=True)
        for k in range(1000):
            path = root / (f"{base}-{stamp}" + (f"-{k}" if k else ""))
            try:
                path.mkdir()
                return path
            except FileExistsError:
                continue
    raise RecordError(f"cannot create a run directory under {root}")


def discard_unlaunched(run_dir: Path) -> str:
    """Remove a run directory this launcher just made and never launched (no launch.json): what a
    failed start (a full disk, a read-only one) left in it is of no use. '' when it is gone (or was
    launched, and so kept); else the words that tell the user to remove it, for the message: `launch ls`
    listed it as NEW for ever and `launch status` said it was never launched."""
    if not Path(run_dir).is_dir() or RunPaths(Path(run_dir)).launch.exists():
        return ""
    shutil.rmtree(run_dir, ignore_errors=True)
    if not os.path.lexists(run_dir):
        return ""
    return f"; the run directory {run_dir} was never launched and could not be removed: remove it with `rm -r {shell_word(run_dir)}`"


def write_json(path: Path, data: Any) -> Path:
    """Write `data` as JSON atomically: a temporary file beside `path`, then a rename."""
    return write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def write_text(path: Path, text: str, shown: Path | None = None) -> Path:
    """Replace `path` by `text` atomically, as `write_chunks` does."""
    return write_chunks(path, [text.encode()], shown)


def write_chunks(path: Path, chunks: Iterable[bytes], shown: Path | None = None) -> Path:
    """Replace `path` by the bytes of `chunks` atomically (a temporary file beside it, then a rename),
    keeping the mode the file had (else the umask's, not mkstemp's 0600). A failed write - a full or
    read-only filesystem - removes the temporary file, leaves the previous version and is a WriteError
    naming `path` (or `shown`, the file it stands for) and its filesystem; anything else raised on the
    way (a download cut by a stop signal) also leaves the previous version and no temporary file."""
    path = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, FileNotFoundError):
            raise
        raise WriteError(write_failure(shown or path, exc)) from None
    except BaseException:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _mode_for(path: Path) -> int:
    """The mode a rewritten file keeps: its own; a new file's is 0666 less the umask, as open() gives."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process umask, read without changing it where Linux shows it (other threads create files too)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def read_json(path: Path, what: str = "file", kind: type | None = None) -> Any:
    """Read a JSON state file; a missing or corrupt one is a RecordError naming the file, and so is one
    whose top level is not `kind` (a hand-edited launch.json holding `[]` was an AttributeError traceback
    in every command that read it)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RecordError(f"{path} is missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"cannot read {what} {path}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{what} {path} is corrupt ({exc.msg} at line {exc.lineno}); restore or delete it") from None
    if kind is not None and not isinstance(data, kind):
        expected = {dict: "a JSON object {...}", list: "a JSON list [...]"}.get(kind, kind.__name__)
        raise RecordError(f"{what} {path} holds {type(data).__name__} {text.strip()[:40]!r} where {expected} is "
                          "expected (edited by hand?); restore or delete it")
    return data


# ---- launch.json: the run's state ----------------------------------------------------------------


def read_state(run_dir: Path) -> dict[str, Any]:
    """launch.json of a run; a run directory without one was never launched."""
    path = RunPaths(Path(run_dir)).launch
    if not path.exists():
        raise RecordError(f"{run_dir} has no {LAUNCH_FILE}: it was never launched (or is not a run directory)")
    return checked_state(read_json(path, LAUNCH_FILE, dict), path)


def checked_state(state: dict[str, Any], path: Path) -> dict[str, Any]:
    """`state`, launch.json at `path` as read, if each of its fields holds what its writers write; else a
    RecordError. Apart from `read_state` for a launch.json read already (`RunRecords.launch`)."""
    problem = _state_problem(state)
    if problem:
        raise RecordError(f"{path}: {problem} (edited by hand?); restore it, or delete that field")
    return state


# launch.json fields -> (what each must be, its check); every writer here writes them so. A hand-edited
# `"state": 5` was reported as UNKNOWN and `"pids": "abc"` taken as no process, without a word (issue #37)
_NUMBER = (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
_STATE_FIELDS: dict[str, tuple[str, Any]] = {
    "state": ("one of the run states " + ", ".join(sorted(ACTIVE | TERMINAL | {UNKNOWN})),
              lambda v: isinstance(v, str) and v in ACTIVE | TERMINAL | {UNKNOWN}),
    "detail": ("text", lambda v: isinstance(v, str)),
    "error": ("text", lambda v: isinstance(v, str)),  # why a failed run failed, as `launch run` said it
    "backend": ("a backend's name", lambda v: isinstance(v, str)),
    "pids": ("a list of process ids", lambda v: isinstance(v, list) and all(
        isinstance(p, int) and not isinstance(p, bool) and 0 < p < 2**31 for p in v)),
    "processes": ("a list of processes (pid, start_time, cmdline, host)",
                  lambda v: isinstance(v, list) and all(isinstance(p, dict) for p in v)),
    "launched": ("a time in seconds", _NUMBER),
    "ended": ("a time in seconds", _NUMBER),
}


def _state_problem(state: dict[str, Any]) -> str | None:
    for name, (what, ok) in _STATE_FIELDS.items():
        if name in state and (state[name] is not None or name in ("pids", "processes")) and not ok(state[name]):
            return f"field {name!r} holds {json.dumps(state[name])[:40]}, not {what}"
    return None


@contextmanager
def dir_locked(run_dir: Path) -> Iterator[None]:
    """An exclusive lock on the run directory itself (no lock file left behind); not reentrant."""
    fd = os.open(Path(run_dir), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def start_state(run_dir: Path, **fields: Any) -> dict[str, Any]:
    """A new launch of the run: launch.json becomes `fields` plus the absolute run directory, no state yet."""
    state = {**fields, "run_dir": str(Path(run_dir).absolute())}
    with dir_locked(run_dir):
        write_json(RunPaths(Path(run_dir)).launch, state)
    return state


@contextmanager
def edit_state(run_dir: Path) -> Iterator[dict[str, Any]]:
    """Read-modify-write launch.json: change the dict yielded; it is written back atomically at the end."""
    with dir_locked(run_dir):
        state = read_state(run_dir)
        yield state
        write_json(RunPaths(Path(run_dir)).launch, state)


def update_state(run_dir: Path, **fields: Any) -> dict[str, Any]:
    """Set `fields` in launch.json; return the whole new state."""
    with edit_state(run_dir) as state:
        state.update(fields)
    return state


def record_state(run_dir: Path, state: str, detail: str = "", **fields: Any) -> str:
    """Record the run's state (and, for an end, when); return the state recorded.

    An end recorded earlier wins: a `launch cancel` marks the run CANCELLED before it stops the
    ranks, and neither the exit codes that stopping causes nor a last RUNNING seen by the launcher
    following it may overwrite that. UNKNOWN is an end too when recorded (the launcher stopped
    following a run its backend could no longer see), but not a final one.
    """
    if state not in ACTIVE | TERMINAL | {UNKNOWN}:
        raise ValueError(f"{state} is not a run state")
    with edit_state(run_dir) as info:
        if info.get("state") not in TERMINAL:
            info.update(state=state, detail=detail)
            if state not in ACTIVE:
                info["ended"] = time.time()
        info.update(fields)
    return info["state"]


# ---- sweep directories ---------------------------------------------------------------------------


def is_sweep(path: Path) -> bool:
    return (Path(path) / SWEEP_FILE).exists()


def member_name(name: Any) -> bool:
    """True for a name that is one directory inside its sweep or study: not empty, no '/', not '.' or
    '..'. Why: a hand-edited sweep.json listing '..' made report, ls and resume act on the parent."""
    return isinstance(name, str) and bool(name) and "/" not in name and "\0" not in name and name not in (".", "..")


def sweep_runs(sweep_dir: Path) -> list[Path]:
    """The run directories of a sweep, in sweep order (some may not have started)."""
    path = Path(sweep_dir) / SWEEP_FILE
    meta = read_json(path, SWEEP_FILE, dict)
    names = meta.get("runs") if isinstance(meta, dict) else None
    if not isinstance(names, list):
        raise RecordError(f"{path} has no list of layout directories under \"runs\"; restore it or run the sweep again")
    outside = [n for n in names if not member_name(n)]
    if outside:
        raise RecordError(f"{path} lists {outside[0]!r} under \"runs\", which is not a directory inside "
                          f"{sweep_dir}; restore the file (entries are layout directory names such as 1x2)")
    return [Path(sweep_dir) / name for name in names]


def study_sweeps(study_dir: Path) -> list[tuple[str, Path]]:
    """(variant label, sweep directory) of a study, in study order (a sweep may not have started)."""
    meta = read_json(Path(study_dir) / STUDY_FILE, STUDY_FILE, dict)
    sweeps = meta.get("sweeps") if isinstance(meta, dict) else None
    if not isinstance(sweeps, list) or not all(isinstance(s, dict) and member_name(s.get("dir")) for s in sweeps):
        raise RecordError(f"{Path(study_dir) / STUDY_FILE} has no list of sweeps (label, dir) under \"sweeps\"; "
                          "restore it or run the study again")
    return [(str(s.get("label", s["dir"])), Path(study_dir) / s["dir"]) for s in sweeps]


def run_state(run_dir: Path) -> str | None:
    """The state recorded in launch.json; None for a run that was never launched."""
    return read_state(run_dir).get("state") if RunPaths(Path(run_dir)).launch.exists() else None
