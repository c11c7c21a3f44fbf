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
import re
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from scalelab.core.errors import RunFailed, ScalelabError

FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
READ_ONLY = frozenset({errno.EROFS})
DENIED = frozenset({errno.EACCES, errno.EPERM})
WRITE_FAILURES = FULL | READ_ONLY | DENIED


class WriteError(ScalelabError):
    """A file could not be written: a full, read-only or forbidden filesystem (the message says which)."""


class RunWriteError(WriteError, RunFailed):
    """A WriteError while a started run was followed (its launch.json on a disk that filled): the run was
    stopped and did not complete, so it exits 1 as a failed run does, not 2 as a refusal before the start."""


def existing(path: Path | str) -> Path:
    """`path` resolved, or its deepest existing ancestor: what a failed write of a file not yet made is on."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path.resolve()


MOUNT_TABLE = "/proc/self/mountinfo"  # proc(5): one line per mount; field 5 its mount point, after " - " its type


def _mounts() -> list[tuple[Path, str]]:
    """(mount point, filesystem type) of every mount this process sees, in mount order (later on top), read from
    /proc/self/mountinfo; [] where there is none (not Linux)."""
    try:
        with open(MOUNT_TABLE, encoding="utf-8", errors="surrogateescape") as f:
            rows = [line.split() for line in f]
    except OSError:
        return []
    return [(Path(_unescape(row[4])), row[row.index("-", 6) + 1]) for row in rows if "-" in row[6:-1]]


def _unescape(field: str) -> str:
    """A mount table's path as it is: the kernel writes a space, tab, newline and backslash as \\040 etc."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def _mount_of(path: Path | str) -> tuple[Path, str]:
    """(mount point, type) of the filesystem holding `path` (or its deepest existing ancestor): the mount
    table's deepest mount point above it. Why not os.path.ismount: a bind mount of a directory of the same
    filesystem (a read-only view of a runs directory) is not a mount to it, so the messages named `/`;
    where the mount table cannot be read, that walk is the fallback (type unknown, '')."""
    there = existing(path)
    found: tuple[Path, str] | None = None
    for mount, kind in _mounts():
        if (mount == there or mount in there.parents) and (found is None or len(mount.parts) >= len(found[0].parts)):
            found = (mount, kind)
    if found:
        return found
    while not os.path.ismount(there) and there != there.parent:
        there = there.parent
    return there, ""


def mount_point(path: Path | str) -> Path:
    """The mount point of the filesystem holding `path` (or its nearest existing parent)."""
    return _mount_of(path)[0]


def free_bytes(path: Path | str) -> str:
    """'1,234 bytes' free for unprivileged users on the filesystem of `path`; 'unknown' if it cannot tell."""
    try:
        st = os.statvfs(existing(path))  # the path's own filesystem, even where its mount point is hidden
    except OSError:
        return "unknown"
    return f"{st.f_bavail * st.f_frsize:,} bytes"


def write_failure(path: Path | str, exc: OSError, what: str = "",
                  fix: str = "or choose another directory (--runs-dir, --out)") -> str:
    """The one line for `exc` raised while writing `path` (`what` says which file it is)."""
    path = user_file(Path(path))
    mount, name = mount_point(path), f"{what} {path}" if what else str(path)
    if exc.errno in FULL:
        return f"cannot write {name}: the filesystem at {mount} is full ({free_bytes(path)} free); free space there {fix}"
    if exc.errno in READ_ONLY:
        return f"cannot write {name}: the filesystem at {mount} is read-only; remount it read-write {fix}"
    if exc.errno in DENIED:
        return f"cannot write {name}: permission denied (filesystem at {mount}); make it writable {fix}"
    return f"cannot write {name} on the filesystem at {mount}: {exc.strerror or exc}; check it {fix}"


_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.[^./]+\.tmp$")  # `.spec.json.k2j3h.tmp`, `.owner.json.17342.tmp`


def user_file(path: Path) -> Path:
    """The file the user knows for one of our temporary files (`.owner.json.17342.tmp` -> `owner.json`, beside
    it: `rundir.write_chunks`' and `lock.RunLock`'s), else `path`. Why: a message naming the temporary file
    sent the user looking for a file that no longer exists."""
    m = _TEMPORARY.match(path.name)
    return path.with_name(m["name"]) if m else path


def unnamed_write_failure(exc: OSError) -> str:
    """The CLI's last resort for a write failure no command wrapped: `write_failure` of the file the OS named;
    where it named none, none is guessed (the current directory was: "cannot write .: the filesystem at / is
    full" named a filesystem with room, not the full one)."""
    if exc.filename:
        return write_failure(Path(exc.filename), exc)
    return (f"a write failed ({exc.strerror or exc}) and the system did not say which file: free space on, or make "
            "writable, the filesystem the command writes to, or choose another directory (--runs-dir, --out)")


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
        st = os.statvfs(existing(path))
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


def extract_inside(tar, folder: Path | str) -> None:
    """Unpack the open tarfile `tar` into `folder`, refusing (tarfile.TarError) what could reach outside it.

    Python 3.11.4 and newer do that with `extractall(filter="data")` (PEP 706). Older 3.11 releases - Debian 12's
    3.11.2, so a machine image's system Python - have no `filter` argument (TypeError: a --script run's
    bootstrap failed on every instance), so there the same rules are applied here: regular files and folders
    only, no absolute names or `..` out of the folder, no set-id bits, owned by whoever unpacks."""
    import tarfile

    if hasattr(tarfile, "data_filter"):
        tar.extractall(folder, filter="data")
        return
    root = Path(folder).resolve()
    members = []
    for member in tar.getmembers():
        target = (root / member.name).resolve()
        if os.path.isabs(member.name) or (target != root and root not in target.parents):
            raise tarfile.TarError(f"{member.name!r} would be unpacked outside {root}")
        if not (member.isfile() or member.isdir()):
            raise tarfile.TarError(f"{member.name!r} is a link or a special file; only files and folders are unpacked")
        member.mode &= 0o755
        member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
        members.append(member)
    tar.extractall(root, members=members)


