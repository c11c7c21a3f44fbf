"""A review of the runs-directory rule (e1ea25b, 997c2ee), the resume of completed runs (5ba03e7), the
refusal of the trainer's options with --script (96f127a) and Slurm --detach (45caa1e): each problem found,
as the user meets it."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import launch

TINY = ("--model", "nmt-tiny", "--engine", "single", "--data", "task", "--warmup-steps", "1", "-y")


def _one_error_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return proc.stderr


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


# ---- 1. a runs directory from $SCALELAB_RUNS_DIR or the ./runs default is checked as a flag's is --------------


@pytest.mark.parametrize("command", [("run", "--steps", "4"), ("sweep", "--workers", "1", "--steps", "4")])
@pytest.mark.parametrize("where", ["default", "env"])
def test_a_runs_directory_that_is_a_file_is_one_line_whichever_way_it_came(command, where, tmp_path) -> None:
    """Before: no flag given, click converted nothing, and new_run_dir's mkdir ended in a FileExistsError
    (./runs a file) or NotADirectoryError ($SCALELAB_RUNS_DIR=/dev/null's child) traceback."""
    env = {}
    if where == "default":
        (tmp_path / "runs").write_text("not a directory\n")
    else:
        (tmp_path / "afile").write_text("not a directory\n")
        env = {"SCALELAB_RUNS_DIR": str(tmp_path / "afile")}
    before = _tree(tmp_path)
    err = _one_error_line(launch(*command, *TINY, cwd=tmp_path, env=env))
    if where == "default":
        assert "the default runs directory" in err and "runs is a regular file, not a directory" in err, err
        assert "--runs-dir DIR" in err, err
    else:
        assert f"$SCALELAB_RUNS_DIR {tmp_path / 'afile'} is a regular file" in err, err
        assert "point $SCALELAB_RUNS_DIR at a directory" in err, err
    assert _tree(tmp_path) == before  # nothing started, nothing made


def test_runs_dir_dev_null_from_the_environment_is_one_line(tmp_path) -> None:
    err = _one_error_line(launch("run", "--steps", "4", *TINY, cwd=tmp_path, env={"SCALELAB_RUNS_DIR": "/dev/null"}))
    assert "$SCALELAB_RUNS_DIR /dev/null is a character device" in err, err


# ---- 3 and 4. a completed run's checkpoint must be of its end; report/cost find runs in a config's runs-dir ---


@pytest.fixture(scope="module")
def configured_run(tmp_path_factory) -> tuple[Path, Path, dict[str, str]]:
    """A 4-step run with a checkpoint of its end, made in the runs-dir a config file names."""
    where = tmp_path_factory.mktemp("configured")
    (where / "scalelab.yaml").write_text("runs-dir: elsewhere\n")
    env = {"SCALELAB_CONFIG": str(where / "scalelab.yaml")}
    proc = launch("run", *TINY, "--steps", "4", "--checkpoint-every", "2", "--name", "cfg", cwd=where, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (where / "elsewhere").iterdir()
    return where, run, env


@pytest.mark.parametrize("command", [("report",), ("cost", "--rate", "1")])
def test_report_and_cost_find_a_short_id_in_the_config_files_runs_dir(configured_run, command) -> None:
    """Before: RunDir looked in ./runs (those commands have no --runs-dir, so the config's default never
    reached them): 'no run matches ... under runs'."""
    where, run, env = configured_run
    proc = launch(command[0], run.name[-6:], *command[1:], cwd=where, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no run matches" not in proc.stderr


# ---- 6. launch study takes the one --runs-dir declaration ---------------------------------------------------


def test_study_declares_runs_dir_as_launch_run_does() -> None:
    from scalelab.launcher.cli import main
    from scalelab.launcher.study import study_cmd

    def option(command):
        return next(p for p in command.params if p.name == "runs_dir")

    mine, run = option(study_cmd), option(main.commands["run"])
    assert mine.help == run.help and type(mine.type) is type(run.type) and mine.callback is run.callback
    assert "config file's runs-dir" in mine.help
