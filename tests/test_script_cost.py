"""`launch cost` of a user's script run whose steps were all warm-up: the run completed and its wall time
was paid for, so it is priced (it exited 2 with the note that it has no throughput figures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import launch, only_run_dir
from test_own_script import WARMUP_ONLY


def test_a_script_run_with_no_measured_step_is_still_billed(tmp_path: Path) -> None:
    (tmp_path / "s.py").write_text(WARMUP_ONLY)
    assert launch("--script", "s.py", "--engine", "single", "--", "--steps", "3", cwd=tmp_path).returncode == 0
    run_dir = only_run_dir(tmp_path / "runs")
    cost = launch("cost", str(run_dir), "--rate", "local=3.6", "--format", "json", cwd=tmp_path)
    assert cost.returncode == 0 and "Traceback" not in cost.stderr, cost.stderr
    row = json.loads(cost.stdout)[0]
    assert row["state"] == "COMPLETED" and row["dollars"] == pytest.approx(3.6 * 60 / 3600)  # the 60 s minimum of a short run
