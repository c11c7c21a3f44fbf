"""Following a run from any terminal (issue #28): short run ids, `launch logs -f` until the run ends,
progress in `status` and `ls`, and no torchrun traceback after a clean cancel."""

from __future__ import annotations

import re
import time

import pytest

from scalelab.core.errors import ScalelabError
from scalelab.core.records import RecordWriter
from scalelab.core.runids import resolve_run_dir
from scalelab.launcher.backend import quiet_stop_tracebacks
from scalelab.launcher.inventory import follow
from scalelab.launcher.progress import RunWatch, duration
from tests.conftest import launch, only_run_dir

TINY = ["--model", "nmt-tiny", "--data", "task", "--engine", "ddp", "--gpus-per-node", "2", "--warmup-steps", "2",
        "--global-batch", "16"]


# ---- short run ids -------------------------------------------------------------------------------


def _runs(tmp_path, *names):
    root = tmp_path / "runs"
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "spec.json").write_text("{}")
    return root


def test_a_unique_prefix_or_suffix_names_the_run(tmp_path):
    root = _runs(tmp_path, "nmt-tiny-ddp-1x2-20261126-151022", "lstm-single-1x1-20261126-151500")
    assert resolve_run_dir("151022", root) == str(root / "nmt-tiny-ddp-1x2-20261126-151022")
    assert resolve_run_dir("lstm", root) == str(root / "lstm-single-1x1-20261126-151500")
    assert resolve_run_dir("no-such-run", root) == "no-such-run"  # left to the command to say it is missing


def test_an_ambiguous_id_is_refused_naming_the_matches(tmp_path):
    root = _runs(tmp_path, "nmt-a-20261126-1", "nmt-b-20261126-2")
    with pytest.raises(ScalelabError, match="matches 2 directories, newest first.*nmt-b.*nmt-a.*give more of the name"):
        resolve_run_dir("nmt", root)


def test_a_sweeps_layout_is_found_by_its_id_too(tmp_path):
    root = _runs(tmp_path, "sweep-20261126-1")
    (root / "sweep-20261126-1" / "run-2x1-77").mkdir()
    (root / "sweep-20261126-1" / "run-2x1-77" / "spec.json").write_text("{}")
    assert resolve_run_dir("2x1-77", root) == str(root / "sweep-20261126-1" / "run-2x1-77")


# ---- what the follower prints --------------------------------------------------------------------


def test_follow_ends_with_the_runs_last_progress():
    """The loop stops once the run is no longer active and always says where it ended."""
    states = iter([True, True, False])
    lines = iter(["step 1/3", "step 2/3", "step 3/3  ended (steps)"])
    out: list[str] = []
    follow(lambda: "log\n", lambda: next(states), out.append, poll_s=0, progress=lambda: next(lines),
           progress_every_s=3600)
    text = "".join(out)
    assert text.startswith("log\n[progress] step 1/3\n")
    assert "step 2/3" not in text  # within progress_every_s of the first line
    assert text.endswith("[progress] step 3/3  ended (steps)\n")


def test_eta_and_step_of_total_come_from_the_records(tmp_path):
    out = RecordWriter(tmp_path, 0, 1)
    out.write("start", global_batch=8, batch_this_rank=8, steps_per_epoch=10)
    for step in range(1, 5):
        out.write("step", step=step, warmup=step == 1, step_s=0.5, samples=8, words=40, loss=3.0 - step / 10)
    out.close()
    snap = RunWatch(tmp_path, steps=None, epochs=3).poll()  # --epochs 3: the total follows steps_per_epoch
    assert (snap.step, snap.total, round(snap.loss, 3), snap.words_per_s) == (4, 30, 2.6, 80.0)
    assert snap.eta_s == 26 * 0.5 and "step 4/30" in snap.line() and "ETA 13s" in snap.line()
    assert (duration(59), duration(61), duration(3725)) == ("59s", "1m01s", "1h02m")


def test_the_stop_traceback_of_torchrun_is_one_line():
    text = ("W1126 api.py:753] Received 15 death signal, shutting down workers\n"
            "Traceback (most recent call last):\n  File \"<frozen runpy>\", line 198, in _run_module_as_main\n"
            "    main()\n           ^^^^^\n"
            "torch.distributed.elastic.multiprocessing.api.SignalException: Process 6331 got signal: 15\n"
            "after\n")
    quiet = quiet_stop_tracebacks(text)
    assert "Traceback" not in quiet and "SignalException" not in quiet
    assert "torchrun agent (pid 6331) stopped by SIGTERM" in quiet and quiet.endswith("after\n")
    other = "Traceback (most recent call last):\n  File \"x\"\nValueError: a real crash\n"
    assert quiet_stop_tracebacks(other) == other  # a real crash keeps its traceback


# ---- a real detached run, followed from a second "terminal" -------------------------------------


def _cli(*args, cwd, timeout=300):
    return launch(*args, cwd=cwd, env={"COLUMNS": "100"}, timeout=timeout)


@pytest.mark.slow
def test_logs_follow_a_detached_run_to_its_end(tmp_path):
    started = _cli("run", *TINY, "--steps", "30", "--detach", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    run = only_run_dir(tmp_path / "runs")
    short = run.name.rsplit("-", 2)[-1]  # the time stamp: a unique suffix
    followed = _cli("logs", short, "-f", cwd=tmp_path)
    assert followed.returncode == 0, followed.stderr
    assert "[progress] step 30/30" in followed.stdout, followed.stdout
    assert re.search(r"\[end\] .*: COMPLETED", followed.stdout), followed.stdout
    assert re.search(r"[\d,]+ words/s", followed.stdout)
    status = _cli("status", short, cwd=tmp_path)
    assert "COMPLETED" in status.stdout and "step 30/30" in status.stdout, status.stdout
    listed = _cli("ls", cwd=tmp_path)
    assert "30/30" in listed.stdout and run.name in listed.stdout, listed.stdout  # 100 columns: the name on one line
    assert all(len(line) <= 100 for line in listed.stdout.splitlines())


@pytest.mark.slow
def test_a_clean_cancel_leaves_no_torchrun_traceback_in_the_logs(tmp_path):
    env = {"COLUMNS": "100", "SCALELAB_HOLD_AT_STEP": "4"}
    started = launch("run", *TINY, "--steps", "30", "--detach", cwd=tmp_path, env=env)
    assert started.returncode == 0, started.stderr
    run = only_run_dir(tmp_path / "runs")
    status = None
    for _ in range(120):  # until both ranks wait at step 4 (not a timing check: a busy machine is slow)
        status = _cli("status", str(run), cwd=tmp_path)
        if "step 4/30" in status.stdout:
            break
        time.sleep(1)
    assert "RUNNING" in status.stdout and "ETA" in status.stdout, status.stdout
    assert _cli("cancel", run.name[-6:], cwd=tmp_path).returncode == 0
    logs = _cli("logs", str(run), cwd=tmp_path)
    assert "Traceback" not in logs.stdout and "SignalException" not in logs.stdout, logs.stdout
    assert "stopped by SIGTERM" in logs.stdout and "ended (interrupted)" in logs.stdout, logs.stdout
