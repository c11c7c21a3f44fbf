"""A stop signal to ONE rank of a user's own script (`launch --script`) ends the run CANCELLED, as it does the
built-in trainer's (tests/test_rank_signals.py): one line naming the rank and the signal, the step every rank
stopped at and the checkpoint, no torchrun or horovodrun dump.

The script asks `track.should_stop()` on every rank and agrees on it (an all-reduce of the flag with MAX, as
examples/own-script/ do), so the rank that got no signal leaves through that agreement: it too records that it
was interrupted (its `interrupted` event without a signal of its own, as the trainer's peers record theirs), so
every rank's `end` says the same, and `launch resume` continues from the script's checkpoint to the end. Rank 1
holds at the stop step until its signal lands (SCALELAB_HOLD_AT_STEP=STEP:1; rank 0 waits in the agreement).
The launcher's side alone, from records: a rank that ended cleanly at the signalled rank's stop step (it could not
see that rank's stop note) still makes the run CANCELLED.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import ROOT, launch, needs_horovod, on_cpu_where_gpus_are_short, read_jsonl
from tests.test_faults import _left
from scalelab.train.track import HOLD_AT_STEP_ENV

STEPS, STOP = 12, 4

AGREE = {
    "ddp": ("import torch.distributed as dist\ndist.init_process_group('gloo')\nrank = dist.get_rank()\n"
            "def agree(flag):\n    t = torch.tensor(float(flag))\n    dist.all_reduce(t, op=dist.ReduceOp.MAX)\n"
            "    return bool(t.item())\n"),
    "horovod": ("import horovod.torch as hvd\nhvd.init()\nrank = hvd.rank()\n"
                "def agree(flag):\n"
                "    return bool(hvd.allreduce(torch.tensor(float(flag)), op=hvd.Max, name='stop').item())\n"),
}
SCRIPT = """import sys, time
import torch
from scalelab import track
{agree}
steps = int(sys.argv[1])
saved = track.checkpoint_dir / "step.txt"
first = int(saved.read_text()) if saved.exists() else 0
print("starts after step", first, flush=True)
for step in range(first, steps):
    time.sleep(0.02)
    track.step(items=4, loss=1.0 / (step + 1))
    if agree(track.should_stop()):
        if rank == 0:
            saved.write_text(str(step + 1))
        break
"""


def records(run: Path, rank: int) -> list[dict]:
    try:
        return read_jsonl(run / "records" / f"rank-{rank}.jsonl")
    except (FileNotFoundError, ValueError):  # not written yet, or a line being written now
        return []


def events(run: Path, rank: int, name: str) -> list[dict]:
    return [r for r in records(run, rank) if r.get("event") == name]


def rank_process(run: Path, rank: int) -> psutil.Process | None:
    """The rank's own process (`python -m scalelab.train.script RUN`), not its agent."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        try:
            agent = any("scalelab.core.torchrun" in a or "horovodrun" in a for a in cmd)
            if not agent and cmd[-2:] == ["scalelab.train.script", str(run)]:
                env = proc.environ()
                if int(env.get("RANK", env.get("HOROVOD_RANK", "-1"))) == rank:
                    return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
            continue
    return None


def left(run: Path) -> list[str]:
    """Every live process naming the run directory: tests/test_faults.py's count."""
    return _left(run)


def wait_for(what: str, check, proc: subprocess.Popen | None = None, patience_s: float = 120):
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        if found := check():
            return found
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"launch ended before {what}: {proc.communicate()}")
        time.sleep(0.2)
    pytest.fail(f"no {what} after {patience_s} s")


