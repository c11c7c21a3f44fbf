"""Cheap checks of a text corpus's content, made before a run or prep directory exists.

Why: parallel files of different lengths and sentiment lines without LABEL<TAB> were found by the ranks (or the
prep's tasks), after the run directory was made, leaving a FAILED run behind for a mistake in the input. Both
are cheap to see from the launcher: a line count is one pass over the bytes (no decoding), and a label is on
every line's start. Cheap has a limit: a file over `COUNT_LIMIT` bytes is not counted (the ranks count it, as
before) and only the first `LABEL_LIMIT` bytes of a sentiment file are read for labels; a mistake past them is
still found, by the ranks, with the same message. Lines are counted as the trainer reads them
(`train.text.read_lines`: breaks at \\n only, a last line without one counts).
"""

from __future__ import annotations

import os
from pathlib import Path

from scalelab.core.errors import SpecError

COUNT_LIMIT = 2 << 30  # bytes of one file whose lines are counted up front (a few seconds at most)
LABEL_LIMIT = 1 << 20  # bytes of a sentiment file whose lines are checked for LABEL<TAB>text up front
# (path, size, mtime) -> what was found in the file: a sweep validates each layout's spec, each reading the same files
_counted: dict[tuple[str, int, int], int] = {}  # its lines
_unlabelled: dict[tuple[str, int, int], tuple[int, str] | None] = {}  # its first line without a label, if any


def _key(p: Path) -> tuple[str, int, int] | None:
    """(resolved path, size, mtime) of the file, the key of what was found in it; None where it cannot be stat-ed."""
    try:
        st = p.stat()
    except OSError:
        return None
    return str(p.resolve()), st.st_size, st.st_mtime_ns


def count_lines(path: str | os.PathLike) -> int | None:
    """Lines of the file as `read_lines` splits them; None for a file over COUNT_LIMIT or unreadable (its reader
    says why)."""
    p = Path(path)
    key = _key(p)
    if key is None:
        return None
    if key in _counted:
        return _counted[key]
    if key[1] > COUNT_LIMIT:
        return None
    lines, last = 0, b"\n"
    try:
        with p.open("rb") as f:
            while chunk := f.read(1 << 20):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
    except OSError:
        return None
    lines += last != b"\n"
    _counted[key] = lines
    return lines


def check_parallel(src: str | os.PathLike, tgt: str | os.PathLike, src_flag: str, tgt_flag: str) -> None:
    """SpecError when the two sides of a translation corpus differ in lines (both counted: `count_lines`)."""
    a, b = count_lines(src), count_lines(tgt)
    if a is not None and b is not None and a != b:
        raise SpecError(f"parallel files differ in length: {src} has {a} lines, {tgt} has {b} (line i of {src_flag} "
                        f"must translate line i of {tgt_flag}); give files with one translation per line on each side")


def check_labelled(path: str | os.PathLike, flag: str) -> None:
    """SpecError naming the first line of the file's first LABEL_LIMIT bytes that is not LABEL<TAB>text (blank
    lines pass, as the trainer skips them)."""
    found = _first_unlabelled(Path(path))
    if found is not None:
        number, line = found
        raise SpecError(f"{path}:{number}: expected LABEL<TAB>text, got {line!r} ({flag}: sentiment data is "
                        "one example a line, its label, a tab, then its text)")


def _first_unlabelled(p: Path) -> tuple[int, str] | None:
    """(number, first 80 characters) of the first line of the file's first LABEL_LIMIT bytes that is not
    LABEL<TAB>text; None where every one is, or where the file cannot be read (its reader says why)."""
    key = _key(p)
    if key is None:
        return None
    if key in _unlabelled:
        return _unlabelled[key]
    try:
        with p.open("rb") as f:
            head = f.read(LABEL_LIMIT + 1)
    except OSError:
        return None
    lines = head.split(b"\n")
    if len(head) > LABEL_LIMIT:
        lines.pop()  # cut at the limit: not a whole line
    found = None
    for number, raw in enumerate(lines, start=1):
        line = raw.decode("utf-8", "replace").rstrip("\r")
        if not line.strip():
            continue
        label, tab, text = line.partition("\t")
        if not tab or not label.strip() or not text.split():
            found = number, line[:80]
            break
    _unlabelled[key] = found
    return found
