"""Mistakes in a corpus's content refused before a run or prep directory exists (`core.datafiles`), and a task
data set smaller than one global batch: each left a FAILED run (or prep, and --out's marker) behind."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from scalelab.core.datafiles import count_lines
from scalelab.launcher.cli import main


def said(result) -> str:
    return result.output + (str(result.exception) if result.exception else "")


@pytest.fixture
def corpus(tmp_path):
    (tmp_path / "src.txt").write_text("".join(f"a b {i}\n" for i in range(30)))
    (tmp_path / "tgt.txt").write_text("".join(f"x y {i}\n" for i in range(20)))
    (tmp_path / "nolabel.txt").write_text("pos\tgood film\ngood movie\n")
    return tmp_path


def test_lines_are_counted_as_the_trainer_reads_them(tmp_path):
    """Breaks at \\n only (a \\u2028 or \\r inside a line does not split it); a last line without \\n counts."""
    (tmp_path / "f").write_text("a\u2028b\r\nc\nd")
    assert count_lines(tmp_path / "f") == 3
    (tmp_path / "g").write_text("a\nb\n")
    assert count_lines(tmp_path / "g") == 2


@pytest.mark.parametrize("args, words", [
    (["--model", "nmt-tiny", "--data", "text", "--train-src", "src.txt", "--train-tgt", "tgt.txt"],
     "src.txt has 30 lines, tgt.txt has 20"),
    (["--model", "sentiment-tiny", "--data", "text", "--train-src", "nolabel.txt"], "nolabel.txt:2: expected LABEL<TAB>text"),
    (["--model", "nmt-tiny", "--data", "task", "--train-samples", "5", "--global-batch", "16"],
     "--train-samples 5 is fewer than one global batch of 16"),
])
@pytest.mark.parametrize("dry", [True, False])
def test_run_refuses_bad_data_before_its_run_directory_exists(corpus, monkeypatch, args, words, dry):
    monkeypatch.chdir(corpus)
    out = CliRunner().invoke(main, ["run", *args, "--steps", "8", "--runs-dir", "runs", *(["--dry-run"] if dry else [])])
    assert out.exit_code != 0 and words in said(out), said(out)
    assert not Path("runs").exists() or not any(Path("runs").iterdir())  # no FAILED run left behind


@pytest.mark.parametrize("args, words", [
    (["--model", "nmt-tiny", "--train-src", "src.txt", "--train-tgt", "tgt.txt"], "src.txt has 30 lines"),
    (["--model", "sentiment-tiny", "--train", "nolabel.txt"], "nolabel.txt:2: expected LABEL<TAB>text"),
])
def test_prep_refuses_bad_data_before_making_anything(corpus, monkeypatch, args, words):
    monkeypatch.chdir(corpus)
    out = CliRunner().invoke(main, ["prep", *args, "--out", "shards", "--runs-dir", "runs"])
    assert out.exit_code != 0 and words in said(out), said(out)
    assert not Path("runs").exists() and not Path("shards").exists()  # no FAILED prep, no marker in --out
