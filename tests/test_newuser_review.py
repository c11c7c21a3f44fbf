"""A new user's review: what `launch` says where someone new to it types what other launchers take, and what
it prints at 80 columns. Each test is a case the review found, through the real command."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import launch


def _error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr


@pytest.mark.parametrize("args, says, not_says", [
    (["--workers", "2"], ["--gpus-per-node", "launch sweep --workers"], ["Did you mean '--nodes'"]),
    (["--gpus", "2"], ["--gpus-per-node"], ["--gpu-type"]),
    (["--nproc-per-node", "2"], ["torchrun's --nproc-per-node is --gpus-per-node"], ["Did you mean"]),
    (["--nnodes", "2"], ["--nodes M"], ["Did you mean"]),
])
def test_options_from_other_launchers_point_to_launchs_own(tmp_path, args, says, not_says):
    """`launch --workers 2` suggested '--nodes' and `launch --gpus 2` '--gpu-type' (Slurm-only)."""
    err = _error(launch(*args, cwd=tmp_path))
    for text in says:
        assert text in err, err
    for text in not_says:
        assert text not in err, err


def test_sweep_gpus_points_to_workers(tmp_path):
    err = _error(launch("sweep", "--gpus", "2", cwd=tmp_path))
    assert "--workers 1,2,4" in err and "--gpu-type" not in err, err


def test_a_scripts_option_says_its_arguments_go_after_the_double_dash(tmp_path):
    """`launch --script train.py --out x` suggested '--account', '--spot', '--subnet'."""
    err = _error(launch("--script", "train.py", "--out", "x", cwd=tmp_path))
    assert "`launch run --script train.py [OPTIONS] -- --out x`" in err, err
    assert "--account" not in err and "--subnet" not in err, err


def test_a_mistyped_option_without_a_script_keeps_clicks_suggestion(tmp_path):
    err = _error(launch("--gpus-pernode", "2", cwd=tmp_path))
    assert "'--gpus-per-node'" in err and "after `--`" not in err, err


def _steps(run_dir, last, end=False):
    from scalelab.core.records import RecordWriter

    out = RecordWriter(run_dir, 0, 1)
    for step in range(1, last + 1):
        out.write("step", step=step, warmup=False, step_s=0.1, samples=8, words=80, loss=1.0)
    if end:
        out.event("end", reason="completed")
    out.close()


def test_progress_past_the_given_total_shows_at_least_the_step(tmp_path):
    """A script run with --steps 10 that runs its own 60 steps showed `step 16/10 ... ETA 0s`, then `step 60/10`."""
    from scalelab.launcher.progress import RunWatch

    _steps(tmp_path, 16)
    snap = RunWatch(tmp_path, steps=10).poll()
    assert (snap.step, snap.total, snap.eta_s) == (16, 16, None)
    assert "step 16/16+" in snap.line() and "ETA" not in snap.line(), snap.line()


def test_progress_within_the_total_is_unchanged(tmp_path):
    from scalelab.launcher.progress import RunWatch

    _steps(tmp_path, 4)
    snap = RunWatch(tmp_path, steps=10).poll()
    assert snap.total == 10 and "step 4/10 " in snap.line() and "ETA" in snap.line(), snap.line()


def test_plain_progress_past_the_total_ends_with_the_runs_own_length(tmp_path, capsys):
    import io

    from rich.console import Console

    from scalelab.launcher.progress import RunProgress

    _steps(tmp_path, 60, end=True)
    with RunProgress(tmp_path, 10, "run", console=Console(file=io.StringIO(), force_terminal=False)):
        pass
    err = capsys.readouterr().err
    assert "step 60/60  loss" in err and "ended (completed)" in err and "/10" not in err, err


def test_steps_for_a_script_notes_it_sets_only_the_bar(tmp_path):
    """`launch --script train.py --steps 10` ran the script's own 60 steps without a word."""
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    proc = launch("--script", str(script), "--steps", "10", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "--steps 10 only sets the progress bar's total" in proc.stderr and "after `--`" in proc.stderr
    proc = launch("--script", str(script), "--steps", "10", "--dry-run", "--", "--steps", "10", cwd=tmp_path)
    assert proc.returncode == 0 and "only sets the progress bar's total" not in proc.stderr, proc.stderr


def test_karp_flatt_of_a_slowdown_names_the_drop_not_noise():
    """The README's own first job (speedup 0.29 on 2 workers) was told "noise, or a different workload per layout";
    a speedup below 1 is a throughput drop, as `launch plan` says."""
    from test_trust import summary

    from scalelab.analysis.scaling import scale_layouts, trust_warnings

    said = [w for w in trust_warnings(scale_layouts([summary(1, 1000.0), summary(2, 290.0)])) if "Karp-Flatt" in w]
    assert len(said) == 1, said
    assert "throughput drops from 1 to 2 workers (1,000 -> 290 words/s, speedup 0.29)" in said[0], said
    assert "negative scaling" in said[0] and "noise" not in said[0], said
    # a speedup above n (superlinear) still has the old cause
    said = [w for w in trust_warnings(scale_layouts([summary(1, 1000.0), summary(2, 2300.0)])) if "Karp-Flatt" in w]
    assert len(said) == 1 and "noise, or a different workload" in said[0], said


def test_a_sweep_whose_axes_differ_is_named_by_both(tmp_path):
    """`--batch-scaling growing --work-scaling fixed` was labelled and reported as "weak" (report.json "mode"),
    which means both axes growing; the sweep directory already said batch-growing-work-fixed."""
    from scalelab.analysis.results import run_label
    from scalelab.core.spec import Spec

    spec = Spec(model="nmt-tiny", batch_per_worker=16, work_scaling="fixed")
    assert run_label(spec).endswith(" batch-growing-work-fixed"), run_label(spec)
    assert run_label(Spec(model="nmt-tiny", batch_per_worker=16, work_scaling="growing")).endswith(" weak")
    assert run_label(Spec(model="nmt-tiny", batch_per_worker=16)).endswith(" weak")  # a run outside a sweep
    assert run_label(Spec(model="nmt-tiny", global_batch=16, work_scaling="fixed")).endswith(" strong")


def test_a_summarys_mode_names_both_axes():
    from test_trust import summary

    from scalelab.analysis.scaling import RunMeta, scale_layouts, summarize_run
    import pandas as pd

    steps = pd.DataFrame([{"rank": r, "step": s, "warmup": False, "step_s": 0.1, "samples": 8, "words": 80,
                           "loss": 1.0} for r in (0,) for s in range(1, 21)])
    meta = RunMeta(label="x", workers=1, nodes=1, gpus_per_node=1, batch_mode="weak", work_scaling="fixed")
    assert summarize_run(steps, None, None, meta).mode == "batch-growing-work-fixed"
    table = scale_layouts([summary(1, 1000.0, mode="batch-growing-work-fixed"),
                           summary(2, 1800.0, mode="batch-growing-work-fixed")])
    assert list(table["speedup"]) == [1.0, 1.8]


def test_ls_where_nothing_ran_yet_says_so_and_exits_0(tmp_path):
    """In a new directory `launch ls` exited 2: "runs directory runs does not exist; pass --runs-dir DIR"."""
    proc = launch("ls", cwd=tmp_path, env={"SCALELAB_RUNS_DIR": ""})
    assert proc.returncode == 0 and "no runs under runs" in proc.stdout, (proc.stdout, proc.stderr)


def test_a_runs_dir_that_is_no_directory_names_where_it_came_from(tmp_path):
    err = _error(launch("ls", cwd=tmp_path, env={"SCALELAB_RUNS_DIR": "/dev/null"}))
    assert "/dev/null is a character device, not a directory" in err and "$SCALELAB_RUNS_DIR" in err, err
    err = _error(launch("status", "--runs-dir", "/dev/null", cwd=tmp_path, env={"SCALELAB_RUNS_DIR": ""}))
    assert "not a directory" in err and "no runs under" not in err, err


def test_a_short_id_where_nothing_ran_advises_no_failing_command(tmp_path):
    """`launch status 151022` with no runs advised `launch ls --runs-dir runs`, which itself failed."""
    err = _error(launch("status", "151022", cwd=tmp_path, env={"SCALELAB_RUNS_DIR": ""}))
    assert "no run was started here yet" in err and "launch ls --runs-dir runs" not in err, err


def test_help_says_what_the_command_does(tmp_path):
    """The review's help inaccuracies: sweep's --threads default, --runs-dir's "(short ids, the newest run)" on
    ls/cancel/resume, cancel/resume silent on short ids, memory's --batch-per-worker "(weak scaling)"."""
    def helped(*args):
        proc = launch(*args, "--help", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        return " ".join(proc.stdout.split())

    assert "a local sweep gives every layout those of its widest layout" in helped("sweep")
    for command in ("ls", "cancel", "resume"):
        assert "the newest run" not in helped(command), command
    for command in ("cancel", "resume"):
        assert "RUN_DIR may be a short id" in helped(command), command
    assert "In a run or sweep every worker takes this batch" in helped("memory")


def _a_run(tmp_path, name="nmt-tiny-ddp-1x2-20261207-044202"):
    from scalelab.core.spec import Spec, save_spec

    run = tmp_path / "runs" / name
    run.mkdir(parents=True)
    save_spec(Spec(), run)
    return run


def _at_80(monkeypatch, tmp_path):
    import io

    from rich.console import Console

    from scalelab.launcher import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCALELAB_RUNS_DIR", raising=False)
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=out, width=80, color_system=None))
    monkeypatch.setattr(cli, "err_console", Console(file=err, width=80, color_system=None))
    return out, err


