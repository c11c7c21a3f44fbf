"""Issue 34: your own training script as the ranks (`launch --script FILE -- ARGS`), measured through `scalelab.track`.

The examples (examples/own-script/: a plain DDP script and a Horovod script) run on 2 local ranks and
their records are the built-in trainer's own (the report reads them unchanged); a script that records
nothing still gets a run; bad input is one line and exit 2 with nothing left running; a cancel
reaches `track.should_stop()`, `launch resume` continues from the script's checkpoint and a launcher
killed with SIGKILL leaves no process behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, launch, needs_horovod, only_run_dir, read_jsonl, run_entry, steps_of

EXAMPLES = ROOT / "examples" / "own-script"
DDP, HOROVOD = EXAMPLES / "train_ddp.py", EXAMPLES / "train_horovod.py"


def records(run_dir: Path, rank: int, kind: str) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "records" / f"rank-{rank}.jsonl") if r["kind"] == kind]


def events(run_dir: Path, rank: int, name: str) -> list[dict]:
    return [r for r in records(run_dir, rank, "event") if r["event"] == name]


def no_process_of(run_dir: Path) -> list[int]:
    from scalelab.core.procs import rank_processes

    return [p.pid for p in rank_processes(run_dir)]


def check_script_run(run_dir: Path, engine: str, steps: int) -> None:
    """Every rank wrote the trainer's step records: numbered 1..steps, the first --warmup-steps (5) marked."""
    from scalelab.core.records import load_run, record_problem

    for rank in (0, 1):
        start = records(run_dir, rank, "start")[0]
        assert (start["engine"], start["world"], start["model"]) == (engine, 2, Path(start["script"]).name)
        got = steps_of(run_dir, rank)
        assert [r["step"] for r in got] == list(range(1, steps + 1))
        assert [r["warmup"] for r in got] == [True] * 5 + [False] * (steps - 5)
        assert all(r["samples"] == r["words"] == 16 * 16 for r in got)  # 16 sequences of 16 tokens per rank
        assert all(record_problem(r) is None and r["step_s"] > 0 for r in got)
        assert events(run_dir, rank, "end")[0]["exit_code"] == 0
    assert len(load_run(run_dir).steps) == 2 * steps  # the one reader takes them as any run's


