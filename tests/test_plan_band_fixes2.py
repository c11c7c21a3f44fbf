"""Planner band fixes (second round): the steps-to-threshold band never below perfect scaling or one
step (scalelab/costs/convergence.py), the worker band's high end past the data capped by the last
measured point's own noise (scalelab/costs/calibration.py), and plan.html's layout table
(scalelab/analysis/html.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from scalelab.costs.convergence import fit_convergence

BATCHES = [8, 16, 32, 64, 256, 4096, 1_000_000]


def _one_batch() -> pd.DataFrame:
    """The tester's sweep: two runs at global batch 16 that reached the threshold in 18 steps (288 samples)."""
    return pd.DataFrame({"label": "m", "global_batch": [16, 16], "steps_to_threshold": [18, 18],
                         "noise_scale": [40.0, 60.0]})


def _two_batches() -> pd.DataFrame:
    """Repeats at two batches: 400 and 420 steps at 16, 230 and 250 at 32."""
    return pd.DataFrame({"label": "m", "global_batch": [16, 16, 32, 32], "steps_to_threshold": [400, 420, 230, 250]})


@pytest.mark.parametrize("runs", [_one_batch(), _two_batches()], ids=["noise-scale", "batch-fit"])
def test_samples_band_never_below_perfect_scaling_nor_one_step(runs):
    rows = fit_convergence(runs, 0.9, "m").predict(BATCHES)
    samples = runs["global_batch"] * runs["steps_to_threshold"]
    above = rows["global_batch"] >= runs["global_batch"].min()
    fewest = np.array([samples[runs["global_batch"] <= b].min() for b in rows.loc[above, "global_batch"]])
    assert (rows.loc[above, "samples_low"].to_numpy() >= fewest - 1e-9).all()
    assert rows.loc[above, "samples_low"].is_monotonic_increasing
    for column in ("steps_low", "predicted_steps_to_threshold", "steps_high"):
        assert (rows[column] >= 1.0).all(), column


def test_a_huge_batch_takes_at_least_one_step():
    """288 samples measured at batch 16, predicted at 1e6: the tester saw 'steps low 0'."""
    rows = fit_convergence(_one_batch(), 0.9, "m").predict([4096, 1_000_000])
    assert rows["steps_low"].tolist() == [1.0, 1.0]


def test_steps_band_below_the_measured_batch_never_below_the_steps_measured():
    """S(B) never falls as the batch shrinks: at batch 8 no fewer steps than the fewest measured at 16."""
    rows = fit_convergence(_one_batch(), 0.9, "m").predict([4, 8])
    assert (rows["steps_low"] >= 18).all()


def test_the_floor_is_no_higher_than_the_physics_allows():
    """Below the measured batch the perfect-scaling floor does not apply (288 samples at 16 is 18 steps,
    not 36, at batch 8): the low end stays under what S_min alone allows."""
    rows = fit_convergence(_one_batch(), 0.9, "m").predict([8])
    assert rows["steps_low"].iloc[0] < 36
