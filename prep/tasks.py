"""The work a Dask worker does, one function per kind of task, each measured as a record.

Every task returns `{"result": ..., "record": {...}}`; the record (docs/prep.md) says what the task
read (bytes, lines, samples, tokens), how long it took, where it ran (worker, host, Slurm node,
pid) and the worker's memory (RSS now and the process's peak). Tasks hold one piece of a corpus
or one shard at a time, which is what keeps a worker's memory bounded whatever the corpus size.
No PyTorch here.
"""

from __future__ import annotations

import os
import resource
import socket
import time
import tracemalloc
from collections import Counter
from typing import Any, Callable

import numpy as np

from core.errors import DataError
from prep.corpus import MARK_EVERY, Position, Storage, decode, read_lines
from prep.families import Payload, Rules
from prep.shardio import Columns, concat, read_rows, window_arrays, windows, write_shard
from train.shard_format import MANIFEST


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
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


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


def _samples(storage: Storage, rules: Rules, files: list[tuple[str, ...]], start: Position, lines: int | None):
    """(position, texts, sample or None, bytes) of each line (pair) from `start`; `lines` None = to the end."""
    offsets = start.offsets
    for count, (number, line, raws) in enumerate(read_lines(storage, files, start)):
        if lines is not None and count >= lines:
            return
        urls = files[number]
        texts = [decode(raw, urls[i], line, rules.keys[i]) for i, raw in enumerate(raws)]
        if line == 0:
            offsets = (0,) * len(raws)
        yield Position(number, line, offsets), texts, rules.sample(texts, urls[0], line), sum(map(len, raws))
        offsets = tuple(o + len(r) for o, r in zip(offsets, raws))


# ---- scan: count tokens, samples and positions -------------------------------------------------


def scan(storage: Storage, rules: Rules, files: list[tuple[str, ...]], start: Position, lines: int,
         count: bool) -> tuple[dict[str, Any], dict]:
    """Read `lines` lines from `start`: token counts per vocabulary (if `count`), samples, positions
    taken (`units`), labels first seen, non-blank lines per role, and a mark every MARK_EVERY lines."""
    counts: dict[str, Counter] = {name: Counter() for name in rules.vocabs}
    marks, labels = [], {}
    units = samples = tokens = nbytes = 0
    nonblank = [0] * len(rules.keys)
    for pos, texts, sample, size in _samples(storage, rules, files, start, lines):
        if pos.line % MARK_EVERY == 0 or not marks:
            marks.append((pos.file, pos.line, pos.offsets, units))
        nbytes += size
        nonblank = [n + bool(t.strip()) for n, t in zip(nonblank, texts)]
        if sample is None:
            continue
        samples += 1
        units += rules.units(sample)
        tokens += rules.tokens(sample)
        label = rules.label(sample)
        if label is not None and label not in labels:
            labels[label] = f"{files[pos.file][0]}:{pos.line + 1}"
        if count:
            rules.count(sample, counts)
    meta = {"units": units, "samples": samples, "marks": marks, "labels": labels, "nonblank": nonblank}
    return {"counts": counts if count else None, "meta": meta}, \
        {"lines": lines, "samples": samples, "tokens": tokens, "bytes": nbytes}


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
    validation samples, whose tokens `--data text` leaves out of the vocabulary."""
    counts: dict[str, Counter] = {name: Counter() for name in rules.vocabs}
    wanted, index = set(held.tolist()), 0
    for _, _, sample, _ in _samples(storage, rules, files, start, lines):
        if sample is None:
            continue
        if index in wanted:
            rules.count(sample, counts)
        index += 1
    return counts, {"lines": lines, "samples": len(held)}


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


def _rows(storage, rules, files, start, first, span, held, vocab):
    """Per-line samples: sample number `first` is the first at `start`."""
    lo, hi = span
    wanted = set(held.tolist())
    train, kept = Columns(rules.family), Columns(rules.family)
    index, lines, nbytes = first, 0, 0
    for _, _, sample, size in _samples(storage, rules, files, start, None):
        if index >= hi:
            break
        lines += 1
        nbytes += size
        if sample is None:
            continue
        if index >= lo:
            (kept if index in wanted else train).add(rules.encode(sample, vocab))
        index += 1
    return train.arrays(), kept.arrays() if len(kept) else None, \
        {"lines": lines, "samples": len(train) + len(kept), "bytes": nbytes}


def _windows(storage, rules, files, start, first, span, held, vocab):
    """rnnlm: stream positions span[0]*L .. span[1]*L (inclusive) read from `start` (position `first`),
    cut into windows; held windows apart."""
    L = rules.seq_len
    begin, end = span[0] * L, span[1] * L + 1
    stream: list[int] = []
    position, lines, nbytes = first, 0, 0
    for _, _, sample, size in _samples(storage, rules, files, start, None):
        if position >= end:
            break
        lines += 1
        nbytes += size
        if sample is None:
            continue
        ids = rules.encode(sample, vocab)["seq"]
        if position + len(ids) > begin:
            stream.extend(ids[max(begin - position, 0):])
        position += len(ids)
    if position < end:
        raise DataError(f"the corpus ended at stream position {position}, before {end}: a file changed during prep")
    rows = windows(np.asarray(stream[: end - begin], dtype=np.int32), span[0], span[1] - span[0], L, begin)
    is_held = np.isin(np.arange(span[0], span[1]), held)
    kept = window_arrays(rows[is_held]) if is_held.any() else None
    return window_arrays(rows[~is_held]), kept, {"lines": lines, "samples": len(rows), "bytes": nbytes}


def regroup(storage: Storage, family: str, parts: list[tuple[str, int, int]], url: str) -> tuple[dict, dict]:
    """A shard made of rows [lo, hi) of each of `parts` (url, lo, hi), in order."""
    arrays = concat([read_rows(storage, part, family, lo, hi) for part, lo, hi in parts])
    info = write_shard(storage, url, family, arrays)
    return info, {"samples": info["samples"], "bytes": info["bytes"]}


# ---- the output directory ----------------------------------------------------------------------


def prepare_out(storage: Storage, out: str) -> tuple[None, dict]:
    """Create the output directory (on the workers' side: it may be a volume only they see);
    refuse one that already holds shards."""
    fs, path = storage.fs(out)
    if fs.exists(storage.join(path, MANIFEST)):
        raise DataError(f"--out {out} already holds shards ({MANIFEST}): choose another directory or delete it")
    fs.makedirs(path, exist_ok=True)
    fs.makedirs(storage.join(path, "_held"), exist_ok=True)
    return None, {}


def write_text(storage: Storage, url: str, text: str) -> tuple[None, dict]:
    with storage.open(url, "w") as f:
        f.write(text)
    return None, {"bytes": len(text.encode())}


def cleanup(storage: Storage, out: str) -> tuple[None, dict]:
    """Remove the held-out pieces once the validation shards are written."""
    fs, path = storage.fs(out)
    held = storage.join(path, "_held")
    if fs.exists(held):
        fs.rm(held, recursive=True)
    return None, {}