def test_the_closing_lines_fit_80_columns_with_the_short_id(tmp_path, monkeypatch):
    """`run directory: X  (launch report X)` and `launch: interrupted; ... launch resume runs/... continues it` ran
    past 80 columns, the run's path twice."""
    from types import SimpleNamespace

    from scalelab.launcher import cli

    out, err = _at_80(monkeypatch, tmp_path)
    run = _a_run(tmp_path, "a-run-with-a-rather-long-name-to-show-the-wrapping-ddp-1x2-20261207-044202")
    from scalelab.core.rundir import RunPaths

    RunPaths(run).checkpoint.parent.mkdir(parents=True, exist_ok=True)  # saved: "continues it" (none: other advice)
    RunPaths(run).checkpoint.write_bytes(b"x")
    cli._run_directory_line(Path("runs") / run.name, "report")
    with pytest.raises(SystemExit):
        cli.interrupted(SimpleNamespace(resume=str(Path("runs") / run.name), exit_code=130))
    said = out.getvalue() + err.getvalue()
    assert "(launch report 044202)" in said, said  # the short id, and the command on one line
    assert f"`launch resume runs/{run.name}`" in said  # the path and the command whole, on a line of their own
    assert max(map(len, said.splitlines())) <= 80 or any(len(line) > 80 and run.name in line
                                                         for line in said.splitlines()), said