@pytest.mark.parametrize("engine", ["ddp", pytest.param("horovod", marks=needs_horovod)])
@pytest.mark.slow
def test_sigterm_to_one_rank_of_a_script_cancels_the_run_and_resume_completes_it(engine: str, tmp_path: Path) -> None:
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text(SCRIPT.format(agree=AGREE[engine]))
    args = on_cpu_where_gpus_are_short(("--script", str(script), "--engine", engine, "--gpus-per-node", "2",
                                        "--warmup-steps", "1", "--runs-dir", str(tmp_path / "runs"), "--",
                                        str(STEPS)))
    proc = subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", *args], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200",
                                 HOLD_AT_STEP_ENV: f"{STOP}:1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        runs = tmp_path / "runs"
        run = wait_for("the run directory", lambda: next((p for p in runs.glob("*") if p.is_dir()), None), proc)
        wait_for(f"rank 1 at step {STOP}", lambda: any(r.get("step") == STOP for r in records(run, 1)
                                                        if r["kind"] == "step"), proc)
        wait_for("rank 1's process", lambda: rank_process(run, 1), proc).send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = [line for line in err.splitlines() if line.startswith("launch")]
    stops = {r: events(run, r, "interrupted") + events(run, r, "end") for r in (0, 1)}
    assert proc.returncode == 1 and len(said) == 1 and "Traceback" not in err, f"{err[-3000:]}\n{stops}"
    assert said[0].startswith(f"launch: error: run {run} was cancelled: rank 1 got SIGTERM, and every rank stopped "
                              f"at step {STOP} with a checkpoint; `launch resume {run}` continues it"), said
    assert json.loads((run / "launch.json").read_text())["state"] == "CANCELLED"
    status = launch("status", str(run), cwd=tmp_path)
    assert "CANCELLED" in status.stdout and "FAILED" not in status.stdout, status.stdout + status.stderr
    for rank in (0, 1):  # every rank stopped at the agreed step, on the one rank's signal; the same end on each
        (stop,) = events(run, rank, "interrupted")
        assert (stop["step"], stop["signal"]) == (STOP, signal.SIGTERM if rank == 1 else None), stops
        (end,) = events(run, rank, "end")
        assert (end["step"], end["reason"], end["exit_code"]) == (STOP, "interrupted", 143), stops
    assert (run / "checkpoint" / "step.txt").read_text() == str(STOP)
    assert wait_for("the end of every process of the run", lambda: not left(run) or None, patience_s=60)
    done = launch("resume", str(run), cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        assert [r["step"] for r in records(run, rank) if r["kind"] == "step"] == list(range(1, STEPS + 1))
        assert [e["reason"] for e in events(run, rank, "end")] == ["interrupted", "completed"]
    assert json.loads((run / "launch.json").read_text())["state"] == "COMPLETED"
    assert f"starts after step {STOP}" in launch("logs", str(run), cwd=tmp_path).stdout
    assert not left(run)


def test_a_rank_that_could_not_see_its_peers_stop_note_still_makes_the_run_cancelled(tmp_path: Path) -> None:
    """The launcher's side (backend.stopped_on_a_signal), from records alone: where the rank that got no signal
    ended cleanly at the very step its signalled peer stopped at (it left through the agreement but could not
    see the peer's note: another machine's disk), the run is CANCELLED all the same, with the one line; a rank
    that ended at another step, or failed, keeps it FAILED."""
    from scalelab.core.records import RecordWriter
    from scalelab.core.rundir import CANCELLED
    from scalelab.core.spec import Spec, save_spec
    from scalelab.launcher.backend import stopped_on_a_signal

    def run(name: str, rank0_end: dict) -> Path:
        where = tmp_path / name
        where.mkdir()
        save_spec(Spec(), where)
        for rank, end in ((0, rank0_end), (1, {"step": STOP, "reason": "interrupted", "exit_code": 143})):
            out = RecordWriter(where, rank, 2)
            out.write("start", run_id=name, model="train.py")
            if rank == 1:
                out.event("interrupted", signal=int(signal.SIGTERM), step=STOP)
            out.event("end", elapsed_s=1.0, wall_s=2.0, **end)
            out.close()
        return where

    agreed = run("agreed", {"step": STOP, "reason": "completed", "exit_code": 0})
    status = stopped_on_a_signal(agreed, None)
    assert status is not None and status.state == CANCELLED
    assert status.detail.startswith(f"rank 1 got SIGTERM, and every rank stopped at step {STOP}"), status.detail
    assert stopped_on_a_signal(run("later", {"step": STEPS, "reason": "completed", "exit_code": 0}), None) is None
    assert stopped_on_a_signal(run("failed", {"step": STOP, "reason": "failed", "exit_code": 1}), None) is None
