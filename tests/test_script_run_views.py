"""What `launch` says of a user's own script run (`launch --script`) that hangs, fails or is killed, from the
reviewer's scripts of a user review (each copied here as text):

- `launch status` agrees with the run's state: a RUNNING run whose rank 0 has returned does not say "ended"
  (hang.py), and a FAILED run says "failed", not the "interrupted" of the rank its agent stopped (exit3.py);
- the one-line error names the rank when one rank failed ("rank 1: exit3.py exited with status 3");
- `launch report` of a FAILED run with no step records says it failed, with its error and `launch logs RUN`,
  not how to add tracking (fail_rank1.py); so does the report of a killed rank's run (kill9.py);
- a rank killed by a signal (kill9.py: SIGKILL, as the OOM killer sends) is one line naming the rank and the
  signal, not torchrun's ChildFailedError dump;
- `launch logs RUN` shows whole lines under torchrun, whose tee of the ranks' files into the launcher's log
  cut a line written in two parts and merged it with the next (noisy.py); `-f` still follows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import launch, needs_horovod, only_run_dir, read_jsonl
from scalelab.core.waiting import wait_until

ENGINES = ["ddp", pytest.param("horovod", marks=needs_horovod)]
RANK = 'r = os.environ.get("RANK", os.environ.get("HOROVOD_RANK"))\n'

HANG = """import os, time
r = int(os.environ["RANK"])
print(f"rank {r} started", flush=True)
if r == 1:
    while True:
        time.sleep(1)
print(f"rank {r} finished", flush=True)
"""
EXIT3 = "import os, sys, time\n" + RANK + """if r == "1":
    time.sleep(1)
    sys.exit(3)
time.sleep(30)
"""
FAIL_RANK1 = """import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    time.sleep(0.5)
    raise RuntimeError("boom on rank 1: bad batch")
dist.all_reduce(torch.zeros(1))  # rank 0 waits in the collective
"""
KILL9 = "import os, signal, time\n" + RANK + """if r == "1":
    time.sleep(1)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(30)
"""
# noisy.py's effect made certain: each stdout line is written in two parts with a stderr line between them
PARTS = "import os, sys, time\n" + RANK + """for i in range(3):
    print(f"rank {r} line {i} begins", end="", flush=True)
    time.sleep(0.3)
    print(f"rank {r} stderr {i}", file=sys.stderr, flush=True)
    time.sleep(0.3)
    print(" and ends", flush=True)
