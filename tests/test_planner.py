"""Planner: NNLS, the two scaling models, model choice by held-out error, Pareto frontier and the
recommendations, checked on synthetic data with known parameters and on seed 001's measurements
(shared/seeds/001, words/s per GPU count, TensorFlow NMT)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from costs.catalog import builtin_catalog
from costs.fitting import (
    CommModel,
    ErnestModel,
    LinkModel,
    PSModel,
    fit_series,
    mixed_throughput,
    nnls,
    pareto_front,
    ps_exchange_s,
    ring_allreduce_s,
)
from costs.planner import PlanRequest, plan

# seed 001, independent-replica cudnn_lstm: (GPUs, words/s)
SEED_001 = [(1, 51046.074), (2, 93790.686), (3, 133520.790), (4, 175351.156), (5, 216412.574),
            (6, 238642.350), (7, 279107.499), (8, 309930.493)]


def test_nnls_matches_brute_force_and_stays_non_negative():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.normal(size=(8, 4))
        b = rng.normal(size=8)
        x = nnls(a, b)
        assert (x >= 0).all()
        # no non-negative point on a grid does better
        best = min(np.sum((a @ np.array(g) - b) ** 2) for g in itertools.product(np.linspace(0, 2, 9), repeat=4))
        assert np.sum((a @ x - b) ** 2) <= best + 1e-9


def test_ernest_recovers_known_parameters():
    w = np.array([1, 2, 4, 8, 16], dtype=float)
    theta = np.array([1e-6, 2e-5, 3e-7, 1e-7])
    y = np.column_stack([np.ones_like(w), 1 / w, np.log(w), w]) @ theta
    m = ErnestModel().fit(w, np.ones_like(w), 1 / y)
    assert m.theta == pytest.approx(theta, rel=1e-6)
    assert m.predict([32], [1])[0] == pytest.approx(1 / (theta @ [1, 1 / 32, np.log(32), 32]), rel=1e-6)


def test_ring_allreduce_time_and_comm_model():
    link = LinkModel(gradient_bytes=100e6, intra_gbps=80, inter_gbps=10, intra_latency_s=0, inter_latency_s=0)
    # 2(N-1)/N * bytes / B: 4 workers on 2 nodes over 10 Gbit/s = 1.25 GB/s -> 1.5 * 0.08 s
    assert ring_allreduce_s(np.array([4.0]), np.array([2.0]), link)[0] == pytest.approx(1.5 * 100e6 / 1.25e9)
    assert ring_allreduce_s(np.array([1.0]), np.array([1.0]), link)[0] == 0.0
    w = np.array([1, 2, 3, 4, 6, 8], dtype=float)
    nodes = np.array([1, 1, 1, 2, 2, 4], dtype=float)
    truth = CommModel(link)  # exchange per step with a fixed (θ2) and a growing (θ3) global batch
    truth.theta = np.array([0.001, 0.02, 0.5, 0.3])
    thr = truth.predict(w, nodes)
    fitted = CommModel(link).fit(w, nodes, thr)
    assert fitted.theta == pytest.approx(truth.theta, rel=1e-6)


def test_model_choice_by_held_out_error_picks_the_true_shape():
    link = LinkModel(intra_latency_s=0, inter_latency_s=0)
    w = np.array([1, 2, 3, 4, 6, 8], dtype=float)
    truth = CommModel(link)
    truth.theta = np.array([2e-6, 2e-5, 4e-6, 0.0])
    df = pd.DataFrame({"workers": w, "nodes": np.where(w > 4, 2, 1), "throughput": truth.predict(w, np.where(w > 4, 2, 1))})
    fit = fit_series("x", df, link)
    assert fit.chosen == "comm"
    assert fit.held_out_error["comm"] < 1e-6 < fit.held_out_error["ernest"]


def test_parameter_server_time_and_its_model_is_chosen_on_ps_data():
    link = LinkModel(gradient_bytes=100e6, intra_gbps=80, inter_gbps=10, intra_latency_s=0, inter_latency_s=0)
    # 4 workers, 2 nodes (2 shards): each shard's link carries 2·3·50 MB at 1.25 GB/s
    assert ps_exchange_s(np.array([4.0]), np.array([2.0]), link)[0] == pytest.approx(2 * 3 * 50e6 / 1.25e9)
    # one node, one shard: N times the ring's time
    one = ps_exchange_s(np.array([4.0]), np.array([1.0]), link)[0]
    assert one == pytest.approx(4 * ring_allreduce_s(np.array([4.0]), np.array([1.0]), link)[0])
    w = np.array([1, 2, 4, 4, 8, 8, 16], dtype=float)
    nodes = np.array([1, 1, 1, 2, 2, 4, 4], dtype=float)
    truth = PSModel(link)
    truth.theta = np.array([1e-4, 1e-3, 0.05, 0.0])
    fit = fit_series("ps", pd.DataFrame({"workers": w, "nodes": nodes, "throughput": truth.predict(w, nodes)}), link)
    assert fit.chosen == "ps"
    assert fit.held_out_error["ps"] < 1e-6 < fit.held_out_error["comm"]


def test_seed_001_extrapolation_within_its_interval():
    """Fit on 1..6 GPUs, predict 7 and 8: the published numbers fall in the stated interval."""
    df = pd.DataFrame({"label": "replica", "workers": [w for w, _ in SEED_001[:6]],
                       "throughput": [t for _, t in SEED_001[:6]], "mode": "weak"})
    p = plan(PlanRequest(df, [7, 8]))
    for w, t in SEED_001[6:]:
        r = p.predictions[p.predictions["workers"] == w].iloc[0]
        assert r["interval_low"] <= t <= r["interval_high"], (w, t, r.to_dict())
        assert abs(r["predicted_throughput"] - t) / t < 0.15
    assert p.fits["replica"].held_out_error[p.fits["replica"].chosen] < 0.1
    assert p.next_measurement is not None and p.next_measurement["workers"] in (7, 8)


def test_two_measurements_fit_but_are_not_validated_and_one_is_refused():
    two = pd.DataFrame({"workers": [1, 2], "throughput": [10.0, 18.0]})
    fit = fit_series("", two)
    assert all(v is None for v in fit.held_out_error.values())
    from core.errors import DataError

    with pytest.raises(DataError, match="at least two different worker counts"):
        fit_series("s", pd.DataFrame({"workers": [2, 2], "throughput": [1.0, 1.1]}))


def test_pareto_front():
    t = [1, 2, 3, 2, 4]
    d = [10, 5, 6, 5, 1]
    assert pareto_front(t, d).tolist() == [True, True, False, False, True]


def test_mixed_types_run_at_the_slowest_speed():
    assert mixed_throughput([100, 100, 100, 56]) == 4 * 56


def test_plan_prices_layouts_and_recommends_within_deadline_and_budget():
    df = pd.DataFrame({"label": "s", "workers": [w for w, _ in SEED_001[:4]], "throughput": [t for _, t in SEED_001[:4]]})
    cat = builtin_catalog()
    cat.add_rate("slurm", 0.5, "gpu-hour")
    work = 2e9
    p = plan(PlanRequest(df, [6, 8], cat, ["g3.4xlarge", "g3.16xlarge", "slurm"], ["on-demand"], work=work,
                         measured_on="g3.4xlarge", deadline_h=5, budget_usd=20))
    c = p.candidates
    assert set(c["instance_type"]) == {"g3.4xlarge", "g3.16xlarge", "slurm"}
    # 6 workers on 4-GPU instances need 2 of them
    assert c[(c["workers"] == 6) & (c["instance_type"] == "g3.16xlarge")]["instances"].iloc[0] == 2
    assert np.allclose(c["hours"], work / c["predicted_throughput"] / 3600, rtol=1e-3)
    # judged by the bad end of the band (hours_high, dollars_high), as the recommendation says
    cheap = p.recommendations["cheapest_within_deadline"]
    ok = c[c["hours_high"] <= 5]
    assert cheap["dollars"] == pytest.approx(ok["dollars"].min()) and cheap["hours_high"] <= 5
    fast = p.recommendations["fastest_within_budget"]
    assert fast["hours"] == pytest.approx(c[c["dollars_high"] <= 20]["hours"].min())
    # both recommendations lie on the frontier
    assert c[c["recommendation"].notna()]["pareto"].all()


def test_plan_spot_with_interruptions_and_unknown_gpu_speed():
    df = pd.DataFrame({"workers": [1, 2, 4], "throughput": [100.0, 190.0, 350.0]})
    cat = builtin_catalog()
    p = plan(PlanRequest(df, [8], cat, ["p2.xlarge", "p3.2xlarge"], ["on-demand", "spot"], work=1e6,
                         measured_on="p2.xlarge", interruptions_per_hour=0.5))
    c = p.candidates
    assert set(c["instance_type"]) == {"p2.xlarge"}  # V100 speed unknown: not guessed
    assert any("--speed V100=FACTOR" in n for n in p.notes)
    od = c[(c["market"] == "on-demand") & (c["workers"] == 8)].iloc[0]
    sp = c[(c["market"] == "spot") & (c["workers"] == 8)].iloc[0]
    assert sp["hours"] > od["hours"] and sp["expected_interruptions"] > 0
    p2 = plan(PlanRequest(df, [8], cat, ["p3.2xlarge"], ["on-demand"], work=1e6, measured_on="p2.xlarge",
                          speed={"V100": 2.0}))
    base = p.candidates[(p.candidates["workers"] == 1) & (p.candidates["market"] == "on-demand")].iloc[0]
    v100 = p2.candidates[p2.candidates["workers"] == 1].iloc[0]
    assert v100["predicted_throughput"] == pytest.approx(2 * base["predicted_throughput"])
