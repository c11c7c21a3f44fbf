"""Issue 37, ask 4 and ask 1's second half: a signal to one rank, and a rank's own error, on every engine.

A stop signal (SIGTERM, SIGUSR1, SIGINT) sent to a single rank process - as a node agent, an OOM killer or a
pre-emption hook sends it - used to end a DDP or Horovod run FAILED (torchrun's ChildFailedError, horovodrun's
"Exit code: 143"). Now that rank sets its stop flag, every rank learns it at the next step through the stop
agreement they already make (`agree_to_stop`), rank 0 checkpoints, every rank records `interrupted` and `end`,
and the launcher derives CANCELLED from those records whatever the agent's exit code
(`runner.ended_as_recorded`). Each case here, on the local backend: the run ends CANCELLED, the launcher says
one line naming the rank and the signal, no process of the run is left (counted by command line), the
checkpoint is of the step the ranks stopped at, and `launch resume` records exactly the losses of an
uninterrupted run of the same spec. The ranks hold at the stop step until the one signalled rank gets its
signal (`SCALELAB_HOLD_AT_STEP=STEP:RANK`: the others wait in the stop agreement), so that it lands there.

A rank that fails with an exception that is not ours (SCALELAB_RAISE_AT_STEP: a RuntimeError, as a library's
bug would raise) writes its last line into an `error` record; the launcher shows that line first - not the
agent's traceback, nor the peers' "Connection reset by peer" (recorded as `peer_lost`) - and the log file keeps
the tracebacks. The same for a user's --script that raises; a killed rank's silence named before its peers'
collective errors is checked by tests/test_faults.py's killed-rank test.

Slurm (the real test cluster) and AWS (moto, the instance played on this machine): tests/test_rank_signals_remote.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch

from tests.conftest import ROOT, launch, needs_horovod, on_cpu_where_gpus_are_short, read_jsonl, runs_made_once
from tests.test_faults import REFERENCE, SPEC, STEPS, _left, _wait_for
from scalelab.train.checkpoint import CHECKPOINT_NAME
from scalelab.train.loop import HOLD_AT_STEP_ENV, RAISE_AT_STEP_ENV

pytestmark = pytest.mark.slow  # every test here starts real ranks (over 5 s on 2 cores)

STOP = 4
# SPEC (8 steps, a checkpoint every 3, one thread per rank) is test_faults.py's: both compare against the
# same uninterrupted runs.
ENGINES = {
    "single": ["--engine", "single"],
    "ddp": ["--engine", "ddp", "--gpus-per-node", "2"],
    "horovod": ["--engine", "horovod", "--gpus-per-node", "2"],
    "ps": ["--engine", "ps", "--gpus-per-node", "2", "--ps-shards", "2"],  # rank 1 owns a shard's Adam state
}
PATIENCE_S = 240


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run of each engine, made once in the pytest run (the ddp and Horovod runs are
    test_faults.py's too)."""
    return runs_made_once(tmp_path_factory, SPEC, ENGINES, REFERENCE)


def world(engine: str) -> int:
    return 1 if engine == "single" else 2


def start(where: Path, engine: str, env: dict) -> subprocess.Popen:
    """`launch` of SPEC on `engine` in the background, its runs under where/runs."""
    where.mkdir(parents=True, exist_ok=True)
    args = [*on_cpu_where_gpus_are_short((*SPEC, *ENGINES[engine])), "--runs-dir", str(where / "runs")]
    return subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", *args], cwd=where,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(what: str, check, proc: subprocess.Popen | None = None, patience_s: float = PATIENCE_S):
    """tests/test_faults.py's wait, with this file's patience."""
    return _wait_for(what, check, proc, patience_s)


def records(run: Path, rank: int) -> list[dict]:
    try:
        return read_jsonl(run / "records" / f"rank-{rank}.jsonl")
    except (FileNotFoundError, ValueError):  # not written yet, or a line being written now
        return []


def rank_process(run: Path, rank: int) -> psutil.Process | None:
    """The rank's own process (`python -m scalelab.train RUN`, RANK or HOROVOD_RANK in its environment; a
    single-process run has neither), not its agent."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        try:
            agent = any("scalelab.core.torchrun" in a or "horovodrun" in a for a in cmd)  # its line ends so too
            if not agent and cmd[-2:] == ["scalelab.train", str(run)]:
                env = proc.environ()
                if int(env.get("RANK", env.get("HOROVOD_RANK", "0"))) == rank:
                    return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def left(run: Path) -> list[str]:
    """Every live process naming the run directory: tests/test_faults.py's count."""
    return _left(run)


def assert_nothing_left(run: Path) -> None:
    assert wait_for("the end of every process of the run", lambda: not left(run) or None, patience_s=60)
    assert not (run / "owner.json").exists(), "the launcher's lock was not released"


