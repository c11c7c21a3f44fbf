"""A reviewer's findings on reports of --script runs and of several directories:

- a script whose `track.step(items=0)` counted nothing: its run completes (exit 0) with its throughput a dash and
  a line saying how to record the items; `launch report` and `launch plan` of it say so, never a traceback;
  a negative count in hand-edited records is refused with its line;
- `launch report runs/*` and `launch cost runs/*` leave out, each with one warning line, a run that failed before
  its first step and a directory that is no run (a prep run), and still fail on such a directory given alone;
- a script that passes no loss shows no "loss 0.000" in `launch status`;
- `launch status` says that its records have unreadable lines;
- the HTML report of a script's run draws no empty legend (matplotlib's UserWarning on stderr);
- a report of several sweeps goes to runs/.reports/ as its help says, not ./.reports/;
- two sweeps of a script that differ in one argument are labelled by it, and the table fits 80 columns.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from conftest import ROOT, launch

ZERO = "from scalelab import track\nfor _ in range(6):\n    track.step(items=0, loss=1.0)\n"
NO_LOSS = "from scalelab import track\nfor _ in range(6):\n    track.step(items=8)\n"
BOOM = "raise SystemExit('boom')\n"
SMALL = ("--engine", "single", "--steps", "6", "--warmup-steps", "1")


def one_error_line(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("[")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def run_script(where: Path, name: str, body: str) -> tuple[Path, object]:
    """`launch --script NAME` of `body` in `where` (its runs in where/runs): its run directory and the launch."""
    (where / name).write_text(body)
    before = set((where / "runs").glob("*")) if (where / "runs").exists() else set()
    proc = launch("--script", name, *SMALL, cwd=where)
    made = set((where / "runs").glob("*")) - before
    assert len(made) == 1, (made, proc.stderr)
    return made.pop(), proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A runs/ folder as a user's: a script's run that counted no items, one that passed no loss, a script that
    failed before its first step, a built-in model's run that failed before its first step, and a prep run."""
    where = tmp_path_factory.mktemp("review")
    zero, proc = run_script(where, "zero.py", ZERO)  # its launch is the first test's to judge
    made = {"where": where, "zero": zero, "zero_proc": proc}
    made["noloss"], proc = run_script(where, "noloss.py", NO_LOSS)
    assert proc.returncode == 0, proc.stderr
    made["boom"], proc = run_script(where, "boom.py", BOOM)
    assert proc.returncode == 1, proc.stderr
    # the built-in trainer's run that stopped before its first step: a failed run's records without their steps
    proc = launch("--model", "nmt-tiny", *SMALL, "-y", cwd=where, env={"SCALELAB_FAIL_AT_STEP": "1"})
    assert proc.returncode == 1, proc.stderr
    failed = next(p for p in (where / "runs").glob("nmt-tiny-*"))
    records = failed / "records" / "rank-0.jsonl"
    records.write_text("".join(line for line in records.read_text().splitlines(True) if '"kind": "step"' not in line))
    made["nosteps"] = failed
    prep = where / "runs" / "prep-nmt-tiny"  # what `launch prep` leaves in runs/ (scalelab/prep/request.py)
    prep.mkdir()
    (prep / "prep.json").write_text("{}")
    made["prep"] = prep
    return made


# ---- a script that counts no items -----------------------------------------------------------------------


@pytest.mark.slow
def test_a_script_that_counts_no_items_completes_and_says_how_to_count_them(runs) -> None:
    proc = runs["zero_proc"]
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    said = " ".join(proc.stdout.split())
    assert "counted no items" in said and "track.step(items=len(batch)" in said, proc.stdout
    assert "—" in proc.stdout  # its samples/s: no figure, not 0
    summary = json.loads((runs["zero"] / "summary.json").read_text())
    assert summary["words_per_s"] is None and summary["steps_measured"] > 0


def test_report_and_plan_of_a_run_without_items_say_so_without_a_traceback(runs) -> None:
    where, run = runs["where"], str(runs["zero"])
    report = launch("report", run, cwd=where)
    assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr
    assert "counted no items" in report.stderr and "track.step(items=" in report.stderr
    assert json.loads((runs["zero"] / "report.json").read_text())[0]["words_per_s"] is None
    plan = launch("plan", run, cwd=where)
    assert plan.returncode == 2, plan.stderr
    assert "no measured throughput" in one_error_line(plan) and "track.step(items=" in one_error_line(plan)


