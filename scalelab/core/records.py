"""Per-rank structured records: the one writer (ranks) and the one reader (launcher, reports).

Layout and record format: docs/records.md. Reading for a report is strict: a record line that is
not JSON is an error naming the file and line (a report over silently skipped lines would lie),
except a truncated *last* line of a rank that was killed mid-write, which is dropped with a warning.
Reading while a run goes on (progress, the AWS mirror, the launcher looking for `error` records) is
tolerant: such a line is skipped with a warning, since the rank may be writing it right now.

A rank that stops on a user error (`ScalelabError`) says so in an `error` record (`record_error`):
the launcher builds its one-line message from those records, never from log text.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from scalelab.core.errors import RecordError
from scalelab.core.rundir import RECORDS_DIR, RunPaths, read_json
from scalelab.core.spec import Spec, read_spec
from scalelab.core.writes import WriteError, check_inside, open_inside, what_it_is, writing

if TYPE_CHECKING:  # pandas costs 0.4 s to import: only the readers that build frames load it
    import pandas as pd

try:  # orjson parses records about 5x faster; the standard library is the fallback
    import orjson

    _loads = orjson.loads
    _DecodeError: tuple[type[Exception], ...] = (orjson.JSONDecodeError,)
except ImportError:  # pragma: no cover
    _loads = json.loads
    _DecodeError = (json.JSONDecodeError,)


# ---- the record kinds: the schema has one owner, here -----------------------------------------

INT, NUM, BOOL, STR = "a whole number", "a number", "true or false", "a string"
OPTIONAL = " or null"
RECORDS_FIX = "and `launch resume` the run, or run with --runs-dir on a filesystem with room"
EVENTS_FIX = "and run the command again, or give --runs-dir a directory on a filesystem with room"  # also before a start

# kind -> {field: expected}; every record also has COMMON. Fields a kind may carry beyond these are
# kept (an `event` has its own); these are the ones reports depend on. Format: docs/records.md.
COMMON: dict[str, str] = {"kind": STR, "rank": INT, "world": INT, "time": NUM}
KINDS: dict[str, dict[str, str]] = {
    "start": {"model": STR + OPTIONAL, "engine": STR + OPTIONAL, "nodes": INT + OPTIONAL,
              "gpus_per_node": INT + OPTIONAL, "global_batch": INT + OPTIONAL,
              "steps_per_epoch": INT + OPTIONAL, "precision": STR + OPTIONAL,
              "grad_compression": STR + OPTIONAL,
              # provenance (scalelab/core/provenance.py): every rank's machine, rank 0's software
              "host": STR + OPTIONAL, "cpu_model": STR + OPTIONAL, "gpu_model": STR + OPTIONAL,
              "stdout": STR + OPTIONAL, "stderr": STR + OPTIONAL,  # the rank's own output files, where files
              "scalelab_version": STR + OPTIONAL, "torch_version": STR + OPTIONAL,
              "horovod_version": STR + OPTIONAL, "python_version": STR + OPTIONAL,
              "git_commit": STR + OPTIONAL, "role": STR + OPTIONAL, "mem_base_bytes": INT + OPTIONAL,
              "output_loss": STR + OPTIONAL, "output_loss_note": STR + OPTIONAL},  # typed when present
    # phases, loss and lr are typed when present (published or hand-made records may lack them)
    "step": {"step": INT, "warmup": BOOL, "step_s": NUM, "samples": INT, "words": INT,
             "epoch": INT + OPTIONAL, "data_s": NUM + OPTIONAL, "forward_s": NUM + OPTIONAL,
             "backward_s": NUM + OPTIONAL, "exchange_s": NUM + OPTIONAL, "optimizer_s": NUM + OPTIONAL,
             "loss": NUM + OPTIONAL, "lr": NUM + OPTIONAL,
             # the gradient noise scale (scalelab/train/noise.py), on the steps that estimated it
             "noise_scale": NUM + OPTIONAL, "noise_trace": NUM + OPTIONAL, "noise_grad_sq": NUM + OPTIONAL,
             "noise_s": NUM + OPTIONAL,
             "loss_scale": NUM + OPTIONAL, "skipped": BOOL + OPTIONAL,  # the two: fp16's gradient scaler
             "profiled": BOOL + OPTIONAL,  # traced by --profile-steps: left out of timings
             "mem_peak_bytes": INT + OPTIONAL, "mem_kind": STR + OPTIONAL,  # scalelab/train/memory.py
             "role": STR + OPTIONAL},  # "server": a ps shard rank of --ps-placement separate (no samples)
    "val": {"step": INT, "epoch": INT, "val_loss": NUM + OPTIONAL, "elapsed_s": NUM},
    "event": {"event": STR},
    "error": {"message": STR},
    # an all-reduce timed over every rank after the last step (spec.link_probe_mb; rank 0 writes it)
    "link": {"scope": STR, "nodes": INT, "mb": NUM, "time_s": NUM, "algbw": NUM, "busbw": NUM},
}


def _fits(value: Any, expected: str) -> bool:
    if value is None:
        return expected.endswith(OPTIONAL)
    base = expected.removesuffix(OPTIONAL)
    if base == BOOL:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if base == INT:
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if base == NUM:
        return isinstance(value, (int, float))
    return isinstance(value, str)


_TYPES = {INT: (int,), NUM: (int, float), BOOL: (bool,), STR: (str,)}
_MISSING = object()
# kind -> [(field, the types that pass at once, the expectation for the message)]; compiled once,
# because reports read a million records and this check runs on each.
_CHECKS: dict[str, list[tuple[str, tuple[type, ...], str]]] = {}


def register_kinds(kinds: Mapping[str, Mapping[str, str]], common: Mapping[str, str] = COMMON) -> None:
    """Add record kinds to the schema (the rank records' own, and a layer above's, e.g. `launch prep`'s,
    which carry no rank); the one writer and the one reader then check them like the built-in ones. A kind is
    one schema for every writer: one registered again with other fields is a ValueError (prep's `error` with an
    `error` field once replaced the ranks', and every rank's error record in that process failed its check)."""
    for kind, fields in kinds.items():
        if _CHECKS.get(kind) is not None and KINDS.get(kind) != dict(fields):
            raise ValueError(f"record kind {kind!r} is registered already with other fields: name it otherwise")
        KINDS[kind] = dict(fields)
        _CHECKS[kind] = [(name, _TYPES[exp.removesuffix(OPTIONAL)] + ((type(None),) if exp.endswith(OPTIONAL) else ()), exp)
                         for name, exp in {**common, **fields}.items()]


register_kinds(dict(KINDS))


def record_problem(rec: Mapping[str, Any], partial: bool = False, absent: tuple[str, ...] = ()) -> str | None:
    """What is wrong with one record against its kind's schema, or None. `partial`: only the fields
    present are checked (the bench and tests write minimal `start` records); `absent`: fields this
    writer never has (the launcher's own events have no rank)."""
    checks = _CHECKS.get(rec.get("kind"))  # type: ignore[arg-type]
    if checks is None:
        return f"unknown record kind {rec.get('kind')!r} (kinds: {', '.join(KINDS)})"
    for name, types, expected in checks:
        value = rec.get(name, _MISSING)
        if type(value) in types:
            continue
        if value is _MISSING:
            if partial or expected.endswith(OPTIONAL) or name in absent:
                continue
            return f"{rec['kind']} record has no {name!r} field"
        if not _fits(value, expected):
            return f"{rec['kind']} record field {name!r} must be {expected}, got {value!r}"
    return None


@dataclass
class RunRecords:
    """Everything recorded by one run, as DataFrames by kind (empty frames when absent)."""

    run_dir: Path
    spec: Spec
    start: "pd.DataFrame"
    steps: "pd.DataFrame"
    val: "pd.DataFrame"
    events: "pd.DataFrame"
    warnings: list[str] = field(default_factory=list)

    @property
    def ranks(self) -> int:
        return int(self.start["world"].max()) if len(self.start) else 0

    @functools.cached_property
    def launch(self) -> dict[str, Any]:
        """launch.json as it was when first asked for ({} before it is written; a corrupt one: RecordError), its
        fields unchecked (`rundir.checked_state` checks them where they matter). Read once for all that the run's
        summary, its notes and its price take from it: `launch report` read it twice for a run whose steps were
        all warm-up."""
        path = RunPaths(self.run_dir).launch
        return read_json(path, "launch file", dict) if path.exists() else {}


RANK_FILE = re.compile(r"rank-(\d+)\.jsonl")


def rank_files(run_dir: Path) -> list[Path]:
    """records/rank-N.jsonl in rank order; a stray rank-abc.jsonl or a rank-0.jsonl that is a directory is
    one line naming it (were a ValueError and an IsADirectoryError traceback in report and resume)."""
    records = RunPaths(Path(run_dir)).records
    found = []
    for path in records.glob("rank-*.jsonl"):
        match = RANK_FILE.fullmatch(path.name)
        if not match:
            raise RecordError(f"{path} is not a rank's records file (rank-N.jsonl, N a number); move it out of "
                              f"{records}, then run the command again")
        refuse_non_file(path)  # a link is refused, with its own message, where opened
        found.append((int(match[1]), path))
    return [path for _, path in sorted(found)]


def refuse_non_file(path: Path, what: str = "a records file", writer: str = "the ranks") -> None:
    """A RecordError naming `path` when it exists as something other than a file (a directory, a FIFO): one
    line for status, logs, report and resume instead of an IsADirectoryError (or a read that never ends). A
    link is left to `open_inside`, which refuses it with its own message."""
    if path.exists() and not path.is_file() and not path.is_symlink():
        raise RecordError(f"{path} is {what_it_is(path)}, not {what}; remove it (it is written by {writer}), then "
                          "run the command again")


def record_files(run_dir: Path) -> list[Path]:
    files = rank_files(run_dir)
    if not files:
        raise RecordError(
            f"{run_dir} has no records (records/rank-*.jsonl); the run did not start training - see {run_dir}/logs"
        )
    return files


MAX_STEP_S = 7 * 24 * 3600.0  # a week: no step takes longer; 1e308 was accepted and broke the throughput


def _value_problem(rec: Mapping[str, Any]) -> str | None:
    """What no rank writes although the schema's types allow it: a step time <= 0, infinite or past a
    week, a negative count of samples or words (hand-edited records; a report then divided by zero or refused
    a negative throughput with a traceback)."""
    if rec.get("kind") == "step":
        step_s = rec.get("step_s")
        if not (isinstance(step_s, (int, float)) and 0 < step_s <= MAX_STEP_S):
            return f"step_s {step_s!r}, where a step time in seconds > 0 and <= {MAX_STEP_S:,.0f} is expected"
        for count in ("samples", "words"):  # a count below 0 summed to a negative throughput
            if isinstance(rec.get(count), int) and rec[count] < 0:
                return f"{count} {rec[count]!r}, where a count of items >= 0 is expected"
    return None


def _decode(lines: list[bytes], path: Path, warnings: list[str], tolerant: bool, cut_last: bool) -> list[dict[str, Any]]:
    """The records among `lines`; a bad line is skipped (tolerant, or the cut last line) or an error."""
    out = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = _loads(line)
            problem = record_problem(rec) if isinstance(rec, dict) and "kind" in rec else "no 'kind' field"
        except (*_DecodeError, UnicodeDecodeError):
            problem = "not a JSON object"
        if problem is None:
            problem = _value_problem(rec)
        if problem is None:
            out.append(rec)
        elif tolerant or (cut_last and i == len(lines)):
            why = "a truncated last line (the rank was killed while writing)" if i == len(lines) else f"a line with {problem}"
            warnings.append(f"{path}:{i}: dropped {why}")
        else:
            raise RecordError(f"corrupt record at {path}:{i} ({problem}); fix or delete that line, or re-run")
    return out


def read_records(path: Path, warnings: list[str], tolerant: bool = False) -> list[dict[str, Any]]:
    """Every record of one file; `tolerant` skips bad lines (with a warning) instead of failing."""
    path = Path(path)
    refuse_non_file(path)
    fd = open_inside(path.parent, path, os.O_RDONLY)  # a planted link is refused, not read
    with os.fdopen(fd, "rb") as f:
        raw = f.read()
    return _decode(raw.split(b"\n"), Path(path), warnings, tolerant, cut_last=not raw.endswith(b"\n"))


class RecordTail:
    """The records appended to one file since the last `read()`, for following a run while it writes.

    Only complete lines are taken (a half-written last line waits for the next read), bad lines are
    skipped, and a file that was rewritten shorter (the AWS mirror merging generations) is read again.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offset = 0
        self.warnings: list[str] = []

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        refuse_non_file(self.path)
        with self.path.open("rb") as f:
            if os.fstat(f.fileno()).st_size < self.offset:
                self.offset = 0
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        return _decode(complete.split(b"\n"), self.path, self.warnings, tolerant=True, cut_last=False)


def read_errors(run_dir: Path, since: float | None = None) -> list[dict[str, Any]]:
    """The `error` records of every rank, in rank order (each rank's own file, then its `error_aside` file);
    only those written at `since` or later."""
    return [rec for path in rank_files(run_dir) for rec in with_errors_aside(path)
            if rec["kind"] == "error" and (since is None or float(rec.get("time", 0)) >= since)]


def errors_aside(path: Path) -> Path:
    """records/error-rank-R.jsonl beside records/rank-R.jsonl (`path`): where a rank's `error` record goes when its
    own records file cannot take it (`record_error`)."""
    return Path(path).with_name(f"error-{Path(path).name}")


def with_errors_aside(path: Path) -> list[dict[str, Any]]:
    """The records of one rank's file (read tolerantly), then the error records it had to write aside; a file
    aside that cannot be read adds nothing."""
    recs = read_records(path, [], tolerant=True)
    aside = errors_aside(path)
    if aside.is_file() and not aside.is_symlink():
        try:
            recs += [r for r in read_records(aside, [], tolerant=True) if r.get("kind") == "error"]
        except (OSError, RecordError):
            pass
    return recs


_LOGS_OF_A_RANK = re.compile(r" --rank \d+\)$")  # the end of an error that names one rank's traceback


def error_messages(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """The error records' messages, each once, in order; one that a single rank of several said names that rank
    ("rank 1: exit3.py exited with status 3"), unless it starts with a rank already (the trainer's own "rank 1:
    RuntimeError: ..."). Why: a script's ranks say which script failed, never which rank, and the launcher said
    "exit3.py exited with status 3" of a run whose rank 1 alone had failed. The same words from several ranks
    stay one message without a rank (every rank raised the same error); so do those that differ only in the rank
    whose full traceback they point to ("launch logs RUN --rank 1)", a shortened message: scalelab/train/script.py),
    said as the first rank said it."""
    said: dict[str, set[Any]] = {}
    world: dict[str, int] = {}
    first: dict[str, str] = {}
    for rec in records:
        message = str(rec.get("message", "")).strip()
        message = first.setdefault(_LOGS_OF_A_RANK.sub(")", message), message)
        said.setdefault(message, set()).add(rec.get("rank"))
        world[message] = max(world.get(message, 1), int(rec.get("world") or 1))
    return [f"rank {next(iter(ranks))}: {message}"
            if len(ranks) == 1 and None not in ranks and world[message] > 1 and not message.startswith("rank ")
            else message for message, ranks in said.items()]


def load_run(run_dir: str | Path) -> RunRecords:
    """Read a run directory's spec and every rank's records."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RecordError(f"run directory not found: {run_dir}")
    import pandas as pd

    spec = read_spec(run_dir)
    warnings: list[str] = []
    by_kind: dict[str, list[dict[str, Any]]] = {"start": [], "step": [], "val": [], "event": []}
    for path in record_files(run_dir):
        for rec in read_records(path, warnings):
            by_kind.setdefault(rec["kind"], []).append(rec)
            if rec["kind"] == "event" and rec.get("event") == CUT_LINE_EVENT:
                warnings.append(f"{path}: a cut last line of {rec.get('bytes')} bytes (an interrupted write) was "
                                "dropped when the rank resumed; the steps it held were run again from the checkpoint")
    frames = {k: pd.DataFrame.from_records(v) for k, v in by_kind.items()}
    return RunRecords(run_dir, spec, frames["start"], frames["step"], frames["val"], frames["event"], warnings)


# ---- the writer: one JSON object a line, one file per rank ------------------------------------


def records_path(run_dir: Path, rank: int) -> Path:
    return RunPaths(Path(run_dir)).rank_records(rank)


CUT_LINE_EVENT = "cut_line_dropped"  # the event a writer records after dropping a cut last line


def open_for_append(run_dir: Path, path: Path) -> tuple[int, int]:
    """(fd, bytes dropped) of `path`, a records file of `run_dir`, opened to append whole lines.

    Why: a full disk or a kill can leave the last line cut; appending onto it would glue the next
    record to it, and a line in the middle of a file that is not JSON is an error forever after
    ("corrupt record at ...:26"). So the cut last line is truncated first (said on stderr, and in an
    event by the RecordWriter); a link or a file outside the run directory is refused (LinkError)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    check_inside(run_dir, path.parent)
    fd = open_inside(run_dir, path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
    try:
        dropped = drop_cut_line(fd)
    except BaseException:
        os.close(fd)
        raise
    if dropped:
        print(f"scalelab: warning: {path}: dropped a cut last line of {dropped} bytes (an interrupted write); "
              "the records before it are kept", file=sys.stderr, flush=True)
    return fd, dropped


def drop_cut_line(fd: int, block: int = 1 << 16) -> int:
    """Truncate an open file after its last newline; the number of bytes removed (0: it ended whole)."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return 0
    end = size
    while end > 0:
        start = max(0, end - block)
        at = os.pread(fd, end - start, start).rfind(b"\n")
        if at >= 0:
            os.ftruncate(fd, start + at + 1)
            return size - (start + at + 1)
        end = start
    os.ftruncate(fd, 0)
    return size


class RecordWriter:
    """Appends records for one rank; `time` and the rank's identity are added to every record."""

    def __init__(self, run_dir: Path, rank: int, world: int) -> None:
        self.path = path = records_path(run_dir, rank)
        self.rank, self.world = rank, world
        with writing(path, "records", RECORDS_FIX):
            fd, dropped = open_for_append(Path(run_dir), path)
            self._file = os.fdopen(fd, "a", buffering=1)  # line-buffered: a reader never sees half a record
        if dropped:  # said in the records too, so that `launch report` can say it
            self.event(CUT_LINE_EVENT, bytes=dropped)

    def write(self, kind: str, **fields: Any) -> None:
        """One record of `kind`; a record that does not fit its kind's schema is a bug, found here."""
        with writing(self.path, "records", RECORDS_FIX):  # a full disk: one line naming it, not an OSError
            self._file.write(record_line({"kind": kind, "rank": self.rank, "world": self.world, "time": time.time(),
                                          **fields}))

    def event(self, event: str, **fields: Any) -> None:
        self.write("event", event=event, **fields)

    def error(self, message: str, **fields: Any) -> None:
        self.write("error", message=message, **fields)

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:  # the last line could not be flushed (a full disk): the write already said so
            pass


def gave_up_records(out: RecordWriter, cause: str, step: int, grace_s: float, **end: Any) -> None:
    """The last records of a rank that exits because it did not stop within `grace_s` of its launcher being gone
    (`cause`; the launcher watches of scalelab/train/loop.py and script.py): an `interrupted` event with `gave_up` (no agreed stop, so no new checkpoint) and its `end`
    (interrupted, exit 143). Written from the watch thread while the main thread is stuck (in a collective, in
    the script): a write that fails changes nothing of the exit."""
    try:
        out.event("interrupted", signal=None, step=step, cause=cause, gave_up=True, grace_s=grace_s)
        out.event("end", step=step, reason="interrupted", exit_code=143, **end)
        out.close()
    except Exception:  # noqa: BLE001 - the exit goes on whatever the disk says
        pass


def record_line(record: Mapping[str, Any], absent: tuple[str, ...] = ()) -> str:
    """One record as its line in a JSONL file, checked against its kind's schema first: a record that
    does not fit is a bug, found where it is written. `absent`: as for `record_problem`."""
    problem = record_problem(record, absent=absent)
    if problem:
        raise ValueError(f"record written against docs/records.md: {problem}")
    return json.dumps(record, default=_jsonable, allow_nan=False) + "\n"


def append_record(path: Path, record: Mapping[str, Any], absent: tuple[str, ...] = ()) -> None:
    """Append one checked record to `path` (a file written now and then, not a rank's stream: the
    launcher's own events)."""
    path = Path(path)
    line = record_line(record, absent)
    with writing(path, "records", EVENTS_FIX):  # a full disk: one line naming this file, not an OSError without one
        fd, _ = open_for_append(path.parent.parent if path.parent.name == RECORDS_DIR else path.parent, path)
        with os.fdopen(fd, "a") as f:
            f.write(line)


# Where each launcher tells a process its rank and world size: torchrun, horovodrun, mpirun (Open MPI,
# then PMI), srun. A rank may fail before its engine starts, so the error record cannot ask the engine.
RANK_VARIABLES = [("RANK", "WORLD_SIZE"), ("HOROVOD_RANK", "HOROVOD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                  ("PMI_RANK", "PMI_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")]


def rank_from_env(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(rank, world size) as this process's launcher set them; (0, 1) for a process started alone."""
    env = os.environ if env is None else env
    for rank, world in RANK_VARIABLES:
        if env.get(rank, "").isdigit():
            return int(env[rank]), int(env.get(world, "1") or 1)
    return 0, 1


# What a collective raises on the ranks left when a peer died: torch.distributed's DistError family, Gloo's
# RuntimeErrors ("Connection closed by peer", "Connection reset by peer"), Horovod's HorovodInternalError.
_PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe", "timed out", "gloo")


def lost_a_peer(exc: BaseException) -> bool:
    """Whether `exc` is a collective failing because another rank is gone, not this rank's own fault: the
    launcher then names the rank that failed (or went silent) first."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & {"DistError", "DistBackendError", "DistNetworkError", "HorovodInternalError"}:
        return True
    return isinstance(exc, RuntimeError) and any(word in str(exc).lower() for word in _PEER_GONE)


def record_error(run_dir: Path, message: str, env: Mapping[str, str] | None = None, peer_lost: bool = False) -> None:
    """A rank stops on an error: an `error` record for the launcher, and the line on stderr for humans.
    `peer_lost`: the error is a collective failing because another rank is gone (the launcher names that
    rank's own error, or its silence, first)."""
    print(f"scalelab: error: {message}", file=sys.stderr, flush=True)
    rank, world = rank_from_env(env)
    fields = {"peer_lost": True} if peer_lost else {}
    try:
        writer = RecordWriter(run_dir, rank, world)
        writer.error(message, **fields)
        writer.close()
    except (OSError, WriteError) as exc:
        # the rank's own records file cannot take it (its size limit, `ulimit -f`, reached; a quota): the same
        # record, in a file of its own beside it, which the launcher reads with it (`read_errors`). Why: the
        # launcher said "rank 0 exited with status 2 ... without an end record" while the rank's stderr said
        # "cannot write records ...: File too large"
        record = {"kind": "error", "rank": rank, "world": world, "time": time.time(), "message": message, **fields}
        try:
            append_record(errors_aside(records_path(run_dir, rank)), record)
        except (OSError, WriteError) as again:  # the line above is then all there is
            print(f"scalelab: could not write the error record under {run_dir}: {exc}; nor aside: {again}",
                  file=sys.stderr, flush=True)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)
