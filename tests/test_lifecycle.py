"""The run lifecycle's parts on their own: launch.json state, the record readers, the follow loop.

The follow loop runs the real local backend on tiny processes (no training), so exit codes, the
state it records and the interruption path are checked in a second each; the end-to-end versions
with real ranks are in test_local_runs.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from scalelab.core.errors import RecordError
from scalelab.core.procs import run_processes
from scalelab.core.records import (
    RecordTail,
    rank_from_env,
    read_errors,
    read_records,
    record_error,
)
from scalelab.core.rundir import read_state, record_state, start_state, update_state
from scalelab.launcher.local import LocalBackend, LocalRequest
from scalelab.launcher.runner import Interrupted, failure, wait


def test_an_earlier_end_wins_and_a_live_state_never_overwrites_it(tmp_path: Path) -> None:
    start_state(tmp_path, backend="local", pids=[])
    assert read_state(tmp_path)["run_dir"] == str(tmp_path.absolute()) and "state" not in read_state(tmp_path)
    assert record_state(tmp_path, "RUNNING", "pids [1]") == "RUNNING" and "ended" not in read_state(tmp_path)
    assert record_state(tmp_path, "CANCELLED", "launch cancel") == "CANCELLED"
    ended = read_state(tmp_path)["ended"]
    assert record_state(tmp_path, "RUNNING", "a late poll") == "CANCELLED"
    assert record_state(tmp_path, "FAILED", "exit codes [143]", exit_codes=[143]) == "CANCELLED"
    info = read_state(tmp_path)
    assert info["detail"] == "launch cancel" and info["ended"] == ended and info["exit_codes"] == [143]
    assert update_state(tmp_path, records=True)["records"] is True
    with pytest.raises(ValueError, match="not a run state"):
        record_state(tmp_path, "DONE")
    start_state(tmp_path, backend="local", pids=[])  # a resume starts afresh
    assert "state" not in read_state(tmp_path)


def test_a_run_directory_without_launch_json_says_so(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="never launched"):
        read_state(tmp_path)
    (tmp_path / "launch.json").write_text("{not json")
    with pytest.raises(RecordError, match="launch.json .* is corrupt"):
        read_state(tmp_path)



def _step(n: int) -> str:
    """A minimal step record that fits its kind (scalelab/core/records.py KINDS)."""
    return ('{"kind": "step", "rank": 0, "world": 1, "time": 1.0, "step": %d, "warmup": false, "step_s": 0.1, '
            '"samples": 8, "words": 80}' % n)


def _val() -> str:
    return '{"kind": "val", "rank": 0, "world": 1, "time": 1.0, "step": 1, "epoch": 0, "val_loss": 1.0, "elapsed_s": 1.0}'


def test_record_tail_takes_complete_lines_skips_bad_ones_and_rereads_a_rewritten_file(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    tail = RecordTail(path)
    assert tail.read() == []  # not written yet
    two = _step(2)
    path.write_text(_step(1) + "\n" + two[:20])
    assert [r["step"] for r in tail.read()] == [1]
    with path.open("a") as f:
        f.write(two[20:] + "\nnot json\n" + _step(3) + "\n")
    assert [r["step"] for r in tail.read()] == [2, 3] and "dropped a line with not a JSON object" in tail.warnings[0]
    path.write_text(_step(1) + "\n")  # rewritten shorter (the AWS mirror merging generations)
    assert [r["step"] for r in tail.read()] == [1]


def test_strict_and_tolerant_reading(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    path.write_text(_step(1) + '\n{"no": "kind"}\n' + _val() + '\n{"kind": "st')
    with pytest.raises(RecordError, match=r"rank-0.jsonl:2 \(no 'kind' field\)"):
        read_records(path, [])
    warnings: list[str] = []
    assert [r["kind"] for r in read_records(path, warnings, tolerant=True)] == ["step", "val"]
    assert len(warnings) == 2 and "truncated last line" in warnings[1]


def test_rank_from_the_launchers_environment() -> None:
    assert rank_from_env({"RANK": "3", "WORLD_SIZE": "4"}) == (3, 4)
    assert rank_from_env({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}) == (1, 2)
    assert rank_from_env({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8"}) == (5, 8)
    assert rank_from_env({"SLURM_PROCID": "2", "SLURM_NTASKS": "4"}) == (2, 4)
    assert rank_from_env({}) == (0, 1)


def test_error_records_since_a_launch(tmp_path: Path, capsys) -> None:
    record_error(tmp_path, "data file not found: a.txt", {"RANK": "1", "WORLD_SIZE": "2"})
    assert "scalelab: error: data file not found: a.txt" in capsys.readouterr().err
    (rec,) = read_errors(tmp_path)
    assert rec["kind"] == "error" and rec["rank"] == 1 and rec["world"] == 2
    assert read_errors(tmp_path, since=rec["time"] + 1) == []  # an earlier launch's error is not this one's


def _local_run(tmp_path: Path, *commands: str) -> tuple[LocalBackend, Path]:
    """The local backend started on small Python commands instead of ranks; their command lines end in
    `-m scalelab.train RUN_DIR` as a rank's do (the backend signals no process that does not name its run)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    backend = LocalBackend({"stop_grace_s": 5})
    request = LocalRequest(run_dir.absolute(), [[sys.executable, "-c", c, "-m", "scalelab.train", str(run_dir.absolute())]
                                                for c in commands], {},
                           [str(run_dir.absolute() / "logs" / f"node-{i}.log") for i in range(len(commands))])
    backend.schedule(request)
    return backend, run_dir


