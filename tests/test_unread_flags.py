"""A review of input handling: each problem as the user met it, each test failing before its fix.

1. `lr: 1e-3` in a spec file was refused ("expected float, got '1e-3'") while a config file took it: the YAML
   loader kept PyYAML's 1.1 floats (a dot and a signed exponent); it reads YAML 1.2's numbers now.
2. Flags the built-in trainer never read were accepted (exit 0): --train-src without --data text, Horovod's
   fusion settings with another engine, --bucket-cap-mb without DDP, --ps-* without the parameter server,
   --balance-every without --balance dynamic, --max-price without --spot. Refused in one line as
   --ps-placement separate with --engine ddp was, unless a config file's default (or a study's base) meant
   for other runs gave it.
3. `--device cuda` on a machine without a GPU, and an empty --train-src, were said by the ranks once started
   (exit 1, a run directory left): now before anything starts, naming the right flag.
4. A config file's bad value (`steps: nan`) broke `launch --help` and `launch ls`.
5. Wording and bounds: `launch sweep -- X`, track.step(items=10**30), "1 characters", "1 units", an empty
   prices file, --time-limit-min 1e9, --toleration ':::'.
Run in-process (tests/conftest.py::run_entry), dry runs where a run would start.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from conftest import run_entry

from scalelab.core.errors import SpecError
from scalelab.core.spec import EngineSpec, Spec
from scalelab.launcher import cli


@pytest.fixture
def spec_of(monkeypatch):
    """The Spec each `launch run` in the test builds (build_spec spied on), newest last."""
    built: list[Any] = []
    real = cli.build_spec

    def spy(params):
        built.append(real(params))
        return built[-1]

    monkeypatch.setattr(cli, "build_spec", spy)
    return built


@pytest.fixture
def config(tmp_path, monkeypatch):
    """Write c.yaml in a fresh cwd and point SCALELAB_CONFIG at it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SCALELAB_CONFIG", "c.yaml")
    monkeypatch.setenv("COLUMNS", "200")

    def write(text: str):
        (tmp_path / "c.yaml").write_text(text)
    return write


def _refused(argv: list[str], monkeypatch, capsys, *words: str) -> str:
    """`launch ARGV` exits 2 with one `launch: error:` line holding `words`, no traceback; that line."""
    code, err, out = run_entry(argv, monkeypatch, capsys)
    said = [line for line in err.splitlines() if line.startswith("launch: error:")]
    assert code == 2 and len(said) == 1 and "Traceback" not in err + out, (code, err[-3000:])
    for word in words:
        assert word in said[0], (word, said[0])
    return said[0]


# ---- 1. YAML 1.2's numbers, in a spec file as in a config file ------------------------------------------------


@pytest.mark.parametrize("text, value", [
    ("1e-3", 0.001), ("1E5", 100000.0), (".5", 0.5), ("-.5", -0.5), ("+1.5e3", 1500.0), ("1e3", 1000.0),
    ("1.5e+3", 1500.0), ("2.", 2.0), ("017", 17), ("0o17", 15), ("0x1F", 31), ("12", 12), ("-4", -4),
    ("1_000", 1000), ("6:8", "6:8"), ("1:30:00", "1:30:00"), ("1e", "1e"), ("1.2.3", "1.2.3"),
])
def test_the_loader_reads_numbers_as_yaml_1_2_does(text, value):
    """1.1 (PyYAML) read 1e-3, 1E5, -.5 and 1e3 as text, 017 as octal 15 and 0o17 as text."""
    from scalelab.core.yamltext import load_yaml

    got = load_yaml(f"x: {text}\n")["x"]
    assert got == value and type(got) is type(value), (text, got)


def test_an_explicit_tag_on_text_that_is_no_number_is_a_yaml_error():
    import yaml

    from scalelab.core.yamltext import load_yaml

    for text in ("x: !!int abc", "x: !!float abc"):
        with pytest.raises(yaml.YAMLError):
            load_yaml(text)


@pytest.mark.parametrize("where", ["spec", "config"])
def test_lr_1e_minus_3_is_read_the_same_from_a_spec_file_and_a_config_file(where, config, monkeypatch, capsys,
                                                                            spec_of, tmp_path):
    (tmp_path / "sci.yaml").write_text("lr: 1e-3\nwarmup_steps: 1\n")
    config("lr: 1e-3\n" if where == "config" else "runs-dir: runs\n")
    argv = ["--dry-run", "--runs-dir", "runs"] + (["--spec", "sci.yaml"] if where == "spec" else [])
    code, err, _ = run_entry(argv, monkeypatch, capsys)
    assert code == 0, err
    assert spec_of[-1].lr == pytest.approx(0.001)


def test_a_fraction_for_a_whole_number_is_refused_in_a_config_file_as_in_a_spec_file(config, monkeypatch, capsys,
                                                                                   tmp_path):
    """Before: click's int type cut `steps: 40.5` in a config file to 40 without a word; a spec file refused it."""
    (tmp_path / "s.yaml").write_text("steps: 40.5\n")
    config("runs-dir: runs\n")
    _refused(["--spec", "s.yaml", "--dry-run"], monkeypatch, capsys, "steps", "40.5")
    config("steps: 40.5\n")
    _refused(["--dry-run"], monkeypatch, capsys, "config file c.yaml", "steps", "40.5")
    assert not (tmp_path / "runs").exists()
