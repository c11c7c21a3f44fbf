"""How a user's own script (`launch --script`) ends when it does what plain Python allows: it handles the stop
signals itself, cleans up in `finally:` after a cancel, leaves non-daemon threads or multiprocessing children
running when it returns, exits 143 on its own, raises an exception without a message, or records no validation
loss under `--loss-threshold`. Each as `python train.py` (or torchrun) would have it: a cancel is a CANCELLED run
(with the script's own save), a thread still writing finishes, nothing is left running, the script's own exit
status is its error line, and nothing warns of what the runner did.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import ROOT, launch, needs_horovod, only_run_dir, read_jsonl
from scalelab.train.track import HOLD_AT_STEP_ENV
from tests.test_faults import _left

ENGINES = ["single", "ddp", pytest.param("horovod", marks=needs_horovod)]
HOLD = 3  # every rank waits after this step for its stop signal (track.step's test aid): the cancel lands there

# Its own SIGTERM handler (a flag), SIGINT ignored, its own save and a clean exit 0 on the flag; each call of its
# handler is counted in a file of its own. `launch resume` runs it again: it goes on from its saved step.
OWN_HANDLER = """import os, signal, sys, time
from scalelab import track
rank = os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or "0"
stop = False
def on_term(signum, frame):
    global stop
    stop = True
    with open(track.checkpoint_dir / f"handled-{rank}", "a") as calls:
        calls.write(f"{signum}\\n")
signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGINT, signal.SIG_IGN)
assert signal.getsignal(signal.SIGTERM) is on_term
saved = track.checkpoint_dir / f"step-{rank}"
first = int(saved.read_text()) if saved.exists() else 0
print("starts after step", first, flush=True)
for step in range(first + 1, int(sys.argv[1]) + 1):
    time.sleep(0.02)
    track.step(items=1, loss=1.0)
    if stop:
        saved.write_text(str(step))
        sys.exit(0)
"""

# No handler: a cancel ends it by SystemExit(143), and its `finally:` takes a second to save.
CLEANUP = """import os, time
from scalelab import track
rank = os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or "0"
try:
    while True:
        time.sleep(0.02)
        track.step(items=1, loss=1.0)
finally:
    print("saving", flush=True)
    time.sleep(1)
    (track.checkpoint_dir / f"saved-{rank}").write_text("whole")
