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
import math
import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Iterator

from scalelab.core.errors import DataError
from scalelab.core.presets import PATH_KEYS
from scalelab.core.presets import path_flag as flag
from scalelab.core.writes import what_it_is

MARK_EVERY = 1024  # lines between two (line, byte offset) marks noted by the scan phase

#: Input flags per family: (required, optional), the trainer's own table (core.presets.PATH_KEYS).
ROLES = PATH_KEYS


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
        if not is_remote(url):  # the built-in file: its readline is what reading costs per line
            return open(url.removeprefix("file://"), mode)
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
        elif not is_remote(pattern) and os.path.lexists(path):  # a directory or FIFO: say what it is
            raise DataError(f"data file {pattern} is {what_it_is(path)}, not a regular file (check {flag(key)})")
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
    newlines = data.count(b"\n")
    if start == 0:
        return (1 + newlines, 0), {"bytes": end - start, "lines": 1 + newlines}
    first = data.find(b"\n")
    return (newlines, lo + first + 1 if first >= 0 else 0), {"bytes": end - start, "lines": newlines}


def number_lines(blocks: list[Block], counts: list[tuple[int, int]]) -> int:
    """Fill in each block's lines, offset and first line number; return the file's line count."""
    line = 0
    for block, (lines, offset) in zip(blocks, counts):
        block.lines, block.offset, block.first_line = lines, offset, line
        line += lines
    return line


def locate_lines(storage: Storage, url: str, offset: int, end: int, relative: list[int]) -> tuple[list[int], dict]:
    """Byte offsets of lines `relative` (counted from the line at `offset`, all starting before `end`)."""
    import numpy as np

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


def read_lines(storage: Storage, files: list[tuple[str, ...]], start: Position, keys: tuple[str, ...],
               lines: int | None = None, mark_every: int = 0) -> Iterator[tuple[int, int, list[str], int, tuple | None]]:
    """(file, line, text of every role, bytes, marked offsets) of `lines` lines (None: to the end of
    the corpus, across files) from `start`.

    Parallel files are read in lockstep (their line counts were checked equal per file). With
    `mark_every`, the first line and every line whose number is a multiple of it come with the byte
    offsets (one per role) where they start; other lines with None. Text: as `train.text.read_lines`
    (a raw line holds one \n at most, at its end, so stripping \r and \n from the right drops exactly
    the line end and any \r before it). DataError names the file, line and flag of bad UTF-8.
    """
    number, line, offsets = start.file, start.line, start.offsets
    left = math.inf if lines is None else lines
    first = True
    while number < len(files) and left > 0:
        with ExitStack() as stack:
            handles = [stack.enter_context(storage.open(url)) for url in files[number]]
            for handle, offset in zip(handles, offsets):
                handle.seek(offset)
            raws: list[bytes] = []
            try:
                while left > 0:
                    marked = mark_every and (first or line % mark_every == 0)
                    mark = tuple(h.tell() for h in handles) if marked else None
                    raws = [h.readline() for h in handles]
                    if not raws[0]:
                        break
                    yield number, line, [r.decode().rstrip("\r\n") for r in raws], sum(map(len, raws)), mark
                    line, left, first = line + 1, left - 1, False
            except UnicodeDecodeError as exc:
                bad = next(i for i, r in enumerate(raws) if not _is_utf8(r))
                raise DataError(f"data file {files[number][bad]} ({flag(keys[bad])}) is not UTF-8 text: "
                                f"line {line + 1}: {exc}") from None
        number, line, offsets = number + 1, 0, (0,) * len(offsets)


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True
