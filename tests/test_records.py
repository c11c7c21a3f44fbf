"""The record schema has one owner (scalelab/core/records.py): the writer refuses a record that does not fit its
kind, and the reader names the file, the line and the field of one that does not."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from scalelab.core.errors import RecordError
from scalelab.core.records import KINDS, RecordWriter, read_records, record_problem


def test_the_writer_refuses_a_record_against_its_kind(tmp_path: Path) -> None:
    out = RecordWriter(tmp_path, 0, 1)
    out.write("val", step=2, epoch=0, val_loss=None, elapsed_s=1.5)  # a val loss may be null
    with pytest.raises(ValueError, match="'val_loss'"):
        out.write("val", step=2, epoch=0, val_loss="low", elapsed_s=1.5)
    with pytest.raises(ValueError, match="unknown record kind 'stepp'"):
        out.write("stepp", step=1)
    with pytest.raises(ValueError, match="no 'message'"):
        out.write("error")
    out.close()
    lines = (tmp_path / "records" / "rank-0.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["kind"] == "val"


@pytest.mark.parametrize("field, value, words", [
    ("step", "abc", "'step' must be a whole number"),
    ("warmup", 1, "'warmup' must be true or false"),
    ("step_s", None, "'step_s' must be a number"),
    ("rank", 1.5, "'rank' must be a whole number"),
])
def test_the_reader_names_file_line_and_field(tmp_path: Path, field: str, value, words: str) -> None:
    good = {"kind": "step", "rank": 0, "world": 1, "time": 1.0, "step": 1, "epoch": 0, "warmup": False,
            "step_s": 0.1, "data_s": 0.0, "forward_s": 0.03, "backward_s": 0.05, "exchange_s": None,
            "optimizer_s": 0.01, "samples": 8, "words": 80, "loss": 2.0, "lr": 0.001}
    assert record_problem(good) is None
    path = tmp_path / "rank-0.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, field: value}) + "\n")
    with pytest.raises(RecordError, match=rf"{path}:2 .*{words}"):
        read_records(path, [])
    warnings: list[str] = []
    assert len(read_records(path, warnings, tolerant=True)) == 1 and "rank-0.jsonl:2" in warnings[0]


def test_every_kind_is_documented() -> None:
    """The rank records' kinds in docs/records.md (`launch prep` registers its own, documented in docs/prep.md)."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "records.md").read_text()
    for kind in ("start", "step", "val", "event", "error"):
        fields = KINDS[kind]
        assert f"### `{kind}`" in doc
        for name in fields:
            assert f"`{name}`" in doc or name in doc, (kind, name)


# ---- a cut last line and planted links (issue #27 items 1 and 3) ----------------------------------


def _write_lines(tmp_path: Path, n: int) -> Path:
    out = RecordWriter(tmp_path, 0, 1)
    for i in range(1, n + 1):
        out.write("val", step=i, epoch=0, val_loss=1.0, elapsed_s=float(i))
    out.close()
    return tmp_path / "records" / "rank-0.jsonl"


def test_a_cut_last_line_is_truncated_before_appending_and_said(tmp_path: Path, capsys) -> None:
    from scalelab.core.records import load_run
    from scalelab.core.spec import Spec, save_spec

    path = _write_lines(tmp_path, 3)
    whole = path.read_bytes()
    path.write_bytes(whole[:-20])  # a kill or a full disk cut the last record
    cut = len(whole) - 20 - (whole[:-20].rfind(b"\n") + 1)
    out = RecordWriter(tmp_path, 0, 1)
    out.write("val", step=4, epoch=0, val_loss=1.0, elapsed_s=4.0)
    out.close()
    assert f"{path}: dropped a cut last line of {cut} bytes" in capsys.readouterr().err
    recs = read_records(path, [])  # strict: no glued line in the middle
    assert [r.get("step") for r in recs if r["kind"] == "val"] == [1, 2, 4]
    assert [r["bytes"] for r in recs if r.get("event") == "cut_line_dropped"] == [cut]
    save_spec(Spec(), tmp_path)
    assert any(f"a cut last line of {cut} bytes" in w for w in load_run(tmp_path).warnings)


def test_a_file_of_one_cut_line_is_emptied(tmp_path: Path) -> None:
    from scalelab.core.records import drop_cut_line

    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"kind": "st')
    fd = os.open(path, os.O_RDWR)
    try:
        assert drop_cut_line(fd, block=4) == 12
    finally:
        os.close(fd)
    assert path.read_bytes() == b""


def test_reading_tolerates_only_a_cut_last_line_with_a_warning(tmp_path: Path) -> None:
    path = _write_lines(tmp_path, 3)
    path.write_bytes(path.read_bytes()[:-20])
    warnings: list[str] = []
    assert len(read_records(path, warnings)) == 2
    assert len(warnings) == 1 and f"{path}:3: dropped a truncated last line" in warnings[0]


@pytest.mark.parametrize("linked", ["file", "records-dir"])
def test_records_are_never_appended_through_a_link(tmp_path: Path, linked: str) -> None:
    from scalelab.core.writes import LinkError

    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "victim.jsonl").write_text("precious\n")
    run = tmp_path / "run"
    (run / "records").mkdir(parents=True) if linked == "file" else run.mkdir()
    if linked == "file":
        (run / "records" / "rank-0.jsonl").symlink_to(target / "victim.jsonl")
    else:
        (run / "records").symlink_to(target)
        (target / "rank-0.jsonl").write_text("precious\n")
    with pytest.raises(LinkError) as exc:
        RecordWriter(run, 0, 1)
    msg = str(exc.value)
    assert "records" in msg and "link" in msg and "\n" not in msg
    assert (target / "victim.jsonl").read_text() == "precious\n"
    if linked == "records-dir":
        assert (target / "rank-0.jsonl").read_text() == "precious\n"