@pytest.mark.slow
def test_ddp_script_on_two_local_ranks_is_measured_like_a_built_in_model(tmp_path: Path) -> None:
    proc = launch("--script", str(DDP), "--engine", "ddp", "--gpus-per-node", "2", "--loss-threshold", "1.5",
                  "--", "--steps", "30", "--val-every", "10", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    assert "train_ddp.py" in proc.stdout and "Traceback" not in proc.stderr
    # the threshold: reached at a validation, and the script stopped there (its own `break`)
    thr = events(run_dir, 0, "threshold")
    assert thr and thr[0]["val_loss"] <= 1.5
    assert steps_of(run_dir, 0)[-1]["step"] == thr[0]["step"] < 30
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reached_threshold"] is True and summary["steps_to_threshold"] == thr[0]["step"]
    assert summary["words_per_s"] > 0 and summary["workers"] == 2
    report = launch("report", str(run_dir), "--format", "json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)[0]["time_to_threshold_s"] > 0
    status = launch("status", str(run_dir), cwd=tmp_path)
    assert status.returncode == 0 and "COMPLETED" in status.stdout, status.stdout + status.stderr
    listed = launch("ls", "--runs-dir", str(tmp_path / "runs"), "--format", "json", cwd=tmp_path)
    (row,) = json.loads(listed.stdout)
    assert row["state"] == "COMPLETED" and row["steps"] == thr[0]["step"] and row["words_per_s"] > 0, row
    logs = launch("logs", str(run_dir), cwd=tmp_path)
    assert "validation loss" in logs.stdout  # the script's own output


@needs_horovod
@pytest.mark.slow
def test_horovod_script_runs_under_horovodrun_on_two_ranks(tmp_path: Path) -> None:
    dry = launch("--script", str(HOROVOD), "--engine", "horovod", "--gpus-per-node", "2", "--dry-run", "--",
                 "--steps", "12", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "horovodrun" in dry.stdout and "-m scalelab.train.script" in dry.stdout
    assert f"python {HOROVOD} --steps 12" in dry.stdout  # the dry run says what every rank runs
    proc = launch("--script", str(HOROVOD), "--engine", "horovod", "--gpus-per-node", "2", "--",
                  "--steps", "12", "--val-every", "100", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    check_script_run(only_run_dir(tmp_path / "runs"), "horovod", 12)


@pytest.mark.slow
def test_ddp_script_records_every_rank_and_runs_alone_unchanged(tmp_path: Path) -> None:
    proc = launch("--script", str(DDP), "--engine", "ddp", "--gpus-per-node", "2", "--",
                  "--steps", "12", "--val-every", "100", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    check_script_run(only_run_dir(tmp_path / "runs"), "ddp", 12)
    # the same script outside a launch: every track call a no-op, no run directory, nothing recorded
    alone = subprocess.run([sys.executable, str(DDP), "--steps", "3", "--val-every", "100"], cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert alone.returncode == 0, alone.stderr
    assert len(list((tmp_path / "runs").iterdir())) == 1


@pytest.mark.slow
def test_a_script_that_calls_nothing_still_gets_a_run_and_the_report_says_how_to_measure(tmp_path: Path) -> None:
    (tmp_path / "plain.py").write_text("import sys\nprint('args', sys.argv[1:])\n")
    proc = launch("--script", "plain.py", "--engine", "single", "--", "--lr", "0.1", "two words", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    assert "no step records" in proc.stdout and "track.step(items=N" in proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_codes"] == [0] and summary["wall_s"] >= 0 and summary["steps_measured"] == 0
    logs = launch("logs", str(run_dir), cwd=tmp_path)
    assert "args ['--lr', '0.1', 'two words']" in logs.stdout  # its arguments after `--`, whole; its output in the logs
    report = launch("report", str(run_dir), cwd=tmp_path)  # nothing to tabulate, and nothing wrong: its note, exit 0
    assert report.returncode == 0 and "has no step records" in report.stdout and "track.step" in report.stdout
    assert "Traceback" not in report.stderr
    (facts,) = json.loads(launch("report", str(run_dir), "--format", "json", cwd=tmp_path).stdout)
    assert facts["steps_measured"] == 0 and facts["exit_codes"] == [0]
    cost = launch("cost", str(run_dir), "--rate", "1/gpu-hour", "--format", "json", cwd=tmp_path)
    assert cost.returncode == 0, cost.stderr
    (row,) = json.loads(cost.stdout)
    assert row["billed_seconds"] == 60 and row["dollars"] > 0  # its wall time is billed, the 60 s minimum


WARMUP_ONLY = """import argparse
from scalelab import track
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
for step in range(parser.parse_args().steps):
    track.step(items=8, loss=1.0 / (step + 1))
"""


@pytest.mark.slow
def test_a_script_whose_steps_were_all_warm_up_completes_with_a_note(tmp_path: Path) -> None:
    """The script decides its length (no spec check can refuse it up front, as the trainer's --steps is):
    4 steps, all warm-up, is a completed run saying how to measure it, not an error after the fact."""
    (tmp_path / "s.py").write_text(WARMUP_ONLY)
    proc = launch("--script", "s.py", "--engine", "single", "--", "--steps", "4", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    said = "recorded only 4 step(s), all warm-up"
    assert said in proc.stdout and "run the script longer" in proc.stdout and "--warmup-steps" in proc.stdout
    assert "raise --steps" not in proc.stdout + proc.stderr  # the trainer's fix: a script's --steps is no length
    run_dir = only_run_dir(tmp_path / "runs")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_codes"] == [0] and summary["steps_measured"] == 0 and said in summary["note"]
    report = launch("report", str(run_dir), cwd=tmp_path)  # as for a script that records nothing: the note
    assert report.returncode == 0 and said in " ".join(report.stdout.split()) and "Traceback" not in report.stderr
    longer = launch("--script", "s.py", "--engine", "single", "--warmup-steps", "2", "--", "--steps", "4",
                    cwd=tmp_path)
    assert longer.returncode == 0 and "note:" not in longer.stdout, longer.stdout + longer.stderr


def test_the_trainer_is_still_refused_steps_within_its_warm_up_before_it_starts(tmp_path, monkeypatch,
                                                                                capsys) -> None:
    monkeypatch.chdir(tmp_path)
    code, err, _ = run_entry(["--engine", "single", "--steps", "4", "--runs-dir", str(tmp_path / "runs")],
                             monkeypatch, capsys)
    assert code == 2 and "--steps 4 is not more than --warmup-steps 5" in err, err
    assert not (tmp_path / "runs").exists()


def test_track_outside_a_launch_does_nothing() -> None:
    from scalelab import track

    assert not track.active()
    track.step(items=-5, loss=float("nan"))  # not even checked: the script runs alone, unchanged
    assert track.validation(loss=0.0) is False and track.should_stop() is False
    assert track.checkpoint_dir is None and track.resumed is False
    light = subprocess.run([sys.executable, "-c", "import sys; from scalelab import track; import scalelab.train.script; "
                            "print(sorted({'torch', 'pandas', 'numpy'} & set(sys.modules)))"],
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert light.stdout.strip() == "[]", light.stdout + light.stderr  # the script imports what it uses, we nothing


@pytest.mark.parametrize("argv, said", [
    (["--script", "missing.py"], "--script missing.py: no such file"),
    (["--script", "."], "is a directory or a special file, not a script"),
    (["--script", "ok.py", "--model", "nmt-tiny"], "--model nmt-tiny picks a built-in preset"),
    (["--script", "ok.py", "--module", "ok"], "give --script FILE or --module MODULE, not both"),
    (["run", "--engine", "single", "--", "--lr", "1"], "arguments after `--` go to your --script"),
    (["--module", "no_such_module_here"], "--module no_such_module_here: no module"),
    (["--script", "ok.py", "--engine", "single", "--gpus-per-node", "2"], "engine 'single' runs one worker"),
    (["--script", "binary.py"], "is not a text file"),
    (["--script", "", "--engine", "single"], "--script is empty"),  # an unset $SCRIPT: not the built-in model
    (["--module", " ", "--engine", "single"], "--module is empty"),
    (["sweep", "--script", "", "--workers", "1,2"], "--script is empty"),
    (["--script", "ok.py", "--engine", "single", "--lr", "0.5"], "--lr 0.5 is an option of the built-in trainer"),
    (["sweep", "--script", "ok.py", "--workers", "1,2", "--val-every", "5"], "--val-every 5 is an option of the"),
])
def test_bad_input_is_one_line_before_anything_starts(argv, said, tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "ok.py").write_text("print('hi')\n")
    (tmp_path / "binary.py").write_bytes(b"\0\1\2")
    monkeypatch.chdir(tmp_path)
    code, err, _ = run_entry([*argv, "--runs-dir", str(tmp_path / "runs")], monkeypatch, capsys)
    assert code == 2 and said in err, err
    assert len([line for line in err.splitlines() if "error" in line]) == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("body, said, engine", [
    ("import sys\nsys.exit(3)\n", "bad.py exited with status 3", "ddp"),
    ("raise ValueError('boom')\n", "bad.py raised ValueError: boom", "ddp"),
    ("from scalelab import track\ntrack.step(items=-1)\n", "track.step(items=-1): items must be a finite number >= 0",
     "single"),
    ("from scalelab import track\ntrack.step(items=4, loss=float('nan'))\n", "track.step(loss=nan): loss must be a finite",
     "single"),
])
def test_a_script_that_fails_at_once_is_one_line_and_leaves_nothing_running(body, said, engine, tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(body)
    ranks = "2" if engine == "ddp" else "1"
    proc = launch("--script", "bad.py", "--engine", engine, "--gpus-per-node", ranks, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr  # the run failed (2 is input refused before anything starts)
    # the progress line ("[RUN] starting ranks: 2 of 2 up") may come first; the error is one line
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("[")]
    # the script's own traceback is its ranks' output, shown tagged (launcher/echo.py); launch's own: none
    assert len(lines) == 1 and said in lines[0] and "Traceback" not in lines[0], proc.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    assert json.loads((run_dir / "launch.json").read_text())["state"] == "FAILED"
    assert no_process_of(run_dir) == []


AT_EXIT = """import atexit, multiprocessing as mp, os, sys, time


def forever():
    while True:
        time.sleep(1)


if __name__ == "__main__":
    if sys.argv[1] == "horovod":
        import horovod.torch as hvd
        import torch
        hvd.init()
        hvd.allreduce(torch.ones(1))  # Horovod's own atexit shutdown then runs with its peer's
    r = os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0"))
    os.makedirs("outputs", exist_ok=True)
    log = open(f"outputs/metrics-{r}.csv", "w")  # never closed, as many scripts leave theirs
    log.write("step,loss\\n1,0.5\\n")
    atexit.register(lambda: open(f"outputs/atexit-{r}.txt", "w").write("summary\\n"))
    child = mp.Process(target=forever, daemon=True)
    child.start()
    open(f"outputs/child-{r}.pid", "w").write(str(child.pid))
"""


@pytest.mark.parametrize("engine", ["ddp", pytest.param("horovod", marks=needs_horovod)])
@pytest.mark.slow
def test_a_script_ends_as_python_does_its_atexit_handlers_open_files_and_daemon_children(engine, tmp_path) -> None:
    """The ranks leave with os._exit (no interpreter teardown under Gloo's or Horovod's threads), which also
    skipped what Python does at exit: a script's unclosed metrics file came out empty, its atexit handler
    never ran (logging.shutdown, wandb, TensorBoard use one) and its daemon process outlived a COMPLETED run.
    torchrun's ranks do all three; so do ours now, Horovod's own atexit shutdown included."""
    (tmp_path / "ends.py").write_text(AT_EXIT)
    proc = launch("--script", "ends.py", "--engine", engine, "--gpus-per-node", "2", "--", engine, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "outputs"
    for rank in (0, 1):
        assert (out / f"metrics-{rank}.csv").read_text() == "step,loss\n1,0.5\n"
        assert (out / f"atexit-{rank}.txt").read_text() == "summary\n"
        child = int((out / f"child-{rank}.pid").read_text())
        with pytest.raises(ProcessLookupError):  # multiprocessing's own exit handler ended it
            os.kill(child, 0)
    assert no_process_of(only_run_dir(tmp_path / "runs")) == []


def wait_for_steps(run_dir: Path, n: int, timeout: float = 90) -> None:
    """Until every rank of the run has recorded `n` steps (all its launches together)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "spec.json").exists():  # written by the launcher just after the run directory
            spec = json.loads((run_dir / "spec.json").read_text())
            paths = [run_dir / "records" / f"rank-{r}.jsonl" for r in range(spec["nodes"] * spec["gpus_per_node"])]
            if all(p.exists() and p.read_text().count('"kind": "step"') >= n for p in paths):
                return
        time.sleep(0.3)
    raise AssertionError(f"{run_dir} did not reach step {n}")


FAULT_ENGINES = [("single", DDP, "1"), ("ddp", DDP, "2"), pytest.param("horovod", HOROVOD, "2", marks=needs_horovod)]


@pytest.mark.slow
@pytest.mark.parametrize("engine, script, ranks", FAULT_ENGINES)
def test_cancel_reaches_should_stop_and_resume_continues_from_the_scripts_checkpoint(engine, script, ranks,
                                                                                      tmp_path) -> None:
    steps = "200000"
    proc = launch("--script", str(script), "--engine", engine, "--gpus-per-node", ranks, "--detach", "--",
                  "--steps", steps, "--val-every", "1000000", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    wait_for_steps(run_dir, 20)
    cancel = launch("cancel", str(run_dir), cwd=tmp_path)
    assert cancel.returncode == 0 and "none left" in cancel.stdout, cancel.stdout + cancel.stderr
    # should_stop() saw it: the script saved and left. A rank that left through the script's stop agreement before
    # its own SIGTERM came records no signal (train/script.py: stopped_peer), so any rank's record may carry it
    stopped = [e for r in range(int(ranks)) for e in events(run_dir, r, "interrupted")]
    assert stopped and signal.SIGTERM in [e["signal"] for e in stopped], stopped
    assert (run_dir / "checkpoint" / "model.pt").is_file()
    saved = stopped[0]["step"]
    resumed = launch("resume", str(run_dir), "--detach", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    wait_for_steps(run_dir, saved + 10)
    launch("cancel", str(run_dir), cwd=tmp_path)
    assert events(run_dir, 0, "resume")[0]["step"] == saved
    after = [r["step"] for r in steps_of(run_dir, 0)]
    assert after[saved:saved + 3] == [saved + 1, saved + 2, saved + 3]  # numbering goes on from the checkpoint
    starts = records(run_dir, 0, "start")
    assert starts[-1]["resumed_from_step"] == saved
    # the script itself read its checkpoint: the loss goes on from where it was, not from an untrained model
    first_loss = steps_of(run_dir, 0)[0]["loss"]
    assert steps_of(run_dir, 0)[saved]["loss"] < first_loss / 2
    assert no_process_of(run_dir) == []


@pytest.mark.slow
@pytest.mark.parametrize("engine, script, ranks", FAULT_ENGINES)
def test_sigkill_of_the_launcher_leaves_nothing_running(engine, script, ranks, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    launcher = subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", "--script", str(script), "--engine",
                                 engine, "--gpus-per-node", ranks, "--", "--steps", "200000", "--val-every", "1000000"],
                                cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        run_dir = only_run_dir(tmp_path / "runs")
        wait_for_steps(run_dir, 10)
        assert no_process_of(run_dir)
    finally:
        launcher.kill()
        launcher.wait()
    deadline = time.monotonic() + 40
    while no_process_of(run_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert no_process_of(run_dir) == []
    # the ranks were asked to stop (should_stop: the one that noticed first; the other follows its agreement)
    assert events(run_dir, 0, "interrupted") or (ranks == "2" and events(run_dir, 1, "interrupted"))


@pytest.mark.slow
def test_sweep_report_and_plan_of_a_script(tmp_path: Path) -> None:
    """The README's walk: two sweeps of the DDP script (global batch 32 and 64) over 1 and 2 workers to a loss
    threshold, `launch report` with dollars at a rate, `launch plan` on those runs."""
    for batch in ("32", "64"):
        proc = launch("sweep", "--script", str(DDP), "--engine", "ddp", "--workers", "1,2", "--loss-threshold", "1.0",
                      "--", "--steps", "60", "--val-every", "5", "--global-batch", batch, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    sweeps = sorted(str(p) for p in (tmp_path / "runs").glob("sweep-train_ddp.py-*"))
    assert len(sweeps) == 2
    report = launch("report", sweeps[0], "--rate", "0.5/gpu-hour", "--format", "json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    rows = json.loads(report.stdout)
    assert [r["workers"] for r in rows] == [1, 2] and all(r["reached_threshold"] for r in rows)
    assert rows[1]["speedup"] > 0 and rows[1]["efficiency"] > 0 and all(r["global_batch"] == 32 * 16 for r in rows)
    assert all(r["dollars"] > 0 and r["dollars_to_threshold"] > 0 for r in rows), rows
    plan = launch("plan", *sweeps, "--measured-on", "g5.xlarge", "--instance-types", "g5.xlarge", "--deadline-h", "1",
                  "--format", "json", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    picked = [r for r in json.loads(plan.stdout) if r.get("table") == "candidates" and r.get("recommendation")]
    assert picked and picked[0]["steps_to_threshold"] > 0 and picked[0]["dollars"] > 0


def test_a_module_runs_as_python_dash_m_from_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "helper.py").write_text("ITEMS = 7\n")
    (tmp_path / "mypkg" / "train.py").write_text(
        "import sys\nfrom scalelab import track\nfrom mypkg.helper import ITEMS\n"
        "assert __name__ == '__main__'\n"
        "for i in range(int(sys.argv[sys.argv.index('--n') + 1])):\n"
        "    track.step(items=ITEMS, loss=1.0 / (i + 1))\n")
    proc = launch("--module", "mypkg.train", "--engine", "single", "--warmup-steps", "2", "--", "--n", "8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    start = records(run_dir, 0, "start")[0]
    assert (start["module"], start["model"], start["script_args"]) == ("mypkg.train", "mypkg.train", ["--n", "8"])
    got = steps_of(run_dir)
    assert [r["samples"] for r in got] == [7] * 8 and [r["warmup"] for r in got] == [True] * 2 + [False] * 6
    assert json.loads((run_dir / "summary.json").read_text())["steps_measured"] == 6


@pytest.mark.slow
def test_a_script_that_never_asks_is_stopped_by_the_signal_and_resumed_knows_it(tmp_path: Path) -> None:
    (tmp_path / "forever.py").write_text(
        "import time\nfrom scalelab import track\n"
        "print('resumed', track.resumed, flush=True)\n"
        "(track.checkpoint_dir / 'state.txt').write_text('saved')\n"
        "while True:\n    track.step(items=1)\n    time.sleep(0.02)\n")
    proc = launch("--script", "forever.py", "--engine", "single", "--detach", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    wait_for_steps(run_dir, 5)
    cancel = launch("cancel", str(run_dir), cwd=tmp_path)
    assert cancel.returncode == 0 and "none left" in cancel.stdout and "SIGKILL" not in cancel.stdout, cancel.stdout
    (end,) = events(run_dir, 0, "end")
    assert (end["reason"], end["exit_code"]) == ("interrupted", 143)  # ended by the signal, at once
    first = len(steps_of(run_dir))
    assert launch("resume", str(run_dir), "--detach", cwd=tmp_path).returncode == 0
    wait_for_steps(run_dir, first + 5)
    launch("cancel", str(run_dir), cwd=tmp_path)
    said = launch("logs", str(run_dir), cwd=tmp_path).stdout
    assert "resumed False" in said and "resumed True" in said
    assert [r["step"] for r in steps_of(run_dir)][first:first + 2] == [first + 1, first + 2]
    assert no_process_of(run_dir) == []


def test_track_records_the_trainers_step_records_in_process(tmp_path: Path, monkeypatch) -> None:
    """The API against the one writer, in this process (what the runner activates): step numbering, warm-up (the
    first step of a launch, timed from the script's start, always), training time, the threshold, the stop."""
    import signal as sig

    from scalelab.core.records import RecordWriter, read_records, record_problem
    from scalelab.core.spec import Spec, save_spec
    from scalelab.train import track

    monkeypatch.setattr(track, "_state", track._State())
    monkeypatch.setattr(track, "checkpoint_dir", None)
    monkeypatch.setattr(track, "resumed", False)
    save_spec(Spec(), tmp_path)
    writer = RecordWriter(tmp_path, 0, 1)
    track._activate(writer, tmp_path, warmup_steps=0, loss_threshold=0.5, last_step=0, elapsed=0.0,
                    started=time.perf_counter() - 3.0)  # the script started 3 s ago (its imports)
    assert track.active() and track.checkpoint_dir == tmp_path / "checkpoint" and track.resumed is False
    for i in range(3):
        track.step(items=8, loss=1.0 - 0.1 * i)
    assert track.validation(loss=0.7) is False and track.validation(loss=0.4) is True
    assert track.validation(loss=0.9) is True  # reached stays reached
    with pytest.raises(track.TrackError, match=r"items must be a finite number >= 0"):
        track.step(items=-1)
    with pytest.raises(track.TrackError, match=r"items must be a whole number"):
        track.step(items=2.5)
    with pytest.raises(track.TrackError, match=r"loss must be a finite number"):
        track.validation(loss=float("inf"))
    track.step(items=8, loss=-0.25, lr=0.01)  # a negative loss is a loss (log-likelihoods); the lr is optional
    assert track.should_stop() is False
    assert track._stopped(sig.SIGTERM) is True and track.should_stop() is True  # asked before: left to the script
    writer.close()
    recs = read_records(tmp_path / "records" / "rank-0.jsonl", [])
    steps = [r for r in recs if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and [r["warmup"] for r in steps] == [True, False, False, False]
    assert steps[0]["step_s"] >= 3.0 and all(r["step_s"] < 3.0 for r in steps[1:])
    assert all(record_problem(r) is None and r["samples"] == r["words"] == 8 for r in steps)
    assert [r.get("lr") for r in steps] == [None, None, None, 0.01]
    (thr,) = [r for r in recs if r.get("event") == "threshold"]
    assert thr["step"] == 3 and thr["val_loss"] == 0.4 and thr["elapsed_s"] < 3.0  # the setup is not training time


def test_the_hold_aid_keeps_a_fast_script_at_its_step_until_a_stop_signal(tmp_path: Path, monkeypatch) -> None:
    """SCALELAB_HOLD_AT_STEP (the trainer's test aid) in track.step: a script whose steps take milliseconds waits
    after step 2 until a signal lands (here from a timer, 1 s on), so a test's signal falls on a known step; the
    wait is not counted in the next step's time; another rank's hold (2:1) does not hold rank 0."""
    import signal as sig
    import threading

    from scalelab.core.records import RecordWriter, read_records
    from scalelab.core.spec import Spec, save_spec
    from scalelab.train import track

    save_spec(Spec(), tmp_path)
    for hold, held in (("2", True), ("2:1", False)):
        monkeypatch.setattr(track, "_state", track._State())
        monkeypatch.setenv(track.HOLD_AT_STEP_ENV, hold)
        monkeypatch.setenv("RANK", "0")
        writer = RecordWriter(tmp_path, 0, 1)
        track._activate(writer, tmp_path, warmup_steps=0, loss_threshold=None, last_step=0, elapsed=0.0,
                        started=time.perf_counter())
        track.should_stop()
        timer = threading.Timer(1.0, track._stopped, args=(sig.SIGUSR1,))
        began = time.perf_counter()
        if held:
            timer.start()
        track.step(items=4)
        track.step(items=4)
        waited = time.perf_counter() - began
        track.step(items=4)
        writer.close()
        if held:
            timer.join()
            steps = [r for r in read_records(tmp_path / "records" / "rank-0.jsonl", []) if r["kind"] == "step"]
            assert waited >= 1.0 and steps[-1]["step_s"] < 0.9  # held; the hold is not step 3's time
            assert track.should_stop() is True
        else:
            assert waited < 0.9 and track.should_stop() is False  # not this rank's hold: no wait


def test_a_config_files_default_model_is_no_conflict_but_the_flag_is(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "ok.py").write_text("print('hi')\n")
    (tmp_path / "config.yaml").write_text("model: nmt-small\n")
    monkeypatch.setenv("SCALELAB_CONFIG", str(tmp_path / "config.yaml"))
    monkeypatch.chdir(tmp_path)
    code, err, out = run_entry(["--script", "ok.py", "--engine", "single", "--dry-run"], monkeypatch, capsys)
    assert code == 0 and "-m scalelab.train.script" in out, err
    code, err, _ = run_entry(["--script", "ok.py", "--model", "nmt-tiny", "--dry-run"], monkeypatch, capsys)
    assert code == 2 and "--model nmt-tiny picks a built-in preset" in err


TRAINER_FLAGS = ["--lr", "0.5", "--optimizer", "sgd", "--global-batch", "64", "--model-arg", "hidden_size=256",
                 "--precision", "bf16", "--data", "task", "--val-every", "5", "--checkpoint-every", "2"]


def test_the_trainers_options_with_a_script_are_refused_naming_each(tmp_path, monkeypatch, capsys) -> None:
    """They reached no script (its model, data and optimizer are its own): refused, not silently ignored; what
    does apply to a script (layout, engine, progress total, warm-up, threads, device, name) is taken."""
    (tmp_path / "ok.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    code, err, _ = run_entry(["--script", "ok.py", "--engine", "single", *TRAINER_FLAGS, "--dry-run"], monkeypatch,
                             capsys)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for shown in ("--lr 0.5", "--optimizer sgd", "--global-batch 64", "--model-arg hidden_size=256",
                  "--precision bf16", "--data task", "--val-every 5", "--checkpoint-every 2"):
        assert shown in err, (shown, err)
    assert "are options of the built-in trainer" in err and "after `--`" in err
    code, err, out = run_entry(["--script", "ok.py", "--engine", "ddp", "--gpus-per-node", "2", "--steps", "50",
                                "--warmup-steps", "2", "--threads", "1", "--device", "cpu", "--name", "mine",
                                "--loss-threshold", "1", "--lr", "0.001", "--dry-run", "--", "--lr", "0.5"],
                               monkeypatch, capsys)  # --lr at its default: nothing given that could be lost
    assert code == 0 and "ok.py --lr 0.5" in out, err


def test_a_config_files_trainer_default_is_no_conflict_but_a_spec_files_value_is(tmp_path, monkeypatch,
                                                                                  capsys) -> None:
    (tmp_path / "ok.py").write_text("print('hi')\n")
    (tmp_path / "config.yaml").write_text("precision: bf16\nlr: 0.01\nval-every: 3\n")  # for the built-in models
    (tmp_path / "script.yaml").write_text("script: ok.py\nengine: single\noptimizer: sgd\n")
    monkeypatch.setenv("SCALELAB_CONFIG", str(tmp_path / "config.yaml"))
    monkeypatch.chdir(tmp_path)
    code, err, out = run_entry(["--script", "ok.py", "--engine", "single", "--dry-run"], monkeypatch, capsys)
    assert code == 0 and "-m scalelab.train.script" in out, err
    code, err, _ = run_entry(["--script", "ok.py", "--engine", "single", "--lr", "0.2", "--dry-run"], monkeypatch,
                             capsys)
    assert code == 2 and "--lr 0.2 is an option of the built-in trainer" in err, err
    code, err, _ = run_entry(["--spec", "script.yaml", "--dry-run"], monkeypatch, capsys)
    assert code == 2 and "--optimizer sgd is an option of the built-in trainer" in err, err


def test_a_spec_file_naming_a_model_and_a_script_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "ok.py").write_text("print('hi')\n")
    (tmp_path / "both.yaml").write_text("model: nmt-small\nscript: ok.py\nengine: single\n")
    (tmp_path / "script.yaml").write_text("script: ok.py\nengine: single\n")
    monkeypatch.chdir(tmp_path)
    code, err, _ = run_entry(["--spec", "both.yaml", "--dry-run"], monkeypatch, capsys)
    assert code == 2 and "names model nmt-small, a built-in preset, and your own code" in err, err
    code, err, out = run_entry(["--spec", "script.yaml", "--dry-run"], monkeypatch, capsys)
    assert code == 0 and f"python {tmp_path / 'ok.py'}" in out, err  # a script from a spec file, resolved
