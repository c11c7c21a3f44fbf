"""The one way our commands set up a rich console.

Off a terminal (CI logs, pipes, a file) rich would wrap every table at 80 columns and cut the help
and the reports' rows; there it gets 160 columns instead. On a terminal rich measures it. Every
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
    return Console(stderr=stderr, width=None if stream.isatty() else OFF_TERMINAL_WIDTH)
