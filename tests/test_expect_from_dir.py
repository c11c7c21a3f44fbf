"""`--expect-from /tmp` (not a run directory) was taken without a word: a launch with no price never read it, one
with a price took a stranger's run from folders below. It is one error naming the flag and the path."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_entry


@pytest.mark.parametrize("rate", [(), ("--rate", "0.5/gpu-hour")])  # unpriced (never read before) and priced
def test_expect_from_a_folder_that_is_no_run_is_refused(rate, monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "elsewhere" / "someone-1x1"  # a run two folders down: the folder given is still no run
    run.mkdir(parents=True)
    (run / "spec.json").write_text(json.dumps({"model": "nmt-tiny"}))
    (tmp_path / "notes.txt").write_text("x")
    for given, why in ((tmp_path, "not a run, sweep or study directory"), (tmp_path / "nothere", "no such directory"),
                       (tmp_path / "notes.txt", "a file, not a run")):
        code, err, out = run_entry(["run", "--model", "nmt-tiny", "--steps", "12", "--dry-run", "--runs-dir",
                                    str(tmp_path / "runs"), *rate, "--expect-from", str(given)], monkeypatch, capsys)
        line = " ".join(err.split())
        assert code == 2 and "Traceback" not in err, err
        assert f"--expect-from {given}: {why}" in line, line
