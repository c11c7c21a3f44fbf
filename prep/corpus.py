"""Where a corpus is and how its lines are read: local files, globs and URLs (s3://) via fsspec.

Why byte blocks: workers read a corpus in parallel only if each can start in the middle of a
file. A file is cut into blocks of bytes; a block owns the lines that *start* in it. The index
phase counts those lines (a newline count at C speed), which numbers every line and gives each
block the byte offset of its first line; later phases seek there, or to a finer (line, offset)
mark that the scan phase notes every `MARK_EVERY` lines.

Line rules are `train.text.read_lines`'s: a line ends at \\n only (a stray \\x0b or \\u2028 cannot
shift one side of a parallel pair), a trailing \\r is dropped, text is UTF-8. Nothing here imports
PyTorch: these functions run in the Dask workers.
"""

from __future__ import annotations

import glob
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from core.errors import DataError

MARK_EVERY = 1024  # lines between two (line, byte offset) marks noted by the scan phase

#: Input flags per family: (required, optional), as `train.text.PATH_KEYS` (a test keeps them equal;
#: restated so that planning a prep, e.g. `--dry-run`, imports no PyTorch).
ROLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "nmt": (("train_src", "train_tgt"), ("valid_src", "valid_tgt")),
    "rnnlm": (("train",), ("valid",)),
    "sentiment": (("train",), ("valid",)),
}


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def is_remote(url: str) -> bool:
    return "://" in url and not url.startswith("file://")


@dataclass
class Storage:
    """How to reach remote URLs: fsspec options (e.g. `endpoint_url` for an S3-compatible store).

    Local paths ignore them; the object travels to the workers with every task.
    """

    options: dict[str, Any] = field(default_factory=dict)

    def fs(self, url: str):
        import fsspec

        return fsspec.core.url_to_fs(url, **(self.options if is_remote(url) else {}))

    def open(self, url: str, mode: str = "rb"):
        fs, path = self.fs(url)
        return fs.open(path, mode)

    def join(self, base: str, name: str) -> str:
        return base.rstrip("/") + "/" + name


def expand(patterns: list[str], key: str, storage: Storage) -> list[tuple[str, int]]:
    """(url, size) of every file `patterns` name, globs expanded in sorted order; DataError if none."""
    out: list[tuple[str, int]] = []
    for pattern in patterns:
        fs, path = storage.fs(pattern)
        if glob.has_magic(pattern):
            paths = [p for p in sorted(fs.glob(path)) if fs.isfile(p)]
            if not paths:
                raise DataError(f"{flag(key)} {pattern!r} matches no file")
        elif fs.isfile(path):
            paths = [path]
        else:
            raise DataError(f"data file not found: {pattern} (check {flag(key)})")
        out.extend((fs.unstrip_protocol(p) if is_remote(pattern) else p, int(fs.size(p))) for p in paths)
    return out


# ---- the index phase ---------------------------------------------------------------------------


@dataclass
class Block:
    """Bytes [start, end) of a file; it owns `lines` lines, the first (number `first_line`) at `offset`."""

    start: int
    end: int
    lines: int = 0
    offset: int = 0
    first_line: int = 0


def blocks_of(size: int, block_bytes: int) -> list[Block]:
    return [Block(s, min(s + block_bytes, size)) for s in range(0, size, block_bytes)]


def index_block(storage: Storage, url: str, start: int, end: int) -> tuple[tuple[int, int], dict]:
    """((lines starting in [start, end), byte offset of the first), stats) - a newline count.

    A line starts at 0 and after every \\n that is not the file's last byte, so the lines starting in
    [start, end) are those after a \\n in [start - 1, end - 1).
    """
    lo = max(start - 1, 0)
    with storage.open(url) as f:
        f.seek(lo)
        data = f.read(max(end - 1 - lo, 0))
    if start == 0:
        return (1 + data.count(b"\n"), 0), {"bytes": end - start}
    first = data.find(b"\n")
    return (data.count(b"\n"), lo + first + 1 if first >= 0 else 0), {"bytes": end - start}


def number_lines(blocks: list[Block], counts: list[tuple[int, int]]) -> int:
    """Fill in each block's lines, offset and first line number; return the file's line count."""
    line = 0
    for block, (lines, offset) in zip(blocks, counts):
        block.lines, block.offset, block.first_line = lines, offset, line
        line += lines
    return line


def locate_lines(storage: Storage, url: str, offset: int, end: int, relative: list[int]) -> tuple[list[int], dict]:
    """Byte offsets of lines `relative` (counted from the line at `offset`, all starting before `end`)."""
    with storage.open(url) as f:
        f.seek(offset)
        data = f.read(end - offset)
    newlines = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
    starts = np.concatenate([[0], newlines + 1])
    return [offset + int(starts[r]) for r in relative], {"bytes": end - offset}


# ---- reading lines -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Position:
    """Where reading starts: file `file` of the list (a tuple of files for parallel text), its
    line `line`, at byte `offsets` (one per role)."""

    file: int
    line: int
    offsets: tuple[int, ...]


def read_lines(storage: Storage, files: list[tuple[str, ...]], start: Position) -> Iterator[tuple[int, int, list[bytes]]]:
    """(file, line, raw lines of every role) from `start` to the end of the corpus, across files.

    Parallel files are read in lockstep (their line counts were checked equal per file). Raw lines
    keep their \\n, so `len()` advances a byte offset; `decode` turns them into text.
    """
    number, line, offsets = start.file, start.line, start.offsets
    while number < len(files):
        with ExitStack() as stack:
            handles = [stack.enter_context(storage.open(url)) for url in files[number]]
            for handle, offset in zip(handles, offsets):
                handle.seek(offset)
            while True:
                raws = [handle.readline() for handle in handles]
                if not raws[0]:
                    break
                yield number, line, raws
                line += 1
        number, line, offsets = number + 1, 0, (0,) * len(offsets)


def decode(raw: bytes, url: str, line: int, key: str) -> str:
    """A raw line as text without its line end; DataError naming the file, line and flag if not UTF-8."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"data file {url} ({flag(key)}) is not UTF-8 text: line {line + 1}: {exc}") from None
    return text[:-1].rstrip("\r") if text.endswith("\n") else text.rstrip("\r")
