"""`launch sweep` over layouts (strong and weak) and `launch report` over its runs."""

from __future__ import annotations

import json

import pytest

from scalelab.core.errors import SpecError
from scalelab.core.spec import Spec
from scalelab.launcher.sweep import parse_layouts, sweep_axes, sweep_specs
from tests.conftest import launch, only_run_dir, steps_of


def test_parse_layouts():
    assert parse_layouts("1,2,4", None) == [(1, 1), (1, 2), (1, 4)]
    assert parse_layouts(None, "1x1, 2x2,4x1") == [(1, 1), (2, 2), (4, 1)]
    for bad in ("0", "a", "1,-2"):
        with pytest.raises(SpecError, match="--workers"):
            parse_layouts(bad, None)
    with pytest.raises(SpecError, match="NODESxGPUS"):
        parse_layouts(None, "2by2")


def test_sweep_specs_strong_and_weak():
    base = Spec(model="nmt-tiny", engine=Spec().engine)
    strong = sweep_specs(base, [(1, 1), (1, 2), (2, 2)], "strong")
    assert [s.resolved_global_batch(16) for s in strong] == [16, 16, 16]
    assert [s.per_worker_batch(16) for s in strong] == [16, 8, 4]
    assert len({s.threads for s in strong}) == 1  # every emulated GPU gets the same compute
    weak = sweep_specs(base, [(1, 1), (1, 2)], "weak")
    assert [s.resolved_global_batch(16) for s in weak] == [16, 32]
    with pytest.raises(SpecError, match="does not split evenly across 3 workers"):
        sweep_specs(base, [(1, 1), (1, 3)], "strong")  # checked before anything runs


def test_sweep_axes_flags_and_the_mode_shorthand():
    assert sweep_axes(None, None, None) == ("fixed", "fixed")
    assert sweep_axes("weak", None, None) == ("growing", "growing")
    assert sweep_axes("weak", "growing", None) == ("growing", "growing")  # agreeing with the mode is fine
    assert sweep_axes(None, "growing", None) == ("growing", "growing")  # the work follows the batch
    assert sweep_axes(None, "growing", "fixed") == ("growing", "fixed")
    # without --work-scaling the length given is kept: the same epochs are the same job
    assert sweep_axes(None, "growing", None, Spec(steps=None, epochs=3)) == ("growing", "fixed")
    with pytest.raises(SpecError, match="--mode strong means --batch-scaling fixed --work-scaling fixed, but "
                                        "--work-scaling growing was given"):
        sweep_axes("strong", None, "growing")


def test_sweep_specs_follow_both_axes_and_record_the_work_axis():
    base = Spec(model="nmt-tiny", engine=Spec().engine, steps=40, warmup_steps=2)
    layouts = [(1, 1), (1, 2), (1, 4)]
    # batch per worker kept, the same job: the steps shrink as the global batch grows
    same_job = sweep_specs(base, layouts, batch_scaling="growing", work_scaling="fixed")
    assert [s.resolved_global_batch(16) for s in same_job] == [16, 32, 64]
    assert [s.steps for s in same_job] == [40, 20, 10]
    assert {s.work_scaling for s in same_job} == {"fixed"}
    # the global batch split, the same work per worker: the steps grow with the workers
    per_worker = sweep_specs(base, layouts, batch_scaling="fixed", work_scaling="growing")
    assert [s.steps for s in per_worker] == [40, 80, 160] and {s.resolved_global_batch(16) for s in per_worker} == {16}
    assert [s.work_scaling for s in sweep_specs(base, layouts, "weak")] == ["growing"] * 3
    assert [s.steps for s in sweep_specs(base, layouts, "strong")] == [40, 40, 40]
    epochs = Spec(model="nmt-tiny", engine=Spec().engine, steps=None, epochs=2)
    assert [s.epochs for s in sweep_specs(epochs, layouts, batch_scaling="growing", work_scaling="growing")] == [2, 4, 8]
    with pytest.raises(SpecError, match="--steps 30 times 1/4 is not a whole number"):
        sweep_specs(base.with_overrides({"steps": 30}), layouts, batch_scaling="growing", work_scaling="fixed")


def test_sweep_refuses_a_mode_that_contradicts_an_axis(tmp_path):
    proc = launch("sweep", "--model", "rnnlm-tiny", "--workers", "1,2", "--mode", "weak", "--batch-scaling", "fixed",
                  "--dry-run", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--mode weak means --batch-scaling growing --work-scaling growing" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strong", "weak"])
def test_sweep_runs_layouts_and_reports(tmp_path, mode):
    # strong through the shorthand; weak as a batch per worker kept on the same job (the steps halve)
    axes = ["--mode", "strong", "--global-batch", "16"] if mode == "strong" else [
        "--batch-scaling", "growing", "--work-scaling", "fixed", "--batch-per-worker", "8"]
    proc = launch("sweep", "--model", "rnnlm-tiny", "--data", "task", "--engine", "ddp", "--workers", "1,2",
                  *axes, "--steps", "6", "--warmup-steps", "1", "--runs-dir", str(tmp_path / "runs"),
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    sweep = only_run_dir(tmp_path / "runs")
    assert json.loads((sweep / "sweep.json").read_text())["runs"] == ["1x1", "1x2"]
    per_rank = [s["samples"] for s in steps_of(sweep / "1x2", 1)]
    assert set(per_rank) == ({8} if mode == "strong" else {8})
    for name in ("report.md", "report.json", "speedup.png", "throughput.png"):
        assert (sweep / name).stat().st_size > 0
    rows = json.loads((sweep / "report.json").read_text())
    assert [r["workers"] for r in rows] == [1, 2]
    assert rows[0]["speedup"] == 1.0 and rows[1]["speedup"] > 0
    assert rows[1]["speedup"] == pytest.approx(rows[1]["words_per_s"] / rows[0]["words_per_s"])
    assert rows[1]["global_batch"] == (16 if mode == "strong" else 16)
    assert rows[0]["global_batch"] == (16 if mode == "strong" else 8)
    # both axes recorded in every run and shown in the report made from the runs
    assert [(r["batch_scaling"], r["work_scaling"]) for r in rows] == [("fixed", "fixed") if mode == "strong" else
                                                                        ("growing", "fixed")] * 2
    md = (sweep / "report.md").read_text()
    assert "Global batch as workers are added" in md and "Total work as workers are added: fixed" in md
    assert len(steps_of(sweep / "1x2", 0)) == (6 if mode == "strong" else 3)
    # report again from the sweep directory, as JSON for scripts
    proc = launch("report", str(sweep), "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout)[1]["workers"] == 2
