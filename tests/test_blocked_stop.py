"""A stop of a run whose ranks are blocked in a collective takes seconds, not the launcher's grace and SIGKILL.

A rank's stop signals have Python handlers (a flag: the rank stops at its next step with a checkpoint), and CPython
runs them only when the main thread comes back to Python: a rank blocked inside a Gloo all-reduce or a Horovod op,
waiting for a peer that waits elsewhere, never did, so `launch cancel` (and Ctrl-C on a foreground `launch`) took
the whole stop grace (30 s by default) and then SIGKILLed it, with no record of the stop. The stop guard
(scalelab/train/stop_guard.py) sees the signal from another thread and, 5 s on with the handler still not run,
has the rank record its stop and exit 143 (tests/test_stop_guard.py has the guard's cases one by one).

Here, on the local backend and both engines: a user's script whose two ranks each wait in a collective the other
never joins, and the built-in trainer with one rank waiting in a gather its peer never joins while the peer waits
in the stop agreement (SCALELAB_BLOCK_AT_STEP). The cancel returns in well under the 30 s grace (it took 31 s
before), needs no SIGKILL, leaves nothing running (counted by command line), the run is CANCELLED, each rank
recorded why it left (or, when its peer left first, the collective that failed with it), and the trainer's last
checkpoint is whole: `launch resume` records the uninterrupted run's losses.
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

from tests.conftest import ROOT, launch, needs_horovod, on_cpu_where_gpus_are_short, read_jsonl, runs_made_once
from tests.test_faults import (
    ENGINES,
    REFERENCE,
    SPEC,
    _at_step,
    _checkpoint_step,
    _left,
    _resume_matches,
    _run_dir,
    _start,
    _wait_for,
)
from scalelab.train.loop import BLOCK_AT_STEP_ENV

pytestmark = pytest.mark.slow  # real ranks, a cancel, a resume

HOROVOD = pytest.param("horovod", marks=needs_horovod)
GRACE_S = 30  # the local backend's default stop grace: what such a cancel took, then SIGKILL
PROMPT_S = 20  # a behaviour check, not a benchmark: the guard's 5 s, the cancel's start and the agents' exits
PATIENCE_S = 180

# Each rank records three steps, leaves a marker, then waits in a collective the other rank never joins: rank 0 on
# the default group, rank 1 on a second one (ddp); an op of a name only that rank submits (Horovod). Neither ever
# returns: only SIGKILL ended them before the guard.
SETUP = {
    "ddp": ("import torch.distributed as dist\ndist.init_process_group('gloo')\nrank = dist.get_rank()\n"
            "elsewhere = dist.new_group([0, 1])\n"
            "def exchange(step):\n    dist.all_reduce(torch.ones(1))\n"
            "def hang():\n    dist.all_reduce(torch.ones(1), group=None if rank == 0 else elsewhere)\n"),
    "horovod": ("import horovod.torch as hvd\nhvd.init()\nrank = hvd.rank()\n"
                "def exchange(step):\n    hvd.allreduce(torch.ones(1), name=f'step-{step}')\n"
                "def hang():\n    hvd.allreduce(torch.ones(1), name=f'only-rank-{rank}')\n"),
}
SCRIPT = """import sys
from pathlib import Path
import torch
from scalelab import track
{setup}
for step in range(3):
    exchange(step)
    track.step(items=4, loss=1.0 / (step + 1))
    if track.should_stop():
        sys.exit(0)