def test_the_follow_loop_stops_the_other_nodes_when_one_fails(tmp_path: Path) -> None:
    backend, run_dir = _local_run(tmp_path, "import time; time.sleep(60)", "print('node 1 gives up'); raise SystemExit(3)")
    status = wait(backend, run_dir)
    assert status.state == "FAILED" and "3" in status.detail
    info = read_state(run_dir)
    assert info["state"] == "FAILED" and info["ended"] >= info["started"]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in info["pids"])
    message = str(failure(backend, run_dir, status))  # no error record: the end of the logs
    assert "last lines of its logs" in message and "node 1 gives up" in message


def test_a_stop_signal_cancels_the_run_and_restores_the_handlers(tmp_path: Path) -> None:
    backend, run_dir = _local_run(tmp_path, "import time; time.sleep(60)")
    before = signal.getsignal(signal.SIGTERM)
    ticks: list[int] = []

    def tick() -> None:
        ticks.append(1)
        if len(ticks) == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Interrupted) as stopped:
        wait(backend, run_dir, on_tick=tick)
    assert stopped.value.exit_code == 143 and signal.getsignal(signal.SIGTERM) is before
    info = json.loads((run_dir / "launch.json").read_text())
    assert info["state"] == "CANCELLED" and "SIGTERM" in info["detail"]
    assert not psutil.pid_exists(info["pids"][0])


@pytest.mark.slow
def test_cancel_finds_orphaned_ranks_kills_what_ignores_sigterm_and_says_what_it_checked(tmp_path: Path) -> None:
    """Node 0 starts a "rank" in a session of its own (as torchrun does) that ignores SIGTERM, then
    exits: the rank is re-parented. Cancel finds it by its command line, SIGKILLs it after the grace
    period and looks again; the run's processes are verified, never taken from `pids` alone."""
    from scalelab.launcher.runner import cancel

    ready = tmp_path / "rank-ignores-sigterm"  # touched once SIG_IGN is installed, not merely once it has exec'd
    rank = ("import pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)")
    node = (f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {rank!r}, *sys.argv[1:]], "
            "start_new_session=True)")
    backend, run_dir = _local_run(tmp_path, node)
    info = read_state(run_dir)
    assert [p["pid"] for p in info["processes"]] == info["pids"] and info["processes"][0]["cmdline"][-1] == str(run_dir)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (backend.poll(run_dir).state == "RUNNING" or not backend.busy(run_dir)):
        time.sleep(0.1)  # until the node has exited, leaving its rank behind
    while time.monotonic() < deadline and not ready.exists():
        time.sleep(0.1)  # a rank that has exec'd but not yet ignored SIGTERM would die of it, with another detail
    assert ready.exists(), "the rank did not install its SIGTERM handler within 30 s"
    orphan = run_processes(run_dir, ("-m", "scalelab.train"))
    assert len(orphan) == 1 and orphan[0].ppid() != os.getpid()
    assert backend.status(run_dir).state == "RUNNING"  # found by its command line, not by `pids`
    said = cancel(backend, run_dir, "test")
    assert said.state == "CANCELLED" and said.detail.startswith("stopped "), said
    assert said.detail == "stopped 1 process (1 after SIGKILL); none left"
    assert read_state(run_dir)["stopped"] == said.detail
    assert LocalBackend().busy(run_dir) is None