@pytest.mark.slow
def test_a_negative_count_in_records_is_refused_with_its_line(runs, tmp_path: Path) -> None:
    run = tmp_path / "negative"
    shutil.copytree(runs["zero"], run)
    records = run / "records" / "rank-0.jsonl"
    records.write_text(records.read_text().replace('"samples": 0, "words": 0', '"samples": -5, "words": -5'))
    for argv in (["report", str(run)], ["plan", str(run)]):
        proc = launch(*argv, cwd=tmp_path)
        assert proc.returncode == 2, (argv, proc.stderr)
        line = one_error_line(proc)
        assert "rank-0.jsonl:" in line and "samples -5" in line and "fix or delete that line" in line, line


# ---- several directories -----------------------------------------------------------------------------------


def runs_glob(runs: dict[str, Path]) -> list[str]:
    """The shell's `runs/*` of the runs fixture (the run without items left to its own tests)."""
    return sorted(str(p) for p in (runs["where"] / "runs").iterdir() if not p.name.startswith(".") and p != runs["zero"])


@pytest.mark.slow
def test_report_of_several_leaves_out_failed_runs_and_prep_directories_with_a_warning_each(runs, tmp_path) -> None:
    where = runs["where"]
    glob = runs_glob(runs)
    proc = launch("report", *glob, "--out", str(tmp_path / "report"), cwd=where)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    warnings = " ".join(proc.stderr.split()).split("warning: ")  # each wrapped between words, as notes are
    left = [w for w in warnings if "left out of the report" in w]
    assert len(left) == 3, proc.stderr
    assert any(str(runs["boom"]) in w and "failed before it recorded a step" in w for w in left)
    assert any(str(runs["nosteps"]) in w and "no step records" in w for w in left)
    assert any(str(runs["prep"]) in w and "not a run directory" in w for w in left)
    rows = json.loads((tmp_path / "report" / "report.json").read_text())
    assert [r["model"] for r in rows] == ["noloss.py"]


def test_report_of_nothing_reportable_and_of_one_bad_directory_still_fail(runs) -> None:
    where = runs["where"]
    both = launch("report", str(runs["boom"]), str(runs["prep"]), cwd=where)
    assert both.returncode == 2 and "none of the 2 directories has a run to report" in one_error_line(both)
    for alone, why in ((runs["boom"], "failed before it recorded a step"), (runs["nosteps"], "no step records")):
        proc = launch("report", str(alone), cwd=where)
        assert proc.returncode == 2 and why in one_error_line(proc) and "left out" not in proc.stderr


def test_cost_of_several_bills_the_failed_runs(runs, tmp_path: Path) -> None:
    where = runs["where"]
    norecords = tmp_path / "norecords"  # a run whose records cannot be read: left out, with a warning
    norecords.mkdir()
    shutil.copy(runs["nosteps"] / "spec.json", norecords)
    proc = launch("cost", *runs_glob(runs), str(norecords), "--rate", "1/gpu-hour", "--format", "json", cwd=where)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    rows = {Path(r["run_dir"]).name: r for r in json.loads(proc.stdout)}
    assert rows[runs["nosteps"].name]["state"] == "FAILED" and rows[runs["nosteps"].name]["dollars"] > 0
    assert rows[runs["boom"].name]["state"] == "FAILED" and len(rows) == 3
    assert "norecords has no records" in proc.stderr and "left out" in proc.stderr
    alone = launch("cost", str(norecords), "--rate", "1/gpu-hour", cwd=where)
    assert alone.returncode == 2 and "has no records" in one_error_line(alone)


# ---- status -------------------------------------------------------------------------------------------------


def test_status_of_a_script_that_passes_no_loss_shows_none(runs) -> None:
    proc = launch("status", str(runs["noloss"]), cwd=runs["where"])
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if "step 6/6" in line)
    assert "loss" not in line and "samples/s" in line, proc.stdout


