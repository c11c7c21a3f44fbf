"""The `launch` console script's entry: the CLI is imported here, inside the Ctrl-C handling.

Why a module of its own: the console script imported `scalelab.launcher.cli` (click, rich and the CLI's own
modules, about 0.1-0.2 s) before any of the CLI's handling existed, so a Ctrl-C in that moment printed
a KeyboardInterrupt traceback where every later Ctrl-C prints one line and exits 130. This module
imports nothing but the standard library's `sys` before it asks for the CLI.
"""

from __future__ import annotations

import sys


def entry() -> None:
    """`launch`: the CLI's own entry (`scalelab.launcher.cli.entry`), after its import."""
    try:
        from scalelab.launcher.cli import entry as cli_entry
    except KeyboardInterrupt:
        print("launch: interrupted before it started; nothing was launched", file=sys.stderr)
        sys.exit(130)
    cli_entry()
