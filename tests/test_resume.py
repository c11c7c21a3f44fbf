"""Exact resume on every engine: a run stopped and resumed records what an uninterrupted run records.

For each engine (single, DDP on 2 ranks, Horovod on 2 ranks) one uninterrupted run is the reference.
Two interruptions are resumed with `launch resume` and compared with it from the resume point on:

- cancel: `launch cancel` sends SIGTERM to the ranks, which agree on a step, checkpoint and stop;
- killed rank: one rank's process gets SIGKILL, the run fails, and the resume starts from the last
  periodic checkpoint (`--checkpoint-every`), replaying the steps done after it.

Losses and learning rates are compared exactly (==), and so are the final parameters and Adam's state
(step, exp_avg, exp_avg_sq): the resumed ranks run the same kernels on the same data, parameters and
RNG states as the reference ranks, and the gradient exchange over 2 ranks adds two numbers per element,
which gives the same float whichever comes first. Dropout is on, so the RNG states matter.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import (
    ROOT,
    launch,
    launched_once,
    needs_horovod,
    on_cpu_where_gpus_are_short,
    only_run_dir,
    read_jsonl,
)
from scalelab.train.checkpoint import CHECKPOINT_NAME
from scalelab.train.loop import HOLD_AT_STEP_ENV, KILL_AT_STEP_ENV
from tests.test_faults import _assert_nothing_left

pytestmark = pytest.mark.slow  # every test here takes over 5 s on 2 cores (the fast subset: -m 'not slow')

SPEC = ["--model", "nmt-tiny", "--data", "task", "--warmup-steps", "1", "--prefetch", "1", "--global-batch", "16",
        "--steps", "10", "--checkpoint-every", "4", "--lr", "0.01", "--model-arg", "dropout=0.2",
        "--threads", "1"]  # one thread per rank: bit-equal runs need it (docs/reliability.md, "Exact resume")
ENGINES = {
    "single": ["--engine", "single"],
    "ddp": ["--engine", "ddp", "--gpus-per-node", "2"],
    "horovod": ["--engine", "horovod", "--gpus-per-node", "2"],
    "ps": ["--engine", "ps", "--gpus-per-node", "2", "--ps-shards", "2"],  # rank 1 owns a shard's Adam state
    "ps-cpu": ["--engine", "ps", "--gpus-per-node", "2", "--ps-shards", "2", "--ps-state", "cpu"],
    "ps-separate": ["--engine", "ps", "--gpus-per-node", "2", "--ps-placement", "separate"],  # rank 2: the server
}
ENGINE_PARAMS = ["single", "ddp", "ps", pytest.param("horovod", marks=needs_horovod)]


def _start(where, engine, *extra, env=None):
    """`launch` of SPEC on `engine` in the folder `where`; the process and the runs folder."""
    where.mkdir(parents=True)
    proc = launch(*SPEC, *ENGINES[engine], *extra, "--runs-dir", "runs", cwd=where, env=env)
    return proc, where / "runs"


def resume_reference(tmp_path_factory, engine: str, *extra: str) -> Path:
    """The uninterrupted local run of SPEC on `engine`, made once in the pytest run (conftest's made_once);
    the Slurm and two-instance AWS resume tests compare with it too."""
    return launched_once(tmp_path_factory, "resume-reference", *SPEC, *ENGINES[engine], *extra)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run of each engine, made once in the pytest run (conftest's made_once)."""
    return lambda engine, *extra: resume_reference(tmp_path_factory, engine, *extra)


def _world(engine):
    return {"single": 1, "ps-separate": 3}.get(engine, 2)


def _last_launch_steps(run, rank):
    """The step records written since the last `start` record (the resumed launch) of one rank."""
    recs = read_jsonl(run / "records" / f"rank-{rank}.jsonl")
    last_start = max(i for i, r in enumerate(recs) if r["kind"] == "start")
    return recs[last_start], [r for r in recs[last_start:] if r["kind"] == "step"]


def _assert_resumed_exactly(resumed, whole, engine, from_step):
    for rank in range(_world(engine)):
        start, steps = _last_launch_steps(resumed, rank)
        assert start["resumed_from_step"] == from_step
        reference = [s for s in read_jsonl(whole / "records" / f"rank-{rank}.jsonl") if s["kind"] == "step"]
        assert [s["step"] for s in steps] == list(range(from_step + 1, 11))
        for key in ("loss", "lr", "samples", "words"):
            assert [s[key] for s in steps] == [s[key] for s in reference[from_step:]], f"rank {rank}: {key}"
    a = torch.load(whole / CHECKPOINT_NAME, weights_only=True)
    b = torch.load(resumed / CHECKPOINT_NAME, weights_only=True)
    assert a["step"] == b["step"] == 10
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    assert all(state.keys() == {"step", "exp_avg", "exp_avg_sq"} for state in a["optimizer"]["state"].values())
    pairs = {**{key: (value, b["model"][key]) for key, value in a["model"].items()},
             **{f"adam {i} {key}": (value, b["optimizer"]["state"][i][key])
                for i, state in a["optimizer"]["state"].items() for key, value in state.items()}}
    differ = {key: _how_far(x, y) for key, (x, y) in pairs.items() if not torch.equal(x, y)}
    assert not differ, f"{len(differ)} of {len(pairs)} tensors are not bit-equal: {differ}"


def _how_far(x: torch.Tensor, y: torch.Tensor) -> str:
    """For a failure's message: how many elements differ and by how much (one flake in CI named only the
    first tensor; this names them all, to tell a reduction order from a wrong state)."""
    if x.shape != y.shape:
        return f"shape {tuple(x.shape)} != {tuple(y.shape)}"
    d = (x.double() - y.double()).abs()
    return f"{int((d > 0).sum())}/{d.numel()} elements, max {float(d.max()):.3g} (of |x| max {float(x.abs().max()):.3g})"


@pytest.mark.parametrize("engine", ENGINE_PARAMS)
def test_killed_rank_resumes_exactly_from_the_last_periodic_checkpoint(tmp_path, engine, reference):
    """SIGKILL of the last rank after step 6: the run fails with one line that names that rank's silence, not
    rank 0's echo of it (rank 0's all-reduce fails, "Connection reset by peer", recorded as `peer_lost`), and
    leaves no process and no lock behind; `launch resume` goes on from the checkpoint of step 4 to the
    uninterrupted run's losses. (tests/test_faults.py held the failure's half of this, on a run of its own.)"""
    rank = _world(engine) - 1  # the last rank: on 2 ranks, not the one that writes checkpoints
    proc, runs = _start(tmp_path / "killed", engine, env={KILL_AT_STEP_ENV: f"6:{rank}"})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.startswith("launch")]  # not its `[RUN] step` lines
    assert len(said) == 1 and f"rank {rank} was killed by SIGKILL (signal 9) after step 6" in said[0], said
    assert rank == 0 or "rank 0" not in said[0], said
    run = only_run_dir(runs)
    assert json.loads((run / "launch.json").read_text())["state"] == "FAILED"
    _assert_nothing_left(run)
    assert torch.load(run / CHECKPOINT_NAME, weights_only=True)["step"] == 4
    assert not (run / "checkpoint.tmp").exists()

    proc = launch("resume", str(run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    _assert_resumed_exactly(run, reference(engine), engine, from_step=4)


def _kill_and_resume(tmp_path, engine: str, rank: int):
    """Run `engine` until `rank` is SIGKILLed after step 6, resume it; the run directory."""
    proc, runs = _start(tmp_path / "killed", engine, env={KILL_AT_STEP_ENV: f"6:{rank}"})
    assert proc.returncode != 0, "the run went on without its killed rank"
    run = only_run_dir(runs)
    assert torch.load(run / CHECKPOINT_NAME, weights_only=True)["step"] == 4
    proc = launch("resume", str(run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return run


def test_ps_with_cpu_state_resumes_exactly(tmp_path, reference):
    """`--ps-state cpu`: the shards' CPU copies and their Adam state come back from the checkpoint too
    (the copies re-read the loaded weights), so the resumed run records the uninterrupted one's losses."""
    run = _kill_and_resume(tmp_path, "ps-cpu", rank=1)
    _assert_resumed_exactly(run, reference("ps-cpu"), "ps-cpu", from_step=4)


def test_ps_separate_resumes_exactly_after_its_server_is_killed(tmp_path, reference):
    """`--ps-placement separate`: the server rank (all the shards, all of Adam's state) is the one killed;
    the resumed server and workers record what the uninterrupted ones record (the server: no samples)."""
    run = _kill_and_resume(tmp_path, "ps-separate", rank=2)
    _assert_resumed_exactly(run, reference("ps-separate"), "ps-separate", from_step=4)
    assert {s["samples"] for s in _last_launch_steps(run, 2)[1]} == {0}


@pytest.mark.usefixtures("needs_cpu_bf16")
@pytest.mark.parametrize("engine", ENGINE_PARAMS)
def test_bf16_run_resumes_exactly(tmp_path, engine, reference):
    """Under bf16 autocast too: the forward casts the fp32 master weights afresh every step, so a resumed
    run that loads them (and Adam's fp32 state) runs the same bf16 kernels on the same numbers."""
    rank = _world(engine) - 1
    proc, runs = _start(tmp_path / "killed", engine, "--precision", "bf16", env={KILL_AT_STEP_ENV: f"6:{rank}"})
    assert proc.returncode != 0, "the run went on without its killed rank"
    run = only_run_dir(runs)
    assert torch.load(run / CHECKPOINT_NAME, weights_only=True)["identity"]["precision"] == "bf16"

    proc = launch("resume", str(run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    whole = reference(engine, "--precision", "bf16")
    _assert_resumed_exactly(run, whole, engine, from_step=4)
    assert {r["precision"] for r in read_jsonl(run / "records" / "rank-0.jsonl") if r["kind"] == "start"} == {"bf16"}
    fp32 = [s["loss"] for s in read_jsonl(reference(engine) / "records" / "rank-0.jsonl") if s["kind"] == "step"]
    bf16 = [s["loss"] for s in read_jsonl(whole / "records" / "rank-0.jsonl") if s["kind"] == "step"]
    assert fp32 != bf16  # bf16 really ran: the losses are rounded differently


@pytest.mark.parametrize("engine", ENGINE_PARAMS)
def test_cancelled_run_resumes_exactly(tmp_path, engine, reference):
    """The ranks hold after step 6 until the cancel's SIGTERM arrives (a test aid), so the cancel
    lands at a known step; they agree to stop there, checkpoint and exit."""
    runs = tmp_path / "runs"
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT), HOLD_AT_STEP_ENV: "6"}
    args = on_cpu_where_gpus_are_short((*SPEC, *ENGINES[engine]))  # a one-GPU machine: two ranks on the CPU
    fg = subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", *args, "--runs-dir", str(runs)],
                          cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not _all_ranks_at(runs, _world(engine), 6):
            time.sleep(0.2)
        assert _all_ranks_at(runs, _world(engine), 6), f"the ranks were not all at step 6 after 240 s (launch: {fg.poll()})"
        run = only_run_dir(runs)
        proc = launch("cancel", str(run), cwd=tmp_path)
        assert proc.returncode == 0 and "CANCELLED" in proc.stdout, proc.stderr
        _, err = fg.communicate(timeout=120)
    finally:
        fg.kill()
    assert fg.returncode == 1 and "was cancelled" in err, err
    assert any(r.get("event") == "interrupted" and r["step"] == 6 for r in read_jsonl(run / "records" / "rank-0.jsonl"))
    assert torch.load(run / CHECKPOINT_NAME, weights_only=True)["step"] == 6

    proc = launch("resume", str(run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    _assert_resumed_exactly(run, reference(engine), engine, from_step=6)


def _all_ranks_at(runs, world, step):
    if not runs.exists() or not any(runs.iterdir()):
        return False
    run = only_run_dir(runs)
    files = [run / "records" / f"rank-{r}.jsonl" for r in range(world)]
    return all(f.exists() and any(r.get("step") == step and r["kind"] == "step" for r in _lines(f)) for f in files)


def _lines(path):
    try:
        return read_jsonl(path)
    except ValueError:  # a line being written right now
        return []


def test_resume_keeps_the_batch_shares_of_dynamic_balancing(tmp_path):
    """The shares in force at the checkpoint (and changes already decided for later steps) are part of
    the data position: after a resume each rank gets the slice the interrupted run had planned."""
    balance = ["--balance", "dynamic", "--balance-every", "2", "--emulate-slowdown", "1,3"]
    proc, runs = _start(tmp_path / "killed", "ddp", *balance, env={KILL_AT_STEP_ENV: "6:1"})
    assert proc.returncode != 0
    run = only_run_dir(runs)
    planned = [(0, [8, 8])] + [(e["effective_step"], e["shares"]) for e in read_jsonl(run / "records" / "rank-0.jsonl")
                               if e.get("event") == "rebalance" and e["step"] <= 4]
    assert len(planned) == 3 and planned[-1][0] > 6  # one change planned at step 4 for after the resume point

    proc = launch("resume", str(run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        steps = _last_launch_steps(run, rank)[1]
        for s in steps[:4]:  # steps 5-8; changes decided after the resume act from step 10 on
            want = next(shares for first, shares in reversed(planned) if s["step"] >= first)
            assert s["samples"] == want[rank], (rank, s["step"], planned)