def test_a_short_id_is_never_one_that_names_two_runs(tmp_path, monkeypatch):
    from scalelab.core.runids import short_id

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCALELAB_RUNS_DIR", raising=False)
    one = _a_run(tmp_path, "nmt-tiny-ddp-1x2-20261207-044202")
    _a_run(tmp_path, "nmt-tiny-ddp-1x2-20261208-044202")  # the same time on the next day
    assert short_id(Path("runs") / one.name) == "20261207-044202"
    assert short_id(tmp_path / "elsewhere" / one.name) == str(tmp_path / "elsewhere" / one.name)


def test_a_second_run_in_the_same_second_gets_its_time_and_suffix_as_its_id(tmp_path, monkeypatch):
    """new_run_dir names it `...-044202-1`; its id was `1`, which any later run ending in 1 (`-044211`) shares."""
    from scalelab.core.runids import resolve_run_dir, short_id

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCALELAB_RUNS_DIR", raising=False)
    first = _a_run(tmp_path, "nmt-tiny-ddp-1x2-20261207-044202")
    second = _a_run(tmp_path, "nmt-tiny-ddp-1x2-20261207-044202-1")
    assert short_id(Path("runs") / second.name) == "044202-1"
    assert short_id(Path("runs") / first.name) == "044202"
    _a_run(tmp_path, "nmt-tiny-ddp-1x2-20261207-044211")
    assert resolve_run_dir("044202-1") == str(Path("runs") / second.name)


def test_logs_rank_step_lines_wrap_at_the_width(tmp_path, monkeypatch):
    from scalelab.core.records import RecordWriter
    from scalelab.launcher.inventory import RankLines

    monkeypatch.setenv("COLUMNS", "80")
    out = RecordWriter(tmp_path, 0, 1)
    out.write("step", step=12345, warmup=True, step_s=1.2345, data_s=0.1234, forward_s=0.3456, backward_s=0.5678,
              exchange_s=0.2345, optimizer_s=0.0123, samples=800, words=128000, loss=4.1234)
    out.close()
    text = RankLines(tmp_path, 0).read()
    lines = text.splitlines()[1:]
    assert len(lines) > 1 and max(map(len, lines)) <= 80, text
    assert " ".join(" ".join(lines).split()).startswith("[rank 0] step 12345 loss 4.1234 1234.5 ms"), text


def test_one_process_is_not_processes(tmp_path):
    import inspect

    from scalelab.launcher import local

    assert "process{'es' if len(live) != 1 else ''}" in inspect.getsource(local)


@pytest.mark.slow
def test_html_report_paths_are_printed_one_way(tmp_path):
    """`report --format html` printed a relative path for one directory and an absolute one for several."""
    from test_costs_cli import _fake_run

    runs = [_fake_run(tmp_path / "runs", f"r{g}", g, 0.1, 6400, None) for g in (1, 2)]
    env = {"SCALELAB_PRICES": str(tmp_path / "no-prices.json")}
    one = launch("report", str(runs[0]), "--format", "html", cwd=tmp_path, env=env)
    both = launch("report", *map(str, runs), "--format", "html", cwd=tmp_path, env=env)
    assert one.returncode == 0 and both.returncode == 0, (one.stderr, both.stderr)
    shown = [one.stdout.strip().splitlines()[-1], both.stdout.strip().splitlines()[-1]]
    assert shown[0] == str(tmp_path.resolve() / "runs/r1/report.html"), shown  # absolute both: opens from anywhere
    assert shown[1].startswith(str(tmp_path.resolve() / "runs/.reports/")), shown
    assert all(Path(s).is_absolute() and Path(s).is_file() for s in shown), shown