def state(run: Path) -> dict:
    return json.loads((run / "launch.json").read_text())


def launch_lines(stderr: str) -> list[str]:
    """What the launcher said itself (its progress lines are `[RUN] step ...`)."""
    return [line for line in stderr.splitlines() if line.startswith("launch")]


def assert_resumes_exactly(run: Path, whole: Path, engine: str, from_step: int) -> None:
    """`launch resume` completes the run; from `from_step` on, every rank's losses and learning rates are
    the uninterrupted run's, and so are the final weights."""
    done = launch("resume", str(run), cwd=run.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(world(engine)):
        recs = records(run, rank)
        last = max(i for i, r in enumerate(recs) if r["kind"] == "start")
        assert recs[last]["resumed_from_step"] == from_step
        steps = [r for r in recs[last:] if r["kind"] == "step"]
        want = [r for r in records(whole, rank) if r["kind"] == "step"][from_step:]
        assert [s["step"] for s in steps] == list(range(from_step + 1, STEPS + 1))
        for key in ("loss", "lr", "samples"):
            assert [s[key] for s in steps] == [s[key] for s in want], f"rank {rank}: {key}"
    a = torch.load(whole / CHECKPOINT_NAME, weights_only=True)
    b = torch.load(run / CHECKPOINT_NAME, weights_only=True)
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=0, atol=0, msg=key)
    assert state(run)["state"] == "COMPLETED"
    assert_nothing_left(run)


# ---- ask 4: one rank signalled ---------------------------------------------------------------------

CASES = [  # every engine, every stop signal on at least two engines, the signalled rank 0 or not
    pytest.param("single", signal.SIGINT, 0, id="single-SIGINT-rank0"),
    pytest.param("ddp", signal.SIGTERM, 1, id="ddp-SIGTERM-rank1"),
    pytest.param("ddp", signal.SIGUSR1, 0, id="ddp-SIGUSR1-rank0"),
    pytest.param("horovod", signal.SIGTERM, 1, id="horovod-SIGTERM-rank1", marks=needs_horovod),
    pytest.param("horovod", signal.SIGINT, 0, id="horovod-SIGINT-rank0", marks=needs_horovod),
    pytest.param("ps", signal.SIGUSR1, 1, id="ps-SIGUSR1-rank1"),
]


