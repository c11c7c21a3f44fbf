"""A plan's bands at and beyond its measurements, and its points across nodes (a review of 2026-12-07).

The series are real nmt-tiny sweeps on a 2-core CPU whose 2-worker point is slower than 1 worker
(negative scaling): gb64 measured 181,005 and 68,004 words/s (step-time spread 14.7 % and 42.8 %),
gb128 151,346 and 132,295 (19.8 % and 48.8 %). Before: the 1-worker measurement of gb64 had a 95 % low
end of 3,013 words/s (99 %: 94), gb128's 16 workers 0.033 words/s, and gb128's 8 workers were
104,305 on one node, 90,077 on two and 80,357 on eight from link speeds no measurement saw.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from scalelab.costs.calibration import all_tasks, predict_band, reference_tables
from scalelab.costs.model import FittedSeries
from scalelab.costs.planner import PlanRequest, plan

GB64 = pd.DataFrame({"label": "gb64", "workers": [1, 2], "nodes": [1, 1], "throughput": [181005.069, 68003.822],
                     "throughput_spread": [0.147157, 0.428407]})
GB128 = pd.DataFrame({"label": "gb128", "workers": [1, 2], "nodes": [1, 1], "throughput": [151345.629, 132294.784],
                      "throughput_spread": [0.198219, 0.487866]})


@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_a_measured_layouts_band_is_its_own_spread(confidence):
    """A measured layout's band is its runs' step-time spread (z·spread either side), not the calibrated
    extrapolation band at d = 0, which grows with the series' loss per doubling (r = 1.7 here)."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    est = FittedSeries.fit("gb64", GB64).estimate([1, 2], confidence=confidence).set_index("workers")
    for w, rel in ((1, 0.147157), (2, 0.428407)):
        point = float(GB64.set_index("workers").loc[w, "throughput"])
        assert est.loc[w, "basis"] == "measured" and est.loc[w, "predicted"] == pytest.approx(point)
        assert est.loc[w, "low"] == pytest.approx(point / (1 + z * rel), rel=1e-6), est
        linear = w * 181005.069  # the high end never passes linear scaling
        assert est.loc[w, "high"] == pytest.approx(min(point * (1 + z * rel), linear), rel=1e-6)


def test_a_measured_layout_without_a_spread_keeps_a_measurements_noise():
    """A table's row says nothing of its spread: its band is a measurement's noise (a few %), still finite
    and around the point, not zero and not the extrapolation band."""
    table = GB64.drop(columns="throughput_spread")
    est = FittedSeries.fit("gb64", table).estimate([1], confidence=0.99).iloc[0]
    assert 0.7 * est["predicted"] < est["low"] < est["predicted"] <= est["high"] < 1.3 * est["predicted"]


@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_the_low_end_beyond_the_counts_stays_above_the_exchanges_floor(confidence):
    """A step grows at most as N − 1 from the most measured count (a ring's and a parameter server's
    latency terms), so 4, 8 and 16 workers deliver at least T(2)·1/(N − 1); across nodes the network may
    be `network_ratio` times slower than the link measured. Before, 16 workers had a low end of 0.033 words/s."""
    wanted = np.array([4, 8, 16])
    same = predict_band(GB128, wanted, [1, 1, 1], confidence)
    across = predict_band(GB128, wanted, [1, 2, 4], confidence)
    floor = 132294.784 / (wanted - 1)
    assert (same["low"].to_numpy() >= floor * (1 - 1e-9)).all(), same
    from scalelab.costs.calibration import network_ratio

    assert (across["low"].to_numpy() >= floor / network_ratio() * (1 - 1e-9)).all(), across
    assert (across["low"].to_numpy() <= same["low"].to_numpy() * (1 + 1e-9)).all()  # a crossing is never cheaper


def test_no_published_prediction_falls_below_the_exchanges_floor():
    """The floor is checked on every extrapolation task of the corpus (520 predictions, 15 sources), crossing
    ones included, without the network's ratio: the bound the band's low end now keeps never cut a truth."""
    from scalelab.costs.calibration import exchange_floor

    tasks = all_tasks()
    assert (tasks["true"] >= tasks["least"] * (1 - 1e-9)).all()
    worst = np.inf
    for table, series in reference_tables().items():
        for label, rows in series.items():
            counts = sorted(set(rows["workers"]))
            for k in range(2, len(counts)):
                fitted, test = rows[rows["workers"] <= counts[k - 1]], rows[rows["workers"] > counts[k - 1]]
                floor = exchange_floor(fitted, test["workers"])
                worst = min(worst, float((test["throughput"].to_numpy() / floor).min()))
    assert worst >= 1 - 1e-9, worst


def test_the_point_beyond_the_measured_nodes_is_the_point_on_them():
    """No measurement spans nodes: 8 workers on 1, 2 or 8 nodes get one point (the crossing is priced by
    the band's low end only), where the comm model's assumed link speeds gave 104,305 / 90,077 / 80,357."""
    band = predict_band(GB128, [8, 8, 8], [1, 2, 8], 0.9)
    assert np.allclose(band["predicted"], band["predicted"].iloc[0])
    assert band["low"].iloc[1] <= band["low"].iloc[0] and band["high"].iloc[1] <= band["high"].iloc[0] * (1 + 1e-9)


def test_a_measured_count_on_more_nodes_keeps_its_measurement_as_the_point():
    """2 workers measured at 132,295 on one node, priced on two 1-GPU nodes: the point is the measurement
    (it was "predicted" 112,622), the crossing lowers the band's low end only."""
    fit = FittedSeries.fit("gb128", GB128)
    one, two = (fit.estimate([2], nodes=[n], confidence=0.9).iloc[0] for n in (1, 2))
    assert two["basis"] == "measured" and two["predicted"] == pytest.approx(132294.784)
    assert two["low"] < one["low"] and two["high"] == pytest.approx(one["high"])
    from scalelab.costs.calibration import network_ratio

    assert two["low"] >= 132294.784 / network_ratio() * (1 - 1e-9)


def test_the_plan_prices_the_same_point_on_every_type_of_one_gpu():
    """Through the planner, on g5 types of 1, 4 and 8 GPUs (no measurement across nodes): every count has
    one point whatever the nodes its type needs, and the measured counts are their measurements."""
    from scalelab.costs.catalog import builtin_catalog

    req = PlanRequest(GB128.drop(columns="throughput_spread"), [1, 2, 4, 8, 16], builtin_catalog(),
                      ["g5.12xlarge", "g5.xlarge", "g5.48xlarge"], work=1e9, measured_on="g5.12xlarge")
    c = plan(req).candidates
    c = c[c["market"] == "on-demand"]
    for w, part in c.groupby("workers"):
        assert np.allclose(part["predicted_throughput"], part["predicted_throughput"].iloc[0]), (w, part)
    two = c[c["workers"] == 2].set_index("instance_type")
    small = two.loc["g5.xlarge"]
    assert small["nodes"] == 2 and small["predicted_throughput"] == pytest.approx(132294.784)
    assert (c["interval_low"] > 0.005 * c["predicted_throughput"]).all(), c  # was 0.033 of 74,146 at 16
