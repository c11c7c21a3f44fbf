"""Issue #37: writes that followed links, a finished run a resume destroyed, tracebacks and silent
acceptances left. Each case: one `launch: error:` line (or a no-op said in one line), the exit code, and
what must not have changed (a link's target, a run directory's files byte-for-byte)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import launch, runs_made_once

SPEC = ["--model", "nmt-tiny", "--data", "task", "--warmup-steps", "1", "--prefetch", "1", "--global-batch", "8",
        "--steps", "4", "--checkpoint-every", "2"]
ENGINES = {"single": ["--engine", "single"], "ddp": ["--engine", "ddp", "--gpus-per-node", "2"]}


@pytest.fixture(scope="module")
def completed(tmp_path_factory):
    """A COMPLETED run of each engine (4 steps, checkpoints at 2 and 4), made once; tests work on copies."""
    return runs_made_once(tmp_path_factory, SPEC, ENGINES, "done")


def _copy(run: Path, dest: Path, state: str | None = None) -> Path:
    shutil.copytree(run, dest, symlinks=True)
    if state:
        info = json.loads((dest / "launch.json").read_text())
        info["state"] = state
        (dest / "launch.json").write_text(json.dumps(info))
    return dest


def _tree(root: Path) -> dict[str, str]:
    """Every entry under `root` (links not followed): a file's sha256, a link's target, 'dir'."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "link -> " + os.readlink(path)
            elif path.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _one_error_line(proc) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], err[-3000:])
    assert "Traceback" not in err and "torchrun" not in err.lower(), err[-3000:]
    assert err.startswith("launch: error:") and len(err.splitlines()) == 1, err[-3000:]
    return err


# ---- 1. no write into a run directory follows a link (the logs included) ------------------------------


def _plant(run: Path, part: str, victim_dir: Path) -> Path:
    """A link at `part` of `run` to something of `victim_dir`; returns the link's target."""
    if part == "logs/launcher.log":
        target = victim_dir / "victim.txt"
        target.write_text("precious\n")
        (run / part).unlink()
    else:
        target = victim_dir / part
        shutil.copytree(run / part, target)  # a plausible target: the folder moved elsewhere
        shutil.rmtree(run / part)
    (run / part).symlink_to(target)
    return target


@pytest.mark.slow
@pytest.mark.parametrize("part", ["logs/launcher.log", "logs", "records"])
def test_resume_refuses_a_planted_link_and_leaves_its_target(part, completed, tmp_path) -> None:
    """`logs/launcher.log` linked to a file, `logs/` or `records/` linked to a folder: `launch resume` of the
    (cancelled) run is one line naming the link and the fix, exit 2; the target, the run's state and its
    files are untouched; no rank started (records/ linked used to end in torchrun's error block). The check
    is `refuse_run_dir_links`, called in `launcher/runner.py` `submitted`, which every backend (local,
    slurm, k8s, aws) goes through before it submits anything."""
    run = _copy(completed("single"), tmp_path / "run", state="CANCELLED")
    victims = tmp_path / "victims"
    victims.mkdir()
    target = _plant(run, part, victims)
    before, victims_before = _tree(run), _tree(victims)
    err = _one_error_line(launch("resume", str(run), cwd=tmp_path))
    assert f"{run / part} is a symbolic link" in err and f"rm {run / part}" in err, err
    assert _tree(victims) == victims_before, "the link's target changed"
    assert _tree(run) == before, "the run directory changed"
    assert json.loads((run / "launch.json").read_text())["state"] == "CANCELLED"
    if part == "logs/launcher.log":
        assert target.read_text() == "precious\n"