@pytest.mark.parametrize("engine, signum, rank", CASES)
def test_a_signal_to_one_rank_stops_every_rank_and_the_run_is_cancelled(tmp_path, reference, engine, signum, rank):
    proc = start(tmp_path, engine, {HOLD_AT_STEP_ENV: f"{STOP}:{rank}"})
    try:
        runs = tmp_path / "runs"
        run = wait_for("the run directory", lambda: next((p for p in runs.glob("*") if p.is_dir()), None), proc)
        wait_for(f"rank {rank} at step {STOP}",
                 lambda: any(r["kind"] == "step" and r["step"] == STOP for r in records(run, rank)), proc)
        target = wait_for(f"rank {rank}'s process", lambda: rank_process(run, rank), proc)
        target.send_signal(signum)  # that one process only: not its agent, not its peers
        _, err = proc.communicate(timeout=PATIENCE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    name = signal.Signals(signum).name
    said = launch_lines(err)
    assert proc.returncode == 1 and len(said) == 1 and "Traceback" not in err, err[-3000:]
    assert said[0].startswith("launch: error:") and "was cancelled" in said[0], said
    stops = {r: [e for e in records(run, r) if e.get("event") in ("interrupted", "end")] for r in range(world(engine))}
    # The whole line and what each rank recorded: a failure under CI's load (2026-12-01, Horovod, SIGINT to rank 0)
    # showed a line without "rank 0 got SIGINT", cut short by pytest, and its records were gone afterwards.
    assert f"rank {rank} got {name}" in said[0] and f"step {STOP}" in said[0] and "launch resume" in said[0], \
        f"{said[0]}\nthe ranks' stops: {stops}"
    assert state(run)["state"] == "CANCELLED"
    for r in range(world(engine)):  # every rank stopped at the agreed step, on the signal of the one
        stops = [e for e in records(run, r) if e.get("event") == "interrupted"]
        assert [e["step"] for e in stops] == [STOP]
        assert stops[0]["signal"] == (int(signum) if r == rank else None)
        assert [e for e in records(run, r) if e.get("event") == "end"][-1]["reason"] == "interrupted"
    assert torch.load(run / CHECKPOINT_NAME, weights_only=True)["step"] == STOP
    assert_nothing_left(run)
    assert_resumes_exactly(run, reference(engine), engine, from_step=STOP)


# ---- ask 1: the rank's own error first -------------------------------------------------------------


@pytest.mark.parametrize("engine", ["single", "ddp", pytest.param("horovod", marks=needs_horovod), "ps"])
def test_a_rank_that_raises_is_named_with_its_own_error_line_first(tmp_path, engine):
    """The last rank raises a RuntimeError after step 2: the launcher's one line is that rank's own error
    (not torchrun's ChildFailedError, horovodrun's RuntimeError, nor rank 0's "Connection reset by peer");
    the tracebacks stay in the log file."""
    rank = world(engine) - 1
    proc = start(tmp_path, engine, {RAISE_AT_STEP_ENV: f"2:{rank}"})
    _, err = proc.communicate(timeout=PATIENCE_S)
    said = launch_lines(err)
    assert proc.returncode == 1 and len(said) == 1 and "Traceback" not in err, err[-3000:]
    assert said[0].startswith(f"launch: error: rank {rank}: RuntimeError: injected fault after step 2"), said
    run = next(p for p in (tmp_path / "runs").glob("*") if p.is_dir())
    assert state(run)["state"] == "FAILED"
    logs = "".join(p.read_text(errors="replace") for p in (run / "logs").glob("*.log"))
    assert "Traceback (most recent call last)" in logs and "injected fault after step 2" in logs
    assert_nothing_left(run)


FAILING_SCRIPT = """\
import os, time
from scalelab import track

if int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0"))) == int(os.environ["FAIL_RANK"]):
    raise ValueError("row 7 of shard 3 has no label")
for _ in range(1200):  # the others wait until they are stopped
    if track.should_stop():
        break
    time.sleep(0.05)
"""


@pytest.mark.parametrize("engine", ["single", "ddp", pytest.param("horovod", marks=needs_horovod)])
def test_a_users_script_that_raises_is_named_with_its_own_error_line_first(tmp_path, engine):
    """--script runs under every starter (plain, torchrun, horovodrun): the script's own exception is the
    line, whatever the agent does to the other ranks."""
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text(FAILING_SCRIPT)
    rank = world(engine) - 1
    args = on_cpu_where_gpus_are_short(("--script", str(script), *ENGINES[engine][:4]))
    done = launch(*args, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, env={"FAIL_RANK": str(rank)})
    said = launch_lines(done.stderr)
    assert done.returncode == 1 and len(said) == 1 and "Traceback" not in said[0], done.stderr[-3000:]
    # the script's traceback is its rank's output: shown as it came, tagged (launcher/echo.py), before the line
    shown = (done.stderr if engine != "single" else done.stdout).splitlines()  # single: one log, on stdout
    assert f"[rank{rank}]:ValueError: row 7 of shard 3 has no label" in shown, done.stdout + done.stderr
    who = f"rank {rank}: " if world(engine) > 1 else ""  # one rank of several failed: it is named
    assert said[0].startswith(f"launch: error: {who}train.py raised ValueError: row 7 of shard 3 has no label"), said
    run = next(p for p in (tmp_path / "runs").glob("*") if p.is_dir())
    assert "Traceback (most recent call last)" in "".join(p.read_text() for p in (run / "logs").glob("*.log"))
    assert_nothing_left(run)


LATE_RANK_SCRIPT = """\
import os, time
os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = "2"  # this script's own, shorter than the launcher's default
import horovod.torch as hvd
at_init = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank0-at-init")
if os.environ["HOROVOD_RANK"] == "1":  # late to the rendezvous by 6 s after rank 0 reached it, as a rank on a
    end = time.monotonic() + 120       # loaded node can be (rank 0 times out after 2 s, whatever its imports took)
    while not os.path.exists(at_init) and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep(6)
else:
    open(at_init, "w").close()
hvd.init()
"""


@needs_horovod
def test_a_rank_that_aborts_in_horovods_rendezvous_is_named_with_gloos_words(tmp_path):
    """A rank whose C++ library throws past its thread aborts (exit 134) without a record or a Python
    traceback: Gloo's rendezvous timing out while a peer is late. The line is that rank's own
    `what()`, not horovodrun's 25-line RuntimeError."""
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text(LATE_RANK_SCRIPT)
    args = on_cpu_where_gpus_are_short(("--script", str(script), *ENGINES["horovod"]))
    done = launch(*args, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    said = launch_lines(done.stderr)
    assert done.returncode == 1 and len(said) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert re.match(r"launch: error: run \S+ failed \(.*\): rank 0 aborted: gloo::IoException: .*Wait timeout "
                    r"after 2 seconds", said[0]), said
    assert "launch logs" in said[0]
    run = next(p for p in (tmp_path / "runs").glob("*") if p.is_dir())
    assert state(run)["state"] == "FAILED"
    assert_nothing_left(run)


# A killed rank named before its peers' collective errors: tests/test_faults.py's killed-rank test (the same
# launch, killed after step 5), which checks the launcher's one line as well as the resume.
