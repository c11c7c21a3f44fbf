"""`launch resume` of a run that recorded steps but has no checkpoint is refused before anything is written.

A cancelled run whose checkpoint.pt was deleted (the message of a damaged checkpoint says to delete it) was
resumed from step 1: its records got a second start and steps 1..N twice, which `launch report` summarised
as one run. The same for a sweep's layout. test_issue37.py's completed 4-step runs, copied and marked
CANCELLED, are the runs here (the single engine and DDP on 2 ranks: the check is the launcher's, before any
engine starts).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import launch, runs_made_once
from tests.test_issue37 import ENGINES, SPEC, _copy, _one_error_line, _tree


@pytest.fixture(scope="module")
def completed(tmp_path_factory):
    return runs_made_once(tmp_path_factory, SPEC, ENGINES, "done")


@pytest.mark.parametrize("engine", ["single", "ddp"])
def test_a_run_with_steps_and_no_checkpoint_is_not_restarted(engine, completed, tmp_path) -> None:
    run = _copy(completed(engine), tmp_path / "run", state="CANCELLED")
    (run / "checkpoint.pt").unlink()
    before = _tree(run)
    err = _one_error_line(launch("resume", str(run), cwd=tmp_path))
    assert "recorded 4 step(s) but has no checkpoint" in err and "a second time" in err, err
    assert f"launch run --spec {run}/spec.json" in err, err
    assert _tree(run) == before, "a refused resume changed the run directory"


def test_a_sweeps_layout_with_steps_and_no_checkpoint_is_refused_before_any_layout_runs(completed, tmp_path) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    run = _copy(completed("single"), sweep / "1x1", state="CANCELLED")
    (run / "checkpoint.pt").unlink()
    (sweep / "sweep.json").write_text(json.dumps({"runs": ["1x1"], "layouts": [[1, 1]]}))
    before = _tree(sweep)
    err = _one_error_line(launch("resume", str(sweep), cwd=tmp_path))
    assert "has no checkpoint" in err, err
    assert _tree(sweep) == before


def test_a_run_that_recorded_no_step_still_starts_over(completed, tmp_path) -> None:
    """Nothing recorded, nothing to count twice: the check leaves it to the resume (checked without one)."""
    from scalelab.core.spec import read_spec
    from scalelab.launcher.backend import get_backend
    from scalelab.launcher.runner import refuse_restart

    run = _copy(completed("single"), tmp_path / "run", state="FAILED")
    (run / "checkpoint.pt").unlink()
    records = run / "records" / "rank-0.jsonl"
    records.write_text("".join(line + "\n" for line in records.read_text().splitlines() if '"kind": "step"' not in line))
    spec = read_spec(run).validate(stored=True)
    refuse_restart(get_backend(spec.backend, spec.backend_options), Path(run), spec)  # no error


def test_a_cancel_that_left_no_checkpoint_does_not_promise_one(completed, tmp_path) -> None:
    """A cancel that cut the first checkpoint write (no stop records): the line said "continues it from its
    last checkpoint" with none saved; it names the new run that starts it over."""
    from scalelab.launcher.runner import cancelled_line

    run = _copy(completed("single"), tmp_path / "run", state="CANCELLED")
    assert "continues it from its last checkpoint" in cancelled_line(run)
    (run / "checkpoint.pt").unlink()
    said = cancelled_line(run)
    assert "no checkpoint was saved" in said and f"launch run --spec {run}/spec.json" in said, said
    assert "continues it" not in said


def _damage(ckpt: Path, how: str) -> None:
    data = ckpt.read_bytes()
    ckpt.unlink()
    if how == "cut":
        ckpt.write_bytes(data[: len(data) // 2])
    elif how == "garbage":
        ckpt.write_bytes(b"not a checkpoint\n")
    elif how == "flipped":  # a whole archive whose data no longer matches its checksums
        at = data.index(b"data/0") + 200
        ckpt.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:])
    else:
        ckpt.mkdir()


@pytest.mark.parametrize("how", ["cut", "garbage", "flipped", "directory"])
def test_a_damaged_checkpoint_is_refused_before_any_rank_starts(how, completed, tmp_path) -> None:
    """A resume from a damaged checkpoint: one line, exit 2, nothing started or changed (the run stays
    CANCELLED), and advice that works - restore it, or `launch run --spec` - not "delete it to start from
    scratch", which `launch resume` then refused (the run has recorded steps). A directory is called one."""
    run = _copy(completed("single"), tmp_path / "run", state="CANCELLED")
    _damage(run / "checkpoint.pt", how)
    before = _tree(run)
    err = _one_error_line(launch("resume", str(run), cwd=tmp_path))
    assert f"so run {run} was not resumed" in err and f"launch resume {run}" in err, err
    assert f"launch run --spec {run}/spec.json" in err and "delete" not in err, err
    assert ("is a directory, not a checkpoint file" in err) == (how == "directory"), err
    assert "truncated" not in err or how in ("cut", "garbage"), err
    assert _tree(run) == before, "a refused resume changed the run directory"


def test_a_whole_checkpoint_passes_the_check(completed) -> None:
    from scalelab.train.checkpoint import checkpoint_problem

    assert checkpoint_problem(completed("single") / "checkpoint.pt") == ""
