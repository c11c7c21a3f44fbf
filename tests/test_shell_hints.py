"""The commands that messages suggest (`launch report RUN`, `launch resume RUN`, ...) can be pasted as shown: a
path the shell would split or expand is quoted (`core.errors.shell_word`), as `--dry-run` quotes its commands;
one it takes whole is shown as it is, so the messages are otherwise unchanged."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import launch

ODD = "sp ace/rüns x"


def test_shell_word_quotes_only_what_the_shell_would_split() -> None:
    from scalelab.core.errors import shell_word

    assert shell_word(Path("runs/nmt-tiny-20260101-000000")) == "runs/nmt-tiny-20260101-000000"
    assert shlex.split(shell_word(f"{ODD}/run $x")) == [f"{ODD}/run $x"]


def _run_dir(root: Path, checkpoint: bool) -> Path:
    run = root / ODD / "my-run"
    (run / "records").mkdir(parents=True)
    (run / "spec.json").write_text(json.dumps({"model": "nmt-tiny"}))
    (run / "launch.json").write_text(json.dumps({"backend": "local", "state": "CANCELLED", "launched": 1.0}))
    if checkpoint:
        (run / "checkpoint.pt").write_bytes(b"PK")
    return run


def _words_after(text: str, command: str) -> list[str]:
    """The words of the first `launch COMMAND ...` quoted in backticks in `text`."""
    found = re.search(rf"`launch {command} ([^`]*)`", text)
    assert found, text
    return shlex.split(found[1])


def test_the_runners_hints_quote_the_run_directory(tmp_path: Path) -> None:
    from scalelab.launcher.backend import no_checkpoint_advice
    from scalelab.launcher.runner import cancelled_line, resume_hint

    run = _run_dir(tmp_path, checkpoint=True)
    assert _words_after(resume_hint(run), "resume") == [str(run)]
    assert _words_after(cancelled_line(run), "resume") == [str(run)]
    bare = _run_dir(tmp_path / "b", checkpoint=False)
    assert _words_after(no_checkpoint_advice(bare), "run") == ["--spec", str(bare / "spec.json")]


@pytest.mark.slow
def test_a_runs_summary_line_names_a_command_that_pastes(tmp_path: Path) -> None:
    """`launch run --runs-dir 'sp ace/rüns x'`: its last line's `(launch report ...)` is one word, and runs."""
    proc = launch("--steps", "2", "--warmup-steps", "1", "--runs-dir", ODD, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = " ".join(proc.stdout.split()).rsplit("(launch report ", 1)[1].rstrip(")")
    words = shlex.split(last)
    assert len(words) == 1 and words[0].startswith(ODD + "/"), proc.stdout[-1000:]
    report = launch("report", *words, cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-3000:]
