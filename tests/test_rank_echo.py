"""The ranks' output on the launcher's terminal while it follows a run (scalelab/launcher/echo.py): every whole
line once, tagged `[rankR]:` on every engine, a rank's stderr on stderr, `--rank-output` choosing the ranks, a
resume showing its own launch's lines only. Before, `launch --script train.py` showed a progress bar and the
table: the script's own prints needed `launch logs RUN -f` in a second terminal.

The engines on the local backend run for real here; the Slurm and AWS files are checked in
tests/test_own_script_slurm.py and tests/test_own_script_aws.py, with their real runs."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from scalelab.core.errors import SpecError
from scalelab.launcher.backend import RankOutput
from scalelab.launcher.echo import RankEcho, parse_rank_output, sizes_before
from tests.conftest import launch, needs_horovod, only_run_dir

ENGINES = ["ddp", pytest.param("horovod", marks=needs_horovod)]

# prints a line in two parts (the end comes a moment later), a line to stderr, then fails on rank 1
SCRIPT = """\
import os, sys, time
from scalelab import track
rank = os.environ.get("RANK") or os.environ.get("HOROVOD_RANK")
for i in range(4):
    print(f"out {i} ", end="", flush=True)
    time.sleep(0.1)
    print("whole", flush=True)
    print(f"err {i}", file=sys.stderr, flush=True)
    track.step(items=8, loss=1.0 / (i + 1))
