"""Config files for defaults (issue 35 ask 8): `~/.config/scalelab/config.yaml` and `./scalelab.yaml`, as
TorchX's `.torchxconfig` and SkyPilot's config give them. Precedence: built-in < user file < project file <
spec file < flag. Run in-process (tests/conftest.py::run_entry); conftest turns the files off for every
other test (SCALELAB_CONFIG=off)."""

from __future__ import annotations

import importlib
import json

import pytest
from conftest import run_entry


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A user config folder and a project folder (the cwd), config files on."""
    monkeypatch.delenv("SCALELAB_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("COLUMNS", "160")
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    (tmp_path / "xdg" / "scalelab").mkdir(parents=True)
    return {"user": tmp_path / "xdg" / "scalelab" / "config.yaml", "project": project / "scalelab.yaml",
            "dir": project}


def sbatch(out: str, key: str) -> str | None:
    lines = [line for line in out.splitlines() if line.startswith(f"#SBATCH --{key}=")]
    return lines[0].split("=", 1)[1] if lines else None


def test_project_file_beats_user_file_and_flags_beat_both(files, monkeypatch, capsys):
    files["user"].write_text("backend: slurm\npartition: cpu\ntime: '20'\n")
    files["project"].write_text("partition: gpu\n")
    code, err, out = run_entry(["--model", "nmt-tiny", "--dry-run"], monkeypatch, capsys)
    assert code == 0, err
    assert (sbatch(out, "partition"), sbatch(out, "time")) == ("gpu", "20")
    code, err, out = run_entry(["--model", "nmt-tiny", "--dry-run", "--partition", "debug"], monkeypatch, capsys)
    assert code == 0 and sbatch(out, "partition") == "debug"


def test_help_shows_the_configured_default_and_its_file(files, monkeypatch, capsys):
    files["project"].write_text("backend: slurm\npartition: gpu\n")
    code, _, out = run_entry(["run", "--help"], monkeypatch, capsys)
    flat = "".join(out.split())  # help wraps long paths: compare without the white space
    assert code == 0
    assert f"[default:slurm,from{files['project']}]" in flat and f"[default:gpu,from{files['project']}]" in flat
    assert "[default:local]" not in flat


def test_a_spec_file_beats_the_config_and_another_backend_ignores_its_options(files, monkeypatch, capsys):
    files["project"].write_text("backend: slurm\npartition: gpu\nsteps: 7\n")
    spec = files["dir"] / "exp.yaml"
    spec.write_text("model: nmt-tiny\nbackend: local\nsteps: 9\n")
    code, err, out = run_entry(["--spec", str(spec), "--dry-run"], monkeypatch, capsys)
    assert code == 0, err  # the config's slurm --partition does not apply to the spec's local backend
    assert "#SBATCH" not in out and "torch" in out
    code, err, out = run_entry(["--model", "nmt-tiny", "--backend", "local", "--dry-run"], monkeypatch, capsys)
    assert code == 0, err  # a flag's other backend: the configured partition is not an error


def test_a_lazy_command_gets_its_defaults(files, monkeypatch, capsys):
    files["project"].write_text("market: spot\n")
    table = files["dir"] / "runs.csv"
    table.write_text("label,seconds,instances\na,3600,p2.xlarge\n")
    monkeypatch.setenv("SCALELAB_PRICES", str(files["dir"] / "no-prices.json"))
    code, err, out = run_entry(["cost", "--from-csv", str(table), "--format", "json"], monkeypatch, capsys)
    assert code == 0, err
    assert [(row["market"], row["dollars"]) for row in json.loads(out)] == [("spot", pytest.approx(0.1288))]


@pytest.mark.parametrize("text, message", [
    ("partiton: gpu\n", "partiton is no option of any command (did you mean 'partition'?)"),
    ("partition: [gpu, cpu]\n", "'partition' must be one value"),
    ("- backend\n", "must be a mapping"),
    ("backend: [\n", "is not valid YAML"),
    ("backend: mars\n", "mars"),
])
def test_a_bad_config_file_is_one_error_line_naming_it(files, monkeypatch, capsys, text, message):
    files["project"].write_text(text)
    code, err, _ = run_entry(["--model", "nmt-tiny", "--dry-run"], monkeypatch, capsys)
    lines = [line for line in err.splitlines() if "launch: error:" in line]
    assert code == 2 and lines and message in err and "Traceback" not in err, err


def test_scalelab_config_names_one_file_or_none(files, monkeypatch, capsys, tmp_path):
    files["project"].write_text("backend: slurm\n")
    monkeypatch.setenv("SCALELAB_CONFIG", "off")
    code, _, out = run_entry(["--model", "nmt-tiny", "--dry-run"], monkeypatch, capsys)
    assert code == 0 and "#SBATCH" not in out
    monkeypatch.setenv("SCALELAB_CONFIG", str(tmp_path / "missing.yaml"))
    code, err, _ = run_entry(["--model", "nmt-tiny", "--dry-run"], monkeypatch, capsys)
    assert code == 2 and "SCALELAB_CONFIG=" in err and "no such file" in err


def test_lazy_flags_list_every_flag_only_a_lazy_command_has():
    """LAZY_FLAGS lets a config key for `cost` or `plan` be known without importing them; it must stay true."""
    from scalelab.launcher import cli

    lazy = set()
    for ref in cli.LAZY_COMMANDS.values():
        module, attr = ref.split(":")
        lazy |= set(cli.option_keys(getattr(importlib.import_module(module), attr)))
    assert set(cli.LAZY_FLAGS) == lazy - set(cli.option_keys(cli.main))


def test_config_defaults_walks_the_option_tree_once(files, monkeypatch):
    """`launch` reads the config files before every command, `--help` included: the option tree of every command
    was walked three times (the defaults, the unknown keys, the values); once now, with the same result."""
    from scalelab.launcher import cli

    files["project"].write_text("backend: slurm\npartition: gpu\nsteps: nan\nrate: 0.45/gpu-hour\n")
    walks = []
    real = cli.option_params
    monkeypatch.setattr(cli, "option_params", lambda command: walks.append(command) or real(command))
    defaults = cli.config_defaults()
    assert walks.count(cli.main) == 1  # (option_params goes on into each subcommand itself)
    assert (defaults["backend"], defaults["rates"], sorted(defaults.problem)) == ("slurm", ["0.45/gpu-hour"], ["steps"])
