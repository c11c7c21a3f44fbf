"""Issue 35: `--help` of every command renders without pandas, SciPy, matplotlib or PyTorch (`launch plan --help`
and `launch cost --help` took 3.7 s against 0.3 s for `launch --help` because they imported all four; the
commands import them where they are used). And `launch report`, `cost` and `plan` on runs print their text
(table, JSON, Markdown) without matplotlib, SciPy or PyTorch: the report's PNG plots (matplotlib, most of the
time of `launch report` on ten runs) are drawn on --plots only. Checked in a fresh interpreter per command,
through sys.modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner
from test_costs_cli import _fake_run

from scalelab.core.errors import ScalelabError
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
from scalelab.core.errors import ScalelabError
from scalelab.launcher.cli import main
result = CliRunner().invoke(main, [*sys.argv[1:], "--help"], prog_name="launch")
print(json.dumps({"exit": result.exit_code, "output": result.output,
                  "heavy": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


def test_the_list_of_commands_is_complete():
    names = {path[0] for path in COMMANDS if path}
    assert {"run", "sweep", "report", "status", "cost", "plan", "memory", "bench", "study", "probe", "prep"} <= names
    assert ("aws", "gc") in COMMANDS


def test_every_help_fits_an_80_column_terminal():
    """`COLUMNS=80 launch --help` printed "Start here" lines 93 characters wide, broken mid-word by the
    terminal. Every command's help, in process (about 0.2 s for all of them), at most 80 wide."""
    runner = CliRunner()
    wide = []
    for path in COMMANDS:
        result = runner.invoke(main, [*path, "--help"], prog_name="launch", env={"COLUMNS": "80"})
        assert result.exit_code == 0, (path, result.output)
        wide += [(" ".join(path) or "launch", len(line), line) for line in result.output.splitlines() if len(line) > 80]
    assert not wide, wide


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


# ---- the text path of report, cost and plan (issue 35 ask 4) ----------------------------------------------

#: Not needed to print a report, a cost or a plan as text (pandas is: their tables are DataFrames).
TEXT_HEAVY = ("matplotlib", "scipy", "torch", "botocore")

RUN = """
import json, sys
from click.testing import CliRunner
from scalelab.core.errors import ScalelabError
from scalelab.launcher.cli import main
result = CliRunner().invoke(main, sys.argv[1:], prog_name="launch")
print(json.dumps({"exit": result.exit_code, "output": result.output,
                  "heavy": [m for m in %r if m in sys.modules]}))
""" % (TEXT_HEAVY,)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> list[str]:
    """A 1-GPU and a 2-GPU local run (records only: no training), so the report has a speedup to plot."""
    root = tmp_path_factory.mktemp("text-path")
    return [str(_fake_run(root, f"r{g}", g, 0.1 * (1 + 0.1 * g) / g, 6400, None)) for g in (1, 2)]


def _in_fresh_interpreter(args: list[str], tmp: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SCALELAB_PRICES": os.path.join(tmp, "no-prices.json"),
           "COLUMNS": "100"}
    done = subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, env=env,
                          timeout=120, cwd=tmp)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["exit"] == 0, result["output"]
    return result


@pytest.mark.parametrize("command", [("report",), ("report", "--format", "json"), ("report", "--format", "markdown"),
                                     ("cost", "--rate", "2.5/gpu-hour"), ("plan", "--rate", "2.5/gpu-hour")],
                         ids=" ".join)
def test_report_cost_and_plan_print_text_without_matplotlib_or_scipy(command, two_runs, tmp_path):
    args = [command[0], *two_runs, *command[1:]]
    if command[0] == "report":
        args += ["--out", str(tmp_path / "rep")]
    result = _in_fresh_interpreter(args, str(tmp_path))
    assert result["heavy"] == [], f"`launch {' '.join(command)}` imported {', '.join(result['heavy'])}"
    if command[0] == "report":
        assert not list((tmp_path / "rep").glob("*.png"))  # no plot drawn unasked


def test_report_draws_its_plots_on_plots_only(two_runs, tmp_path, monkeypatch):
    """Without --plots: report.md and report.json, no PNG, no link to one, no "plot:" said; with --plots:
    speedup.png and throughput.png beside report.md, linked from it, and the terminal names speedup.png."""
    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "no-prices.json"))
    monkeypatch.setenv("COLUMNS", "200")
    plain, drawn = tmp_path / "plain", tmp_path / "drawn"
    out = CliRunner().invoke(main, ["report", *two_runs, "--out", str(plain)])
    assert out.exit_code == 0, out.output
    assert sorted(p.name for p in plain.iterdir()) == ["report.json", "report.md", "warnings.json"]
    assert ".png" not in (plain / "report.md").read_text() and "plot:" not in out.output
    out = CliRunner().invoke(main, ["report", *two_runs, "--out", str(drawn), "--plots"])
    assert out.exit_code == 0, out.output
    for name in ("speedup.png", "throughput.png"):
        assert (drawn / name).read_bytes()[:4] == b"\x89PNG"
        assert f"]({name})" in (drawn / "report.md").read_text()
    assert f"plot: {drawn / 'speedup.png'}" in " ".join(out.output.split())


