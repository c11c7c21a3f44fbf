"""How a user's own script's ends and failures are reported: the rank that left early is named, not the peer
that lost it; an exit status is said as it is (a signal only where the status says one); a checkpoint is
claimed only where one was saved; and `launch logs RUN --rank N` shows rank N's own output under torchrun."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import launch, needs_horovod, only_run_dir
from scalelab.core.launch import Site, launch_plan
from scalelab.core.rundir import read_state
from scalelab.core.spec import EngineSpec, Spec, save_spec
from scalelab.core.waiting import wait_until
from scalelab.launcher.backend import RankEnd, _silent, early_leavers, silent_ranks, stop_line
from scalelab.launcher.local import LocalBackend, LocalRequest

EARLY_DDP = """import sys, torch, torch.distributed as dist
from scalelab import track
dist.init_process_group("gloo")
for step in range(1, 11):
    dist.all_reduce(torch.ones(4))
    track.step(items=4, loss=1.0)
    if dist.get_rank() == 1 and step == 3:
        sys.exit(0)
"""
EARLY_HOROVOD = """import sys, torch, horovod.torch as hvd
from scalelab import track
hvd.init()
for step in range(1, 11):
    hvd.allreduce(torch.ones(4), name=f"s{step}")
    track.step(items=4, loss=1.0)
    if hvd.rank() == 1 and step == 3:
        sys.exit(0)
