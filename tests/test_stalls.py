"""A hung rank (issue: fault-injection review, a hung rank never detected): the progress line and `launch status`
say that the run has made no step for so long, since which step and where each rank last was, with no stale
ETA; the launcher ends it after --stall-timeout-min as FAILED with one line, nothing left running. Judged from
the records (their `time` fields) alone.

The runs hang one rank (an own script that sleeps on rank 1, the built-in trainer's SCALELAB_HANG_AT_STEP) while
the others wait in its collective; a stall timeout of 0.1 min (6 s) ends them. Their stop grace is 3 s: the ranks
stuck in a collective never take SIGTERM's path, SIGKILL ends them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, launch, needs_horovod, on_cpu_where_gpus_are_short
from scalelab.core.procs import run_processes
from scalelab.core.spec import STALL_TIMEOUT_MIN, Spec
from scalelab.launcher.progress import STALL_FLOOR_S, RunWatch
from scalelab.launcher.runner import stall_check, stall_timeout_s
from scalelab.train.loop import HANG_AT_STEP_ENV
from tests.test_faults import _at_step, _held_at, _left, _run_dir, _start, _wait_for

HVD = pytest.param("horovod", marks=needs_horovod)
STALL = ["--stall-timeout-min", "0.1", "--backend-opt", "stop_grace_s=3"]


# ---- what the records say: a fake clock over hand-made records ------------------------------------------------


def _records(run: Path, rank: int, recs: list[dict]) -> None:
    path = run / "records" / f"rank-{rank}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for rec in recs:
            f.write(json.dumps({"rank": rank, "world": 2, **rec}) + "\n")


def _steps(t0: float, upto: int, step_s: float = 0.5) -> list[dict]:
    return [{"kind": "step", "step": s, "warmup": False, "step_s": step_s, "samples": 8, "words": 8, "loss": 1.0,
             "time": t0 + s * step_s} for s in range(1, upto + 1)]


def _watch(run: Path, now: float) -> RunWatch:
    watch = RunWatch(run, steps=100)
    watch.clock = lambda: now
    return watch


def test_a_run_silent_past_the_threshold_is_said_to_have_stalled_without_an_eta(tmp_path: Path) -> None:
    t0 = 1_000_000.0
    _records(tmp_path, 0, [{"kind": "start", "time": t0}, *_steps(t0, 31)])
    _records(tmp_path, 1, [{"kind": "start", "time": t0}, *_steps(t0, 30)])
    last = t0 + 31 * 0.5
    before = _watch(tmp_path, last + STALL_FLOOR_S - 1).poll()
    assert before.stalled is None and before.eta_s is not None, before
    after = _watch(tmp_path, last + 130).poll()
    assert after.stalled == "no step for 2m10s (since step 31; rank 1 last recorded step 30 (2m10s ago), the others step 31)"
    assert after.eta_s is None and "ETA" not in after.line() and after.stalled in after.line()
    assert after.as_of("FAILED").stalled is None and after.as_of("RUNNING").stalled == after.stalled


def test_every_rank_at_the_same_step_and_slow_steps_set_the_threshold(tmp_path: Path) -> None:
    """Ranks in the same step's collective: none is behind. Steps of 10 s: 20 of them (200 s) before a stall."""
    t0 = 1_000_000.0
    for rank in (0, 1):
        _records(tmp_path, rank, [{"kind": "start", "time": t0}, *_steps(t0, 5, step_s=10.0)])
    last = t0 + 50
    assert _watch(tmp_path, last + 150).poll().stalled is None  # over the 60 s floor, under 20 steps
    assert _watch(tmp_path, last + 250).poll().stalled == "no step for 4m10s (since step 5; every rank last recorded step 5)"


def test_no_stall_before_the_first_step_after_the_end_or_while_queued(tmp_path: Path) -> None:
    t0 = 1_000_000.0
    for rank in (0, 1):  # an earlier launch stepped and ended; this one started and has not stepped yet
        _records(tmp_path, rank, [{"kind": "start", "time": t0}, *_steps(t0, 3),
                                  {"kind": "event", "event": "end", "step": 3, "reason": "interrupted", "time": t0 + 2},
                                  {"kind": "start", "time": t0 + 10}])
    assert _watch(tmp_path, t0 + 3600).poll().stalled is None  # starting up (or resuming) is no stall
    for rank in (0, 1):
        _records(tmp_path, rank, _steps(t0 + 10, 2))
    assert _watch(tmp_path, t0 + 3600).poll().stalled is not None
    queued = _watch(tmp_path, t0 + 3600)
    queued.queued = "Slurm job 7 PENDING (BeginTime)"  # requeued: when it runs again is the queue's to say
    assert queued.poll().stalled is None
    for rank in (0, 1):
        _records(tmp_path, rank, [{"kind": "event", "event": "end", "step": 2, "reason": "steps", "time": t0 + 12}])
    assert _watch(tmp_path, t0 + 3600).poll().stalled is None


