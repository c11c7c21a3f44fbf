"""How a user names their own code, as torchrun and `python -m` take it, and the one line when it is wrong, before
anything starts (scalelab/launcher/owncode.py): a script given positionally (`launch train.py ARGS`, `launch run
train.py`) is pointed to --script; every dotted part of --module is looked for, nothing imported."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_entry


@pytest.fixture
def code(tmp_path: Path, monkeypatch) -> Path:
    """ok.py; pkg/ (a package) with sub/train.py; ns/inner/m.py (a namespace package); pkg's __init__ must not run."""
    (tmp_path / "ok.py").write_text("#!/usr/bin/env python3\nprint('hi')\n")
    (tmp_path / "run.sh").write_text("#!/bin/bash -e\npython ok.py\n")
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("raise SystemExit('the launcher imported the package')\n")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "train.py").write_text("print('hi')\n")
    (tmp_path / "ns" / "inner").mkdir(parents=True)
    (tmp_path / "ns" / "inner" / "m.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("argv, said", [
    (["ok.py", "--lr", "3"], "ok.py: your own script is given as --script, its arguments after `--`: "
                             "`launch run --script ok.py -- --lr 3`"),
    (["train.py"], "`launch run --script train.py`"),  # not there yet: a .py name is still a script
    (["run", "ok.py", "--gpus-per-node", "2"], "`launch run [OPTIONS] --script ok.py [-- SCRIPT_ARGS]`"),
    (["sweep", "ok.py", "--workers", "1,2"], "`launch sweep [OPTIONS] --script ok.py [-- SCRIPT_ARGS]`"),
    (["--module", "pkg.nothere"], "--module pkg.nothere: no module 'nothere' in package 'pkg'"),
    (["--module", "pkg.sub.nothere"], "no module 'nothere' in package 'pkg.sub'"),
    (["--module", "pkg.sub.train.x"], "'pkg.sub.train' is a module, not a package holding 'x'"),
    (["--module", "ns.inner.zz"], "no module 'zz' in package 'ns.inner'"),
    (["--script", "run.sh"], "--script run.sh is a script for '/bin/bash -e', not Python"),
])
def test_a_misnamed_script_or_module_is_one_line_naming_what_to_type(argv, said, code, monkeypatch, capsys) -> None:
    rc, err, _ = run_entry([*argv, "--runs-dir", str(code / "runs")] if argv[0] != "ok.py" and argv[0] != "train.py"
                           else argv, monkeypatch, capsys)
    assert rc == 2 and said in " ".join(err.split()), err
    assert "Traceback" not in err and "imported the package" not in err
    assert not (code / "runs").exists()


@pytest.mark.parametrize("module", ["pkg.sub.train", "ns.inner.m", "json.tool"])
def test_modules_python_m_finds_are_taken_without_being_imported(module, code, monkeypatch, capsys) -> None:
    rc, err, out = run_entry(["--module", module, "--engine", "single", "--dry-run"], monkeypatch, capsys)
    assert rc == 0, err
    assert module in out and "imported the package" not in err + out


def test_a_python_shebang_is_a_script(code, monkeypatch, capsys) -> None:
    rc, err, out = run_entry(["--script", "ok.py", "--engine", "single", "--dry-run"], monkeypatch, capsys)
    assert rc == 0 and "ok.py" in out, err


def test_resume_refuses_arguments_for_the_script_saying_where_they_are_kept(code, monkeypatch, capsys) -> None:
    """`launch resume RUN -- ARGS` was click's "Got unexpected extra arguments"; the script's arguments are kept in
    the run's spec.json, changed there with --allow-changed script_args."""
    from scalelab.core.spec import Spec, save_spec

    run = code / "runs" / "r"
    run.mkdir(parents=True)
    save_spec(Spec(script=str(code / "ok.py")).validate(), run)
    rc, err, _ = run_entry(["resume", str(run), "--", "--steps", "95"], monkeypatch, capsys)
    said = " ".join(err.split())
    assert rc == 2 and "launch resume takes no arguments for the script (--steps 95)" in said, err
    assert "edit `script_args` there and resume with --allow-changed script_args" in said


def test_the_detach_banner_says_what_a_cancel_does_to_a_script(code) -> None:
    """A script saves what it saves itself: the banner said "its ranks checkpoint" of every run."""
    from scalelab.core.spec import Spec
    from scalelab.launcher.cli import _stopped_how

    script = _stopped_how(Spec(script=str(code / "ok.py")).validate(), Path("runs/r"))
    assert script == "its ranks get SIGTERM; launch resume runs/r starts ok.py again"
    assert _stopped_how(Spec(model="nmt-tiny").validate(), Path("runs/r")).startswith("its ranks checkpoint;")


@pytest.mark.parametrize("first", ["~nosuchuser-scalelab", "a" * 300])
def test_a_first_word_no_path_can_be_is_an_unknown_command_not_a_traceback(first, code, monkeypatch, capsys) -> None:
    rc, err, _ = run_entry([first], monkeypatch, capsys)
    assert rc == 2 and "no command" in err and "Traceback" not in err, err


@pytest.mark.parametrize("line", ["#!/usr/bin/env -S uv run --script", "#!/usr/bin/env pypy3", "#!/usr/bin/python3 -u"])
def test_a_python_script_whose_line_names_another_program_is_taken(line, code, monkeypatch, capsys) -> None:
    """Only interpreters surely not Python are refused: a PEP 723 script run through uv, PyPy, python -u."""
    (code / "other.py").write_text(f"{line}\nprint('hi')\n")
    rc, err, _ = run_entry(["--script", "other.py", "--engine", "single", "--dry-run"], monkeypatch, capsys)
    assert rc == 0, err
