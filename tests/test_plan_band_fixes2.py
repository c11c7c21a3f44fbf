"""Planner band fixes (second round): the steps-to-threshold band never below one step
(scalelab/costs/convergence.py), the worker band's high end past the data capped by the last
measured point's own noise (scalelab/costs/calibration.py), and plan.html's layout table
(scalelab/analysis/html.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from conftest import launch

from scalelab.costs.convergence import fit_convergence
from scalelab.costs.model import FittedSeries

def _one_batch() -> pd.DataFrame:
    """The tester's sweep: two runs at global batch 16 that reached the threshold in 18 steps (288 samples)."""
    return pd.DataFrame({"label": "m", "global_batch": [16, 16], "steps_to_threshold": [18, 18],
                         "noise_scale": [40.0, 60.0]})


def test_a_huge_batch_takes_at_least_one_step():
    """288 samples measured at batch 16, predicted at 1e6: the tester saw 'steps low 0'."""
    rows = fit_convergence(_one_batch(), 0.9, "m").predict([4096, 1_000_000])
    assert rows["steps_low"].tolist() == [1.0, 1.0]
    assert (rows["predicted_steps_to_threshold"] >= 1.0).all() and (rows["steps_high"] >= 1.0).all()


SEED001 = Path(__file__).resolve().parent.parent / "scalelab" / "costs" / "data" / "seed001_nmt_scaling.csv"


@pytest.mark.parametrize("label", sorted(pd.read_csv(SEED001)["label"].unique()))
@pytest.mark.parametrize("confidence", [0.8, 0.9])
def test_per_gpu_high_end_past_the_data_never_above_the_last_measured_points(label, confidence):
    """Seed 001's 8 GPUs (one node) measured, 9-16 predicted: the band's high end per GPU never passes
    the measured 8's own high end per GPU (at 9 it was 2.9 % above the last rate, the measured band +1.3 %)."""
    table = pd.read_csv(SEED001)
    rows = table[table["label"] == label].assign(nodes=1)
    counts = [8, 9, 10, 12, 16]
    est = FittedSeries.fit(label, rows).estimate(counts, [1] * len(counts), confidence).set_index("workers")
    per_gpu = est["high"] / est.index.to_numpy(float)
    assert est.loc[8, "basis"] == "measured"
    assert (per_gpu.loc[9:] <= per_gpu.loc[8] * (1 + 1e-9)).all(), per_gpu.to_dict()
    assert (est["high"] >= est["predicted"]).all()  # the cap never cuts below the point


SEED004 = SEED001.with_name("seed004_money_speed.csv")


@pytest.fixture(scope="module")
def layout_page(tmp_path_factory) -> str:
    """plan.html of a `--predict` plan: one measured layout and one the step-time model predicts."""
    tmp = tmp_path_factory.mktemp("layouts")
    proc = launch("plan", "--from-csv", str(SEED004), "--predict", "4x1@4*g3.4xlarge,16x1@16*g3.4xlarge",
                  "--out", str(tmp / "pout"), cwd=tmp, env={"SCALELAB_PRICES": str(tmp / "none.json")})
    assert proc.returncode == 0, proc.stderr
    return (tmp / "pout" / "plan.html").read_text()


def _cells(page: str, heading: str) -> list[str]:
    """The text of every cell of the table under `heading`."""
    part = page.split(f"<h2>{heading}</h2>", 1)[1].split("<h2>", 1)[0]
    return [re.sub(r"<[^>]+>", "", c).replace("&nbsp;", " ") for c in re.findall(r"<t[dh][^>]*>.*?</t[dh]>", part)]


def test_plan_page_has_the_layout_table_of_plan_md(layout_page):
    cells = _cells(layout_page, "Predicted time of each layout")
    for header in ("layout", "basis", "time", "low", "high", "compute", "exchange"):
        assert header in cells
    assert "measured" in cells and "model" in cells  # each layout's basis
    assert "4x1@4*g3.4xlarge" in cells and "16x1@16*g3.4xlarge" in cells


def test_plan_page_of_layouts_has_no_empty_models_table_or_empty_throughput(layout_page):
    assert "<h2>Scaling models</h2>" not in layout_page
    cells = _cells(layout_page, "Candidates")
    assert "throughput /s" not in cells and "—" not in cells


def test_plan_page_writes_instances_as_count_star_type(tmp_path):
    """Worker counts on a type: `2*g3.4xlarge` as the terminal, plan.md and plan.json write it, not `2× g3.4xlarge`."""
    table = tmp_path / "t.csv"
    table.write_text("label,workers,throughput\ns,1,1000\ns,2,1900\n")
    proc = launch("plan", "--from-csv", str(table), "--predict-workers", "2", "--work", "1e7", "--instance-types",
                  "g3.4xlarge", "--measured-on", "g3.4xlarge", "--out", str(tmp_path / "p"), cwd=tmp_path,
                  env={"SCALELAB_PRICES": str(tmp_path / "none.json")})
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "p" / "plan.html").read_text()
    assert "×" not in page and "2*g3.4xlarge" in " ".join(_cells(page, "Candidates"))