"""


def error_line(proc) -> str:
    """The one error line of a failed launch (the progress lines and the ranks' own, tagged, start with '[')."""
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("[")]
    assert proc.returncode != 0 and len(lines) == 1 and "Traceback" not in lines[0], proc.stderr
    return lines[0]


@pytest.mark.parametrize("engine, body", [("ddp", EARLY_DDP), pytest.param("horovod", EARLY_HOROVOD,
                                                                           marks=needs_horovod)])
@pytest.mark.slow
def test_a_rank_that_leaves_early_is_named_not_the_peer_that_lost_it(engine, body, tmp_path: Path) -> None:
    (tmp_path / "early.py").write_text(body)
    said = error_line(launch("--script", "early.py", "--engine", engine, "--gpus-per-node", "2", cwd=tmp_path))
    assert ("rank 1 left at step 3 with exit status 0 while the other ranks went on; rank 0 then lost its peer"
            in said), said
    assert "GLHF" not in said and "Horovod has been shut down" not in said and "checkpoint" not in said


@pytest.mark.parametrize("engine, ranks", [("single", "1"), ("ddp", "2")])
def test_an_exit_past_the_runner_says_its_status_and_no_checkpoint(engine, ranks, tmp_path: Path) -> None:
    (tmp_path / "bye.py").write_text("import os\nfrom scalelab import track\ntrack.step(items=1, loss=1.0)\n"
                                     "os._exit(5)\n")
    said = error_line(launch("--script", "bye.py", "--engine", engine, "--gpus-per-node", ranks, cwd=tmp_path))
    # under torchrun the rank that exits first has its peer stopped by the agent (SIGTERM, said as such)
    assert re.search(r"rank \d exited with status 5 after step 1 without an end record", said), said
    assert "checkpoint" not in said and "or out of memory?" not in said, said


def test_a_status_names_a_signal_only_where_it_says_one() -> None:
    seen = RankEnd(1, 2, 4, None, [], [])
    killed = "rank 1 was killed by SIGKILL (signal 9) after step 4, with no error and no end record: out of memory?"
    assert _silent(1, seen, 137) == killed and _silent(1, seen, -9) == killed
    assert _silent(1, seen, -11).startswith("rank 1 was killed by SIGSEGV (signal 11) after step 4")
    assert "memory" not in _silent(1, seen, -11)  # the OOM killer's signal is SIGKILL
    assert _silent(1, RankEnd(1, 2, None, None, [], []), -9, stepped=False).startswith(
        "rank 1 was killed by SIGKILL (signal 9), with no error")  # no step named where the run records none
    assert _silent(1, seen, 2) == "rank 1 exited with status 2 after step 4 without an end record"
    assert "killed by a signal, or out of memory?" in _silent(1, None, None)  # nothing known: said as a guess


def test_a_stop_claims_a_checkpoint_only_where_one_was_saved(tmp_path: Path) -> None:
    (tmp_path / "checkpoint").mkdir()  # what every script run gets, saved into or not
    ranks = [RankEnd(r, 2, 1, {"event": "end", "step": 1, "reason": "interrupted"}, [],
                     [{"event": "interrupted", "signal": 15, "cause": "its launcher (pid 7) is gone"}]) for r in (0, 1)]
    said = stop_line(tmp_path, ranks)
    assert said.startswith("its launcher (pid 7) is gone, and every rank stopped at step 1; no checkpoint"), said
    assert "with a checkpoint" not in said and "continues it from there" not in said
    assert f"no checkpoint was saved ({tmp_path}/checkpoint/ is empty)" in said  # where a script saves its own
    (tmp_path / "checkpoint" / "model.pt").write_bytes(b"saved")
    assert "stopped at step 1 with a checkpoint; `launch resume" in stop_line(tmp_path, ranks)


def test_a_trainer_run_stopped_without_a_checkpoint_names_its_checkpoint_file(tmp_path: Path) -> None:
    """The built-in trainer saves RUN/checkpoint.pt; it has no checkpoint/ folder to call empty."""
    save_spec(Spec(engine=EngineSpec(name="ddp"), nodes=1, gpus_per_node=2, batch_per_worker=8), tmp_path)
    ranks = [RankEnd(r, 2, 1, {"event": "end", "step": 1, "reason": "interrupted"}, [],
                     [{"event": "interrupted", "signal": 15}]) for r in (0, 1)]
    said = stop_line(tmp_path, ranks)
    assert f"no checkpoint was saved (no {tmp_path}/checkpoint.pt)" in said and "checkpoint/" not in said, said
    # its resume refuses to train recorded steps again (runner.refuse_restart): a new run is what starts it over
    assert f"a new run of its spec: `launch run --spec {tmp_path}/spec.json`" in said and "launch resume" not in said
    (tmp_path / "checkpoint.pt").write_bytes(b"saved")
    assert "stopped at step 1 with a checkpoint; `launch resume" in stop_line(tmp_path, ranks)


RAISES_ON_RANK_1 = """import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise ValueError("rank one breaks")
dist.barrier()
"""


@pytest.mark.slow
def test_logs_of_one_rank_show_its_own_output_under_torchrun(tmp_path: Path) -> None:
    """Two emulated nodes of one rank each: rank 1 is local rank 0 of node 1, so the tag must be the global rank.
    torchrun keeps the ranks' output it tees in the run directory (RUN/logs/torchrun), not in a new
    $TMPDIR/torchelastic_* per agent that nothing deletes."""
    (tmp_path / "bad.py").write_text(RAISES_ON_RANK_1)
    tmp = tmp_path / "tmp"  # the run's own temporary directory: another test's torchrun cannot write here
    tmp.mkdir()
    proc = launch("--script", "bad.py", "--engine", "ddp", "--nodes", "2", "--gpus-per-node", "1", cwd=tmp_path,
                  env={"TMPDIR": str(tmp)})
    assert "rank one breaks" in error_line(proc)
    run_dir = only_run_dir(tmp_path / "runs")
    assert not list(tmp.glob("torchelastic_*")), sorted(p.name for p in tmp.iterdir())
    kept = list((run_dir / "logs" / "torchrun").glob("*/attempt_0/0/stderr.log"))
    assert len(kept) == 2 and any("rank one breaks" in log.read_text() for log in kept), kept  # one per agent
    one = launch("logs", str(run_dir), "--rank", "1", cwd=tmp_path)
    zero = launch("logs", str(run_dir), "--rank", "0", cwd=tmp_path)
    assert one.returncode == 0 and "[rank1]:ValueError: rank one breaks" in one.stdout, one.stdout + one.stderr
    assert zero.returncode == 0 and "rank one breaks" not in zero.stdout.replace("error: bad.py raised", "")
    assert "[rank0]:Traceback" in zero.stdout, zero.stdout


@pytest.mark.parametrize("engine", ["ddp", "ps"])
def test_every_torchrun_launch_tags_its_ranks_lines_with_the_global_rank(engine: str) -> None:
    spec = Spec(engine=EngineSpec(name=engine), nodes=2, gpus_per_node=2, batch_per_worker=8)
    for node in launch_plan(spec, "/runs/r", Site(python="py")):
        assert "--tee=3" in node.argv and node.env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[rank${rank}]:"
        assert "--log-dir=/runs/r/logs/torchrun" in node.argv  # what it tees is kept in the run, not in /tmp


TORCHRUN_SUMMARY = ("print('[0]:\\n  time      : 2026-01-01_00:00:00\\n  host      : h\\n"
                    "  rank      : 1 (local_rank: 1)\\n  exitcode  : 5 (pid: 42)')")


def test_rank_exits_are_read_from_this_launch_of_the_log_only(tmp_path: Path) -> None:
    """launcher.log is appended across resumes: torchrun's failure summary of the first launch (rank 1 exited 5)
    is not what the second launch, whose agent printed none, says of rank 1."""
    import sys

    run = tmp_path / "run"
    run.mkdir()
    save_spec(Spec(engine=EngineSpec(name="ddp"), nodes=1, gpus_per_node=2, batch_per_worker=8), run)
    log = str(run / "logs" / "launcher.log")
    backend = LocalBackend()
    for body, exits in ((TORCHRUN_SUMMARY, {"1": 5}), ("print('resumed, nothing to report')", None)):
        backend.schedule(LocalRequest(run_dir=run, commands=[[sys.executable, "-c", body]], env={}, log_files=[log]))
        wait_until(lambda: backend.poll(run).state != "RUNNING", timeout_s=60)
        assert read_state(run).get("rank_exits") == exits, Path(log).read_text()
    assert "exitcode  : 5" in backend.logs(run)  # the whole log is still what `launch logs` shows


def _ends(leaver_step: int, lost_step: int) -> list[RankEnd]:
    """Rank 0 lost its peer after step `lost_step`; rank 1 ended cleanly at `leaver_step`."""
    lost = RankEnd(0, 2, lost_step, {"event": "end", "step": lost_step, "reason": "failed", "exit_code": 1},
                   ["train.py raised DistBackendError: Connection reset by peer"], [], True)
    clean = RankEnd(1, 2, leaver_step, {"event": "end", "step": leaver_step, "reason": "completed", "exit_code": 0},
                    [], [])
    return [lost, clean]


def test_a_rank_that_reached_its_last_step_is_not_said_to_have_left(tmp_path: Path) -> None:
    """Rank 1 ran all 10 steps and ended; rank 0 then failed in a last collective of its own: rank 1 left nothing
    early. A rank that ended before the steps its peer reached, or before the planned steps, did."""
    save_spec(Spec(engine=EngineSpec(name="ddp"), nodes=1, gpus_per_node=2, batch_per_worker=8, steps=10), tmp_path)
    assert silent_ranks(tmp_path, _ends(10, 10)) is None  # the run's planned steps, read from its spec
    assert "rank 1 left at step 3" in silent_ranks(tmp_path, _ends(3, 3))  # rank 0 failed in step 4
    assert early_leavers(_ends(10, 10), planned=10) == early_leavers(_ends(10, 9), planned=10) == ""
    assert early_leavers(_ends(3, 7), planned=10).startswith("rank 1 left at step 3 with exit status 0")
    # a script without --steps: a rank that ended where its peer last recorded is named (EARLY_DDP: the peer
    # failed inside step 4); records cannot tell that from a last step
    assert early_leavers(_ends(3, 3)).startswith("rank 1 left at step 3")