"""


def world(engine: str) -> str:
    return "1" if engine == "single" else "2"


def records(run: Path, rank: int) -> list[dict]:
    try:
        return read_jsonl(run / "records" / f"rank-{rank}.jsonl")
    except (FileNotFoundError, ValueError):
        return []


def ends(run: Path, rank: int) -> list[dict]:
    return [r for r in records(run, rank) if r.get("event") == "end"]


def start(tmp_path: Path, name: str, body: str, engine: str, *args: str) -> tuple[subprocess.Popen, Path]:
    """`launch run --script NAME` in the background, once every rank holds at step HOLD: (its process, the run)."""
    (tmp_path / name).write_text(body)
    argv = ["--script", name, "--engine", engine, "--gpus-per-node", world(engine), "--device", "cpu", *args]
    proc = subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", *argv], cwd=tmp_path, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", HOLD_AT_STEP_ENV: str(HOLD)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        runs = [p for p in (tmp_path / "runs").glob("*") if p.is_dir()] if (tmp_path / "runs").exists() else []
        if runs and all(any(r.get("step") == HOLD for r in records(runs[0], k)) for k in range(int(world(engine)))):
            return proc, runs[0]
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the ranks did not reach step {HOLD}: {proc.communicate()}")


def nothing_left(run: Path) -> None:
    deadline = time.monotonic() + 60
    while _left(run) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _left(run), _left(run)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.slow
def test_a_cancel_of_a_script_that_handles_sigterm_itself_is_cancelled_and_resumes(engine: str, tmp_path: Path):
    """It was recorded COMPLETED ("every rank recorded its end ... before the cancel reached it"), launch exited 0,
    and `launch resume` refused the run."""
    proc, run = start(tmp_path, "ownsig.py", OWN_HANDLER, engine, "--", "40")
    try:
        cancel = launch("cancel", str(run), cwd=tmp_path)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert cancel.returncode == 0 and "CANCELLED" in cancel.stdout and "COMPLETED" not in cancel.stdout, cancel.stdout
    assert proc.returncode == 1 and "was cancelled" in err, err[-3000:]
    assert json.loads((run / "launch.json").read_text())["state"] == "CANCELLED"
    for rank in range(int(world(engine))):
        (end,) = ends(run, rank)
        assert (end["reason"], end["exit_code"], end["step"]) == ("interrupted", 143, HOLD), end
        assert (run / "checkpoint" / f"step-{rank}").read_text() == str(HOLD)  # the script's own save
        # its handler, once: the cancel's SIGTERM and torchrun's agent's are one stop
        assert (run / "checkpoint" / f"handled-{rank}").read_text() == "15\n"
    nothing_left(run)
    done = launch("resume", str(run), cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run / "launch.json").read_text())["state"] == "COMPLETED"
    assert [r["step"] for r in records(run, 0) if r["kind"] == "step"] == list(range(1, 41))
    nothing_left(run)


@pytest.mark.slow
def test_ctrl_c_of_a_script_that_handles_sigterm_itself_leaves_a_run_to_resume(tmp_path: Path) -> None:
    """Ctrl-C said "`launch resume` continues it" (exit 130), but `launch status` said COMPLETED and resume refused."""
    proc, run = start(tmp_path, "ownsig.py", OWN_HANDLER, "ddp", "--", "40")
    try:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "launch resume" in err, err[-3000:]
    status = launch("status", str(run), cwd=tmp_path)
    assert "CANCELLED" in status.stdout and "COMPLETED" not in status.stdout, status.stdout
    nothing_left(run)
    done = launch("resume", str(run), cwd=tmp_path, timeout=240)
    assert done.returncode == 0 and "starts after step 3" in launch("logs", str(run), cwd=tmp_path).stdout, done.stderr
    nothing_left(run)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_cancel_leaves_the_scripts_finally_block_to_finish(engine: str, tmp_path: Path) -> None:
    """The cancel's SIGTERM and torchrun's agent's reached each rank: the second raised SystemExit(143) inside the
    script's `finally:`, which printed "saving" and never saved."""
    proc, run = start(tmp_path, "cleanup.py", CLEANUP, engine)
    try:
        cancel = launch("cancel", str(run), cwd=tmp_path)
        proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert cancel.returncode == 0 and "CANCELLED" in cancel.stdout, cancel.stdout + cancel.stderr
    for rank in range(int(world(engine))):
        assert (run / "checkpoint" / f"saved-{rank}").read_text() == "whole"
        (end,) = ends(run, rank)
        assert (end["reason"], end["exit_code"]) == ("interrupted", 143), end
    nothing_left(run)


def test_completed_ends_recorded_after_the_cancel_do_not_make_it_completed(tmp_path: Path) -> None:
    """The launcher's side (runner._completed_first): only ends recorded before the cancel was asked for count."""
    from scalelab.core.records import RecordWriter
    from scalelab.core.rundir import start_state
    from scalelab.core.spec import Spec, save_spec
    from scalelab.launcher.runner import _completed_first

    save_spec(Spec(), tmp_path)
    start_state(tmp_path, state="RUNNING", launched=time.time() - 60)
    out = RecordWriter(tmp_path, 0, 1)
    out.write("start", run_id="r", model="x.py")
    out.event("end", step=3, reason="completed", elapsed_s=1.0, exit_code=0, wall_s=1.0)
    out.close()
    ended = read_jsonl(tmp_path / "records" / "rank-0.jsonl")[-1]["time"]
    assert _completed_first(tmp_path, ended + 5).startswith("every rank recorded its end at step 3")
    assert _completed_first(tmp_path, ended - 5) == ""  # ended after the cancel: the script's reply to it


