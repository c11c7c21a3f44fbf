"""`launch prep` defects fixed: an existing --out is never emptied of the user's files, Ctrl-C says
one line, a failed prep records why (and `launch report` says it), the scaling table fits 80 columns."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason='launch prep needs Dask: pip install "scalelab[prep]"')
pytest.importorskip("pyarrow", reason='launch prep needs pyarrow: pip install "scalelab[prep]"')

from scalelab.core.errors import DataError  # noqa: E402
from scalelab.prep import tasks  # noqa: E402
from scalelab.prep.bench import generate  # noqa: E402
from scalelab.prep.corpus import Storage  # noqa: E402
from tests.conftest import ROOT, launch, only_run_dir  # noqa: E402


def nmt_corpus(where: Path, lines: int = 2000) -> tuple[Path, Path]:
    made = generate(where / "gen", "nmt", lines)
    return Path(made["train_src"][0]), Path(made["train_tgt"][0])


# ---- 1. an existing --out ------------------------------------------------------------------------


def test_an_out_folder_holding_the_users_files_is_refused_and_left_alone(tmp_path: Path) -> None:
    """The reviewer's case: the inputs and a vocabulary of the user's in --out. Was: vocab.en.txt
    deleted, exit 0, nothing said."""
    src, tgt = nmt_corpus(tmp_path)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "src.txt").write_bytes(src.read_bytes())
    (corpus / "tgt.txt").write_bytes(tgt.read_bytes())
    (corpus / "vocab.en.txt").write_text("my vocabulary\n")
    before = {p.name: p.read_bytes() for p in corpus.iterdir()}
    done = launch("prep", "--runs-dir", "runs", "--workers", "1", "--model", "nmt-tiny", "--train-src", "corpus/src.txt",
                  "--train-tgt", "corpus/tgt.txt", "--out", "corpus", "--shard-size", "1000", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert {p.name: p.read_bytes() for p in corpus.iterdir()} == before
    assert "--out corpus is not empty" in done.stderr and "vocab.en.txt" in done.stderr
    assert "another --out" in done.stderr and "Traceback" not in done.stderr


def test_prepare_out_cleans_only_a_marked_unfinished_prep_and_never_its_inputs(tmp_path: Path) -> None:
    storage, out = Storage(), tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    with pytest.raises(DataError, match=r"not empty and no earlier prep made it \(notes.txt\)"):
        tasks.prepare_out(storage, str(out), "run-a", ())
    assert (out / "notes.txt").read_text() == "mine\n"

    fresh = tmp_path / "fresh"
    tasks.prepare_out(storage, str(fresh), "run-a", ())
    assert json.loads((fresh / tasks.MARKER).read_text())["run"] == "run-a"
    # an interrupted prep left shards; an input the user keeps there looks like one of them
    (fresh / "train-00000.arrow").write_text("stale")
    (fresh / "vocab.src.txt").write_text("stale")
    (fresh / "vocab.input.txt").write_text("an input\n")
    _, stats = tasks.prepare_out(storage, str(fresh), "run-b", (str(fresh / "vocab.input.txt"),))
    assert stats["stale_files_removed"] == 3  # the two stale files and _held
    assert (fresh / "vocab.input.txt").read_text() == "an input\n"
    assert not (fresh / "train-00000.arrow").exists() and not (fresh / "vocab.src.txt").exists()
    assert json.loads((fresh / tasks.MARKER).read_text())["run"] == "run-b"

    (fresh / "manifest.json").write_text("{}")
    with pytest.raises(DataError, match="already holds shards"):
        tasks.prepare_out(storage, str(fresh), "run-c", ())


def test_an_empty_out_folder_is_used(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    tasks.prepare_out(Storage(), str(tmp_path / "empty"), "run", ())
    assert (tmp_path / "empty" / tasks.MARKER).is_file() and (tmp_path / "empty" / "_held").is_dir()
