"""`launch ls` and `launch status` over hand-made run, sweep and study directories (no training)."""

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from scalelab.core.rundir import write_json
from scalelab.core.spec import Spec, save_spec
from scalelab.launcher.cli import main
from scalelab.launcher.inventory import age, cell, combined_state, inventory


def make_run(path: Path, nodes: int = 1, gpus: int = 1, state: str = "COMPLETED", summary: bool = True,
             usd_per_hour: float | None = None) -> Path:
    path.mkdir(parents=True)
    save_spec(Spec(nodes=nodes, gpus_per_node=gpus).validate(), path)
    now = time.time()
    info = {"backend": "local", "state": state, "launched": now - 7200, "ended": now - 3600, "run_dir": str(path)}
    if usd_per_hour is not None:
        info["usd_per_hour"] = usd_per_hour
    write_json(path / "launch.json", info)
    if summary:
        write_json(path / "summary.json", {"steps_measured": 50, "steps_warmup": 5, "words_per_s": 12345.6})
    return path


def make_sweep(path: Path) -> Path:
    path.mkdir(parents=True)
    make_run(path / "1x1")
    make_run(path / "1x2", gpus=2, state="FAILED", summary=False)
    (path / "1x4").mkdir()  # written, never launched: as `launch sweep` writes every layout before the first runs
    save_spec(Spec(nodes=1, gpus_per_node=4).validate(), path / "1x4")
    write_json(path / "sweep.json", {"runs": ["1x1", "1x2", "1x4"], "layouts": [[1, 1], [1, 2], [1, 4]]})
    return path


def test_ls_lists_runs_sweeps_and_studies(tmp_path):
    make_run(tmp_path / "run-a", usd_per_hour=3.0)
    make_sweep(tmp_path / "sweep-b")
    study = tmp_path / "study-c"
    make_sweep(study / "v0")
    write_json(study / "study.json", {"title": "t", "sweeps": [{"label": "base", "dir": "v0"}]})
    (tmp_path / "not-a-run").mkdir()
    rows = {r["name"]: r for r in inventory(tmp_path)}
    assert set(rows) == {"run-a", "sweep-b", "study-c"}
    run = rows["run-a"]
    assert (run["kind"], run["backend"], run["layout"], run["state"]) == ("run", "local", "1x1", "COMPLETED")
    assert run["steps"] == 55 and run["words_per_s"] == 12345.6
    assert abs(run["cost_usd"] - 3.0) < 0.01  # one hour at $3/h
    assert Path(run["path"]).is_absolute()
    sweep = rows["sweep-b"]
    assert sweep["state"] == "FAILED" and sweep["layout"] == "1x1,1x2,1x4"
    assert [r["state"] for r in sweep["layouts"]] == ["COMPLETED", "FAILED", "NEW"]
    assert rows["study-c"]["layouts"][0]["variant"] == "base"


