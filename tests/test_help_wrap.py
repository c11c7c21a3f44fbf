"""Help at 80 columns wraps at spaces only (core/terminal.wrap_help_at_spaces): click's textwrap default also
broke after a hyphen, so flags named in a help text came out as `--cpus-per-` / `task` and defaults as
`[default: us-` / `east-1]`."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from scalelab.launcher.cli import main

COMMANDS = main.list_commands(click.Context(main))  # the lazy ones (plan, study, prep, ...) too


@pytest.mark.parametrize("command", COMMANDS)
def test_no_word_is_cut_at_a_hyphen_at_80_columns(command: str) -> None:
    out = CliRunner().invoke(main, [command, "--help"], terminal_width=80)
    assert out.exit_code == 0, out.output
    cut = [line for line in out.output.splitlines() if re.search(r"[A-Za-z0-9]-$", line)]
    assert cut == [], cut
    assert max(len(line) for line in out.output.splitlines()) <= 80


def test_the_slurm_flags_named_in_run_help_are_whole() -> None:
    out = " ".join(CliRunner().invoke(main, ["run", "--help"], terminal_width=80).output.split())
    assert "(sbatch --cpus-per-task)" in out and "[default: scalelab-RUN]" in out
