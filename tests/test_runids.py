"""Issue 35: a short id that matches several runs (the layout `1x2` of several sweeps) is refused, listing
them newest first, by every command that takes a run; `launch status` alone shows the newest run."""

from __future__ import annotations

import json
import os

import pytest

from scalelab.core.errors import ScalelabError
from scalelab.core.runids import newest_run_dir, resolve_run_dir
from scalelab.core.spec import Spec, save_spec
from tests.conftest import ROOT, launch

# three sweeps, oldest first (their spec files' times say so, not their names)
SWEEPS = ("sweep-b-20261127-0900", "sweep-a-20261127-1000", "sweep-c-20261127-1100")


def _sweeps(tmp_path):
    root = tmp_path / "runs"
    for age, name in enumerate(SWEEPS):
        sweep = root / name
        for layout, gpus in (("1x1", 1), ("1x2", 2)):
            (sweep / layout).mkdir(parents=True)
            save_spec(Spec(model="nmt-tiny", gpus_per_node=gpus).validate(), sweep / layout)
            os.utime(sweep / layout / "spec.json", (1_800_000_000 + age * 60,) * 2)
        (sweep / "sweep.json").write_text(json.dumps({"runs": ["1x1", "1x2"], "layouts": [[1, 1], [1, 2]]}))
        os.utime(sweep / "sweep.json", (1_800_000_000 + age * 60,) * 2)
    return root


def test_an_id_of_several_sweeps_layouts_is_refused_newest_first(tmp_path):
    root = _sweeps(tmp_path)
    with pytest.raises(ScalelabError) as err:
        resolve_run_dir("1x2", root)
    said = str(err.value)
    assert "matches 3 directories, newest first" in said
    positions = [said.index(f"{name}/1x2") for name in reversed(SWEEPS)]
    assert positions == sorted(positions)  # sweep-c (newest), sweep-a, sweep-b: by time, not by name
    assert f"`launch status {root / SWEEPS[2] / '1x2'}`" in said  # how to name one exactly
    assert resolve_run_dir(str(root / SWEEPS[0] / "1x2"), root) == str(root / SWEEPS[0] / "1x2")  # a path is exact
    assert resolve_run_dir("sweep-a", root) == str(root / SWEEPS[1])  # a unique prefix still works


def test_the_newest_run_is_the_default_and_none_is_an_error(tmp_path):
    root = _sweeps(tmp_path)
    assert newest_run_dir(root) == root / SWEEPS[2]
    with pytest.raises(ScalelabError, match="no runs under"):
        newest_run_dir(tmp_path / "empty")


@pytest.mark.parametrize("command", ["status", "cancel", "resume", "logs"])
def test_every_command_refuses_an_ambiguous_id_in_one_line(tmp_path, command):
    root = _sweeps(tmp_path)
    done = launch(command, "1x2", cwd=tmp_path, env={"SCALELAB_RUNS_DIR": str(root)})
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("launch: error:")]
    assert len(errors) == 1 and "matches 3 directories, newest first" in errors[0]
    assert f"`launch {command} {root / SWEEPS[2] / '1x2'}`" in errors[0]
    assert not (root / SWEEPS[0] / "1x2" / "launch.json").exists()  # nothing was done to the oldest


