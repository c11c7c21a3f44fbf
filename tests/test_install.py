"""The installed package as a user gets it (issue #24): one top-level package, a `launch --help` that
imports no command, and a trainer that nothing in the caller's working directory can shadow.

The shadowing cases run the installed `launch` console script (the one beside this Python; the source
checkout is not put on PYTHONPATH) from a directory that holds a `train.py`, a `core/` package and a
`launcher.py`, each of which would fail loudly and leave a marker if imported: with the old top-level
names (`python -m train` in the caller's directory) the user's `train.py` ran instead of the trainer.
Every engine runs on the local backend, and on the real Slurm cluster (tests/test_slurm_cluster.py's
fixture; skipped with its reason where this machine cannot run Slurm).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import click
import pytest

from scalelab.core.procs import tool_path
from scalelab.launcher.cli import LAZY_COMMANDS, LAZY_HELP, main
from tests.conftest import ROOT, build_wheel, horovod_available, only_run_dir, steps_of

ENGINES = ["single", "ddp", "ps", pytest.param("horovod", marks=pytest.mark.skipif(
    not horovod_available(), reason="Horovod with PyTorch + Gloo is not installed: run scripts/build-horovod.sh"))]
SHADOWS = {
    "train.py": "open('SHADOWED-train', 'w').close(); raise SystemExit('the caller\\'s train.py ran')\n",
    "core/__init__.py": "open('SHADOWED-core', 'w').close(); raise SystemExit('the caller\\'s core ran')\n",
    "launcher.py": "open('SHADOWED-launcher', 'w').close(); raise SystemExit('the caller\\'s launcher ran')\n",
}


def shadowing_dir(where: Path) -> Path:
    for name, text in SHADOWS.items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(text)
    return where


def installed_launch(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """The `launch` console script installed beside this Python, run without the checkout on PYTHONPATH."""
    exe = tool_path("launch")
    cmd = [exe, *args] if exe else [sys.executable, "-m", "scalelab.launcher.cli", *args]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(cmd, cwd=cwd, env={**env, "COLUMNS": "200"}, capture_output=True, text=True, timeout=timeout)


def assert_trained_normally(done: subprocess.CompletedProcess, cwd: Path, steps: int) -> None:
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert not list(cwd.glob("SHADOWED-*")), "a file of the caller's directory was imported"
    run_dir = only_run_dir(cwd / "runs")
    assert [r["step"] for r in steps_of(run_dir)][-1] == steps


def test_the_wheel_holds_one_top_level_package(tmp_path: Path) -> None:
    done = build_wheel(tmp_path)
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("scalelab-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"scalelab"}
    entry = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith("entry_points.txt"))
    assert "launch = scalelab.launcher.entry:entry" in zipfile.ZipFile(wheel).read(entry).decode()


def test_launch_help_lists_every_command_and_imports_none_of_them() -> None:
    """`launch --help` took 5-8 s because listing the commands imported them all (PyTorch, pandas)."""
    code = ("import sys\nfrom click.testing import CliRunner\nfrom scalelab.launcher.cli import main\n"
            "r = CliRunner().invoke(main, ['--help'])\nprint(r.exit_code)\nprint(r.output)\n"
            "print('HEAVY', sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pandas', 'matplotlib')"
            " or m in ('scalelab.costs.cli', 'scalelab.aws.cli', 'scalelab.prep.cli', 'scalelab.launcher.bench')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.stdout.splitlines()[0] == "0", done.stderr
    assert done.stdout.splitlines()[-1] == "HEAVY []"
    for name in [*LAZY_COMMANDS, "run", "sweep", "report", "resume", "status", "cancel", "logs", "ls"]:
        assert f"\n  {name} " in done.stdout, f"{name} missing from launch --help"


@pytest.mark.parametrize("name", sorted(LAZY_COMMANDS))
def test_the_listed_help_of_a_lazy_command_is_its_own(name: str) -> None:
    """LAZY_HELP is a copy made so that listing imports nothing: it must say what the command says."""
    command = main.get_command(click.Context(main), name)
    assert command is not None
    assert command.get_short_help_str(10_000) == click.Command(name, help=LAZY_HELP[name]).get_short_help_str(10_000)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_launch_from_a_directory_that_shadows_module_names_trains_normally(tmp_path: Path, engine: str) -> None:
    cwd = shadowing_dir(tmp_path)
    workers = "1" if engine == "single" else "2"
    done = installed_launch("--model", "nmt-tiny", "--engine", engine, "--gpus-per-node", workers, "--steps", "3",
                            "--warmup-steps", "1", "--threads", "1", "--runs-dir", "runs", cwd=cwd)
    assert_trained_normally(done, cwd, steps=3)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_a_slurm_run_from_a_directory_that_shadows_module_names_trains_normally(slurm_cluster, tmp_path: Path,
                                                                                engine: str) -> None:
    """The batch script and its ranks start in the submission directory, as Slurm does by default."""
    cwd = shadowing_dir(tmp_path)
    workers = "1" if engine == "single" else "2"
    done = installed_launch("--backend", "slurm", "--model", "nmt-tiny", "--engine", engine, "--gpus-per-node",
                            workers, "--steps", "3", "--warmup-steps", "1", "--threads", "1", "--runs-dir", "runs",
                            cwd=cwd)
    assert_trained_normally(done, cwd, steps=3)