"""


class Files:
    """A backend stand-in that names the files its test writes."""

    name = "local"

    def __init__(self, outputs: list[RankOutput] | None) -> None:
        self.outputs = outputs

    def rank_output_files(self, run_dir: Path) -> list[RankOutput] | None:
        return self.outputs


def echo_of(outputs: list[RankOutput] | None, ranks=(0, 1), before=None) -> tuple[RankEcho, list[tuple[str, bool]]]:
    said: list[tuple[str, bool]] = []
    echo = RankEcho(Files(outputs), Path("."), ranks, before or {}, lambda text, err: said.append((text, err)))
    return echo, said


def test_whole_lines_once_tagged_and_a_line_being_written_waits_for_its_end(tmp_path: Path) -> None:
    out, err = tmp_path / "stdout.log", tmp_path / "stderr.log"
    out.write_text("a\nb ")
    err.write_text("oops\n")
    echo, said = echo_of([RankOutput(out, "[rank1]:"), RankOutput(err, "[rank1]:", err=True)])
    echo.tick()
    assert said == [("[rank1]:a\n", False), ("[rank1]:oops\n", True)]
    with open(out, "a") as f:
        f.write("end\nc")
    echo.tick()
    assert said[2:] == [("[rank1]:b end\n", False)]
    echo.tick()
    assert said[3:] == []  # nothing new: nothing again
    echo.close()
    assert said[3:] == [("[rank1]:c\n", False)]  # the run ended: the last line as it is


def test_lines_that_carry_their_rank_are_retagged_and_the_launchers_own_are_not_shown(tmp_path: Path) -> None:
    log = tmp_path / "launcher.log"
    log.write_text("[0]<stdout>:hvd out\n[1]<stderr>:hvd err\n[1,3]<stdout>:mpirun out\n[rank2]:torchrun tee\n"
                   "horovodrun's own line\n")
    echo, said = echo_of([RankOutput(log)], ranks=(0, 1, 2, 3))
    echo.close()
    assert said == [("[rank0]:hvd out\n[rank3]:mpirun out\n[rank2]:torchrun tee\n", False), ("[rank1]:hvd err\n", True)]


def test_horovodruns_exit_word_after_a_ranks_unended_line_is_neither_shown_nor_missed(tmp_path: Path) -> None:
    """A rank's last output without its newline, then horovodrun's "Process R exit with status code N." on the
    same line of its log: the rank's part is shown alone, and the exit status is still read (it went unread, and
    `[rank0]:partial lineProcess 0 exit with status code 143.` was shown)."""
    from scalelab.launcher.backend import reported_exits

    log = tmp_path / "launcher.log"
    text = ("[1]<stdout>:partial lineProcess 1 exit with status code 5.\n"
            "[0]<stdout>:50%Process 0 exit with status code 143.\nProcess 2 exit with status code 1.\n")
    log.write_text(text)
    echo, said = echo_of([RankOutput(log)], ranks=(0, 1, 2))
    echo.close()
    assert said == [("[rank1]:partial line\n[rank0]:50%\n", False)]
    assert reported_exits(text) == {1: 5, 0: 143, 2: 1}


def test_only_the_chosen_ranks_and_only_what_came_after_the_launch(tmp_path: Path) -> None:
    zero, one = tmp_path / "0.log", tmp_path / "1.log"
    zero.write_text("old line of an earlier launch\n")
    one.write_text("")
    before = sizes_before(tmp_path)
    with open(zero, "a") as f:
        f.write("new\n")
    one.write_text("rank one\n")
    echo, said = echo_of([RankOutput(zero, "[rank0]:"), RankOutput(one, "[rank1]:")], ranks=(0,), before=before)
    echo.close()
    assert said == [("[rank0]:new\n", False)]


def test_skipped_lines_a_file_rewritten_shorter_and_no_files_here(tmp_path: Path) -> None:
    task = tmp_path / "0_log.out"
    task.write_text("submitit INFO (2026-12-06 10:00:00,000) - Starting with JobEnvironment\nmine\n")
    echo, said = echo_of([RankOutput(task, "[rank0]:", skip=lambda line: line.startswith("submitit INFO"))])
    echo.tick()
    task.write_text("x\n")  # shorter than what was shown: nothing of it shown twice, what comes after it is
    echo.tick()
    with open(task, "a") as f:
        f.write("after\n")
    echo.close()
    assert said == [("[rank0]:mine\n", False), ("[rank0]:after\n", False)]
    echo, said = echo_of(None)  # Kubernetes: the output is not on this machine
    echo.tick()
    echo.tick()
    assert len(said) == 1 and said[0][1] and "launch logs" in said[0][0] and "-f" in said[0][0]


@pytest.mark.parametrize("value, ranks", [("all", {0, 1, 2}), ("none", set()), ("0", {0}), ("2,0", {0, 2}),
                                          (" ALL ", {0, 1, 2})])
def test_rank_output_values(value: str, ranks: set[int]) -> None:
    assert parse_rank_output(value, 3) == ranks


@pytest.mark.parametrize("value, said", [("3", "the run has ranks 0..2, not 3"), ("-1", "not -1"),
                                         ("zero", "give all, none, or ranks such as 0 or 0,3"),
                                         ("", "give all, none")])
def test_a_bad_rank_output_is_named(value: str, said: str) -> None:
    with pytest.raises(SpecError, match=said):
        parse_rank_output(value, 3)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.slow
def test_a_scripts_prints_reach_the_terminal_tagged_with_their_rank(engine: str, tmp_path: Path) -> None:
    (tmp_path / "talk.py").write_text(SCRIPT)
    proc = launch("--script", "talk.py", "--engine", engine, "--gpus-per-node", "2", "--runs-dir", "runs",
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert [line for line in proc.stdout.splitlines() if line.startswith(f"[rank{rank}]:")] == [
            f"[rank{rank}]:out {i} whole" for i in range(4)], proc.stdout
        assert [line for line in proc.stderr.splitlines() if line.startswith(f"[rank{rank}]:")] == [
            f"[rank{rank}]:err {i}" for i in range(4)], proc.stderr
    assert "run directory: runs/" in proc.stdout  # the summary still follows

    quiet = launch("--script", "talk.py", "--engine", engine, "--gpus-per-node", "2", "--runs-dir", "quiet",
                   "--rank-output", "1", cwd=tmp_path)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert "[rank0]:" not in quiet.stdout + quiet.stderr and "[rank1]:out 3 whole" in quiet.stdout


def test_the_one_process_of_single_is_rank_0_and_its_traceback_is_the_scripts_own(tmp_path: Path) -> None:
    """The traceback starts at the script's frame, as `python fails.py` prints it: the runner's and runpy's
    frames before it were five lines of scalelab's own in every failing script's output."""
    (tmp_path / "fails.py").write_text("print('before', flush=True)\nraise ValueError('boom')\n")
    proc = launch("--script", "fails.py", "--engine", "single", "--runs-dir", "runs", cwd=tmp_path)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()  # single: the process's stderr goes into its one log with its stdout
    at = lines.index("[rank0]:Traceback (most recent call last):")
    assert lines[at - 1:at + 5] == ["[rank0]:before", "[rank0]:Traceback (most recent call last):",
                                    f'[rank0]:  File "{tmp_path / "fails.py"}", line 2, in <module>',
                                    "[rank0]:    raise ValueError('boom')", "[rank0]:ValueError: boom"], proc.stdout
    assert "launch: error: fails.py raised ValueError: boom" in proc.stderr, proc.stderr


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.slow
def test_a_resume_shows_only_its_own_launchs_lines(engine: str, tmp_path: Path) -> None:
    """horovodrun appends to the run's one log and torchrun starts new files: neither shows the first launch's
    lines again."""
    (tmp_path / "twice.py").write_text(  # saved once both ranks are past their start (`resumed`: a saved folder)
        "import os, sys, time\nfrom pathlib import Path\nfrom scalelab import track\n"
        "rank = os.environ.get('RANK') or os.environ['HOROVOD_RANK']\n"
        "print('resumed' if track.resumed else 'first', flush=True)\n"
        "track.step(items=8, loss=1.0)\n"
        "if not track.resumed:\n"
        "    Path(f'up-{rank}').touch()\n"
        "    while rank == '0' and not all(Path(f'up-{r}').exists() for r in '01'):\n"
        "        time.sleep(0.05)\n"
        "    if rank == '0':\n"
        "        (Path(track.checkpoint_dir) / 'saved').write_text('x')\n"
        "    while not (Path(track.checkpoint_dir) / 'saved').exists():\n"
        "        time.sleep(0.05)\n"
        "    sys.exit(3)\n")
    first = launch("--script", "twice.py", "--engine", engine, "--gpus-per-node", "2", "--warmup-steps", "0",
                   "--runs-dir", "runs", cwd=tmp_path)
    assert first.returncode == 1 and "[rank0]:first" in first.stdout.splitlines(), (first.stdout, first.stderr)
    run_dir = only_run_dir(tmp_path / "runs")
    again = launch("resume", str(run_dir), cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    shown = [line for line in again.stdout.splitlines() if line.startswith("[rank")]
    assert sorted(shown) == ["[rank0]:resumed", "[rank1]:resumed"], again.stdout
    assert json.loads((run_dir / "launch.json").read_text())["state"] == "COMPLETED"


def test_rank_output_with_detach_or_out_of_range_is_refused_before_anything_starts(tmp_path: Path) -> None:
    (tmp_path / "talk.py").write_text(SCRIPT)
    for args, said in [(("--detach", "--rank-output", "0"), "with --detach nothing follows it"),
                       (("--rank-output", "2"), "--rank-output '2': the run has ranks 0..1, not 2")]:
        proc = launch("--script", "talk.py", "--gpus-per-node", "2", "--runs-dir", "runs", *args, cwd=tmp_path)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stdout_is_the_terminal", [True, False])
def test_lines_go_above_a_live_bar_on_a_terminal_and_to_stdout_itself_elsewhere(stdout_is_the_terminal, tmp_path,
                                                                               monkeypatch) -> None:
    """`launch ... > out.txt` with the bar on the terminal keeps the lines in out.txt; on the terminal they are
    printed above the bar (through rich's stand-in for stdout), which stays at the bottom."""
    from rich.console import Console

    from scalelab.launcher.progress import RunProgress

    stdout = Terminal() if stdout_is_the_terminal else io.StringIO()
    monkeypatch.setattr(sys, "stdout", stdout)
    screen = io.StringIO()
    with RunProgress(tmp_path, 10, "run", console=Console(file=screen, force_terminal=True, width=80)) as prog:
        prog.write_above("[rank0]:hello\n")
    assert ("[rank0]:hello" in screen.getvalue()) == stdout_is_the_terminal, screen.getvalue()
    assert stdout.getvalue() == ("" if stdout_is_the_terminal else "[rank0]:hello\n")


def test_a_multi_node_runs_outputs_are_tagged_by_their_start_records_read_once(tmp_path: Path) -> None:
    """Two emulated nodes, each torchrun agent's local rank 0: the global rank is the one whose `start` record
    names the file, learnt as the records come (rank 1's start arrives later). What was read is not read again:
    the echo asks every second, and a run's records grow with every step (read whole, O(steps) a second)."""
    from scalelab.core.spec import Spec, save_spec
    from scalelab.launcher.local import rank_outputs

    run = tmp_path / "run"
    run.mkdir()
    save_spec(Spec(model="nmt-tiny", nodes=2, gpus_per_node=1).validate(), run)
    files = []
    for node in ("a", "b"):
        folder = run / "logs" / "torchrun" / node / "attempt_0" / "0"
        folder.mkdir(parents=True)
        (folder / "stdout.log").write_text("hello\n")
        files.append(folder / "stdout.log")
    (run / "records").mkdir()
    rank0, rank1 = run / "records" / "rank-0.jsonl", run / "records" / "rank-1.jsonl"
    start = {"kind": "start", "world": 2, "time": 1.0}
    rank0.write_text(json.dumps({**start, "rank": 0, "stdout": str(files[0])}) + "\n")
    rank1.write_text("")
    assert [tag for tag, _ in rank_outputs(run)] == ["[rank0]:", "[default0]:"]
    with open(rank1, "a") as f:
        f.write(json.dumps({**start, "rank": 1, "stdout": str(files[1])}) + "\n")
    rank0.write_text("x" * len(rank0.read_text()))  # already read: a rewrite in place is not read again
    assert [tag for tag, _ in rank_outputs(run)] == ["[rank0]:", "[rank1]:"]
