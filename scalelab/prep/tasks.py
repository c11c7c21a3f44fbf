"""The work a Dask worker does, one function per kind of task, each measured as a record.

Every task returns `{"result": ..., "record": {...}}`; the record (docs/prep.md) says what the task
read (bytes, lines, samples, tokens), how long it took, where it ran (worker, host, Slurm node,
pid) and the worker's memory (RSS now and the process's peak). Tasks hold one piece of a corpus
or one shard at a time, which is what keeps a worker's memory bounded whatever the corpus size.
No PyTorch here.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import sys
import time
import tracemalloc
from collections import Counter
from typing import Any, Callable

import numpy as np

from scalelab.core.errors import DataError
from scalelab.prep.corpus import MARK_EVERY, Position, Storage, read_lines
from scalelab.prep.families import Payload, Rules, Tally
from scalelab.prep.shardio import Columns, concat, read_rows, window_arrays, windows, write_shard
from scalelab.train.shard_format import MANIFEST

TRACE_ENV = "SCALELAB_PREP_TRACE_MEMORY"  # diagnostic: record each task's peak of Python allocations


def measured(phase: str, task: int, fn: Callable[..., tuple[Any, dict]], *args: Any) -> dict[str, Any]:
    """Run `fn(*args)` -> (result, stats) and wrap its result with the task's record.

    With SCALELAB_PREP_TRACE_MEMORY=1 the record also holds `alloc_peak_mb`, the peak of memory
    allocated while the task ran (tracemalloc: exact but about twice as slow): what a worker needs
    for one task, which must not grow with the corpus. (Tracing covers the whole process: give
    each worker one thread when measuring.)
    """
    trace = os.environ.get(TRACE_ENV) == "1"
    started_tracing = trace and not tracemalloc.is_tracing()
    if trace:
        tracemalloc.start() if started_tracing else tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
    start, t0 = time.time(), time.perf_counter()
    result, stats = fn(*args)
    seconds = time.perf_counter() - t0
    if trace:
        stats["alloc_peak_mb"] = (tracemalloc.get_traced_memory()[1] - base) / 2**20
    if started_tracing:
        tracemalloc.stop()
    return {"result": result, "record": {"kind": "task", "phase": phase, "task": task, "start": start,
                                         "end": time.time(), "seconds": seconds, **stats, **where()}}


def dask_setup(worker: Any = None) -> None:
    """Dask's preload hook (`launch prep`'s local workers): the worker process ignores SIGINT, so a
    Ctrl-C to the terminal's process group is the driver's alone, which stops the workers quietly
    instead of each printing a KeyboardInterrupt traceback."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def where(dask_worker: Any = None) -> dict[str, Any]:
    """The worker running this task, its host (and Slurm node) and its memory in MB. With
    `Client.run(where)` Dask passes the worker itself: a worker's memory before any task."""
    import psutil

    try:
        from distributed import get_worker

        worker = str((dask_worker or get_worker()).name)
    except (ImportError, ValueError):
        worker = "driver"
    return {"worker": worker, "host": socket.gethostname(), "node": os.environ.get("SLURMD_NODENAME"),
            "pid": os.getpid(), "rss_mb": psutil.Process().memory_info().rss / 2**20,
            "peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> float:
    """This process's peak resident size in MiB (Linux: VmHWM of /proc/self/status).

    Why not getrusage's ru_maxrss: Linux carries it over fork and exec, so a worker process that
    `launch prep` spawns (its driver ~310 MB with PyTorch loaded) reported the driver's peak, not
    its own (~130 MB after imports), which also hid any growth during the prep.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def brief(outcome: dict[str, Any], key: str | None) -> tuple[dict, Any]:
    """(record, `key` of the result or None) of an outcome: what the driver fetches of a counting task."""
    return outcome["record"], (outcome["result"][key] if key else None)


def warm_up() -> None:
    """Import what tasks use on a fresh worker, so the first task's time is its work (a warm-up).
    pyarrow loads pandas (when installed) the first time it converts a numpy array."""
    import importlib

    for name in ("pyarrow", "pyarrow.ipc", "pandas", "psutil", "fsspec"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def pick(outcome: dict[str, Any], key: str) -> Any:
    """A task's "record", its "result", or one `key` of its result (run on the worker that holds the
    outcome, so only that part travels)."""
    return outcome[key] if key in ("record", "result") else outcome["result"][key]


def scan(storage: Storage, rules: Rules, files: list[tuple[str, ...]], start: Position, lines: int,
         count: bool) -> tuple[dict[str, Any], dict]:
    """Read `lines` lines from `start`: token counts per vocabulary (if `count`), samples, positions
    taken (`units`), labels first seen, whether each role has a non-blank line, and a mark (file,
    line, byte offsets, units before it) at the first line and every MARK_EVERY lines."""
    tally, marks, nbytes = Tally(rules, count), [], 0
    nonblank = [False] * len(rules.keys)
    for number, line, texts, size, mark in read_lines(storage, files, start, rules.keys, lines, MARK_EVERY):
        if mark is not None:
            marks.append((number, line, mark, tally.units))
        nbytes += size
        if not all(nonblank):
            nonblank = [seen or bool(t.strip()) for seen, t in zip(nonblank, texts)]
        sample = rules.sample(texts, files[number][0], line)
        if sample is not None:
            tally.add(sample, (number, line))
    labels = {label: f"{files[n][0]}:{line + 1}" for label, (n, line) in tally.labels.items()}
    meta = {"units": tally.units, "samples": tally.samples, "marks": marks, "labels": labels, "nonblank": nonblank}
    return {"counts": tally.counts() if count else None, "meta": meta}, \
        {"lines": lines, "samples": tally.samples, "tokens": tally.tokens, "bytes": nbytes}


def merge_counts(*outcomes: dict[str, Any]) -> dict[str, Counter]:
    """Token counts of the outcomes of scans, hold-out counts or merges added: a step of the tree."""
    parts = [o["result"]["counts"] if "meta" in o["result"] else o["result"] for o in outcomes]
    out = {name: Counter(c) for name, c in parts[0].items()}
    for part in parts[1:]:
        for name, c in part.items():
            out[name].update(c)
    return out


def count_held(storage: Storage, rules: Rules, files: list[tuple[str, ...]], start: Position, lines: int,
               held: np.ndarray) -> tuple[dict[str, Counter], dict]:
    """Token counts of the samples numbered `held` (0 = the piece's first sample): the held-out
    validation samples, whose tokens `--data text` leaves out of the vocabulary. Only those are
    tokenised; the others are only told apart from lines without a sample."""
    tally, wanted, index, nbytes = Tally(rules), set(held.tolist()), 0, 0
    for number, line, texts, size, _ in read_lines(storage, files, start, rules.keys, lines):
        nbytes += size
        if rules.has_sample(texts):
            if index in wanted:
                tally.add(rules.sample(texts, files[number][0], line))
            index += 1
    return tally.counts(), {"lines": lines, "samples": len(held), "bytes": nbytes}


# ---- encode: write shards ----------------------------------------------------------------------


def encode(storage: Storage, rules: Rules, files: list[tuple[str, ...]], mark: tuple, span: tuple[int, int],
           held: np.ndarray, vocab: Payload, urls: tuple[str, str | None]) -> tuple[dict[str, Any], dict]:
    """Samples span[0] .. span[1]-1 (windows for rnnlm) read from `mark` = (file, line, offsets,
    units before it): those not in `held` go to shard urls[0], the held ones to urls[1]."""
    start = Position(*mark[:3])
    collect = _windows if rules.windowed else _rows
    train, kept, stats = collect(storage, rules, files, start, mark[3], span, held, vocab)
    info = {"shard": write_shard(storage, urls[0], rules.family, train)}
    if urls[1] is not None and kept is not None:
        info["held"] = write_shard(storage, urls[1], rules.family, kept)
    return info, stats


def _until(storage, rules, files, start, first, end, stats):
    """(position, sample) of every sample read from `start`, where the corpus position is `first`,
    until position `end` (a sample number, or an rnnlm stream position); counts lines and bytes."""
    position = first
    for number, line, texts, size, _ in read_lines(storage, files, start, rules.keys):
        if position >= end:
            return
        stats["lines"] += 1
        stats["bytes"] += size
        sample = rules.sample(texts, files[number][0], line)
        if sample is not None:
            yield position, sample
            position += rules.units(sample)


def _rows(storage, rules, files, start, first, span, held, vocab):
    """Per-line samples span[0] .. span[1]-1; sample number `first` is the first at `start`."""
    wanted, stats = set(held.tolist()), {"lines": 0, "bytes": 0}
    train, kept = Columns(rules.family), Columns(rules.family)
    for index, sample in _until(storage, rules, files, start, first, span[1], stats):
        if index >= span[0]:
            (kept if index in wanted else train).add(rules.encode(sample, vocab))
    return train.arrays(), kept.arrays() if len(kept) else None, {**stats, "samples": len(train) + len(kept)}


def _windows(storage, rules, files, start, first, span, held, vocab):
    """rnnlm: stream positions span[0]*L .. span[1]*L (inclusive) read from `start` (position `first`),
    cut into windows; held windows apart."""
    L = rules.seq_len
    begin, end = span[0] * L, span[1] * L + 1
    stream: list[int] = []
    stats = {"lines": 0, "bytes": 0}
    for position, sample in _until(storage, rules, files, start, first, end, stats):
        ids = rules.encode(sample, vocab)["seq"]
        if position + len(ids) > begin:
            stream.extend(ids[max(begin - position, 0):])
    if len(stream) < end - begin:
        raise DataError(f"the corpus ended {end - begin - len(stream)} tokens early: a file changed during prep")
    rows = windows(np.asarray(stream[: end - begin], dtype=np.int32), span[0], span[1] - span[0], L, begin)
    is_held = np.isin(np.arange(span[0], span[1]), held)
    kept = window_arrays(rows[is_held]) if is_held.any() else None
    return window_arrays(rows[~is_held]), kept, {**stats, "samples": len(rows)}


def regroup(storage: Storage, family: str, parts: list[tuple[str, int, int]], url: str) -> tuple[dict, dict]:
    """A shard made of rows [lo, hi) of each of `parts` (url, lo, hi), in order."""
    arrays = concat([read_rows(storage, part, family, lo, hi) for part, lo, hi in parts])
    info = write_shard(storage, url, family, arrays)
    return info, {"samples": info["samples"], "bytes": info["bytes"]}


# ---- the output directory ----------------------------------------------------------------------


MARKER = ".scalelab-prep"  # written into --out when a prep starts: what is in there is that prep's to clean
OUTPUTS = ("train-*.arrow", "valid-*.arrow", "vocab*.txt", "_held")  # what a prep writes (less the manifest)


def check_out(storage: Storage, out: str) -> bool:
    """Whether `out` is an earlier, unfinished prep's (it holds the marker); DataError when it holds
    finished shards, or files of someone else's (not empty, no marker): those are never touched."""
    fs, path = storage.fs(out)
    if fs.exists(storage.join(path, MANIFEST)):
        raise DataError(f"--out {out} already holds shards ({MANIFEST}): choose another directory or delete it")
    if fs.exists(storage.join(path, MARKER)):
        return True
    if not fs.exists(path):
        return False
    if not fs.isdir(path):
        raise DataError(f"--out {out} is a file, not a directory: choose another --out")
    found = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path, detail=False))
    if found:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise DataError(f"--out {out} is not empty and no earlier prep made it ({shown}): launch prep writes "
                        "shards only into a new or empty directory; give another --out, or empty this one")
    return False