THREAD = """import sys, threading, time
from pathlib import Path
def later():
    time.sleep(2)
    env = __import__('os').environ
    Path(sys.argv[1], f"thread-{env.get('RANK') or env.get('HOROVOD_RANK') or '0'}").write_text("written")
threading.Thread(target=later).start()
"""


@pytest.mark.parametrize("engine", ENGINES)
def test_a_non_daemon_thread_finishes_after_the_script_returns(engine: str, tmp_path: Path) -> None:
    """As `python x.py` and torchrun: the interpreter joins non-daemon threads at exit; the runner killed them."""
    (tmp_path / "thr.py").write_text(THREAD)
    done = launch("--script", "thr.py", "--engine", engine, "--gpus-per-node", world(engine), "--device", "cpu",
                  "--", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.glob("thread-*")) == [f"thread-{r}" for r in range(int(world(engine)))]


def exit_of(body: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """`body`, then the runner's end (`end_as_python_would` with a 2 s limit), in a process of its own."""
    (tmp_path / "end.py").write_text(textwrap.dedent(body) + textwrap.dedent("""
        from scalelab.train import exit_without_teardown
        from scalelab.train.script import end_as_python_would
        end_as_python_would(2)
        exit_without_teardown(0)
        """))
    with open(tmp_path / "err.txt", "w") as err:  # a file, not a pipe: a child left running holds no pipe open
        done = subprocess.run([sys.executable, str(tmp_path / "end.py")], stdout=err, stderr=err, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    return subprocess.CompletedProcess(done.args, done.returncode, "", (tmp_path / "err.txt").read_text())


def test_a_non_daemon_child_that_never_ends_is_ended_after_the_limit(tmp_path: Path) -> None:
    """multiprocessing's exit handler waits for a non-daemon child without a limit; the rank left after its limit
    and the child ran on forever under pid 1, after a COMPLETED run."""
    import psutil

    done = exit_of("""
        import multiprocessing as mp, time
        from pathlib import Path
        def forever():
            while True:
                time.sleep(1)
        if __name__ == "__main__":
            child = mp.Process(target=forever)
            child.start()
            Path("child.pid").write_text(str(child.pid))
        """, tmp_path)
    child = psutil.Process(int((tmp_path / "child.pid").read_text())) if psutil.pid_exists(
        int((tmp_path / "child.pid").read_text())) else None
    try:
        assert done.returncode == 0, done.stderr
        assert "did not finish within 2 s; leaving without them (ended its 1 remaining child process" in done.stderr
        assert child is None or not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, "the child runs on"
    finally:
        if child is not None and child.is_running():
            child.kill()


def test_threads_that_end_are_joined_without_waiting_out_the_limit(tmp_path: Path) -> None:
    """A ThreadPoolExecutor never shut down and a thread ending 0.5 s after the script: every rank waited the whole
    limit (`threading._shutdown` run off the main thread waits for the main thread's own lock) and then said its
    threads, named as none, had not finished."""
    done = exit_of("""
        import threading, time
        from concurrent.futures import ThreadPoolExecutor
        from pathlib import Path
        pool = ThreadPoolExecutor(max_workers=2)
        pool.submit(lambda: Path("pool.txt").write_text("saved")).result()
        threading.Thread(target=lambda: (time.sleep(0.5), Path("late.txt").write_text("done"))).start()
        """, tmp_path)
    assert done.returncode == 0 and "did not finish" not in done.stderr, done.stderr
    assert (tmp_path / "pool.txt").read_text() == "saved" and (tmp_path / "late.txt").read_text() == "done"


def test_a_thread_that_never_ends_is_left_after_the_limit_with_a_warning(tmp_path: Path) -> None:
    done = exit_of("""
        import threading, time
        threading.Thread(target=lambda: time.sleep(600), name="sleeper").start()
        """, tmp_path)
    assert done.returncode == 0 and "the script's threads sleeper did not finish within 2 s" in done.stderr, done.stderr


@pytest.mark.parametrize("engine", ["ddp", pytest.param("horovod", marks=needs_horovod)])
def test_a_script_that_exits_143_itself_is_named_by_its_status(engine: str, tmp_path: Path) -> None:
    """No stop signal reached it: its 143 is the script's own status, not a stop (was torchrun's log dump)."""
    (tmp_path / "e143.py").write_text("import os, sys\nif (os.environ.get('RANK') or os.environ.get('HOROVOD_RANK'))"
                                      " == '1':\n    sys.exit(143)\n")
    done = launch("--script", "e143.py", "--engine", engine, "--gpus-per-node", "2", "--device", "cpu", cwd=tmp_path)
    said = [line for line in done.stderr.splitlines() if line.startswith("launch")]
    assert done.returncode == 1 and len(said) == 1, done.stderr[-3000:]
    assert said[0].startswith("launch: error: rank 1: e143.py exited with status 143 (its output: launch logs"), said
    assert "last lines of its logs" not in done.stderr and "ChildFailedError" not in said[0]


def test_flushing_the_scripts_files_does_not_warn_of_deprecated_torch_names() -> None:
    """`isinstance` on every object asked torch.distributed.reduce_op its class: a FutureWarning on every rank."""
    import warnings

    import torch.distributed  # noqa: F401 - what puts reduce_op among the objects

    from scalelab.train.script import flush_open_files

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        flush_open_files()
    assert not [str(w.message) for w in seen], [str(w.message) for w in seen]


@pytest.mark.parametrize("engine", ["single", "ddp"])
def test_an_exception_without_a_message_has_no_dangling_colon_and_says_where(engine: str, tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 3\nassert x == 4\n")
    done = launch("--script", "a.py", "--engine", engine, "--gpus-per-node", world(engine), "--device", "cpu",
                  cwd=tmp_path)
    said = [line for line in done.stderr.splitlines() if line.startswith("launch")]
    assert done.returncode == 1 and len(said) == 1, done.stderr[-3000:]
    assert "a.py raised AssertionError (at a.py:2; its output: launch logs" in said[0], said


def test_a_loss_threshold_without_validation_losses_says_it_could_not_be_judged(tmp_path: Path) -> None:
    (tmp_path / "noval.py").write_text("from scalelab import track\nfor i in range(3):\n"
                                       "    track.step(items=1, loss=1.0)\n")
    done = launch("--script", "noval.py", "--engine", "single", "--loss-threshold", "1.0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    warned = [line for line in (done.stdout + done.stderr).splitlines() if "could not be judged" in line]
    assert len(warned) == 1 and "track.validation(loss=v)" in warned[0], done.stdout + done.stderr
    run = only_run_dir(tmp_path / "runs")
    assert any(r.get("event") == "threshold_not_reached" for r in records(run, 0))


def test_the_raise_is_placed_in_the_users_code_not_in_a_virtualenv_under_it(tmp_path: Path) -> None:
    """A project's own .venv lies under the script's folder: the error line named site-packages/torch/...:1501."""
    from scalelab.train.script import _raised_at

    lib = tmp_path / ".venv" / "lib" / "python3.11" / "site-packages" / "lib.py"
    namespace: dict = {}
    exec(compile("def fail():\n    raise ValueError('deep')\n", str(lib), "exec"), namespace)
    exec(compile("def main(fail):\n    x = 1\n    fail()\n", str(tmp_path / "train.py"), "exec"), namespace)
    try:
        namespace["main"](namespace["fail"])
    except ValueError as exc:
        assert _raised_at(exc, tmp_path) == "train.py:3"


def test_a_message_given_to_sys_exit_is_in_the_one_line_error(tmp_path: Path) -> None:
    """`sys.exit("fatal: ...")` prints its message and exits 1, as Python does; the launcher's line said only
    "exited with status 1", the reason left in the logs."""
    (tmp_path / "quit.py").write_text("import sys\nsys.exit('fatal: config.yaml is missing')\n")
    proc = launch("--script", "quit.py", "--engine", "single", cwd=tmp_path)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("launch: error:")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr
    assert "quit.py exited with status 1: fatal: config.yaml is missing" in errors[0], errors[0]
