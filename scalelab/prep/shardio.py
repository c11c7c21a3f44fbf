"""Shards in and out of memory: rows gathered into columns, columns written as Arrow IPC files.

A shard is built from numpy columns only (`lengths` + flat `values` per token-list column), so the
bytes of a shard depend on its samples alone, never on how they were gathered: a shard put
together from pieces of several tasks is the same file as one written at once.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from scalelab.prep.corpus import Storage
from scalelab.train.shard_format import COLUMNS, SCALAR_COLUMNS, list_columns, schema

Arrays = dict[str, Any]  # list column -> (values int32, lengths int32); scalar column -> int32 array


class Columns:
    """Rows appended one at a time (dicts of column -> ids or label), turned into numpy arrays."""

    def __init__(self, family: str) -> None:
        self.family = family
        self.values: dict[str, list[int]] = {c: [] for c in list_columns(family)}
        self.lengths: dict[str, list[int]] = {c: [] for c in list_columns(family)}
        self.scalars: dict[str, list[int]] = {c: [] for c in COLUMNS[family] if c in SCALAR_COLUMNS}

    def add(self, row: dict[str, Any]) -> None:
        for name, ids in row.items():
            if name in self.scalars:
                self.scalars[name].append(ids)
            else:
                self.values[name].extend(ids)
                self.lengths[name].append(len(ids))

    def __len__(self) -> int:
        return len(next(iter(self.lengths.values())))

    def arrays(self) -> Arrays:
        out: Arrays = {c: (np.asarray(self.values[c], dtype=np.int32), np.asarray(self.lengths[c], dtype=np.int32))
                       for c in self.values}
        out.update({c: np.asarray(v, dtype=np.int32) for c, v in self.scalars.items()})
        return out


def windows(stream: np.ndarray, first: int, count: int, seq_len: int, begin: int) -> np.ndarray:
    """Windows `first .. first+count-1` of seq_len + 1 tokens (window k starts at stream position
    k * seq_len) from `stream`, which holds the stream from position `begin` on: a [count, L+1] array."""
    starts = np.arange(first, first + count, dtype=np.int64) * seq_len - begin
    return stream[starts[:, None] + np.arange(seq_len + 1)]


def window_arrays(rows: np.ndarray) -> Arrays:
    return {"seq": (rows.reshape(-1).astype(np.int32), np.full(len(rows), rows.shape[1], dtype=np.int32))}


def rows_of(arrays: Arrays) -> int:
    first = next(iter(arrays.values()))
    return len(first[1]) if isinstance(first, tuple) else len(first)


def token_count(arrays: Arrays) -> int:
    return int(sum(len(v[0]) for v in arrays.values() if isinstance(v, tuple)))


def encode_ipc(family: str, arrays: Arrays) -> bytes:
    """One Arrow IPC file (one record batch, uncompressed: memory-mappable) of the columns."""
    import pyarrow as pa

    cols = []
    for name in COLUMNS[family]:
        if name in SCALAR_COLUMNS:
            cols.append(pa.array(arrays[name], type=pa.int32()))
        else:
            values, lengths = arrays[name]
            offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
            np.cumsum(lengths, out=offsets[1:])
            cols.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.int32())))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema(family)) as writer:
        writer.write_batch(pa.record_batch(cols, schema=schema(family)))
    return sink.getvalue().to_pybytes()


def write_shard(storage: Storage, url: str, family: str, arrays: Arrays) -> dict[str, Any]:
    """Write the columns to `url`; return the manifest entry (file name, counts, bytes, SHA-256)."""
    data = encode_ipc(family, arrays)
    with storage.open(url, "wb") as f:
        f.write(data)
    return {"file": url.rsplit("/", 1)[-1], "samples": rows_of(arrays), "tokens": token_count(arrays),
            "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def read_rows(storage: Storage, url: str, family: str, lo: int, hi: int) -> Arrays:
    """Rows [lo, hi) of a shard as numpy columns."""
    import pyarrow as pa

    with storage.open(url) as f:
        table = pa.ipc.open_file(pa.py_buffer(f.read())).read_all().slice(lo, hi - lo)
    out: Arrays = {}
    for name in COLUMNS[family]:
        column = table.column(name).combine_chunks()
        if name in SCALAR_COLUMNS:
            out[name] = column.to_numpy().astype(np.int32)
        else:
            out[name] = (column.flatten().to_numpy().astype(np.int32),
                         np.diff(column.offsets.to_numpy()).astype(np.int32))
    return out


def concat(parts: list[Arrays]) -> Arrays:
    out: Arrays = {}
    for name, first in parts[0].items():
        if isinstance(first, tuple):
            out[name] = (np.concatenate([p[name][0] for p in parts]), np.concatenate([p[name][1] for p in parts]))
        else:
            out[name] = np.concatenate([p[name] for p in parts])
    return out
