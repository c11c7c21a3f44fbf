"""`extract_inside` (scalelab/core/writes.py): a --script's code folder (AWS instances) and the records a fetch
pod sends back (Kubernetes) are unpacked with nothing reaching outside the folder, on every Python 3.11.

Python 3.11.4 and newer do it with `extractall(filter="data")`; 3.11.0-3.11.3 (Debian 12's system Python is
3.11.2) have no `filter` argument, which failed every --script bootstrap there (TypeError). Both paths are
checked: the second by hiding `tarfile.data_filter`, which is how the helper tells them apart."""

from __future__ import annotations

import io
import os
import stat
import tarfile

import pytest

from scalelab.core.writes import extract_inside


def _archive(*members: tuple[tarfile.TarInfo, bytes | None]) -> tarfile.TarFile:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    buf.seek(0)
    return tarfile.open(fileobj=buf, mode="r:gz")


def _file(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


def _link(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info, None


@pytest.fixture(params=["filter-data", "older-3.11"])
def python(request, monkeypatch):
    if request.param == "older-3.11":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python has no extractall(filter=...): the older-3.11 case covers it")
    return request.param


def test_files_and_folders_are_unpacked_without_set_id_bits(tmp_path, python):
    folder = tmp_path / "code"
    extract_inside(_archive(_file("train.py", b"print(1)\n"), _file("pkg/util.py", b"u", mode=0o4755)), folder)
    assert (folder / "train.py").read_bytes() == b"print(1)\n" and (folder / "pkg" / "util.py").read_bytes() == b"u"
    assert not os.stat(folder / "pkg" / "util.py").st_mode & stat.S_ISUID


@pytest.mark.parametrize("member", [_file("../escaped.py"), _link("out", "/etc/passwd")], ids=["dotdot", "link-out"])
def test_what_reaches_outside_the_folder_is_refused(tmp_path, python, member):
    folder = tmp_path / "code"
    folder.mkdir()
    with pytest.raises(tarfile.TarError):
        extract_inside(_archive(member), folder)
    assert not (tmp_path / "escaped.py").exists() and list(folder.iterdir()) == []


def test_an_absolute_name_never_lands_at_that_path(tmp_path, python):
    """Refused on older 3.11; the "data" filter keeps it inside the folder, its leading / stripped."""
    folder, outside = tmp_path / "code", tmp_path / "absolute.py"
    folder.mkdir()
    try:
        extract_inside(_archive(_file(str(outside))), folder)
    except tarfile.TarError:
        assert python == "older-3.11"
    assert not outside.exists()
