"""The record schema has one owner (scalelab/core/records.py): the writer refuses a record that does not fit its
kind, and the reader names the file, the line and the field of one that does not."""

from __future__ import annotations

import json
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