def test_a_rank_that_returned_leaves_the_silence_to_the_one_still_running(tmp_path: Path) -> None:
    """A script's rank 0 returned at step 10 while rank 1 hangs after step 4: rank 1's silence counts."""
    t0 = 1_000_000.0
    _records(tmp_path, 0, [{"kind": "start", "time": t0}, *_steps(t0, 10),
                           {"kind": "event", "event": "end", "step": 10, "reason": "completed", "time": t0 + 5.2}])
    _records(tmp_path, 1, [{"kind": "start", "time": t0}, *_steps(t0, 4)])
    snap = _watch(tmp_path, t0 + 2 + 100).poll()
    assert snap.stalled is not None and "rank 1 last recorded step 4" in snap.stalled, snap


def test_the_stall_timeout_defaults_to_the_trainers_and_is_off_for_a_script() -> None:
    assert stall_timeout_s(Spec()) == STALL_TIMEOUT_MIN * 60
    assert stall_timeout_s(Spec(script="train.py")) is None and stall_timeout_s(Spec(module="pkg.train")) is None
    assert stall_timeout_s(Spec(stall_timeout_min=0)) is None
    assert stall_timeout_s(Spec(script="train.py", stall_timeout_min=2)) == 120


def test_the_stall_timeout_waits_for_twenty_median_steps(tmp_path: Path) -> None:
    """--stall-timeout-min 1 of a run whose steps take 10 s: not ended after 61 s of silence, ended after 201 s."""
    t0 = 1_000_000.0
    for rank in (0, 1):
        _records(tmp_path, rank, [{"kind": "start", "time": t0}, *_steps(t0, 5, step_s=10.0)])
    spec = Spec(stall_timeout_min=1)
    early, late = _watch(tmp_path, t0 + 50 + 61), _watch(tmp_path, t0 + 50 + 201)
    early.poll(), late.poll()
    assert stall_check(spec, early)() is None
    said = stall_check(spec, late)()
    assert said and said.startswith("no step for 3m21s (since step 5;") and "--stall-timeout-min 1" in said, said
    assert stall_check(Spec(script="x.py"), late) is None


# ---- the launcher ends a hung run: both engines, an own script and the built-in trainer ---------------------

HANG_DDP = """import sys, time, torch, torch.distributed as dist
from scalelab import track
dist.init_process_group("gloo")
for step in range(int(sys.argv[1])):
    if step == 5 and dist.get_rank() == 1:
        print("rank 1 hanging", flush=True)
        time.sleep(10**6)
    t = torch.ones(1)
    dist.all_reduce(t)
    track.step(items=1, loss=1.0)
    if track.should_stop():  # asked: a stop signal is left to the script, and its sleep goes on
        break
"""
HANG_HVD = """import sys, time, torch
import horovod.torch as hvd
from scalelab import track
hvd.init()
for step in range(int(sys.argv[1])):
    if step == 5 and hvd.rank() == 1:
        print("rank 1 hanging", flush=True)
        time.sleep(10**6)
    hvd.allreduce(torch.ones(1), name="x")
    track.step(items=1, loss=1.0)
    if track.should_stop():
        break
"""
HANG_SINGLE = """import sys, time
from scalelab import track
for step in range(int(sys.argv[1])):
    if step == 5:
        time.sleep(10**6)
    track.step(items=1, loss=1.0)
"""


