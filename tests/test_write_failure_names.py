"""A failed write names the file the user knows and the filesystem it is really on (user review, items 2
and 3): a full disk while a run directory was made said "cannot write .: the filesystem at / is full
(72,239,030,272 bytes free)" and left a run directory that never launched; a read-only bind mount was
called "the filesystem at /", and a resume there named the lock's temporary file. Full and read-only
disks are injected (the mount table, /dev/full, an EROFS from the OS) so that these run as any user;
the last test uses a real read-only bind mount where it may (root)."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from scalelab.core import writes
from scalelab.core.errors import ScalelabError
from scalelab.core.lock import RunLock
from scalelab.core.writes import WriteError, mount_point, write_failure
from tests.conftest import run_entry


def _table(tmp_path: Path, *mounts: tuple[str, str]) -> Path:
    """A mountinfo file (proc(5)) with / and `mounts` ((mount point, type)), optional fields and all."""
    lines = ["27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw"]
    for i, (point, kind) in enumerate(mounts):
        escaped = point.replace(" ", "\\040")
        lines.append(f"{40 + i} 27 254:0 /some/dir {escaped} ro,relatime master:2 - {kind} /dev/vda ro")
    table = tmp_path / "mountinfo"
    table.write_text("\n".join(lines) + "\n")
    return table


def test_a_bind_mount_is_named_as_its_own_mount_point(tmp_path: Path, monkeypatch) -> None:
    """A read-only bind mount of a directory of the root filesystem is not a mount to os.path.ismount (same
    device): its files were said to be on `/`. The mount table names it, a space in its name included."""
    ro = tmp_path / "r o"
    (ro / "run").mkdir(parents=True)
    monkeypatch.setattr(writes, "MOUNT_TABLE", str(_table(tmp_path, (str(ro), "ext4"), (str(ro), "tmpfs"))))
    assert mount_point(ro / "run" / "report.md") == ro  # a file not yet made: its deepest existing directory's
    assert mount_point(ro / "run" / "new" / "deeper") == ro
    assert writes.filesystem_type(ro / "run") == "tmpfs", "the mount on top (listed last) is the one seen"
    assert mount_point(tmp_path / "elsewhere") == Path("/")
    message = write_failure(ro / "run" / "report.md", OSError(errno.EROFS, "Read-only file system"), "the report")
    assert f"the report {ro}/run/report.md: the filesystem at {ro} is read-only" in message


def test_a_temporary_file_is_named_as_the_file_it_stands_for(tmp_path: Path) -> None:
    assert writes.user_file(tmp_path / ".owner.json.17342.tmp") == tmp_path / "owner.json"
    assert writes.user_file(tmp_path / ".spec.json.k2j3h_x.tmp") == tmp_path / "spec.json"
    assert writes.user_file(tmp_path / "notes.tmp") == tmp_path / "notes.tmp"
    message = write_failure(tmp_path / ".launch.json.a1b2.tmp", OSError(errno.ENOSPC, "No space left on device"))
    assert f"cannot write {tmp_path}/launch.json:" in message and ".tmp" not in message


def test_the_lock_on_a_read_only_filesystem_names_owner_json(tmp_path: Path, monkeypatch) -> None:
    """On a read-only filesystem even unlinking a file that was never made fails (EROFS): that error, from the
    lock's clean-up, replaced the one naming owner.json and showed `.owner.json.PID.tmp`."""
    import scalelab.core.rundir as rundir

    run = tmp_path / "run"
    run.mkdir()

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(run / f".owner.json.{os.getpid()}.tmp.x1y2.tmp"))

    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if str(path).endswith(".tmp"):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(rundir.tempfile, "mkstemp", read_only)
    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.raises(WriteError) as info:
        RunLock(run).acquire()
    message = str(info.value)
    assert f"{run}/owner.json: the filesystem at {mount_point(run)} is read-only" in message, message
    assert ".tmp" not in message


def test_an_unnamed_write_failure_names_no_filesystem_it_did_not_happen_on() -> None:
    message = writes.unnamed_write_failure(OSError(errno.ENOSPC, "No space left on device"))
    assert "cannot write ." not in message and "filesystem at /" not in message
    assert "No space left on device" in message and "did not say which file" in message


@pytest.fixture
def events_on_a_full_disk(monkeypatch):
    """The launcher's events file opened on /dev/full: every write of it fails ENOSPC, with no file named, as
    on the review's 200 KiB tmpfs with 8 KiB left (spec.json fitted, the first event did not)."""
    import scalelab.core.records as records

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    real = records.open_for_append

    def full(run_dir, path, *args, **kwargs):
        if Path(path).name == "launcher-events.jsonl":
            return os.open("/dev/full", os.O_WRONLY), 0
        return real(run_dir, path, *args, **kwargs)

    monkeypatch.setattr(records, "open_for_append", full)


def _launch(runs: Path, monkeypatch, capsys) -> tuple[int, str]:
    monkeypatch.chdir(runs.parent)
    code, err, _ = run_entry(["run", "--engine", "single", "--steps", "30", "--device", "cpu", "--runs-dir", str(runs)],
                             monkeypatch, capsys)
    return code, " ".join(err.split())


def test_a_full_disk_while_the_run_directory_is_made_names_the_file_and_leaves_no_run(
        tmp_path: Path, monkeypatch, capsys, events_on_a_full_disk) -> None:
    runs = tmp_path / "runs"
    code, err = _launch(runs, monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err
    assert err.startswith("launch: error: cannot write records ") and "/records/launcher-events.jsonl:" in err, err
    assert f"the filesystem at {mount_point(runs)} is full" in err and "cannot write ." not in err
    assert "launch resume" not in err, "a run that never launched cannot be resumed"
    assert list(runs.iterdir()) == [], "a run directory that never launched was left (listed NEW by `launch ls`)"


def test_a_run_directory_that_cannot_be_removed_is_named_with_how_to_remove_it(
        tmp_path: Path, monkeypatch, capsys, events_on_a_full_disk) -> None:
    import scalelab.core.rundir as rundir

    monkeypatch.setattr(rundir.shutil, "rmtree", lambda *args, **kwargs: None)  # as a directory not ours
    runs = tmp_path / "runs"
    code, err = _launch(runs, monkeypatch, capsys)
    [left] = list(runs.iterdir())
    assert code == 2 and "launcher-events.jsonl" in err
    assert f"the run directory {left} was never launched and could not be removed: remove it with `rm -r {left}`" \
        in err, err


@pytest.fixture
def read_only_view(tmp_path: Path):
    """`tmp_path/ro`: a read-only bind mount of `tmp_path/rw` (root only; skipped elsewhere)."""
    rw, ro = tmp_path / "rw", tmp_path / "ro"
    rw.mkdir()
    ro.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a bind mount needs root; the injected mount table covers the same path")
    for args in (["mount", "--bind", str(rw), str(ro)], ["mount", "-o", "remount,bind,ro", str(ro)]):
        proc = subprocess.run(args, capture_output=True, text=True, check=False)
        if proc.returncode:
            subprocess.run(["umount", str(ro)], capture_output=True, check=False)
            pytest.skip(f"this machine forbids bind mounts ({proc.stderr.strip()})")
    yield ro
    subprocess.run(["umount", str(ro)], check=True)


def test_a_real_read_only_bind_mount_is_named(read_only_view: Path) -> None:
    from scalelab.core.rundir import new_run_dir

    with pytest.raises(ScalelabError) as info:
        new_run_dir(read_only_view / "runs", "x")
    assert f"the filesystem at {read_only_view} is read-only" in str(info.value), str(info.value)
