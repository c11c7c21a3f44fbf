"""Failed writes as one line: which file, which filesystem, and what to do about it.

Where the launcher and the ranks write (run directories, launch.json, records, owner.json, reports)
the filesystem can be read-only, not ours, or full. Each of those is something the user fixes, not a
bug, so it becomes a `WriteError` naming the path, the filesystem it lives on (its mount point and
free bytes) and the fix, instead of an `OSError` traceback. Files half written are removed by the
callers (they know which); this module only says what went wrong.
"""

from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from scalelab.core.errors import ScalelabError

FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
READ_ONLY = frozenset({errno.EROFS})
DENIED = frozenset({errno.EACCES, errno.EPERM})
WRITE_FAILURES = FULL | READ_ONLY | DENIED


class WriteError(ScalelabError):
    """A file could not be written: a full, read-only or forbidden filesystem (the message says which)."""


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem holding `path` (or its nearest existing parent)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    path = path.resolve()
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> str:
    """'1,234 bytes' free for unprivileged users on the filesystem of `path`; 'unknown' if it cannot tell."""
    try:
        st = os.statvfs(mount_point(path))
    except OSError:
        return "unknown"
    return f"{st.f_bavail * st.f_frsize:,} bytes"


def write_failure(path: Path | str, exc: OSError, what: str = "",
                  fix: str = "or choose another directory (--runs-dir, --out)") -> str:
    """The one line for `exc` raised while writing `path` (`what` says which file it is)."""
    path = Path(path)
    mount, name = mount_point(path), f"{what} {path}" if what else str(path)
    if exc.errno in FULL:
        return f"cannot write {name}: the filesystem at {mount} is full ({free_bytes(path)} free); free space there {fix}"
    if exc.errno in READ_ONLY:
        return f"cannot write {name}: the filesystem at {mount} is read-only; remount it read-write {fix}"
    if exc.errno in DENIED:
        return f"cannot write {name}: permission denied (filesystem at {mount}); make it writable {fix}"
    return f"cannot write {name} on the filesystem at {mount}: {exc.strerror or exc}; check it {fix}"


@contextmanager
def writing(path: Path | str, what: str = "", fix: str = "or choose another directory (--runs-dir, --out)") -> Iterator[None]:
    """Inside, an OSError from a write becomes a `WriteError` naming the file (the one the OS named, else
    `path`) and its filesystem."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError, FileExistsError)):
            raise
        raise WriteError(write_failure(Path(exc.filename or path), exc, what, fix)) from None


def check_writable(path: Path | str, what: str, fix: str) -> None:
    """Refuse early a local output that cannot be written (read-only, or not ours) before work starts
    that would fail at its end; a full disk cannot be foreseen and is said when it happens."""
    path = Path(path)
    there = path
    while not there.exists() and there != there.parent:
        there = there.parent
    if not os.access(there, os.W_OK):
        read_only = bool(os.statvfs(there).f_flag & os.ST_RDONLY)
        exc = OSError(errno.EROFS if read_only else errno.EACCES, "not writable")
        raise WriteError(write_failure(path, exc, what, fix))


FULL_BELOW_BYTES = 1 << 20  # less room than this where a run writes: its records and checkpoints cannot go on


def full_note(path: Path | str) -> str:
    """'the filesystem at M is full (N bytes free)' when there is (almost) no room left where `path` is,
    else '': said with a run that failed without a word, since a full disk also stops its error record."""
    try:
        st = os.statvfs(mount_point(Path(path)))
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    return f"the filesystem at {mount_point(Path(path))} is full ({free:,} bytes free)" if free < FULL_BELOW_BYTES else ""


def is_write_failure(exc: BaseException) -> bool:
    """An OSError the user fixes by making room or choosing a writable place (for the CLI's last resort)."""
    return isinstance(exc, OSError) and exc.errno in WRITE_FAILURES


# ---- the one safe open inside a run directory ------------------------------------------------------


class LinkError(ScalelabError):
    """A file of a run directory is a symbolic link, or lies outside the directory: never followed."""


def _link_message(path: Path, root: Path, why: str, fix: str = "") -> str:
    fix = fix or f"remove the link (rm {path}) or put the file itself there"
    return f"{path} {why}; scalelab never reads or writes through a link out of {root}: {fix}, then run the command again"


def check_inside(root: Path | str, path: Path | str) -> Path:
    """`path` as it will be opened, refused (LinkError) when its directory resolves outside `root` (a linked
    `records/` or `logs/`) or its final component is a symbolic link. Why: a run directory is shared and
    edited by hand; a planted link would make a resume append to, or a checkpoint overwrite, any file
    the user can write, and `launch logs` print any file the user can read."""
    root, path = Path(root), Path(path)
    if os.path.islink(path):
        raise LinkError(_link_message(path, root, f"is a symbolic link (to {os.readlink(path)})"))
    real_root = root.resolve()
    parent = path.parent.resolve()
    if parent != real_root and real_root not in parent.parents:
        raise LinkError(_link_message(path, root, f"lies outside {root} (in {parent})",
                                      f"replace the link to {parent} by a directory, or correct the file name"))
    return path


def open_inside(root: Path | str, path: Path | str, flags: int, mode: int = 0o666) -> int:
    """os.open of a file of the run directory `root`: checked as `check_inside`, and opened with O_NOFOLLOW
    so that a link planted between the check and the open fails too (ELOOP), with the same message."""
    path = check_inside(root, path)
    try:
        return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LinkError(_link_message(path, Path(root), "is a symbolic link")) from None
        raise


def refuse_links(out_dir: Path | str, names: tuple[str, ...]) -> None:
    """Refuse (LinkError) before anything is written when one of the files `names` a command is about to
    (re)write in `out_dir` is a symbolic link: replacing it would overwrite the link's target."""
    for name in names:
        check_inside(out_dir, Path(out_dir) / name)


def write_inside(root: Path | str, path: Path | str, data: str | bytes, append: bool = False) -> None:
    """Write (or append) `data` to a file of the run directory `root` through `open_inside`: the backends'
    copies of records, placements and logs never follow a link planted in the run directory."""
    raw = data.encode() if isinstance(data, str) else data
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = open_inside(root, path, flags, 0o644)
    with os.fdopen(fd, "ab" if append else "wb") as f:
        f.write(raw)
