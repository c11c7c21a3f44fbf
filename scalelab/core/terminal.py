"""The one way our commands set up a rich console.

Off a terminal (CI logs, pipes, a file) rich would wrap every table at 80 columns and cut the help
and the reports' rows; there it gets $COLUMNS, else 160 columns. On a terminal rich measures it. Every
command module (`launch`, `launch cost`/`plan`, `launch bench`, `launch prep`'s report, the runner's
messages) makes its consoles here, so they agree.
"""

from __future__ import annotations

import sys

from rich.console import Console

#: Columns of a console that does not write to a terminal.
OFF_TERMINAL_WIDTH = 160


def make_console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr): the terminal's width, or OFF_TERMINAL_WIDTH off one."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else columns_env() or OFF_TERMINAL_WIDTH)


def columns_env() -> int | None:
    """$COLUMNS when it is a sensible width: a user who sets it (or `script`, `watch`, a CI with a known
    width) gets tables of that width off a terminal too, as on one."""
    import os

    value = os.environ.get("COLUMNS", "")
    return int(value) if value.isdigit() and 20 <= int(value) <= 1000 else None


def duration_text(seconds: float) -> str:
    """A duration at a glance: 45 s, 12.5 min, 2.11 h (a short job was "0.00 h"). Here, with no pandas or
    matplotlib, so `launch cost` renders its wall column without loading the HTML report's libraries."""
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        return "—"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"
