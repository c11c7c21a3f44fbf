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


# ---- 2. a --script run made before the trainer's options were refused still resumes -------------------------


def test_a_script_run_with_the_trainers_options_in_its_spec_resumes(tmp_path) -> None:
    """Before 96f127a --script ignored --lr/--seed, so they are in such runs' spec.json (and in the trajectory
    their launch recorded); `launch resume` validated the stored spec as if they were asked for now and
    refused with advice for `launch run`."""
    (tmp_path / "plain.py").write_text("print('done')\n")
    proc = launch("--script", "plain.py", "--engine", "single", "--runs-dir", "runs", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    spec = json.loads((run / "spec.json").read_text())
    (run / "spec.json").write_text(json.dumps({**spec, "lr": 0.5, "seed": 7}))
    events = run / "records" / "launcher-events.jsonl"
    lines = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    for e in lines:  # the launch recorded what it ran with, as an old run's did
        if e.get("event") == "trajectory":
            e["fields"] = {**e["fields"], **{k: v for k, v in (("lr", 0.5), ("seed", 7)) if k in e["fields"]}}
    events.write_text("".join(json.dumps(e) + "\n" for e in lines))
    state = json.loads((run / "launch.json").read_text())
    (run / "launch.json").write_text(json.dumps({**state, "state": "CANCELLED"}))  # interrupted, say

    proc = launch("resume", str(run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "built-in trainer" not in proc.stderr
    assert json.loads((run / "launch.json").read_text())["state"] == "COMPLETED"
    # asking for them now is still refused
    err = _one_error_line(launch("--script", "plain.py", "--engine", "single", "--lr", "0.5", "--runs-dir", "runs",
                                 cwd=tmp_path))
    assert "--lr 0.5 is an option of the built-in trainer" in err, err


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


@pytest.mark.slow
def test_raised_steps_with_a_checkpoint_older_than_the_runs_end_are_refused(configured_run, tmp_path) -> None:
    """Interrupted at step k (checkpoint on the signal), resumed to its end N without --checkpoint-every,
    then steps raised: before, the resume went on from k and wrote steps k+1..N a second time."""
    import torch

    _, completed, _ = configured_run
    run = tmp_path / completed.name
    shutil.copytree(completed, run, symlinks=True)
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    assert ckpt["step"] == 4
    torch.save({**ckpt, "step": 2}, run / "checkpoint.pt")  # the checkpoint of an interruption at step 2
    spec = json.loads((run / "spec.json").read_text())
    (run / "spec.json").write_text(json.dumps({**spec, "steps": 6}))
    before = _tree(run)
    err = _one_error_line(launch("resume", str(run), cwd=tmp_path, env={"SCALELAB_CONFIG": "off"}))
    assert "its checkpoint is of step 2, not of its end" in err and "start a new run" in err, err
    assert _tree(run) == before


# ---- 5. a script that ended past the runner is ended, not damaged -------------------------------------------


def test_a_script_that_exits_past_the_runner_is_completed_for_resume(tmp_path) -> None:
    """os._exit(0) skips the runner's `end` record; before, resume said the records were damaged (exit 2)."""
    (tmp_path / "exits.py").write_text("import os\nprint('bye', flush=True)\nos._exit(0)\n")
    proc = launch("--script", "exits.py", "--engine", "single", "--runs-dir", "runs", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    assert json.loads((run / "launch.json").read_text())["state"] == "COMPLETED"
    before = _tree(run)
    proc = launch("resume", str(run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = " ".join(proc.stdout.split())
    assert "is COMPLETED already (exits.py ran to its end); nothing to resume" in said, said
    assert _tree(run) == before


# ---- 6. launch study takes the one --runs-dir declaration ---------------------------------------------------


def test_study_declares_runs_dir_as_launch_run_does() -> None:
    from scalelab.launcher.cli import main
    from scalelab.launcher.study import study_cmd

    def option(command):
        return next(p for p in command.params if p.name == "runs_dir")

    mine, run = option(study_cmd), option(main.commands["run"])
    assert mine.help == run.help and type(mine.type) is type(run.type) and mine.callback is run.callback
    assert "config file's runs-dir" in mine.help


# ---- 7. a precision variant probed with a script is refused as what it is -----------------------------------


def test_probe_of_a_script_with_a_precision_variant_names_the_candidate(tmp_path) -> None:
    """Before: '--precision bf16 is an option of the built-in trainer ...', a flag the user never gave."""
    (tmp_path / "plain.py").write_text("print('done')\n")
    err = _one_error_line(launch("probe", "--script", "plain.py", "--warmup-steps", "1", "--probe-steps", "2",
                                 "--instance-types", "local-1t,local-2t-bf16", "--dry-run", cwd=tmp_path))
    assert "probe candidate local-2t-bf16 sets the built-in trainer's precision (bf16)" in err, err
    assert "probe local-2t instead" in err and "--precision bf16 is" not in err, err
    ok = launch("probe", "--script", "plain.py", "--warmup-steps", "1", "--probe-steps", "2",
                "--instance-types", "local-1t,local-2t", "--dry-run", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-3000:]


# ---- 8. a detached start whose state cannot be asked is still started ---------------------------------------


def test_a_detached_start_whose_status_fails_says_submitted(monkeypatch, tmp_path, capsys) -> None:
    """Before: an sacct/squeue hiccup in the status after the submit exited 2, though the job was queued."""
    from scalelab.core.errors import ScalelabError
    from scalelab.core.spec import Spec
    from scalelab.launcher import cli

    class Hiccup:
        def status(self, run_dir):
            raise ScalelabError("sacct: error: slurmdbd: connection refused")

    monkeypatch.setattr(cli, "start_detached", lambda backend, spec, run_dir: None)
    cli.run_and_show(Hiccup(), Spec(), tmp_path / "run", detach=True)
    said = " ".join(capsys.readouterr().out.split())
    assert "detached: no launcher follows it (submitted)" in said, said