@pytest.mark.slow
def test_resuming_a_sweep_refuses_a_planted_link_in_a_layout(completed, tmp_path) -> None:
    """Sweeps submit without `submitted`: `continue_sweep` checks every layout it would run first."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps({"runs": ["1x1"], "layouts": [[1, 1]]}))
    run = _copy(completed("single"), sweep / "1x1", state="CANCELLED")
    victims = tmp_path / "victims"
    victims.mkdir()
    target = _plant(run, "logs/launcher.log", victims)
    before = _tree(sweep)
    err = _one_error_line(launch("resume", str(sweep), cwd=tmp_path))
    assert f"{run / 'logs/launcher.log'} is a symbolic link" in err, err
    assert target.read_text() == "precious\n" and _tree(sweep) == before


def test_the_local_backend_opens_its_logs_without_following_a_link(tmp_path) -> None:
    """Beside the check before submitting, the local backend's own open of each log is O_NOFOLLOW and
    checked for a linked folder (`open_inside`): a link planted after `submitted`'s check is refused too,
    nothing is started and the target gets no byte."""
    from scalelab.core.writes import LinkError
    from scalelab.launcher.local import LocalBackend, LocalRequest

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for case in ("file", "folder"):
        run = tmp_path / f"run-{case}"
        run.mkdir()
        if case == "file":
            (run / "logs").mkdir()
            (run / "logs" / "launcher.log").symlink_to(victim)
        else:
            (run / "logs").symlink_to(elsewhere)
        marker = tmp_path / f"started-{case}"
        request = LocalRequest(run_dir=run, commands=[[sys.executable, "-c", f"open({str(marker)!r}, 'w')"]],
                               env={}, log_files=[str(run / "logs" / "launcher.log")])
        with pytest.raises(LinkError, match="never reads or writes through a link"):
            LocalBackend().schedule(request)
        assert not marker.exists(), f"{case}: a process was started"
        assert not (run / "launch.json").exists()
    assert victim.read_text() == "precious\n"
    assert list(elsewhere.iterdir()) == []


def test_write_inside_helpers_cover_prep_records(tmp_path) -> None:
    """prep's records go through the same open: a linked records/ of a prep run is refused."""
    from scalelab.core.writes import LinkError
    from scalelab.prep.records import Recorder

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "prep-run"
    run.mkdir()
    (run / "records").symlink_to(elsewhere)
    with pytest.raises(LinkError):
        Recorder(run)
    assert list(elsewhere.iterdir()) == []


