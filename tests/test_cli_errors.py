"""Bad input through the real `launch` command: one clear message, exit 2 (1 where the ranks found it: the run started and failed), no traceback, nothing left.

Each case is something a user actually types wrong; the assertions check the message names the
problem and the fix, the exit code is non-zero, no Python traceback leaks, and no run directory full
of half-started processes is left behind.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import launch, only_run_dir, read_jsonl


def _assert_clean_error(proc: subprocess.CompletedProcess, *needles: str, code: int = 2) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, f"{needle!r} not in:\n{proc.stderr}"


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--nodes", "0"], ["nodes must be a positive whole number, got 0 (from --nodes)"]),
        (["--gpus-per-node", "-1"], ["gpus_per_node must be a positive whole number, got -1 (from --gpus-per-node)"]),
        (["--lr", "nan"], ["lr: expected float (a finite number), got nan (from --lr)"]),
        (["--cycle-time-ms", "inf"], ["engine.cycle_time_ms: expected float (a finite number), got inf (from --cycle-time-ms)"]),
        (["--emulate-slowdown", "1,x"], ["emulate_slowdown: expected a list of float", "(from --emulate-slowdown)"]),
        (["--global-batch", "16", "--batch-per-worker", "4"], ["--global-batch", "--batch-per-worker", "both given"]),
        (["--model-arg", "hidden_size=big"], ["model field hidden_size: expected int (a whole number), got 'big' (from --model-arg)"]),
        (["--backend-opt", "master_port=x"], ["local backend option master_port: expected int", "(from --backend-opt)"]),
        (["--backend", "slurm", "--cpus-per-task", "0", "--dry-run"],
         ["slurm backend option cpus_per_task (--cpus-per-task) must be >= 1, got 0 (from --cpus-per-task)"]),
        (["--nodes", "two"], ["'two' is not a valid integer"]),
        (["--model", "transformer"], ["unknown model preset 'transformer'", "nmt-tiny"]),
        (["--engine", "mpi"], ["'mpi' is not one of", "horovod"]),
        (["--gpus-pernode", "2"], ["No such option", "--gpus-pernode", "'--gpus-per-node'", "Usage: launch run"]),
        (["--global-batch", "15", "--gpus-per-node", "2"], ["does not split evenly across 2 workers"]),
        (["--model-arg", "hiden_size=3"], ["hiden_size", "hidden_size"]),
        (["--backend-opt", "gpus=3"], ["unknown local backend option(s): gpus (from --backend-opt)", "master_port (default 0)"]),
        (["--data", "text", "--train-src", "nope.src", "--train-tgt", "nope.tgt", "--engine", "single"],
         ["nope.src"]),
        (["--spec", "missing.yaml"], ["spec file not found: missing.yaml"]),
    ],
)
def test_bad_input_is_one_clear_message(tmp_path, args, needles):
    proc = launch("--runs-dir", str(tmp_path / "runs"), "--steps", "2", *args, cwd=tmp_path)
    _assert_clean_error(proc, *needles)


def test_missing_data_file_fails_before_any_rank_starts(tmp_path):
    proc = launch("--runs-dir", str(tmp_path / "runs"), "--data", "text", "--train-src", "absent.txt",
                  "--model", "rnnlm-tiny", "--engine", "ddp", "--gpus-per-node", "2", cwd=tmp_path)
    _assert_clean_error(proc, "data file not found: absent.txt", "--train-src")
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_corrupt_record_line_is_named(tmp_path):
    proc = launch("--runs-dir", str(tmp_path / "runs"), "--engine", "single", "--steps", "3", "--warmup-steps", "1",
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = only_run_dir(tmp_path / "runs")
    rec = run / "records" / "rank-0.jsonl"
    lines = rec.read_text().splitlines()
    lines.insert(2, '{"kind": "step", "step": 2, oops')
    rec.write_text("\n".join(lines) + "\n")
    proc = launch("report", str(run), cwd=tmp_path)
    _assert_clean_error(proc, "corrupt record at", "rank-0.jsonl:3")


@pytest.mark.slow
def test_report_on_a_directory_that_is_not_a_run(tmp_path):
    (tmp_path / "empty").mkdir()
    _assert_clean_error(launch("report", str(tmp_path / "empty"), cwd=tmp_path), "is not a run directory (no spec.json), a sweep directory", "or a study directory")
    _assert_clean_error(launch("report", str(tmp_path / "nothing"), cwd=tmp_path), "not found")


@pytest.mark.slow
def test_horovod_not_built_with_pytorch(tmp_path):
    """A `horovod` package without working PyTorch support (what a plain `pip install horovod` without
    torch at build time gives): the launcher says so and how to fix it, before starting any rank."""
    fake = tmp_path / "fake" / "horovod"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "torch.py").write_text("raise ImportError('horovod was built without PyTorch support')\n")
    proc = launch("--runs-dir", str(tmp_path / "runs"), "--engine", "horovod", "--gpus-per-node", "2",
                  cwd=tmp_path, env={"PYTHONPATH": f"{tmp_path / 'fake'}:{__import__('tests.conftest').conftest.ROOT}"})
    _assert_clean_error(proc, "Horovod with PyTorch support is not installed", "scripts/build-horovod.sh")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_dry_run_prints_commands_and_runs_nothing(tmp_path):
    proc = launch("--runs-dir", str(tmp_path / "runs"), "--engine", "ddp", "--nodes", "2", "--gpus-per-node", "2",
                  "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count("scalelab.core.torchrun") == 2  # one torchrun agent per emulated node
    assert "--nnodes=2" in out and "--node-rank=1" in out and "--nproc-per-node=2" in out
    assert "OMP_NUM_THREADS=" in out and "-m scalelab.train" in out
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_help_explains(tmp_path):
    proc = launch("--help", cwd=tmp_path)
    assert proc.returncode == 0 and "sweep" in proc.stdout and "report" in proc.stdout
    proc = launch("run", "--help", cwd=tmp_path)
    assert "--gpus-per-node" in proc.stdout and "weak scaling" in proc.stdout.lower()


#: Good lines past the launcher's own check of a sentiment file's labels (its first MiB, core/datafiles.py): the
#: mistake after them is one only the ranks find, as in a file too large to check up front.
PAST_THE_CHECK = "1\tgood film\n" * 90_000  # 1,080,000 bytes
BAD_LINE = "labelled.txt:90001"


@pytest.mark.slow
def test_error_inside_the_ranks_reaches_the_user_as_one_line(tmp_path):
    """A malformed data file is only found when the ranks read it: its message, not torchrun's
    traceback, is what the user sees; the run is marked failed and no rank process is left."""
    bad = tmp_path / "labelled.txt"
    bad.write_text(PAST_THE_CHECK + "no tab on this line\n" + "0\tbad film\n" * 20)
    proc = launch("--runs-dir", str(tmp_path / "runs"), "--model", "sentiment-tiny", "--data", "text",
                  "--train-src", str(bad), "--engine", "ddp", "--gpus-per-node", "2", "--steps", "2",
                  "--warmup-steps", "1", cwd=tmp_path)
    _assert_clean_error(proc, BAD_LINE, code=1)  # found by the ranks: the run failed
    assert "ChildFailedError" not in proc.stderr
    run = only_run_dir(tmp_path / "runs")
    info = json.loads((run / "launch.json").read_text())
    assert info["state"] == "FAILED"
    for pid in info["pids"]:
        assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0
    errors = [r for rank in (0, 1) for r in read_jsonl(run / "records" / f"rank-{rank}.jsonl") if r["kind"] == "error"]
    # Every rank reads the file, so at least one says where it is wrong. A rank whose peer exits on that error
    # while it is still in a collective (Gloo's handshake, presumably) records a `peer_lost` error instead, which
    # the launcher's line leaves out. (CI, 2026-12-02: rank 1's record, 43 ms after rank 0's, lacked the file's
    # message; the old assertion did not print it, these do.)
    assert any(BAD_LINE in e["message"] for e in errors), errors
    assert all(e["rank"] in (0, 1) and e["world"] == 2 and (BAD_LINE in e["message"] or e.get("peer_lost"))
               for e in errors), errors


@pytest.mark.slow
def test_the_error_line_comes_from_the_error_records_not_the_logs(tmp_path):
    """The launcher's message is built from the ranks' `error` records: with every "scalelab: error:"
    line removed from the logs it is the same; without error records it falls back to the logs' end."""
    from scalelab.launcher.backend import RunStatus
    from scalelab.launcher.local import LocalBackend
    from scalelab.launcher.runner import failure

    bad = tmp_path / "labelled.txt"
    bad.write_text(PAST_THE_CHECK + "no tab on this line\n" + "1\tgood film\n" * 5)
    proc = launch("--runs-dir", str(tmp_path / "runs"), "--model", "sentiment-tiny", "--data", "text",
                  "--train-src", str(bad), "--engine", "single", "--steps", "2", "--warmup-steps", "1", cwd=tmp_path)
    _assert_clean_error(proc, BAD_LINE, code=1)  # found by the ranks: the run failed
    run = only_run_dir(tmp_path / "runs")
    logs = [Path(f) for f in json.loads((run / "launch.json").read_text())["log_files"]]
    for log in logs:
        log.write_text("".join(line for line in log.read_text().splitlines(True) if "scalelab: error:" not in line)
                       + "last words of the rank\n")
    status = RunStatus("FAILED", "exit codes [2]")
    message = str(failure(LocalBackend(), run, status))
    assert BAD_LINE in message and "last lines of its logs" not in message
    records = run / "records" / "rank-0.jsonl"
    records.write_text("".join(line for line in records.read_text().splitlines(True) if '"error"' not in line))
    message = str(failure(LocalBackend(), run, status))
    assert "labelled.txt" not in message and "last lines of its logs" in message and "last words of the rank" in message


def test_a_flag_click_cannot_read_has_the_one_error_prefix(tmp_path):
    """click said `Error: ...` where every other error says `launch: error: ...`."""
    proc = launch("--runs-dir", str(tmp_path / "runs"), "--nodes", "two", cwd=tmp_path)
    _assert_clean_error(proc, "launch: error: ", "'two' is not a valid integer", "Usage: launch run", "--help")
    assert not any(line.startswith("Error:") for line in proc.stderr.splitlines()), proc.stderr


def test_launch_alone_prints_its_help_once(tmp_path):
    """`launch` with nothing printed the usage line, then `launch: error: Usage: ...` with the whole help."""
    proc = launch(cwd=tmp_path)
    text = proc.stdout + proc.stderr
    assert text.count("Usage: launch") == 1, text
    assert "launch: error:" not in text and "Traceback" not in text
    assert "Commands:" in text and "sweep" in text  # the help itself, not only a usage line
    assert proc.returncode in (0, 2)  # click >= 8.2 exits 2 (no command given), older clicks 0
