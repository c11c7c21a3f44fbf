"""Issue 35: a run that reaches its loss threshold inside the warm-up is a success (COMPLETED, with its
time and steps to the threshold); summaries, reports, `launch resume` and `launch ls` agree, and the
report says its throughput was not measured instead of refusing the sweep."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from scalelab.analysis.scaling import RunMeta, scale_layouts, summarize_run, trust_warnings
from scalelab.core.errors import RecordError
from scalelab.core.rundir import read_state
from tests.conftest import launch, needs_horovod

META = RunMeta(label="lm", nodes=1, gpus_per_node=1, workers=1, engine="single", model="lm",
               global_batch=10, loss_threshold=2.5)


def _steps(n: int, warmup: int) -> pd.DataFrame:
    return pd.DataFrame([dict(kind="step", rank=0, world=1, time=100.0 + s, step=s, epoch=0, warmup=s <= warmup,
                              step_s=0.5, samples=10, words=100, loss=3.0 - 0.1 * s, lr=0.1)
                         for s in range(1, n + 1)])


def _threshold_at(step: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    val = pd.DataFrame([dict(kind="val", rank=0, step=step, val_loss=2.4, elapsed_s=1.25, time=200.0)])
    events = pd.DataFrame([dict(kind="event", rank=0, event="threshold", step=step, elapsed_s=1.25, time=200.0)])
    return val, events


def test_a_threshold_reached_in_warm_up_is_a_summary_with_no_throughput():
    val, events = _threshold_at(5)
    s = summarize_run(_steps(5, warmup=5), val, events, META)
    assert s.reached_threshold is True and s.steps_to_threshold == 5 and s.time_to_threshold_s == 1.25
    assert s.steps_measured == 0 and s.steps_warmup == 5
    assert s.words_per_s is None and s.step_s_mean is None and s.share_data is None
    assert json.loads(json.dumps(s.to_dict()))["words_per_s"] is None  # summary.json stays strict JSON


def test_only_warm_up_without_the_threshold_is_still_an_error():
    with pytest.raises(RecordError, match="no measured steps"):
        summarize_run(_steps(5, warmup=5), None, None, META)
    val = pd.DataFrame([dict(kind="val", rank=0, step=5, val_loss=2.9, elapsed_s=1.0, time=200.0)])
    with pytest.raises(RecordError, match="no measured steps"):  # validated, but not below the threshold
        summarize_run(_steps(5, warmup=5), val, None, META)


def test_the_scaling_table_bases_a_series_on_its_smallest_measured_layout():
    val, events = _threshold_at(5)
    early = summarize_run(_steps(5, warmup=5), val, events, META)
    two = summarize_run(_steps(20, warmup=5), None, None,
                        RunMeta(label="lm", nodes=1, gpus_per_node=2, workers=2, model="lm", global_batch=10))
    four = summarize_run(_steps(20, warmup=5).assign(step_s=0.25), None, None,
                         RunMeta(label="lm", nodes=1, gpus_per_node=4, workers=4, model="lm", global_batch=10))
    table = scale_layouts([early, two, four])
    assert table["workers"].tolist() == [1, 2, 4]
    assert np.isnan(table["words_per_s"].iloc[0]) and np.isnan(table["speedup"].iloc[0])
    assert table["base_workers"].iloc[1:].tolist() == [2, 2]  # the 1-worker run has no figure to be the base
    assert table["speedup"].iloc[1:].tolist() == pytest.approx([1.0, 2.0])
    said = "\n".join(trust_warnings(table))
    assert "at 1 worker(s): reached the loss threshold at step 5, inside its 5 warm-up step(s)" in said
    assert "not measured past warm-up" in said and "only 0 measured" not in said


ENGINES = [
    pytest.param("single", "1", id="single"),
    pytest.param("ddp", "1,2", id="ddp", marks=pytest.mark.slow),  # two layouts, two ranks: over 20 s on 2 cores
    pytest.param("horovod", "1,2", id="horovod", marks=[needs_horovod, pytest.mark.slow]),
]


@pytest.mark.parametrize("engine,workers", ENGINES)
@pytest.mark.slow
def test_an_early_threshold_sweep_completes_and_is_reported(tmp_path, engine, workers):
    """The README's threshold example (nmt-tiny to loss 4.3) validated every 5 steps: the threshold is met at
    step 5, the last warm-up step. The sweep used to stop with "no measured steps ... raise --steps"."""
    runs = tmp_path / "runs"
    done = launch("sweep", "--model", "nmt-tiny", "--data", "task", "--engine", engine, "--workers", workers,
                  "--val-every", "5", "--loss-threshold", "4.3", "--steps", "60", "--runs-dir", str(runs),
                  cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stderr.split())  # the report's warnings wrap between words
    assert "no measured steps" not in said and "not measured past warm-up" in said, done.stderr
    (sweep,) = runs.iterdir()
    layouts = [p for p in sorted(sweep.iterdir()) if p.is_dir()]
    assert len(layouts) == len(workers.split(","))
    for run_dir in layouts:
        assert read_state(run_dir)["state"] == "COMPLETED"
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["reached_threshold"] is True and summary["steps_to_threshold"] == 5
        assert summary["time_to_threshold_s"] > 0 and summary["steps_measured"] == 0
        assert summary["words_per_s"] is None

    report = launch("report", str(sweep), "--format", "json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    rows = json.loads(report.stdout)
    assert [r["workers"] for r in rows] == [int(w) for w in workers.split(",")]
    assert all(r["time_to_threshold_s"] > 0 and r["steps_to_threshold"] == 5 and r["words_per_s"] is None
               for r in rows)
    assert "not measured past warm-up" in " ".join(report.stderr.split())  # a warning wraps between words
    assert "time to threshold" in (sweep / "report.md").read_text()

    resumed = launch("resume", str(sweep), cwd=tmp_path)  # nothing left to run: it reports, not fails
    assert resumed.returncode == 0, resumed.stderr
    listed = launch("ls", "--runs-dir", str(runs), "--format", "json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert row["state"] == "COMPLETED" and {r["state"] for r in row["layouts"]} == {"COMPLETED"}