def _inputs(storage: Storage, patterns: list[str]) -> set[str]:
    """The paths the input patterns name (as fsspec strips them): never cleaned, wherever they live."""
    import glob

    out = set()
    for pattern in patterns:
        fs, path = storage.fs(pattern)
        for p in (fs.glob(path) if glob.has_magic(pattern) else [path]):
            out.add(os.path.realpath(p) if "://" not in pattern else fs._strip_protocol(p))
    return out


def prepare_out(storage: Storage, out: str, run: str = "", inputs: tuple[str, ...] = ()) -> tuple[None, dict]:
    """Create the output directory (on the workers' side: it may be a volume only they see) and
    mark it as this prep's; refuse one that holds shards or someone else's files (`check_out`),
    and clear what an earlier, unfinished prep left (its marker says so), inputs excepted."""
    fs, path = storage.fs(out)
    stale: list[str] = []
    if check_out(storage, out):
        keep = _inputs(storage, list(inputs))
        stale = [p for pattern in OUTPUTS for p in fs.glob(storage.join(path, pattern))
                 if (os.path.realpath(p) if "://" not in out else fs._strip_protocol(p)) not in keep]
        if stale:
            fs.rm(stale, recursive=True)
    fs.makedirs(path, exist_ok=True)
    with storage.open(storage.join(out, MARKER), "w") as f:
        f.write(json.dumps({"run": run, "written_by": "launch prep", "time": time.time()}) + "\n")
    fs.makedirs(storage.join(path, "_held"), exist_ok=True)
    return None, {"stale_files_removed": len(stale)}