print(f"rank {r} LAST LINE", flush=True)
"""


def run_script(tmp_path: Path, name: str, body: str, engine: str = "ddp", *extra: str,
               layout: tuple[str, ...] = ("--gpus-per-node", "2")):
    (tmp_path / name).write_text(body)
    return launch("--script", name, "--engine", engine, *layout, *extra, cwd=tmp_path)


def error_line(proc) -> str:
    """The one error line of a failed launch (the progress lines and the ranks' own, tagged, start with '[')."""
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("[")]
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in lines[0], proc.stderr
    return lines[0]


def test_a_running_run_whose_rank_0_returned_does_not_say_it_ended(tmp_path: Path) -> None:
    started = run_script(tmp_path, "hang.py", HANG, "ddp", "--detach")
    assert started.returncode == 0, started.stderr
    run = only_run_dir(tmp_path / "runs")
    try:
        ends = run / "records" / "rank-0.jsonl"
        wait_until(lambda: ends.exists() and any(r.get("event") == "end" for r in read_jsonl(ends)), 120, 0.5)
        status = launch("status", str(run), cwd=tmp_path)
        assert "RUNNING" in status.stdout and "ended" not in status.stdout, status.stdout
    finally:
        assert launch("cancel", str(run), cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_failed_rank_is_named_and_the_status_says_failed(engine: str, tmp_path: Path) -> None:
    said = error_line(run_script(tmp_path, "exit3.py", EXIT3, engine))
    assert "rank 1: exit3.py exited with status 3" in said, said
    run = only_run_dir(tmp_path / "runs")
    status = launch("status", str(run), cwd=tmp_path)
    assert "FAILED" in status.stdout and "ended (failed)" in status.stdout, status.stdout
    assert "interrupted" not in status.stdout, status.stdout


@pytest.mark.slow
def test_the_report_of_a_failed_run_without_step_records_says_it_failed(tmp_path: Path) -> None:
    said = error_line(run_script(tmp_path, "fail_rank1.py", FAIL_RANK1))
    assert "rank 1: fail_rank1.py raised RuntimeError: boom on rank 1: bad batch" in said, said
    run = only_run_dir(tmp_path / "runs")
    lines = [report_line(run, tmp_path)]
    assert "failed" in lines[0] and "boom on rank 1: bad batch" in lines[0], lines[0]
    assert re.search(rf"launch logs \S*{run.name}\b", lines[0]), lines[0]
    assert "track" not in lines[0] and "to measure it" not in lines[0], lines[0]


def report_line(run: Path, where: Path) -> str:
    """The one line `launch report RUN` says of a run it cannot report (exit 2, nothing to read)."""
    report = launch("report", str(run), cwd=where)
    lines = [line for line in report.stderr.splitlines() if line.strip()]
    assert report.returncode == 2 and len(lines) == 1 and "Traceback" not in report.stderr, report.stderr
    return lines[0]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_rank_killed_by_a_signal_is_one_line_naming_it(engine: str, tmp_path: Path) -> None:
    proc = run_script(tmp_path, "kill9.py", KILL9, engine)
    said = error_line(proc)
    run = only_run_dir(tmp_path / "runs")
    assert "rank 1 was killed by SIGKILL (signal 9)" in said and "out of memory?" in said, said
    assert re.search(rf"`launch logs \S*{run.name} --rank 1`", said), said
    assert "ChildFailedError" not in proc.stderr and "last lines of its logs" not in said, said
    assert json.loads((run / "launch.json").read_text())["state"] == "FAILED"
    reported = report_line(run, tmp_path)  # the launcher's line, kept in launch.json: no rank recorded an error
    assert "failed" in reported and "rank 1 was killed by SIGKILL" in reported and "track" not in reported, reported


def whole_lines(text: str, tag: str, rank: int) -> None:
    """Every line of rank `rank` in `text` (tagged `tag`) whole: each stdout line once, its two parts joined;
    each stderr line on its own."""
    mine = [line[len(tag):] for line in text.splitlines() if line.startswith(tag)]
    stdout = [f"rank {rank} line {i} begins and ends" for i in range(3)] + [f"rank {rank} LAST LINE"]
    assert [line for line in mine if "stderr" not in line] == stdout, text
    assert [line for line in mine if "stderr" in line] == [f"rank {rank} stderr {i}" for i in range(3)], text


TWO_NODES = ("--nodes", "2", "--gpus-per-node", "1")  # two torchrun agents: each rank is local rank 0 of its own


@pytest.mark.parametrize("engine, layout, tags", [
    ("ddp", ("--gpus-per-node", "2"), ("[rank0]:", "[rank1]:")),
    ("ddp", TWO_NODES, ("[rank0]:", "[rank1]:")),  # the global rank, from the rank's start record
    pytest.param("horovod", ("--gpus-per-node", "2"), ("[0]<stdout>:", "[1]<stdout>:"), marks=needs_horovod),
])
@pytest.mark.slow
def test_the_combined_log_shows_whole_lines_and_follows(engine: str, layout: tuple[str, ...], tags: tuple[str, str],
                                                        tmp_path: Path) -> None:
    started = run_script(tmp_path, "parts.py", PARTS, engine, "--detach", layout=layout)
    assert started.returncode == 0, started.stderr
    run = only_run_dir(tmp_path / "runs")
    followed = launch("logs", str(run), "-f", cwd=tmp_path)  # until the run ends
    assert followed.returncode == 0 and re.search(r"\[end\] .*: COMPLETED", followed.stdout), followed.stdout
    logs = launch("logs", str(run), cwd=tmp_path)
    assert logs.returncode == 0, logs.stderr
    for rank, tag in enumerate(tags):
        err = tag.replace("stdout", "stderr")
        for text in (followed.stdout, logs.stdout):
            whole_lines("\n".join(line.replace(err, tag) for line in text.splitlines()), tag, rank)
    one = launch("logs", str(run), "--rank", "1", cwd=tmp_path)
    assert "rank 1 line 0 begins and ends" in one.stdout and "rank 0 line" not in one.stdout, one.stdout
