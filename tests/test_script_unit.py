"""Issue 34: a --script run counts its own items (`track.unit("images")`), and every place that shows its
throughput says that unit: the report in the terminal, Markdown, JSON and HTML, the sweep's report, `launch ls`,
`launch status`'s progress line and `launch plan`. They said "words/s" of a script's images. And `--repeats`
with `--script`, until then only checked in a dry run, runs for real here: two repeats of two layouts, local
ranks (a plain Python script: it records with `scalelab.track` and needs no PyTorch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import copy_made_once, launch, read_jsonl

SCRIPT = """\
import time
from scalelab import track

track.unit("images")
for i in range(12):
    time.sleep(0.02)
    track.step(items=32, loss=2.0 - 0.05 * i)
"""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[Path, Path, str]:
    """(working directory, sweep directory, the sweep's own output): 1 and 2 ranks, 2 repeats each. The sweep
    (4 runs, 6 ranks) is made once in the pytest run (conftest's made_once); each worker's module reads its own
    copy, as its reports write into the sweep's directory."""
    def make(cwd: Path) -> Path:
        (cwd / "imgs.py").write_text(SCRIPT)
        proc = launch("sweep", "--script", "imgs.py", "--engine", "ddp", "--workers", "1,2", "--repeats", "2",
                      "--warmup-steps", "2", "--device", "cpu", cwd=cwd, env={"COLUMNS": "100"})
        assert proc.returncode == 0, proc.stderr
        (cwd / "sweep-output.txt").write_text(proc.stdout)
        return cwd

    cwd = copy_made_once(tmp_path_factory, ["script-unit-sweep", SCRIPT], make, "unit")
    (sweep_dir,) = (cwd / "runs").glob("sweep-imgs.py-*")
    return cwd, sweep_dir, (cwd / "sweep-output.txt").read_text()


def test_repeats_of_a_script_run_for_real_each_recording_its_steps(sweep):
    _, sweep_dir, _ = sweep
    runs = sorted(p.name for p in sweep_dir.iterdir() if p.is_dir())
    assert runs == ["1x1-r0", "1x1-r1", "1x2-r0", "1x2-r1"]
    for name in runs:
        run = sweep_dir / name
        ranks = 2 if name.startswith("1x2") else 1
        for rank in range(ranks):
            steps = [r for r in read_jsonl(run / "records" / f"rank-{rank}.jsonl") if r["kind"] == "step"]
            assert [r["step"] for r in steps] == list(range(1, 13)) and all(r["samples"] == 32 for r in steps)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["unit"] == "images" and summary["workers"] == ranks and summary["words_per_s"] > 0, summary


@pytest.mark.slow
def test_the_sweeps_report_says_images_per_second(sweep):
    _, sweep_dir, out = sweep
    header = next(line for line in out.splitlines() if "workers" in line)
    assert "images/s" in out and "words/s" not in out, out
    assert "samples/s" not in header  # a script's samples are its items: the same figure again
    markdown = (sweep_dir / "report.md").read_text()
    table_header = next(line for line in markdown.splitlines() if line.startswith("| label"))
    assert "images/s" in table_header and "words/s" not in table_header, table_header


@pytest.mark.slow
def test_report_json_markdown_and_html_carry_the_unit(sweep):
    cwd, sweep_dir, _ = sweep
    rows = json.loads(launch("report", str(sweep_dir), "--format", "json", cwd=cwd).stdout)
    assert len(rows) == 4 and all(r["unit"] == "images" for r in rows), rows
    md = launch("report", str(sweep_dir), "--format", "markdown", cwd=cwd).stdout
    assert "| images/s |" in md and "words/s" not in md.split("## Definitions")[0], md
    html = launch("report", str(sweep_dir), "--format", "html", cwd=cwd)
    assert html.returncode == 0, html.stderr
    page = Path(html.stdout.strip().splitlines()[-1]).read_text()
    assert "images/s" in page and "UserWarning" not in html.stderr, html.stderr


def test_ls_and_status_show_the_runs_unit(sweep):
    cwd, sweep_dir, _ = sweep
    listed = launch("ls", "--runs-dir", str(cwd / "runs"), cwd=cwd, env={"COLUMNS": "100"})
    assert listed.returncode == 0, listed.stderr
    assert "images/s" in listed.stdout.splitlines()[0] and "words/s" not in listed.stdout, listed.stdout
    (row,) = json.loads(launch("ls", "--runs-dir", str(cwd / "runs"), "--format", "json", cwd=cwd).stdout)
    assert row["unit"] == "images" and all(r["unit"] == "images" for r in row["layouts"]), row
    status = launch("status", str(sweep_dir / "1x2-r0"), cwd=cwd, env={"COLUMNS": "100"})
    assert status.returncode == 0 and "images/s" in status.stdout and "words/s" not in status.stdout, status.stdout


def test_plan_says_the_runs_unit(sweep):
    cwd, sweep_dir, _ = sweep
    plan = launch("plan", str(sweep_dir), "--rate", "2.5", cwd=cwd, env={"COLUMNS": "100"})
    assert plan.returncode == 0, plan.stderr
    assert "Predicted throughput per second (images/s)" in plan.stdout and "words/s" not in plan.stdout, plan.stdout


def test_rows_of_several_units_name_each_rows_unit():
    """A report of a built-in run (words) and a script run (images) together: one "items/s" column and each
    row's unit beside it, not one unit claimed for both."""
    from test_trust import summary

    from scalelab.analysis.report import table_rows, throughput_header
    from scalelab.analysis.scaling import scale_layouts

    df = scale_layouts([summary(1, 1000.0, label="builtin"), summary(1, 500.0, label="mine")])
    df.loc[df["label"] == "mine", "unit"] = "images"
    assert throughput_header(df) == "items/s"
    headers, rows = table_rows(df)
    unit = headers.index("unit")
    assert headers[unit - 1] == "items/s" and sorted(r[unit] for r in rows) == ["images", "words"], (headers, rows)
    assert throughput_header(df[df["label"] == "builtin"]) == "words/s"


def test_ls_rows_of_several_units_say_each_cells_unit():
    """`launch ls` over a built-in run and a script run: the column is "throughput" and each cell names its unit per second."""
    import io

    from rich.console import Console

    from scalelab.launcher.cli import rows_table

    base = {"kind": "run", "backend": "local", "layout": "1x1", "state": "COMPLETED", "steps": 12, "total_steps": 12,
            "loss": None, "eta_s": None, "cost_usd": None, "age_s": 5.0}
    rows = [{**base, "name": "nmt-tiny-ddp-1x1", "words_per_s": 9179.0, "unit": "words"},
            {**base, "name": "imgs.py-ddp-1x1", "words_per_s": 1582.0, "unit": "images"}]
    console = Console(file=io.StringIO(), width=100, color_system=None)
    console.print(rows_table(rows, None, 100))
    out = console.file.getvalue()
    assert "throughput" in out.splitlines()[0] and "9,179 words/s" in out and "1,582 images/s" in out, out
    one = Console(file=io.StringIO(), width=100, color_system=None)
    one.print(rows_table(rows[1:], None, 100))
    assert "images/s" in one.file.getvalue().splitlines()[0], one.file.getvalue()


def test_a_peers_stop_note_of_an_earlier_launch_is_not_a_stop_of_this_one(tmp_path) -> None:
    """A resumed rank 0 that ended before rank 1 had started (and removed its note of the launch before) took
    that note as a stop of this launch: exit 143, and horovodrun ended rank 1 (a CI run of
    test_rank_echo.py::test_a_resume_shows_only_its_own_launchs_lines[horovod])."""
    from scalelab.train.script import stop_note, stopped_peer

    (tmp_path / "records").mkdir()
    stop_note(tmp_path, 1).write_text(json.dumps({"rank": 1, "signal": 15, "step": 1, "time": 1000.0}))
    assert stopped_peer(tmp_path, 0, 2, since=1001.0) is None  # written before this rank started: the last launch's
    assert stopped_peer(tmp_path, 0, 2, since=999.0) == 1  # this launch's
    stop_note(tmp_path, 1).write_text("cut")  # unreadable: its mtime (now) decides
    assert stopped_peer(tmp_path, 0, 2, since=1001.0) == 1


def test_a_workers_sigchld_pending_with_the_stop_is_the_stops_not_the_scripts(tmp_path, monkeypatch):
    """A cancel signals the rank, then its DataLoader workers; a worker's SIGCHLD pending with the rank's SIGTERM
    ran torch's handler at the stop handler's first call, before the handler had replaced it: its "DataLoader worker
    (pid N) is killed by signal: Terminated" became the rank's end (failed, exit 1) in CI. That error is now the
    stop's: the replacement is made again and the stop goes on (SystemExit 143, the stop recorded). Any other
    RuntimeError is still raised."""
    import signal

    from scalelab.train import script, track

    calls = []

    def quiet(any_handler: bool = False) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Terminated. ")

    monkeypatch.setattr(script, "quiet_worker_deaths", quiet)
    monkeypatch.setattr(track, "_state", track._State())
    stops = script.StopSignals(tmp_path, 0)
    with pytest.raises(SystemExit) as ended:
        stops(signal.SIGTERM, None)
    assert ended.value.code == script.INTERRUPTED and len(calls) == 2 and track._state.stop == signal.SIGTERM

    def broken(any_handler: bool = False) -> None:
        raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Segmentation fault. ")

    monkeypatch.setattr(script, "quiet_worker_deaths", broken)
    with pytest.raises(RuntimeError, match="Segmentation fault"):
        script.StopSignals(tmp_path, 0)(signal.SIGTERM, None)


def test_a_second_stop_delivered_inside_the_scripts_handler_is_a_repeat_not_its_call(tmp_path, monkeypatch):
    """A cancel's SIGTERM and torchrun's agent's reached a rank together; the second arrived while the script's own
    handler ran, was taken for the script calling the handler it replaced, and ended the rank (SystemExit 143) before
    the script's save (a CI run of stop 67: test_own_script_exits' cancel case, its handled-1 file empty). It is
    swallowed as a repeat now; a real call from the script's handler still gets the runner's action."""
    import signal
    import sys

    from scalelab.train import script, track

    monkeypatch.setattr(script, "quiet_worker_deaths", lambda any_handler=False: None)
    monkeypatch.setattr(track, "_state", track._State())
    stops = script.StopSignals(tmp_path, 0)
    seen = []

    def own(signum, frame):  # the script's handler; the second signal is delivered while it runs
        seen.append(signum)
        if len(seen) == 1:
            stops(signal.SIGTERM, sys._getframe())  # what Python passes: the frame the signal interrupted
        seen.append("saved")

    stops.script[signal.SIGTERM] = own
    stops(signal.SIGTERM, None)
    assert seen == [signal.SIGTERM, "saved"] and track._state.stop == signal.SIGTERM

    def chaining(signum, frame):  # a script's handler that calls the one it replaced, with the frame it was given
        stops(signum, frame)

    later = script.StopSignals(tmp_path, 0)
    later.script[signal.SIGUSR1] = chaining
    monkeypatch.setattr(track, "_state", track._State())
    with pytest.raises(SystemExit) as ended:
        later(signal.SIGUSR1, sys._getframe())
    assert ended.value.code == script.INTERRUPTED