RUN_DIR_PARTS = ("records", "logs", "slurm", "checkpoint.pt", "checkpoint.tmp")  # what a launch writes into


def refuse_run_dir_links(run_dir: Path | str) -> None:
    """Refuse (LinkError) a run directory where a launch would write through a link: `records/`, `logs/`
    (or `slurm/`) that is a link or resolves out of the run directory, a checkpoint that is a link, or a
    link among the files in `records/` and `logs/`. Called by every backend before anything is submitted
    or written (`launcher/runner.py` `submitted`), so a refused link leaves the run's state, its files and
    the link's target as they were; the opens themselves use O_NOFOLLOW (`open_inside`) as well."""
    root = Path(run_dir)
    for name in RUN_DIR_PARTS:
        part = root / name
        if not os.path.lexists(part):
            continue
        check_inside(root, part)  # the part itself is not a link
        if part.is_dir():
            check_inside(root, part / "x")  # a directory resolving out of the run directory
            for entry in sorted(part.iterdir()):
                if name == "slurm" and _beside(part, entry):
                    continue  # submitit's own .submission_file_*.sh -> JOB_submission.sh, in the same folder
                check_inside(root, entry)


def _beside(folder: Path, entry: Path) -> bool:
    """Whether `entry` is a link to a file (not a link) in the same folder: what submitit makes beside each
    job's submission script. It leads nowhere outside the run directory, so it is not refused."""
    if not entry.is_symlink():
        return False
    target = Path(os.readlink(entry))
    target = target if target.is_absolute() else folder / target
    return target.parent.resolve() == folder.resolve() and not target.is_symlink() and not target.is_dir()


def write_inside(root: Path | str, path: Path | str, data: str | bytes, append: bool = False) -> None:
    """Write (or append) `data` to a file of the run directory `root` through `open_inside`: the backends'
    copies of records, placements and logs never follow a link planted in the run directory."""
    raw = data.encode() if isinstance(data, str) else data
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = open_inside(root, path, flags, 0o644)
    with os.fdopen(fd, "ab" if append else "wb") as f:
        f.write(raw)


# ---- the one place paths given on the command line are checked ---------------------------------------

# filesystems made by the kernel: nothing a run writes can be created there (mkdir in /proc fails ENOENT)
PSEUDO_FILESYSTEMS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "devpts", "securityfs", "debugfs", "tracefs",
                                "pstore", "bpf", "configfs", "fusectl", "mqueue", "efivarfs", "binfmt_misc"})


def what_it_is(path: Path | str) -> str:
    """'a directory', 'a FIFO (named pipe)', 'a character device', ...: said instead of "not found" when a
    path exists but is not the kind of file a command wants, so the user sees what they gave."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "missing"
    kinds = [(stat.S_ISLNK, f"a symbolic link (to {os.readlink(path) if os.path.islink(path) else '?'})"),
             (stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")]
    return next((text for test, text in kinds if test(mode)), "a special file")


def filesystem_type(path: Path | str) -> str:
    """The type of the filesystem holding `path` ('ext4', 'proc'), '' if it cannot tell."""
    return _mount_of(path)[1]


def check_output_dir(path: Path | str, flag: str) -> Path:
    """`path` given to `flag` (--runs-dir, --out) as a directory the command may create and write, refused
    (WriteError) before anything is made when it cannot be: empty, an existing non-directory (a file,
    /dev/null), under a file (FILE/x) or on a kernel filesystem (/proc/x). Why one place: each command
    created its directory its own way and those cases ended in a mkdir traceback, half through a run."""
    text = str(path)
    if not text.strip():
        raise WriteError(f"{flag} is empty: give a directory, e.g. {flag} runs")
    p = Path(text)
    if os.path.lexists(p):
        if not p.is_dir():
            raise WriteError(f"{flag} {p} is {what_it_is(p)}, not a directory: give a directory (or a new path)")
        there = p
    else:
        there = p.parent
        while not os.path.lexists(there) and there != there.parent:
            there = there.parent
        if not there.is_dir():
            raise WriteError(f"{flag} {p} cannot be created: {there} is {what_it_is(there)}, not a directory; "
                             "give a path under a directory")
    kind = filesystem_type(there)
    if kind in PSEUDO_FILESYSTEMS:
        raise WriteError(f"{flag} {p} is on the kernel's {kind} filesystem ({mount_point(there)}), where no file "
                         "can be made: give a directory on a disk")
    return p


def check_input_file(path: Path | str, what: str) -> Path:
    """`path` as a regular file to read, else one line (DataError) saying what it is instead: missing, a
    directory, a FIFO, a device. Why before opening: reading a FIFO with no writer blocks forever, and
    "not found" for a directory sends the user looking for a file that is there."""
    from scalelab.core.errors import DataError

    p = Path(path)
    kind = what_it_is(p) if not os.path.islink(p) or not p.exists() else what_it_is(p.resolve())
    if kind == "missing":
        raise DataError(f"{what} not found: {p}")
    if kind != "a regular file":
        raise DataError(f"{what} {p} is {kind}, not a regular file: give the file itself")
    return p