@pytest.mark.slow
def test_status_says_that_records_have_unreadable_lines(runs, tmp_path: Path) -> None:
    run = tmp_path / "corrupt"
    shutil.copytree(runs["noloss"], run)
    records = run / "records" / "rank-0.jsonl"
    lines = records.read_text().splitlines(True)
    lines[1] = "{garbage\n"
    records.write_text("".join(lines))
    proc = launch("status", str(run), cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "unreadable record lines" in line]
    assert len(warned) == 1 and "rank-0.jsonl:2" in warned[0], proc.stderr


# ---- HTML ---------------------------------------------------------------------------------------------------


def test_html_report_of_a_script_run_warns_of_no_empty_legend(runs, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(runs["noloss"], run)
    proc = launch("report", str(run), "--format", "html", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "UserWarning" not in proc.stderr and "legend" not in proc.stderr, proc.stderr
    assert (run / "report.html").is_file()


# ---- sweeps of a script that differ in one argument -------------------------------------------------------------


def whole_table(text: str, width: int) -> bool:
    """Whether the boxed table in `text` fits `width` columns whole: every line of it ends with its border
    (a table wider than the terminal was cut at its last column, mid-border)."""
    ends = {"┏": "┓", "┃": "┃", "┡": "┩", "│": "│", "└": "┘"}
    rows = [line.rstrip() for line in text.splitlines() if line[:1] in ends]
    return bool(rows) and all(len(line) <= width and line.endswith(ends[line[0]]) for line in rows)


def fake_script_sweep(root: Path, name: str, script_args: list[str], tokens_per_s: dict[int, float]) -> Path:
    """A completed sweep of examples/own-script/train_ddp.py (with `script_args`) over 1 and 2 workers, as its
    records would have it (docs/records.md): the reports only read them."""
    from scalelab.core.rundir import write_json
    from scalelab.core.spec import EngineSpec, Spec, save_spec

    sweep = root / name
    for gpus, speed in tokens_per_s.items():
        run = sweep / f"1x{gpus}"
        (run / "records").mkdir(parents=True)
        save_spec(Spec(model="train_ddp.py", script=str(ROOT / "examples/own-script/train_ddp.py"),
                       script_args=script_args, engine=EngineSpec(name="ddp"), gpus_per_node=gpus, warmup_steps=2), run)
        write_json(run / "launch.json", {"backend": "local", "state": "COMPLETED", "launched": 1000.0,
                                         "ended": 1013.0, "run_dir": str(run)})
        for rank in range(gpus):
            recs = [{"kind": "start", "rank": rank, "world": gpus, "time": 1000.5, "unit": "tokens"}]
            recs += [{"kind": "step", "rank": rank, "world": gpus, "step": step, "warmup": step <= 2,
                      "step_s": 512 / speed, "samples": 32 // gpus, "words": 512 // gpus, "loss": 3.0,
                      "time": 1001.0 + step} for step in range(1, 13)]
            (run / "records" / f"rank-{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_json(sweep / "sweep.json", {"runs": [f"1x{g}" for g in tokens_per_s], "layouts": [[1, g] for g in tokens_per_s]})
    return sweep


@pytest.fixture
def sweeps(tmp_path: Path) -> Path:
    """Two sweeps of a script that differ only in --global-batch (as `launch sweep --script train_ddp.py --workers
    1,2 -- --steps 12 --val-every 6 [--global-batch 64]` leaves them), in tmp_path/runs."""
    fake_script_sweep(tmp_path / "runs", "sweep-a", ["--steps", "12", "--val-every", "6"], {1: 2000.0, 2: 3600.0})
    fake_script_sweep(tmp_path / "runs", "sweep-b", ["--steps", "12", "--val-every", "6", "--global-batch", "64"],
                      {1: 2500.0, 2: 4000.0})
    return tmp_path


def test_a_report_of_several_sweeps_goes_to_runs_reports(sweeps) -> None:
    proc = launch("report", *sorted(str(p) for p in (sweeps / "runs").glob("sweep-*")), cwd=sweeps)
    assert proc.returncode == 0, proc.stderr
    assert f"report: {sweeps / 'runs' / '.reports' / 'report-'}" in proc.stdout, proc.stdout
    assert (sweeps / "runs" / ".reports").is_dir() and not (sweeps / ".reports").exists()


def test_sweeps_of_a_script_that_differ_in_one_argument_are_labelled_by_it_in_80_columns(sweeps) -> None:
    dirs = sorted(str(p) for p in (sweeps / "runs").glob("sweep-*"))
    proc = launch("report", *dirs, "--out", str(sweeps / "report"), cwd=sweeps, env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout.split("\nnote:")[0].split("\nreport:")[0]
    assert whole_table(table, 80), proc.stdout
    assert "--global-batch=64" in table and "--global-batch=default" in table, proc.stdout
    assert "speedup" in table, proc.stdout


def test_plan_tells_the_sweeps_apart_by_their_argument(sweeps) -> None:
    dirs = sorted(str(p) for p in (sweeps / "runs").glob("sweep-*"))
    proc = launch("plan", *dirs, "--format", "json", cwd=sweeps)
    assert proc.returncode == 0, proc.stderr
    series = {r.get("label") or r.get("series") for r in json.loads(proc.stdout)}
    assert any(s and s.endswith("--global-batch=64") for s in series), series
    assert any(s and s.endswith("--global-batch=default") for s in series), series


# ---- the pieces --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, others, words", [
    (["--steps", "12", "--global-batch", "64"], [["--steps", "12"]], ["--global-batch=64"]),
    (["--steps", "12"], [["--steps", "12", "--global-batch", "64"]], ["--global-batch=default"]),
    (["--lr=0.1", "--amp"], [["--lr=0.2"]], ["--lr=0.1", "--amp"]),
    (["--lr=0.2"], [["--lr=0.1", "--amp"]], ["--lr=0.2", "--amp=default"]),
    (["--shift", "-1", "a.txt"], [["--shift", "2", "b.txt"]], ["--shift=-1", "arg1=a.txt"]),
    (["--a", "1", "--b", "2"], [["--b", "2", "--a", "1"]], None),  # only the order differs: said whole
])
def test_script_args_words_name_only_what_differs(args, others, words) -> None:
    from scalelab.analysis.results import script_args_words

    assert script_args_words(args, [args, *others]) == words


def test_a_label_wider_than_the_terminal_folds_inside_the_table() -> None:
    from scalelab.analysis.report import print_scaling

    label = "script_args=--steps,12,--val-every,6,--global-batch,64,--hidden,128,--vocab,64"
    df = pd.DataFrame({"label": [label, label, "other", "other"], "workers": [1, 2, 1, 2], "nodes": [1] * 4,
                       "gpus_per_node": [1, 2, 1, 2], "words_per_s": [1000.0, 1800, 900, 1700],
                       "speedup": [1, 1.8, 1, 1.9], "efficiency": [1, 0.9, 1, 0.95]})
    console = Console(width=80, record=True)
    print_scaling(df, console=console)
    text = console.export_text()
    assert whole_table(text, 80), text
    assert "speedup" in text and "1.80" in text and "┃ label" in text, text


def test_report_warnings_wrap_between_words_at_the_terminals_width(monkeypatch):
    """At 80 columns `launch report`'s warnings ran to 148 and 196 columns (printed unwrapped) while its notes
    wrapped: they now wrap as the notes do, between words."""
    import io
    from types import SimpleNamespace

    from scalelab.analysis import results
    from scalelab.launcher import cli

    warning = ("nmt-tiny fused fp32 ddp strong at 2 worker(s): Karp-Flatt serial fraction 4.32 is outside [0, 1]: the "
               "speedup is not explained by a serial part (noise, or a different workload per layout)")
    monkeypatch.setattr(results, "build_report", lambda *a, **k: SimpleNamespace(warnings=[warning], json_text="{}"))
    err = io.StringIO()
    monkeypatch.setattr(cli, "err_console", Console(file=err, width=80, color_system=None))
    cli.report_dirs([Path("runs/x")], None, "json", plots=False)
    lines = err.getvalue().splitlines()
    assert len(lines) > 1 and max(map(len, lines)) <= 80, lines
    assert " ".join(" ".join(lines).split()) == f"warning: {warning}"  # whole words: none cut