Path(sys.argv[1], f"blocked-{{rank}}").touch()
hang()
print("never here", flush=True)
"""


def records(run: Path, rank: int) -> list[dict]:
    try:
        return read_jsonl(run / "records" / f"rank-{rank}.jsonl")
    except (FileNotFoundError, ValueError):
        return []


def events(run: Path, rank: int, name: str) -> list[dict]:
    return [r for r in records(run, rank) if r.get("event") == name]


def state(run: Path) -> dict:
    return json.loads((run / "launch.json").read_text())


def start_blocked_script(tmp_path: Path, engine: str) -> tuple[subprocess.Popen, Path]:
    """A foreground `launch --script` of SCRIPT, returned once both ranks are inside their collectives."""
    script, markers = tmp_path / "code" / "train.py", tmp_path / "markers"
    script.parent.mkdir()
    markers.mkdir()
    script.write_text(SCRIPT.format(setup=SETUP[engine]))
    args = on_cpu_where_gpus_are_short(("--script", str(script), "--engine", engine, "--gpus-per-node", "2",
                                        "--runs-dir", str(tmp_path / "runs"), "--", str(markers)))
    fg = subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", *args], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run = _run_dir(tmp_path / "runs", fg)
    _wait_for("both ranks in their collectives", lambda: len(list(markers.iterdir())) == 2, fg, PATIENCE_S)
    time.sleep(1)  # from the marker into the collective
    return fg, run


def timed_cancel(run: Path, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    began = time.monotonic()
    proc = launch("cancel", str(run), cwd=cwd)
    return proc, time.monotonic() - began


def assert_left_blocked_or_lost_the_peer(run: Path) -> None:
    """Every rank recorded how it left: blocked (`interrupted` with `blocked_s`, on SIGTERM) or, where its peer left
    first and its collective failed with that, the peer lost; at least one left blocked."""
    blocked = []
    for rank in (0, 1):
        stops = [e for e in events(run, rank, "interrupted") if "blocked_s" in e]
        lost = [r for r in records(run, rank) if r["kind"] == "error" and r.get("peer_lost")]
        assert stops or lost, f"rank {rank} recorded neither: {records(run, rank)[-4:]}"
        for stop in stops:
            assert stop["signal"] == signal.SIGTERM and stop["blocked_s"] >= 4.5, stop
        blocked += [rank] if stops else []
    assert blocked, "no rank left blocked"


@pytest.mark.parametrize("engine", ["ddp", HOROVOD])
def test_cancel_of_a_script_blocked_in_a_collective_takes_seconds_not_the_grace(tmp_path, engine):
    fg, run = start_blocked_script(tmp_path, engine)
    try:
        proc, took = timed_cancel(run, tmp_path)
        _, err = fg.communicate(timeout=PATIENCE_S)
    finally:
        fg.kill()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert took < PROMPT_S, f"the cancel took {took:.1f} s (the grace is {GRACE_S} s): {proc.stdout}"
    assert "none left" in proc.stdout and "SIGKILL" not in proc.stdout, proc.stdout
    assert fg.returncode == 1 and "was cancelled" in err, err[-3000:]
    assert state(run)["state"] == "CANCELLED"
    assert not _left(run)
    assert_left_blocked_or_lost_the_peer(run)
    for rank in (0, 1):  # the script runner's end, as for any stop: its exit handlers ran, its note is there
        if [e for e in events(run, rank, "interrupted") if "blocked_s" in e]:
            (end,) = events(run, rank, "end")
            assert (end["step"], end["reason"], end["exit_code"]) == (3, "interrupted", 143), end
            assert (run / "records" / f"stop-rank-{rank}.json").is_file()
    assert "never here" not in launch("logs", str(run), cwd=tmp_path).stdout


def test_ctrl_c_of_a_foreground_launch_whose_ranks_are_blocked_stops_it_in_seconds(tmp_path):
    fg, run = start_blocked_script(tmp_path, "ddp")
    began = time.monotonic()
    try:
        fg.send_signal(signal.SIGINT)
        _, err = fg.communicate(timeout=PATIENCE_S)
    finally:
        fg.kill()
    took = time.monotonic() - began
    assert fg.returncode == 128 + signal.SIGINT and "interrupted; every process of the run was stopped" in err, err
    assert took < PROMPT_S, f"the launcher took {took:.1f} s to stop the run (the grace is {GRACE_S} s)"
    assert state(run)["state"] == "CANCELLED" and not _left(run)
    assert_left_blocked_or_lost_the_peer(run)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """tests/test_faults.py's uninterrupted runs of SPEC, made once in the pytest run."""
    return runs_made_once(tmp_path_factory, SPEC, ENGINES, REFERENCE)


@pytest.mark.parametrize("engine", ["ddp", HOROVOD])
def test_cancel_of_trainer_ranks_blocked_in_a_collective_takes_seconds_and_keeps_the_checkpoint(tmp_path, reference,
                                                                                              engine):
    """After step 4, rank 1 waits in a gather and rank 0 in the stop agreement; the periodic checkpoint is step 3's.
    Neither can stop at a step with a checkpoint: each leaves on its guard (or on its peer's exit), records no
    `end`, and the resume goes on from step 3 to the uninterrupted run's losses."""
    fg = _start(tmp_path, engine, env={BLOCK_AT_STEP_ENV: "4:1"})
    try:
        run = _run_dir(tmp_path / "runs", fg)
        _wait_for("both ranks at step 4", lambda: _at_step(run, 4), fg)
        time.sleep(2)  # into the gather and the agreement
        proc, took = timed_cancel(run, tmp_path)
        _, err = fg.communicate(timeout=PATIENCE_S)
    finally:
        fg.kill()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert took < PROMPT_S, f"the cancel took {took:.1f} s (the grace is {GRACE_S} s): {proc.stdout}"
    assert "none left" in proc.stdout and "SIGKILL" not in proc.stdout, proc.stdout
    assert fg.returncode == 1 and "was cancelled" in err and "continues it from its last checkpoint" in err, err[-3000:]
    assert state(run)["state"] == "CANCELLED" and not _left(run)
    assert_left_blocked_or_lost_the_peer(run)
    for rank in (0, 1):
        assert [e["step"] for e in events(run, rank, "interrupted")] in ([], [4])
        assert not events(run, rank, "end"), "a rank that left blocked stopped at no agreed step"
    assert _checkpoint_step(run) == 3 and not (run / "checkpoint.tmp").exists()
    _resume_matches(run, reference(engine), from_step=3)
