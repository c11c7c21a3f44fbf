"""Issue 35: `--help` of every command renders without pandas, SciPy, matplotlib or PyTorch (`launch plan --help`
and `launch cost --help` took 3.7 s against 0.3 s for `launch --help` because they imported all four; the
commands import them where they are used). Checked in a fresh interpreter per command, through sys.modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest

from scalelab.launcher.cli import main
from tests.conftest import ROOT

HEAVY = ("pandas", "scipy", "matplotlib", "torch")


def _command_paths() -> list[tuple[str, ...]]:
    """Every command of `launch`, and the subcommands of its groups (`aws gc`), as argument tuples."""
    ctx = click.Context(main)
    out: list[tuple[str, ...]] = [()]
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        out.append((name,))
        if isinstance(command, click.Group):
            out += [(name, sub) for sub in command.list_commands(click.Context(command))]
    return out


COMMANDS = _command_paths()

RENDER = """
import json, sys
from click.testing import CliRunner
from scalelab.launcher.cli import main
result = CliRunner().invoke(main, [*sys.argv[1:], "--help"], prog_name="launch")
print(json.dumps({"exit": result.exit_code, "output": result.output,
                  "heavy": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


def test_the_list_of_commands_is_complete():
    names = {path[0] for path in COMMANDS if path}
    assert {"run", "sweep", "report", "status", "cost", "plan", "memory", "bench", "study", "probe", "prep"} <= names
    assert ("aws", "gc") in COMMANDS


@pytest.mark.parametrize("args", COMMANDS, ids=lambda path: " ".join(path) or "launch")
def test_help_imports_no_heavy_library(args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", RENDER, *args], capture_output=True, text=True, env=env,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["exit"] == 0 and "Usage: launch" in result["output"], result["output"]
    assert result["heavy"] == [], f"`launch {' '.join(args)} --help` imported {', '.join(result['heavy'])}"


def test_shell_completion_documented_in_the_readme_works():
    """The README's completion line (issue 35): click's bash script for `launch`, and it completes a command."""
    root = ROOT
    assert "_LAUNCH_COMPLETE=bash_source launch" in (root / "README.md").read_text()
    env = {**os.environ, "PYTHONPATH": str(root), "_LAUNCH_COMPLETE": "bash_source"}
    code = "import sys; sys.argv[0] = 'launch'; from scalelab.launcher.cli import entry; entry()"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "_launch_completion()" in out.stdout, out.stderr
    env.update(_LAUNCH_COMPLETE="bash_complete", COMP_WORDS="launch pl", COMP_CWORD="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "plain,plan" in out.stdout.splitlines(), out.stdout + out.stderr  # bash_complete: type,value per line