def write_text(storage: Storage, url: str, text: str) -> tuple[None, dict]:
    with storage.open(url, "w") as f:
        f.write(text)
    return None, {"bytes": len(text.encode())}


def write_manifest(storage: Storage, out: str, text: str) -> tuple[None, dict]:
    """The manifest, last; from then on it marks the directory as finished shards, not the marker."""
    done = write_text(storage, storage.join(out, MANIFEST), text)
    fs, path = storage.fs(out)
    if fs.exists(storage.join(path, MARKER)):
        fs.rm(storage.join(path, MARKER))
    return done


def remove_scratch(storage: Storage, out: str, run: str) -> None:
    """A failed prep's `_held/` scratch folder, when `out` carries this run's marker (so it is ours)."""
    fs, path = storage.fs(out)
    marker = storage.join(path, MARKER)
    if not fs.exists(marker):
        return
    with fs.open(marker, "r") as f:
        if json.loads(f.read() or "{}").get("run") != run:
            return
    cleanup(storage, out)


def cleanup(storage: Storage, out: str) -> tuple[None, dict]:
    """Remove the held-out pieces once the validation shards are written."""
    fs, path = storage.fs(out)
    held = storage.join(path, "_held")
    if fs.exists(held):
        fs.rm(held, recursive=True)
    return None, {}
