"""`launch sweep` over layouts (strong and weak) and `launch report` over its runs."""

from __future__ import annotations

import json

import pytest

from core.errors import SpecError
from core.spec import Spec
from launcher.sweep import parse_layouts, sweep_specs
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


@pytest.mark.parametrize("mode", ["strong", "weak"])
def test_sweep_runs_layouts_and_reports(tmp_path, mode):
    batch = ["--global-batch", "16"] if mode == "strong" else ["--batch-per-worker", "8"]
    proc = launch("sweep", "--model", "rnnlm-tiny", "--data", "task", "--engine", "ddp", "--workers", "1,2",
                  "--mode", mode, *batch, "--steps", "5", "--warmup-steps", "1", "--runs-dir", str(tmp_path / "runs"),
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
    # report again from the sweep directory, as JSON for scripts
    proc = launch("report", str(sweep), "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout)[1]["workers"] == 2