def test_how_a_run_ended_is_read_from_its_records_when_no_launcher_saw_it(tmp_path: Path) -> None:
    from scalelab.core.records import RecordWriter
    from scalelab.launcher.backend import ended_by_records

    def ranks(*ends: dict | None, world: int = 2) -> Path:
        run = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
        for rank, end in enumerate(ends):
            out = RecordWriter(run, rank, world)
            out.write("start")
            out.write("step", step=1, warmup=True, step_s=0.1, samples=8, words=80)
            if end is not None:
                if end.get("reason") == "interrupted":
                    out.event("interrupted", step=1, signal=None, **({"cause": "its launcher (pid 7) is gone"} if rank else {}))
                out.event("end", step=1, **end)
            out.close()
        return run

    assert ended_by_records(tmp_path / "nothing", None) is None
    assert ended_by_records(ranks({"reason": "steps"}, {"reason": "steps"}), None).state == "COMPLETED"
    stopped = ended_by_records(ranks({"reason": "interrupted"}, {"reason": "interrupted"}), None)
    assert stopped.state == "CANCELLED" and "its launcher (pid 7) is gone" in stopped.detail and "launch resume" in stopped.detail
    killed = ended_by_records(ranks({"reason": "steps"}, None), None)
    assert killed.state == "FAILED" and "rank 1 after step 1 stopped with no error and no end record" in killed.detail
    missing = ended_by_records(ranks({"reason": "steps"}, world=2), None)
    assert missing.state == "FAILED" and "rank 1 before its first step" in missing.detail
    run = ranks({"reason": "steps"}, {"reason": "steps"})
    assert ended_by_records(run, since=time_after(run)) is None  # an earlier launch's records are not this one's


def time_after(run: Path) -> float:
    return max(json.loads(line)["time"] for path in (run / "records").glob("*.jsonl")
               for line in path.read_text().splitlines()) + 1


def test_a_sweep_report_names_the_layouts_that_did_not_finish(tmp_path: Path) -> None:
    from scalelab.analysis.results import finished_layouts
    from scalelab.core.rundir import write_json

    sweep = tmp_path / "sweep"
    for name, state in (("1x1", "COMPLETED"), ("1x2", "CANCELLED"), ("1x4", None)):
        (sweep / name).mkdir(parents=True)
        (sweep / name / "spec.json").write_text("{}")
        if state:
            start_state(sweep / name, backend="local")
            record_state(sweep / name, state, "interrupted (SIGINT to the launcher)")
    write_json(sweep / "sweep.json", {"runs": ["1x1", "1x2", "1x4"]})
    done, warnings = finished_layouts(sweep)
    assert done == [sweep / "1x1"] and len(warnings) == 2
    assert "layout 1x2" in warnings[0] and "cancelled: interrupted (SIGINT" in warnings[0]
    assert "1x4" in warnings[1] and "never started" in warnings[1] and f"launch resume {sweep}" in warnings[1]
    record_state(sweep / "1x1", "RUNNING")  # an end recorded earlier wins
    (sweep / "1x1" / "launch.json").write_text(json.dumps({"state": "FAILED"}))
    with pytest.raises(RecordError, match="no layout of the sweep .* has finished yet .*1x1 failed"):
        finished_layouts(sweep)


def test_a_failed_layout_is_named_by_its_error_not_the_agents_exit_code(tmp_path: Path) -> None:
    """A script's rank exited 3; torchrun's agent exited 1: the sweep's report said "failed: exit codes [1]"."""
    from scalelab.analysis.results import finished_layouts
    from scalelab.core.rundir import update_state, write_json

    sweep = tmp_path / "sweep"
    (sweep / "1x2").mkdir(parents=True)
    (sweep / "1x2" / "spec.json").write_text("{}")
    start_state(sweep / "1x2", backend="local")
    record_state(sweep / "1x2", "FAILED", "exit codes [1]")
    update_state(sweep / "1x2", error="rank 1: train.py exited with status 3")
    write_json(sweep / "sweep.json", {"runs": ["1x2"]})
    with pytest.raises(RecordError, match=r"1x2 failed: rank 1: train.py exited with status 3\)"):
        finished_layouts(sweep)