def test_plots_drawn_before_are_kept_for_the_same_table_and_redrawn_for_another(two_runs, tmp_path, monkeypatch):
    """A sweep's directory holds its PNGs: `launch report` of the same runs without --plots keeps them
    (not drawn again: their modification time stays) and report.md still links them; a report of other
    runs there draws them again, so no report links plots of another table."""
    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "no-prices.json"))
    out_dir = tmp_path / "sweep-like"
    assert CliRunner().invoke(main, ["report", *two_runs, "--out", str(out_dir), "--plots"]).exit_code == 0
    for name in ("speedup.png", "throughput.png"):
        os.utime(out_dir / name, (1, 1))  # as if drawn long ago
    out = CliRunner().invoke(main, ["report", *two_runs, "--out", str(out_dir)])
    assert out.exit_code == 0, out.output
    for name in ("speedup.png", "throughput.png"):
        assert (out_dir / name).stat().st_mtime == 1  # the same table: kept
        assert f"]({name})" in (out_dir / "report.md").read_text()
    out = CliRunner().invoke(main, ["report", two_runs[0], "--out", str(out_dir)])
    assert out.exit_code == 0, out.output
    redrawn = [name for name in ("speedup.png", "throughput.png") if (out_dir / name).stat().st_mtime > 1]
    assert redrawn and all(f"]({name})" in (out_dir / "report.md").read_text() for name in redrawn)


def test_an_interrupted_redraw_leaves_no_digest_and_a_digest_that_is_a_folder_is_one_line(two_runs, tmp_path,
                                                                                          monkeypatch):
    """The digest of the plots' table is removed before a redraw and written after it: a redraw cut
    half-way never leaves plots of another table linked as fresh. A `.plots-of` that is a folder is
    refused in one line, not a traceback."""
    from scalelab.analysis import report as rep

    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "no-prices.json"))
    out_dir = tmp_path / "r"
    assert CliRunner().invoke(main, ["report", *two_runs, "--out", str(out_dir), "--plots"]).exit_code == 0
    assert (out_dir / rep.PLOT_KEY).is_file()

    def cut(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(rep, "plot_throughput", cut)
    CliRunner().invoke(main, ["report", two_runs[0], "--out", str(out_dir), "--plots"])  # another table, cut
    assert not (out_dir / rep.PLOT_KEY).exists()  # so the next report of either table draws again
    monkeypatch.undo()
    folder = tmp_path / "f"
    (folder / rep.PLOT_KEY).mkdir(parents=True)
    out = CliRunner().invoke(main, ["report", *two_runs, "--out", str(folder), "--plots"])
    # a ScalelabError: `launch` prints it as one `launch: error:` line (the CLI's handler, tested for all)
    assert isinstance(out.exception, ScalelabError) and "is not a file" in str(out.exception), out.exception


def test_report_html_still_draws_its_plots_inside_the_page(two_runs, tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "no-prices.json"))
    out = CliRunner().invoke(main, ["report", *two_runs, "--out", str(tmp_path / "h"), "--format", "html"])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "h" / "report.html").read_text().count("data:image/png;base64,") >= 2


# A Ctrl-C while `launch` imports its CLI, made certain: an import hook raises KeyboardInterrupt where the CLI's
# module is asked for, as the signal would in that moment. Then the console script's own code runs.
CTRL_C_IN_THE_IMPORT = """import sys
class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "scalelab.launcher.cli":
            raise KeyboardInterrupt
sys.meta_path.insert(0, CtrlC())
from scalelab.launcher.entry import entry
sys.argv = ["launch", "--version"]
sys.exit(entry())
"""


def test_a_ctrl_c_while_launch_imports_its_cli_is_one_line_and_exit_130() -> None:
    """It was a KeyboardInterrupt traceback: the console script imported the CLI before any of its handling."""
    done = subprocess.run([sys.executable, "-c", CTRL_C_IN_THE_IMPORT], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert done.stderr == "launch: interrupted before it started; nothing was launched\n", done.stderr


def test_the_console_script_enters_through_the_guarded_entry() -> None:
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["launch"] == "scalelab.launcher.entry:entry"
