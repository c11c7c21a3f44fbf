"""Looking runs up after something went wrong: a sweep stopped between layouts, a layout deleted by hand, an
empty id, a sweep or a prep given where a run is wanted (hand-made directories, no training)."""

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from scalelab.core.errors import RecordError
from scalelab.core.rundir import write_json
from scalelab.core.spec import Spec, read_spec, save_spec
from scalelab.launcher.cli import main
from scalelab.launcher.inventory import combined_state, describe
from tests.conftest import run_entry


def said(result) -> str:
    """What a command printed and the one-line error `launch` prints for a ScalelabError (`entry` does that)."""
    return result.output + (str(result.exception) if result.exception else "")


def make_sweep(path: Path, done: tuple[str, ...] = ("1x1",), layouts=((1, 1), (1, 2), (1, 4)),
               batch: str = "fixed") -> Path:
    """A sweep as `launch sweep` writes it (every layout's spec first), the `done` layouts COMPLETED."""
    from scalelab.launcher.sweep import sweep_specs

    base = Spec(model="nmt-tiny", steps=40, threads=1, backend="local")
    specs = sweep_specs(base, list(layouts), batch_scaling=batch, work_scaling="fixed")
    path.mkdir(parents=True)
    for spec in specs:
        run_dir = path / f"{spec.nodes}x{spec.gpus_per_node}"
        run_dir.mkdir()
        save_spec(spec, run_dir)
        if run_dir.name in done:
            now = time.time()
            write_json(run_dir / "launch.json", {"backend": "local", "state": "COMPLETED", "launched": now - 60,
                                                 "ended": now - 30, "run_dir": str(run_dir)})
            write_json(run_dir / "summary.json", {"steps_measured": 30, "steps_warmup": 5, "words_per_s": 100.0})
    write_json(path / "sweep.json", {"runs": [f"{n}x{g}" for n, g in layouts], "layouts": [list(x) for x in layouts]})
    return path


def test_a_sweep_stopped_after_a_layout_completed_is_incomplete_not_new(tmp_path):
    """Ctrl-C between layouts left 1x1 COMPLETED and the others NEW: the sweep read NEW, as if nothing had run.
    It is INCOMPLETE, and its row says how far it got and what continues it."""
    sweep = make_sweep(tmp_path / "sw")
    row = describe(sweep)
    assert row["state"] == "INCOMPLETE"
    assert "1 of 3 layouts completed" in row["note"] and f"launch resume {sweep}" in row["note"]
    assert combined_state(["NEW", "NEW"]) == "NEW" and combined_state(["COMPLETED", "COMPLETED"]) == "COMPLETED"
    assert combined_state(["COMPLETED", "CANCELLED", "NEW"]) == "CANCELLED"
    out = CliRunner().invoke(main, ["ls", "--runs-dir", str(tmp_path)])
    assert out.exit_code == 0 and "INCOMPLETE" in out.output and "1 of 3 layouts completed" in out.output, out.output
    out = CliRunner().invoke(main, ["status", str(sweep)])
    assert out.exit_code == 0 and ": INCOMPLETE" in out.output and "launch resume" in out.output, out.output


def test_a_deleted_layout_is_named_missing_and_resume_rebuilds_its_spec(tmp_path):
    """A layout directory deleted by hand: status showed the sweep NEW, the report advised `launch resume`, and
    the resume failed ("spec.json is missing"). Status names it MISSING; resume makes it again, its spec what
    `launch sweep` wrote (steps scaled to its layout)."""
    import shutil

    from scalelab.launcher.layouts import restore_missing_layouts

    sweep = make_sweep(tmp_path / "sw", done=("1x1", "1x2"), batch="growing")  # the steps shrink with the workers
    wanted = read_spec(sweep / "1x4").to_dict()
    shutil.rmtree(sweep / "1x4")
    row = describe(sweep)
    assert [r["state"] for r in row["layouts"]] == ["COMPLETED", "COMPLETED", "MISSING"]
    assert row["state"] == "INCOMPLETE" and "1x4 is missing" in row["note"]
    assert restore_missing_layouts(sweep) == ["1x4"]
    assert read_spec(sweep / "1x4").to_dict() == wanted and wanted["steps"] == 10  # 40 steps at 1 worker: the same work
    assert describe(sweep)["layouts"][2]["state"] == "NEW" and restore_missing_layouts(sweep) == []