@pytest.mark.parametrize("width", [100, 160])
def test_ls_cli_table_fits_the_terminals_width_and_json(tmp_path, monkeypatch, width):
    """`ls` is as wide as the terminal ($COLUMNS): no line over it, and in a wide one a long run name on one
    line (it was capped at 100 columns, so names wrapped over 2-3 lines in any terminal)."""
    from rich.console import Console

    import scalelab.launcher.cli as cli

    monkeypatch.setattr(cli, "console", Console(width=width, force_terminal=False))
    name = "run-with-a-rather-long-name-20261123-185000"
    make_run(tmp_path / name, usd_per_hour=2.5)
    make_sweep(tmp_path / "sweep-b")
    out = CliRunner().invoke(main, ["ls", "--runs-dir", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "12,346" in out.output and "55/" in out.output
    assert "2.50" in out.output and "backend" in out.output  # at 100 too (issue 35: they went before names wrapped)
    assert max(len(line) for line in out.output.splitlines()) <= width
    if width > 100:
        assert name in out.output  # on one line (it wrapped over 2-3 lines, capped at 100 columns)
    else:  # broken after a hyphen, never inside the date
        assert "run-with-a-rather-long-name-20261123-" in out.output and "\n185000" in out.output
    assert "True" not in out.output and "inf" not in out.output
    rows = json.loads(CliRunner().invoke(main, ["ls", "--runs-dir", str(tmp_path), "--format", "json"]).output)
    assert {r["kind"] for r in rows} == {"run", "sweep"}


def test_status_of_a_sweep_shows_every_layout(tmp_path):
    sweep = make_sweep(tmp_path / "sweep-b")
    out = CliRunner().invoke(main, ["status", str(sweep)])
    assert out.exit_code == 0, out.output
    for word in ("1x1", "1x2", "1x4", "COMPLETED", "FAILED", "NEW"):
        assert word in out.output
    row = json.loads(CliRunner().invoke(main, ["status", str(sweep), "--format", "json"]).output)
    assert len(row["layouts"]) == 3


def test_status_of_something_else_is_a_clear_error(tmp_path):
    out = CliRunner().invoke(main, ["status", str(tmp_path), "--format", "json"])
    assert out.exit_code != 0 and "not a run, sweep or study" in str(out.exception)


def test_cells_and_ages():
    assert cell(True) == "yes" and cell(False) == "no" and cell(float("inf")) == "—" and cell(None) == "—"
    assert cell(1437.6) == "1,438" and cell(2.5, 2) == "2.50"
    assert age(30) == "30s" and age(3 * 3600 + 5) == "3h" and age(None) == "—"
    assert combined_state(["COMPLETED", "RUNNING"]) == "RUNNING"


def test_a_mistyped_command_says_did_you_mean():
    out = CliRunner().invoke(main, ["stauts", "runs/x"])
    assert out.exit_code == 2 and "did you mean `launch status`" in out.output
    out = CliRunner().invoke(main, ["xyzzy"])
    assert out.exit_code == 2 and "commands: " in out.output and "ls" in out.output


def test_rank_log_picks_one_ranks_lines(tmp_path):
    from scalelab.launcher.inventory import rank_log

    text = "[1,0]<stdout>:step 1\n[1,1]<stdout>:step 1 r1\n[rank1]: torchrun line\nlauncher line\n"
    assert rank_log(tmp_path, text, 1) == "[1,1]<stdout>:step 1 r1\n[rank1]: torchrun line\n"
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank-0.log").write_text("own file\n")
    assert rank_log(tmp_path, text, 0) == "own file\n"


def test_follow_prints_only_new_text_until_the_run_ends():
    from scalelab.launcher.inventory import follow

    texts = iter(["a\n", "a\nb\n", "a\nb\nc\n"])
    states = iter([True, True, False])
    out = []
    follow(lambda: next(texts), lambda: next(states), out.append, poll_s=0)
    assert "".join(out) == "a\nb\nc\n"


def test_ctrl_c_stops_following_only():
    from scalelab.launcher.inventory import follow

    def read():
        raise KeyboardInterrupt

    out = []
    follow(read, lambda: True, out.append, poll_s=0)
    assert "stopped following" in "".join(out)


def test_ls_shows_a_run_whose_summary_is_damaged_from_its_records(tmp_path):
    """Before: UNREADABLE with every column '—', while status, logs and report read the same run. Now its
    state and figures come from launch.json and its records, with a note that its summary is damaged."""
    from tests.conftest import launch

    runs = tmp_path / "runs"
    made = launch("run", "--model", "nmt-tiny", "--engine", "single", "--data", "task", "--steps", "30",
                  "--val-every", "2", "--val-batches", "1", "--loss-threshold", "100", "--name", "thr", "-y",
                  "--runs-dir", str(runs), cwd=tmp_path)
    assert made.returncode == 0, made.stderr[-3000:]
    (run,) = runs.iterdir()
    (run / "summary.json").write_bytes(b"\x8f\xff\x00" + bytes(range(256)))
    listed = launch("ls", "--runs-dir", str(runs), "--format", "json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert row["state"] == "COMPLETED" and row["steps"] == 2 and row["total_steps"] == 30, row
    assert row["loss"] is not None and row["age_s"] is not None and "error" not in row, row
    assert "its summary is damaged" in row["note"] and "summary.json" in row["note"], row
    table = launch("ls", "--runs-dir", str(runs), cwd=tmp_path)
    assert table.returncode == 0 and "COMPLETED" in table.stdout and "UNREADABLE" not in table.stdout, table.stdout
    assert "its summary is damaged" in " ".join(table.stdout.split())


def make_prep(path: Path, workers: int = 2, records: list[dict] | None = None, summary: dict | None = None) -> Path:
    """A prep run directory as `launch prep` writes it: prep.json, its records, summary.json once it finished."""
    path.mkdir(parents=True)
    write_json(path / "prep.json", {"backend": "local", "model": "rnnlm-tiny", "mode": "strong", "workers": workers})
    if records is not None:
        (path / "records").mkdir()
        (path / "records" / "prep.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if summary is not None:
        write_json(path / "summary.json", summary)
    return path


def test_ls_and_status_list_prep_runs_and_sweeps_beside_training_runs(tmp_path):
    """`launch prep` writes under the runs directory too; `launch ls` left its runs out and `launch status` refused
    them ("spec.json is missing"). Each is listed with its workers, its state from what it wrote and its lines/s."""
    phase = {"kind": "phase", "phase": "scan", "tasks": 1, "start": 1.0, "end": 2.0, "seconds": 1.0}
    make_prep(tmp_path / "prep-done", records=[phase], summary={"lines_per_s": 5000.0})
    make_prep(tmp_path / "prep-bad", workers=1,
              records=[{"kind": "failure", "error": "DataError", "message": "bad line", "time": 3.0}])
    make_prep(tmp_path / "prep-stopped",
              records=[{"kind": "failure", "error": "interrupted", "message": "SIGTERM", "time": 3.0}])
    make_prep(tmp_path / "prep-going", records=[phase])
    sweep = tmp_path / "prep-sweep"
    sweep.mkdir()
    write_json(sweep / "prep.json", {"backend": "local", "sweep": ["1w", "2w"]})
    make_prep(sweep / "1w", workers=1, records=[phase], summary={"lines_per_s": 100.0})
    (tmp_path / "prep-corrupt").mkdir()
    (tmp_path / "prep-corrupt" / "prep.json").write_text("{not json")
    for name, text in (("prep-list", "[1, 2]"), ("prep-sweep5", '{"sweep": 5}'), ("prep-up", '{"sweep": [".."]}')):
        (tmp_path / name).mkdir()  # hand-edited: a traceback for the whole listing, or the parent listed
        (tmp_path / name / "prep.json").write_text(text)
    make_run(tmp_path / "run-a")
    rows = {r["name"]: r for r in inventory(tmp_path)}
    assert {n: (r["kind"], r["state"]) for n, r in rows.items()} == {
        "prep-done": ("prep", "COMPLETED"), "prep-bad": ("prep", "FAILED"), "prep-stopped": ("prep", "CANCELLED"),
        "prep-going": ("prep", "INCOMPLETE"), "prep-sweep": ("prep", "INCOMPLETE"), "prep-corrupt": ("prep", "UNREADABLE"),
        "prep-list": ("prep", "UNREADABLE"), "prep-sweep5": ("prep", "UNREADABLE"), "prep-up": ("prep", "UNREADABLE"),
        "run-a": ("run", "COMPLETED")}
    assert (rows["prep-done"]["layout"], rows["prep-done"]["words_per_s"], rows["prep-done"]["unit"]) == \
        ("2 workers", 5000.0, "lines")
    assert rows["prep-bad"]["layout"] == "1 worker" and "corrupt" in rows["prep-corrupt"]["error"]
    assert [(r["name"], r["state"]) for r in rows["prep-sweep"]["layouts"]] == [("1w", "COMPLETED"), ("2w", "NEW")]
    out = CliRunner().invoke(main, ["ls", "--runs-dir", str(tmp_path)])
    assert out.exit_code == 0 and "prep-done" in out.output and "5,000 lines" in out.output, out.output
    status = CliRunner().invoke(main, ["status", str(sweep)])
    assert status.exit_code == 0, status.output
    assert f"prep {sweep.absolute()}: INCOMPLETE" in status.output and "100" in status.output and "1 worker" in status.output


@pytest.mark.parametrize("state, summary", [("COMPLETED", True), ("FAILED", False), ("RUNNING", False)])
def test_a_runs_row_reads_its_spec_once(tmp_path, monkeypatch, state, summary):
    """`launch ls` read each run's spec.json two or three times (run_row, verified_status, the progress columns);
    the row reads it once. A RUNNING run's backend is asked (settle, stood in for here); a stopped one's records
    are read for where it stopped."""
    import scalelab.launcher.runner as runner
    from scalelab.launcher.backend import RunStatus
    from scalelab.launcher.inventory import run_row

    run = make_run(tmp_path / "r", state=state, summary=summary)
    (run / "records").mkdir()
    step = {"kind": "step", "rank": 0, "world": 1, "step": 3, "time": time.time(), "warmup": False, "step_s": 0.5,
            "samples": 8, "words": 100, "loss": 2.5}
    (run / "records" / "rank-0.jsonl").write_text(json.dumps(step) + "\n")
    monkeypatch.setattr(runner, "settle", lambda backend, run_dir: RunStatus(state, "asked"))
    reads = []
    real = Path.read_text

    def counted(self, *args, **kwargs):
        if self.name == "spec.json":
            reads.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counted)
    row = run_row(run)
    assert row["state"] == state and row["steps"] and len(reads) == 1, (row, reads)