def _ended_by_the_stall(proc, where: Path, step: int) -> Path:
    """The launcher's one line, the run FAILED with it in launch.json and `launch status`, nothing left."""
    run = next(p for p in (where / "runs").iterdir() if p.is_dir())
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 1, proc.stderr
    assert said.count("launch: error:") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "no step for" in said and f"(since step {step};" in said and "stalled past its stall timeout" in said, said
    assert "none left" in said, said
    state = json.loads((run / "launch.json").read_text())
    assert state["state"] == "FAILED" and state["detail"].startswith("no step for"), state
    status = launch("status", str(run), cwd=where)
    assert "FAILED no step for" in " ".join(status.stdout.split()), status.stdout
    assert _left(run) == []
    return run


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["single", "ddp", HVD])
def test_a_hung_script_is_ended_by_its_stall_timeout(tmp_path: Path, engine: str) -> None:
    script = {"single": HANG_SINGLE, "ddp": HANG_DDP, "horovod": HANG_HVD}[engine]
    (tmp_path / "hang.py").write_text(script)
    ranks = "1" if engine == "single" else "2"
    proc = launch("run", "--script", "hang.py", "--engine", engine, "--gpus-per-node", ranks, "--steps", "50",
                  *STALL, "--runs-dir", str(tmp_path / "runs"), "--", "50", cwd=tmp_path, timeout=240)
    _ended_by_the_stall(proc, tmp_path, 5)
    assert "every rank last recorded step 5" in " ".join(proc.stderr.split()), proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["ddp", HVD])
def test_a_hung_rank_of_the_trainer_is_ended_by_its_stall_timeout(tmp_path: Path, engine: str) -> None:
    proc = launch("run", "--model", "nmt-tiny", "--data", "task", "--steps", "30", "--global-batch", "16",
                  "--threads", "1", "--checkpoint-every", "3", "--engine", engine, "--gpus-per-node", "2", *STALL,
                  "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, env={HANG_AT_STEP_ENV: "5:1"}, timeout=240)
    run = _ended_by_the_stall(proc, tmp_path, 5)
    assert f"`launch resume {run}`" in " ".join(proc.stderr.split())  # its step-3 checkpoint continues it


# ---- the launcher killed while a rank is stuck: the cause the ranks recorded, not a guess -------------------


def _script_run(where: Path, script: str) -> subprocess.Popen:
    (where / "hang.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = on_cpu_where_gpus_are_short(("run", "--script", "hang.py", "--engine", "ddp", "--gpus-per-node", "2",
                                        "--steps", "50", "--runs-dir", str(where / "runs"), "--", "50"))
    return subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", *args], cwd=where, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("engine,how", [("ddp", "hang"), ("ddp", "script"),
                                        pytest.param("horovod", "sigstop", marks=needs_horovod)])
def test_a_killed_launcher_with_a_stuck_rank_is_named_as_the_cause(tmp_path: Path, engine: str, how: str) -> None:
    """SIGKILL of the launcher while rank 1 hangs (the trainer's hang aid; a script's sleep) or is stopped
    (SIGSTOP, as the review did): the ranks that cannot stop give up 25 s later and record why; `launch status`
    says CANCELLED with that cause and no new checkpoint - not "killed by SIGTERM" (the exit status 143 read back)
    nor "out of memory?" for the rank its agent then killed."""
    if how == "script":
        fg = _script_run(tmp_path, HANG_DDP)
        run = _run_dir(tmp_path / "runs", fg)
        _wait_for("both ranks at step 5", lambda: _at_step(run, 5), fg)
    elif how == "hang":
        fg = _start(tmp_path, engine, env={HANG_AT_STEP_ENV: "5:1"})
        run = _run_dir(tmp_path / "runs", fg)
        _wait_for("both ranks at step 5", lambda: _at_step(run, 5), fg)
    else:
        fg, run = _held_at(tmp_path, engine, 5)
        rank1 = next(p for p in run_processes(run, ("-m", "scalelab.train"))
                     if (p.environ().get("HOROVOD_RANK") or p.environ().get("RANK")) == "1")
        rank1.suspend()
    try:
        fg.kill()
        fg.communicate()
        _wait_for("every process of the run gone", lambda: not _left(run) or None, patience_s=120)
    finally:
        for line in _left(run):
            os.kill(int(line.split()[0]), signal.SIGKILL)
    status = launch("status", str(run), cwd=tmp_path)
    shown = " ".join(status.stdout.split())
    assert f"CANCELLED its launcher (pid {fg.pid}) is gone; " in shown, status.stdout + status.stderr
    # which rank gives up first is the race of their 2 s watches; its agent may end the other before its own 25 s
    assert re.search(r"rank [01] did not stop within 25 s and exited after step 5", shown), shown
    assert "no new checkpoint was saved" in shown and "SIGTERM" not in shown and "out of memory" not in shown, shown
    if how == "sigstop":  # stopped, it recorded nothing; horovodrun killed it once rank 0 had exited
        assert "rank 0 did not stop within 25 s" in shown and "rank 1 ended with no record after step 5" in shown
    if how != "script":
        assert f"`launch resume {run}` continues it from its last checkpoint" in shown, shown