def test_a_deleted_layout_that_cannot_be_rebuilt_is_refused_with_what_to_do(tmp_path):
    """Siblings whose specs differ beyond their layout (an lr edited by hand) give no trusted source: refused,
    naming the field, the directory to restore and the sweep to run again."""
    import shutil

    from scalelab.launcher.layouts import restore_missing_layouts

    sweep = make_sweep(tmp_path / "sw", done=("1x1",))
    spec = read_spec(sweep / "1x1")
    spec.lr = 0.5
    save_spec(spec, sweep / "1x1")
    shutil.rmtree(sweep / "1x4")
    with pytest.raises(RecordError, match="1x4 missing, and cannot be rebuilt.*lr.*launch sweep"):
        restore_missing_layouts(sweep)
    assert not (sweep / "1x4").exists()


def test_plan_uses_the_layouts_that_completed_and_names_the_others(tmp_path, capsys):
    """`launch plan SWEEP` failed on a missing or unfinished layout ("run directory not found"); it measures the
    finished ones, as `launch report` does, and a warning names each left out."""
    import shutil

    from scalelab.costs.cli import finished_run_dirs

    sweep = make_sweep(tmp_path / "sw", done=("1x1", "1x2"))
    shutil.rmtree(sweep / "1x4")
    assert finished_run_dirs((str(sweep),)) == (str(sweep / "1x1"), str(sweep / "1x2"))
    out = CliRunner().invoke(main, ["plan", str(sweep), "--format", "json"])
    assert "run directory not found" not in out.output and "layout 1x4" in out.output, out.output


@pytest.mark.parametrize("command", ["status", "logs", "resume", "report"])
def test_an_empty_run_id_is_refused_not_read_as_the_current_directory(tmp_path, monkeypatch, command):
    """`launch status ""` answered ". is not a run directory": the empty id was the current directory."""
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(main, [command, ""])
    assert out.exit_code != 0 and "run id is empty" in said(out) and "launch ls" in said(out), said(out)
    assert ". is not a run directory" not in said(out)


def make_prep(path: Path) -> Path:
    path.mkdir(parents=True)
    write_json(path / "prep.json", {"backend": "local", "workers": 2, "model": "nmt-tiny"})
    return path


def test_logs_of_a_sweep_names_its_layouts_and_a_prep_says_what_applies(tmp_path):
    """`launch logs SWEEP` and `launch resume PREP` said "spec.json is missing"; they say what the directory is
    and the commands that take it (the layouts of a sweep, by name)."""
    sweep = make_sweep(tmp_path / "sw", layouts=((1, 1), (1, 2)))
    out = CliRunner().invoke(main, ["logs", str(sweep)])
    assert out.exit_code != 0 and "is a sweep" in said(out) and f"launch logs {sweep / '1x1'}" in said(out), said(out)
    assert "1x1, 1x2" in said(out) and "spec.json is missing" not in said(out)
    prep = make_prep(tmp_path / "prep-x")
    for command in ("logs", "resume"):
        out = CliRunner().invoke(main, [command, str(prep)])
        assert out.exit_code != 0 and "is a prep" in said(out) and f"launch status {prep}" in said(out), said(out)
    assert "not resumed" in said(out)


def test_status_with_no_id_shows_the_newest_prep_as_ls_lists_it(tmp_path):
    """Only preps under the runs directory: `launch ls` listed them and `launch status` said "no runs under"."""
    make_prep(tmp_path / "prep-x")
    assert "prep-x" in CliRunner().invoke(main, ["ls", "--runs-dir", str(tmp_path)]).output
    out = CliRunner().invoke(main, ["status", "--runs-dir", str(tmp_path)])
    assert out.exit_code == 0 and "prep-x" in said(out) and "no runs under" not in said(out), said(out)
    out = CliRunner().invoke(main, ["logs", "--runs-dir", str(tmp_path)])
    assert out.exit_code != 0 and "is a prep" in said(out), said(out)


def test_cancel_of_a_study_or_a_prep_says_what_it_is(tmp_path, monkeypatch, capsys):
    """`launch cancel STUDY` and `launch cancel PREP` said "is not a run directory: spec.json is missing" where
    `launch logs` explains the directory; cancel takes sweeps, so a study's sweeps are offered, not "one of its
    layouts"."""
    from scalelab.core.rundir import STUDY_FILE

    study = tmp_path / "study-x"
    study.mkdir()
    write_json(study / STUDY_FILE, {"title": "t", "sweeps": []})
    prep = make_prep(tmp_path / "prep-x")
    for path, what in ((study, "is a study, not a run"), (prep, "is a prep")):
        code, err, _ = run_entry(["cancel", str(path)], monkeypatch, capsys)
        assert code != 0 and what in err and "spec.json is missing" not in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "Ctrl-C" in err