def test_status_alone_shows_the_newest_and_ls_shows_every_one(tmp_path):
    root = _sweeps(tmp_path)
    env = {"SCALELAB_RUNS_DIR": str(root)}
    shown = launch("status", "--format", "json", cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["name"] == SWEEPS[2]
    listed = launch("ls", "--runs-dir", str(root), "--format", "json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert sorted(row["name"] for row in json.loads(listed.stdout)) == sorted(SWEEPS)
    empty = launch("status", cwd=tmp_path, env={"SCALELAB_RUNS_DIR": str(tmp_path / "none")})
    assert empty.returncode == 2 and empty.stderr.count("launch: error:") == 1 and "no runs under" in empty.stderr


# ---- one rule for where runs live: --runs-dir, else $SCALELAB_RUNS_DIR, else a config file's, else ./runs ----


def _one_sweep(root, name):
    sweep = root / name / "1x1"
    sweep.mkdir(parents=True)
    save_spec(Spec(model="nmt-tiny").validate(), sweep)
    (root / name / "sweep.json").write_text(json.dumps({"runs": ["1x1"], "layouts": [[1, 1]]}))
    return root


def test_run_ls_and_the_short_ids_of_status_logs_cancel_resume_use_one_runs_directory(tmp_path):
    """Before: `launch run` and `ls` ignored $SCALELAB_RUNS_DIR (runs went to ./runs) while short ids were
    looked up under it, and status/logs/cancel/resume had no --runs-dir."""
    env_dir = tmp_path / "by-env"
    env = {"SCALELAB_RUNS_DIR": str(env_dir)}
    made = launch("run", "--model", "nmt-tiny", "--engine", "single", "--data", "task", "--steps", "30",
                  "--val-every", "2", "--val-batches", "1", "--loss-threshold", "100", "--name", "envrun", "-y",
                  cwd=tmp_path, env=env)
    assert made.returncode == 0, made.stderr[-3000:]
    assert not (tmp_path / "runs").exists()
    (run,) = env_dir.iterdir()
    listed = launch("ls", "--format", "json", cwd=tmp_path, env=env)
    assert listed.returncode == 0 and [r["name"] for r in json.loads(listed.stdout)] == [run.name], listed.stderr
    for command in (["status"], ["logs"], ["cancel"], ["resume"]):
        done = launch(*command, "envrun", "--runs-dir", str(env_dir), cwd=tmp_path)  # the flag, no variable
        assert done.returncode == 0 and str(run) in done.stdout, (command, done.stdout, done.stderr)
    newest = launch("status", "--runs-dir", str(env_dir), "--format", "json", cwd=tmp_path)
    assert newest.returncode == 0 and json.loads(newest.stdout)["name"] == run.name, newest.stderr


@pytest.mark.parametrize("command", ["status", "logs", "cancel", "resume"])
def test_an_id_that_matches_no_run_names_the_directory_searched(tmp_path, command):
    """Before: "nosuchrun is not a run directory: nosuchrun/spec.json is missing"."""
    root = _one_sweep(tmp_path / "somewhere", "sweep-x-20261127-0900")
    done = launch(command, "nosuchrun", "--runs-dir", str(root), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    said = " ".join(done.stderr.split())
    assert done.stderr.count("launch: error:") == 1
    assert f"no run matches 'nosuchrun' under {root} (`launch ls --runs-dir {root}` lists them)" in said, said


def test_the_flag_wins_over_the_variable_which_wins_over_a_config_file(tmp_path):
    roots = {where: _one_sweep(tmp_path / where, f"sweep-{where}-20261127-0900")
             for where in ("flag", "env", "config", "runs")}
    config = tmp_path / "config.yaml"
    config.write_text(f"runs-dir: {roots['config']}\n")

    def newest(*args, **env):
        done = launch("status", *args, "--format", "json", cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["name"].split("-")[1]

    assert newest() == "runs"  # ./runs of the working directory
    assert newest(SCALELAB_CONFIG=str(config)) == "config"
    assert newest(SCALELAB_CONFIG=str(config), SCALELAB_RUNS_DIR=str(roots["env"])) == "env"
    assert newest("--runs-dir", str(roots["flag"]), SCALELAB_CONFIG=str(config),
                  SCALELAB_RUNS_DIR=str(roots["env"])) == "flag"


def test_a_study_follows_the_same_runs_directory_rule(tmp_path):
    """`launch study` declared its own --runs-dir (default runs) and ignored $SCALELAB_RUNS_DIR."""
    study = str(ROOT / "examples" / "seed004-sentiment.yaml")
    env_dir = tmp_path / "by-env"
    shown = launch("study", study, "--scale", "test", "--dry-run", cwd=tmp_path,
                   env={"SCALELAB_RUNS_DIR": str(env_dir)})
    assert shown.returncode == 0 and f"{env_dir}/study-" in shown.stdout, shown.stderr[-2000:]
    flag = launch("study", study, "--scale", "test", "--dry-run", "--runs-dir", str(tmp_path / "flag"), cwd=tmp_path,
                  env={"SCALELAB_RUNS_DIR": str(env_dir)})
    assert f"{tmp_path / 'flag'}/study-" in flag.stdout and str(env_dir) not in flag.stdout


def _two_runs(root):
    """Two ended runs with a log each, the second the newest."""
    for age, name in enumerate(("old-20261127-0900", "new-20261127-1000")):
        run = root / name
        (run / "logs").mkdir(parents=True)
        save_spec(Spec(model="nmt-tiny").validate(), run)
        (run / "logs" / "launcher.log").write_text(f"the log of {name}\n")
        (run / "launch.json").write_text(json.dumps({"backend": "local", "state": "COMPLETED",
                                                     "log_files": [str(run / "logs" / "launcher.log")]}))
        os.utime(run / "spec.json", (1_800_000_000 + age * 60,) * 2)
    return root


def test_logs_alone_shows_the_newest_run_and_cancel_and_resume_need_one(tmp_path):
    """The README said the newest run is the default of status, logs, cancel and resume; only status had it.
    `launch logs` now has it too (it only reads); `cancel` and `resume` keep asking for RUN_DIR (a default would
    stop or restart a run by accident), and the README says so."""
    root = _two_runs(tmp_path / "runs")
    shown = launch("logs", "--runs-dir", str(root), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "the log of new-20261127-1000" in shown.stdout and "old-" not in shown.stdout, shown.stdout
    for command in ("cancel", "resume"):
        refused = launch(command, "--runs-dir", str(root), cwd=tmp_path)
        assert refused.returncode == 2 and "Missing argument 'RUN_DIR'" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "`cancel` and `resume` always need one" in readme


def test_logs_alone_with_a_sweep_newest_says_to_name_one_of_its_runs(tmp_path):
    root = _sweeps(tmp_path)
    done = launch("logs", "--runs-dir", str(root), cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("launch: error:") == 1, done.stderr
    said = " ".join(done.stderr.split())
    assert f"the newest under {root}: {root / SWEEPS[2]} is a sweep, not a run" in said, said
    assert f"`launch logs {root / SWEEPS[2]}/" in said  # one of its layouts, named