# ---- 2. a COMPLETED run is never turned into anything else by a resume that ran no step ------------


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["single", "ddp"])
def test_resume_of_a_completed_run_with_a_corrupt_checkpoint_changes_nothing(engine, completed, tmp_path) -> None:
    """Before: `launch resume` of a COMPLETED run whose checkpoint is damaged recorded it FAILED. Now it is a
    no-op said in one line, exit 0, every file byte-for-byte as it was; with its spec's steps raised (so
    that it would train), the damaged checkpoint is one error line before anything changes."""
    run = _copy(completed(engine), tmp_path / "run")
    ckpt = run / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:3000])
    before = _tree(run)
    proc = launch("resume", str(run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "COMPLETED already" in proc.stdout and "nothing to resume" in proc.stdout, proc.stdout
    assert _tree(run) == before
    assert json.loads((run / "launch.json").read_text())["state"] == "COMPLETED"

    spec = json.loads((run / "spec.json").read_text())
    (run / "spec.json").write_text(json.dumps({**spec, "steps": 6}))
    before = _tree(run)
    err = _one_error_line(launch("resume", str(run), cwd=tmp_path))
    assert f"checkpoint {ckpt}" in err and "truncated" in err, err
    assert _tree(run) == before
    assert json.loads((run / "launch.json").read_text())["state"] == "COMPLETED"


@pytest.mark.slow
def test_a_completed_run_whose_steps_were_raised_resumes_to_them(completed, tmp_path) -> None:
    """The one way a resume changes a COMPLETED run: it runs more steps (spec.json's steps raised)."""
    run = _copy(completed("single"), tmp_path / "run")
    spec = json.loads((run / "spec.json").read_text())
    (run / "spec.json").write_text(json.dumps({**spec, "steps": 6}))
    proc = launch("resume", str(run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (run / "records" / "rank-0.jsonl").read_text().splitlines()
             if '"kind": "step"' in line]
    assert steps[-1] == 6 and json.loads((run / "launch.json").read_text())["state"] == "COMPLETED"


# ---- 3. tracebacks left: each one `launch: error:` line, exit 2 ------------------------------------


def _entry(argv: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """`launch ARGV` in-process through the console entry point: (exit code, stderr, stdout)."""
    from conftest import run_entry

    return run_entry(argv, monkeypatch, capsys)


def _refused(argv, words, monkeypatch, capsys, lines: int = 1) -> str:
    code, err, out = _entry(argv, monkeypatch, capsys)
    assert code == 2, (code, err[-2000:], out[-2000:])
    assert "Traceback" not in err + out, err[-3000:]
    said = [line for line in err.strip().splitlines() if line.startswith("launch: error:")]
    assert len(said) == 1 and len(err.strip().splitlines()) <= lines, err
    for word in words:
        assert word in said[0], (word, said[0])
    return said[0]


BIG = "9" * 5_000_000
DEEP = 100_000


@pytest.mark.parametrize("name, text, words", [
    ("big.yaml", f"seed: {BIG}\n", ["big.yaml", "line 1", "5,000,000 digits", "4,300"]),
    ("big.json", f'{{"model": "nmt-tiny",\n "seed": {BIG}}}', ["big.json", "line 2", "5,000,000 digits"]),
    ("deep.yaml", "model_args: " + "[" * DEEP + "]" * DEEP + "\n", ["deep.yaml", "nested deeper", "flatten"]),
    ("deep.json", '{"model_args": ' + "[" * DEEP + "]" * DEEP + "}", ["deep.json", "nested deeper", "flatten"]),
])
def test_a_spec_beyond_pythons_limits_is_one_line(name, text, words, tmp_path, monkeypatch, capsys) -> None:
    """Before: ValueError (int's 4,300-digit limit) and RecursionError tracebacks. The YAML loader says
    which line and which limit; a shallow, short-numbered spec still loads."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text(text)
    _refused(["--spec", name, "--dry-run", "--runs-dir", "runs"], words, monkeypatch, capsys)
    from scalelab.core.yamltext import load_yaml

    assert load_yaml("a: " + "[" * 50 + "]" * 50 + f"\nb: {'9' * 4300}\n")["b"] == int("9" * 4300)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "0.3", "1"])
def test_plan_confidence_outside_its_range_is_refused_at_the_flag(value, tmp_path, monkeypatch, capsys) -> None:
    """Before: click's FloatRange let NaN through (every comparison with NaN is False) and the planner
    refused it naming the wrong range (0 to 1). Now the flag itself: finite, 0.5 to 0.99."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.csv").write_text("label,workers,throughput\nA,1,100\nA,2,180\nA,4,300\n")
    _refused(["plan", "--from-csv", "good.csv", "--confidence", value], ["--confidence", ">= 0.5 and <= 0.99"],
             monkeypatch, capsys, lines=3)  # click's usage line and hint around it, as for every flag


@pytest.mark.parametrize("bucket, why", [
    ("my bucket", "lowercase letters, digits, dots and hyphens"),
    ("My_Bucket", "lowercase letters, digits, dots and hyphens"),
    ("ab", "3 to 63"),
    ("b" * 64, "3 to 63"),
    ("-bucket", "begin and end with a letter or a digit"),
    ("a..b", "two dots"),
    ("192.168.1.1", "IP address"),
    ("xn--bucket", "xn--"),
    ("bucket-s3alias", "-s3alias"),
])
def test_an_s3_bucket_name_is_checked_before_any_api_call(bucket, why, tmp_path, monkeypatch, capsys) -> None:
    """Before: `--bucket 'my bucket'` reached boto3 (a ParamValidationError traceback). Now S3's naming
    rules are checked where the flag enters; a dry run shows it with no network."""
    monkeypatch.chdir(tmp_path)
    _refused(["--backend", "aws", "--bucket", bucket, "--region", "us-east-1", "--dry-run", "--runs-dir", "runs"],
             ["--bucket", why, "S3's naming rules"], monkeypatch, capsys)
    code, err, out = _entry(["--backend", "aws", "--bucket", "my-team.scalelab-1", "--region", "us-east-1",
                             "--dry-run", "--runs-dir", "runs"], monkeypatch, capsys)
    assert code == 0, err


@pytest.mark.parametrize("command", [["--dry-run"], [], ["sweep", "--workers", "1", "--dry-run"]])
def test_a_name_too_long_for_a_directory_is_refused_where_it_enters(command, tmp_path, monkeypatch, capsys) -> None:
    """Before: a --name of 300 characters was `OSError: [Errno 36] File name too long` when the run directory
    was made. Now the spec refuses it (at most 200: the date and time are added); nothing is created."""
    monkeypatch.chdir(tmp_path)
    argv = [*command, "--name", "a" * 300, "--runs-dir", "runs", "--model", "nmt-tiny", "--data", "task",
            "--steps", "6", "--warmup-steps", "1"]
    _refused(argv, ["--name", "300 characters", "at most 200"], monkeypatch, capsys)
    assert not (tmp_path / "runs").exists()


def test_new_run_dir_refuses_a_name_too_long(tmp_path) -> None:
    """The same limit where any name becomes a directory (a study's title): one line, nothing made."""
    from scalelab.core.errors import RecordError
    from scalelab.core.rundir import new_run_dir

    with pytest.raises(RecordError, match="at most 200"):
        new_run_dir(tmp_path / "runs", "study-" + "t" * 250)
    assert new_run_dir(tmp_path / "runs", "x" * 200).name.startswith("x" * 200 + "-")


# ---- 4. silent acceptances: refused where the value enters, saying why and the limit ----------------


@pytest.mark.parametrize("args, words", [
    (["--lr", "1e30"], ["--lr", "at most 10", "diverges"]),
    (["--lr", "10.5"], ["--lr", "at most 10"]),
    (["--threads", "100000"], ["--threads", "at most 1024"]),
    (["--interop-threads", "5000"], ["--interop-threads", "at most 1024"]),
    (["--model-arg", "num_layers=0"], ["num_layers", "at least 1"]),  # nmt-tiny: a field its family ignores
    (["--model", "rnnlm-tiny", "--model-arg", "num_layers=0"], ["num_layers", "at least 1"]),
    (["--model", "rnnlm-tiny", "--model-arg", "dec_layers=0"], ["dec_layers", "at least 1"]),
])
def test_values_past_their_bounds_are_refused_in_the_spec(args, words, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    _refused([*args, "--dry-run", "--runs-dir", "runs"], words, monkeypatch, capsys)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args", [["--lr", "10"], ["--threads", "1024"], ["--model", "rnnlm-tiny",
                                                                         "--model-arg", "num_layers=1"]])
def test_values_at_their_bounds_are_accepted(args, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    code, err, _ = _entry([*args, "--dry-run", "--runs-dir", "runs"], monkeypatch, capsys)
    assert code == 0, err


def test_the_local_backend_holds_threads_to_its_cores(tmp_path, monkeypatch, capsys) -> None:
    """On the local backend the ranks run here: more than 4 threads per core of this machine is refused
    before any run directory exists (checked by `validate`, so a real run, not a dry run)."""
    from scalelab.core.errors import SpecError
    from scalelab.core.spec import Spec
    from scalelab.launcher.local import LocalBackend

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    _refused(["--threads", "9", "--runs-dir", "runs", "--model", "nmt-tiny", "--data", "task", "--steps", "6",
              "--warmup-steps", "1"], ["--threads 9", "2 cores x 4", "at most 8"], monkeypatch, capsys)
    assert not (tmp_path / "runs").exists()
    LocalBackend().check(Spec.from_dict({"engine": {"name": "single"}, "threads": 8, "interop_threads": 8}).validate())
    with pytest.raises(SpecError, match="--interop-threads 9"):
        LocalBackend().check(Spec.from_dict({"engine": {"name": "single"}, "interop_threads": 9}).validate())


@pytest.mark.parametrize("text, words", [
    ('{\n  "model": "nmt-tiny",\n  "nodes": 1,\n}\n', ["spec.json", "trailing comma at line 3", "closing } at line 4"]),
    ('{"model": "nmt-tiny", "emulate_slowdown": [1,]}', ["trailing comma at line 1", "closing ]"]),
    ("{'model': 'nmt-tiny'}", ["spec.json", "not valid JSON", "line 1, column 2"]),
])
def test_a_json_spec_must_be_json(text, words, tmp_path, monkeypatch, capsys) -> None:
    """Before: YAML read `{"nodes": 1,}` and single quotes without a word. A .json spec is now JSON; the
    same text named .yaml still loads."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.json").write_text(text)
    _refused(["--spec", "spec.json", "--dry-run", "--runs-dir", "runs"], words, monkeypatch, capsys)
    if "nodes" in text:
        (tmp_path / "spec.yaml").write_text(text)
        code, err, _ = _entry(["--spec", "spec.yaml", "--dry-run", "--runs-dir", "runs"], monkeypatch, capsys)
        assert code == 0, err


@pytest.mark.parametrize("value", ["", ",", " , "])
def test_plan_instance_types_naming_no_type_is_refused(value, tmp_path, monkeypatch, capsys) -> None:
    """Before: `--instance-types ''` priced the default types as if the flag were not given."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.csv").write_text("label,workers,throughput\nA,1,100\nA,2,180\nA,4,300\n")
    _refused(["plan", "--from-csv", "good.csv", "--instance-types", value], ["--instance-types", "names no type"],
             monkeypatch, capsys)


def test_submitits_own_link_beside_its_script_is_not_refused(tmp_path):
    """The real Slurm cluster's resume failed on submitit's `.submission_file_*.sh -> JOB_submission.sh`
    (a link to a file beside it, in the run's slurm/ folder); a link out of the folder is still refused."""
    import os

    from scalelab.core.writes import refuse_run_dir_links

    slurm = tmp_path / "slurm"
    slurm.mkdir()
    (slurm / "119_submission.sh").write_text("#!/bin/sh\n")
    os.symlink(slurm / "119_submission.sh", slurm / ".submission_file_abc.sh")
    refuse_run_dir_links(tmp_path)  # no error
    outside = tmp_path.parent / f"{tmp_path.name}-target"
    outside.write_text("x")
    os.symlink(outside, slurm / "planted.sh")
    with pytest.raises(Exception, match="symbolic link"):
        refuse_run_dir_links(tmp_path)


@pytest.mark.parametrize("args, words", [
    (["--model", "nmt-tiny", "--model-arg", "num_layers=2"],
     "--model-arg num_layers: nmt-tiny (family nmt) does not read it (num_layers: give enc_layers and dec_layers)"),
    (["--model", "rnnlm-tiny", "--model-arg", "enc_layers=2"],
     "--model-arg enc_layers: rnnlm-tiny (family rnnlm) does not read it (enc_layers: give num_layers)"),
    (["--model", "sentiment-tiny", "--model-arg", "attention=false"],
     "--model-arg attention: sentiment-tiny (family sentiment) does not read it; its fields:"),
])
def test_a_model_field_its_family_never_reads_is_refused(args, words, tmp_path, monkeypatch, capsys) -> None:
    """`--model-arg num_layers=2` on nmt-small was accepted and the run trained the preset's model unchanged:
    the nmt family reads enc_layers and dec_layers. `launch memory` predicted the unchanged model the same way."""
    monkeypatch.chdir(tmp_path)
    _refused([*args, "--dry-run", "--runs-dir", "runs"], [words], monkeypatch, capsys)
    assert not (tmp_path / "runs").exists()
    _refused(["memory", *args], [words], monkeypatch, capsys)
