"""Steps and samples to a loss threshold against the global batch (scalelab/costs/convergence.py), the
conformal bands of throughput (scalelab/costs/calibration.py), and the planner's time to the threshold:
S(B) at each layout's global batch times its step time, judged by the band's bad end."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from scalelab.core.errors import DataError
from scalelab.costs.calibration import conformal_quantile
from scalelab.costs.catalog import builtin_catalog
from scalelab.costs.convergence import SEED_SPREAD, convergence_rows, fit_convergence, lr_rule
from scalelab.costs.planner import Overheads, PlanRequest, plan


def _curve(s_min: float, b_noise: float, batches, seeds=(1, 2, 3), wobble=0.02) -> pd.DataFrame:
    """Runs on S(B) = S_min (1 + B_noise/B), each seed a little off (as seeds are)."""
    rows = []
    for b in batches:
        for i, seed in enumerate(seeds):
            steps = s_min * (1 + b_noise / b) * (1 + wobble * (i - 1))
            rows.append({"label": "m", "global_batch": b, "steps_to_threshold": round(steps), "seed": seed,
                         "noise_scale": b_noise, "lr": 1e-3 * b / 16, "lr_warmup_steps": 20})
    return pd.DataFrame(rows)


def test_batch_fit_recovers_the_curve_and_its_band_holds_the_truth():
    fit = fit_convergence(_curve(100.0, 64.0, [16, 32]), 0.9, "m")
    assert fit.basis == "batch-fit" and fit.batches == [16, 32]
    assert fit.s_min == pytest.approx(100.0, rel=0.05) and fit.b_noise == pytest.approx(64.0, rel=0.1)
    rows = fit.predict([16, 64, 256])
    truth = 100.0 * (1 + 64.0 / rows["global_batch"])
    assert ((rows["steps_low"] <= truth) & (truth <= rows["steps_high"])).all()
    assert rows["predicted_samples_to_threshold"].tolist() == pytest.approx(
        (rows["predicted_steps_to_threshold"] * rows["global_batch"]).tolist())
    # the band widens with the distance from the measured batches
    width = (rows["steps_high"] - rows["steps_low"]) / rows["predicted_steps_to_threshold"]
    assert width.iloc[0] < width.iloc[1] < width.iloc[2]
    # E(B) = E_min (1 + B / B_noise): more samples at a larger batch
    assert rows["predicted_samples_to_threshold"].is_monotonic_increasing
    assert "linear scaling: lr 0.001 at global batch 16" in fit.lr_rule and "20 steps of warm-up" in fit.lr_rule


def test_no_sign_of_diminishing_returns_means_an_unbounded_noise_scale():
    runs = pd.DataFrame({"global_batch": [16, 32, 64], "steps_to_threshold": [800, 400, 200]})
    fit = fit_convergence(runs, 0.9)
    assert fit.s_min == pytest.approx(0.0, abs=1e-6) and math.isinf(fit.b_noise)
    assert fit.predict([128])["predicted_steps_to_threshold"].iloc[0] == pytest.approx(100.0, rel=1e-3)
    assert fit.form_spread == SEED_SPREAD  # an exact fit still extrapolates with the seed spread


def test_one_batch_and_its_noise_scale():
    runs = _curve(100.0, 64.0, [16]).assign(noise_scale=64.0)
    fit = fit_convergence(runs, 0.9, "m")
    assert fit.basis == "noise-scale" and fit.noise_scale == 64.0
    row = fit.predict([128]).iloc[0]
    s0 = float(np.exp(np.log(runs["steps_to_threshold"]).mean()))
    assert row["predicted_steps_to_threshold"] == pytest.approx(s0 * (1 + 64 / 128) / (1 + 64 / 16))
    # the band reaches perfect scaling (samples do not grow) at one end
    assert row["steps_low"] <= s0 * 16 / 128 <= row["steps_high"]
    with pytest.raises(DataError, match="none measured the gradient noise scale"):
        fit_convergence(runs.assign(noise_scale=None), 0.9, "m")
    with pytest.raises(DataError, match="no run reached the loss threshold"):
        fit_convergence(runs.assign(steps_to_threshold=None), 0.9, "m")


def test_the_learning_rate_rule_is_read_from_the_runs():
    b = pd.Series([16, 64])
    assert lr_rule(pd.DataFrame({"global_batch": b, "lr": [1e-3, 1e-3]})) == "constant: lr 0.001 at every global batch"
    assert lr_rule(pd.DataFrame({"global_batch": b, "lr": [1e-3, 4e-3], "lr_warmup_steps": [0, 0]})).startswith(
        "linear scaling: lr 0.001 at global batch 16")
    assert lr_rule(pd.DataFrame({"global_batch": b, "lr": [1e-3, 2e-3]})) == "mixed: lr 0.001 at batch 16, lr 0.002 at batch 64"


def test_convergence_rows_group_runs_by_model_and_threshold():
    table = pd.DataFrame({"model": ["rnnlm-tiny", "rnnlm-tiny"], "loss_threshold": [0.5, 0.5], "global_batch": [16, 32],
                          "steps_to_threshold": [800, None], "noise_scale": [70.0, 80.0], "lr": [1e-3, 2e-3],
                          "lr_warmup_steps": [0, 0], "workers": [1, 2]})
    rows = convergence_rows(table)
    assert rows["label"].tolist() == ["rnnlm-tiny to loss 0.5"] and rows["steps_to_threshold"].tolist() == [800]


@pytest.mark.parametrize("dtype", [object, "string", "str"])
def test_convergence_rows_of_runs_none_of_which_reached_their_threshold(dtype):
    """A sweep with --loss-threshold that no run reached: no rows. It was a TypeError in `launch plan` (a text
    column of pandas' own string dtype + the float column an empty map makes)."""
    table = pd.DataFrame({"model": pd.Series(["nmt-tiny", "nmt-tiny"], dtype=dtype), "loss_threshold": [4.0, 4.0],
                          "steps_to_threshold": [None, None], "global_batch": [16, 16]})
    rows = convergence_rows(table)
    assert len(rows) == 0 and set(rows.columns) >= {"label", "steps_to_threshold"}


def test_conformal_quantile():
    assert conformal_quantile(range(1, 10), 0.9) == 9  # ceil(10 * 0.9) = 9th of 9
    assert math.isinf(conformal_quantile(range(1, 9), 0.9))  # too few scores for 90 %
    with pytest.raises(DataError, match="between 0 and 1"):
        conformal_quantile([1.0], 1.5)


def _measured() -> pd.DataFrame:
    """Three layouts of one series whose global batch grows (16 per worker): words/s, 10 words a sample."""
    return pd.DataFrame({"label": "s", "workers": [1, 2, 4], "nodes": 1, "throughput": [1000.0, 1900.0, 3600.0],
                         "global_batch": [16, 32, 64], "batch_scaling": "growing", "words_per_sample": 10.0,
                         "convergence": "m to loss 1"})


def test_time_to_threshold_is_steps_at_the_layouts_batch_times_its_step_time():
    conv = _curve(100.0, 64.0, [16, 32]).assign(label="m to loss 1")
    cat = builtin_catalog()
    cat.add_rate("slurm", 1.0, "gpu-hour")
    p = plan(PlanRequest(_measured(), [8], cat, ["slurm"], convergence=conv, overheads=Overheads(30.0, 0.1)))
    c = p.candidates.set_index("workers")
    assert c.loc[8, "global_batch"] == 128  # 16 per worker, growing
    steps = p.convergence["m to loss 1"].steps([128])[0][0]
    assert c.loc[8, "steps_to_threshold"] == pytest.approx(steps)
    train_s = steps * 128 * 10.0 / c.loc[8, "predicted_throughput"]
    assert c.loc[8, "hours"] == pytest.approx((30.0 + 1.1 * train_s) / 3600)
    assert (c["hours_low"] <= c["hours"]).all() and (c["hours"] <= c["hours_high"]).all()
    # a larger global batch takes fewer steps but more samples (the work is no constant)
    assert c.loc[1, "steps_to_threshold"] > c.loc[8, "steps_to_threshold"]
    assert c.loc[1, "steps_to_threshold"] * 16 < c.loc[8, "steps_to_threshold"] * 128


def test_plan_rows_keep_the_batch_predictions_and_the_priced_candidates():
    """--predict-batch with --instance-types: JSON and plan.json carry both answers, each row
    naming its table (the batch rows used to hide the candidates)."""
    conv = _curve(100.0, 64.0, [16, 32]).assign(label="m to loss 1")
    cat = builtin_catalog()
    cat.add_rate("slurm", 1.0, "gpu-hour")
    p = plan(PlanRequest(_measured(), [8], cat, ["slurm"], convergence=conv, predict_batch=[64, 128]))
    rows = p.rows()
    batch = [r for r in rows if r["table"] == "steps_to_threshold"]
    priced = [r for r in rows if r["table"] == "candidates"]
    assert [r["global_batch"] for r in batch] == [64, 128] and "predicted_steps_to_threshold" in batch[0]
    assert len(priced) == len(p.candidates) == 4 and {r["instance_type"] for r in priced} == {"slurm"}
    assert len(rows) == len(batch) + len(priced)
    alone = plan(PlanRequest(_measured(), [8], cat, ["slurm"], convergence=conv)).rows()
    assert {r["table"] for r in alone} == {"candidates"}


def test_recommendations_judge_by_the_bad_end_of_the_band():
    conv = _curve(100.0, 64.0, [16, 32]).assign(label="m to loss 1")
    cat = builtin_catalog()
    cat.add_rate("slurm", 1.0, "gpu-hour")
    free = plan(PlanRequest(_measured(), [8], cat, ["slurm"], convergence=conv)).candidates
    # a deadline between a layout's predicted hours and the high end of its band rules it out
    row = free.sort_values("dollars").iloc[0]
    deadline = (row["hours"] + row["hours_high"]) / 2
    p = plan(PlanRequest(_measured(), [8], cat, ["slurm"], convergence=conv, deadline_h=deadline))
    rec = p.recommendations["cheapest_within_deadline"]
    assert row["workers"] == 1 and row["hours"] <= deadline  # the point estimate alone would pick it
    sure = free[free["hours_high"] <= deadline].sort_values("dollars").iloc[0]
    assert rec["workers"] == sure["workers"] == 2 and rec["hours_high"] <= deadline
    assert all("90% sure" in r for r in p.candidates["recommendation"].dropna())


def test_seed_004_tables_are_shipped_and_read_as_throughput():
    from scalelab.costs.calibration import reference_series

    series = reference_series()
    train = series["seed004_sentiment_scaling.csv: sentiment LSTM training, 10 epochs, M60 GPUs"]
    # the same 10 epochs on every layout: throughput is 1 / time (seed 004's money-speed table)
    one = train[train["workers"] == 1]["throughput"].iloc[0]
    eight = train[train["workers"] == 8]["throughput"].iloc[0]
    assert eight / one == pytest.approx(35920 / 9531)
    weak = series["seed004_emr_preprocessing.csv: EMR preprocessing, 12.5% of the corpus per node (weak)"]
    # the same work per node: 8 nodes did 4 times the work of 2 in 55 minutes against 99
    thr = weak.set_index("workers")["throughput"]
    assert thr[8] / thr[2] == pytest.approx(4 * 99 / 55)


@pytest.mark.slow
def test_validation_counts_each_independent_held_out_prediction_once():
    from importlib.resources import files

    from scalelab.costs.validation import evaluate, independent

    runs = pd.read_csv(files("scalelab.costs.data") / "convergence_tiny_presets.csv")
    rows = evaluate(runs, 0.9)
    held = independent(rows)
    fit = held[held["basis"] == "batch-fit"]
    # 2 models x batches 64, 128 x 3 seeds: the 2-worker sweeps and the weak sweeps repeat the
    # 1-worker runs' steps, and the weak sweeps' batch 16 and 32 are the runs fitted on
    assert len(rows[rows["basis"] == "batch-fit"]) == 42 and len(fit) == 12
    assert set(fit["global_batch"]) == {64, 128} and held["held_out"].all()
    assert not held.duplicated(["basis", "model", "global_batch", "seed", "predicted"]).any()
