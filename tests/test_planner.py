"""Planner: NNLS, the two scaling models, model choice by held-out error, Pareto frontier and the
recommendations, checked on synthetic data with known parameters and on seed 001's measurements
(shared/seeds/001, words/s per GPU count, TensorFlow NMT)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from scalelab.costs.catalog import builtin_catalog
from scalelab.costs.fitting import (
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
from scalelab.costs.planner import PlanRequest, plan, resolve_candidate

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


def test_nnls_gives_scipy_s_answer_for_few_columns_and_hands_wide_problems_to_it():
    """The exact small-support search and Lawson-Hanson agree, on random and on rank-deficient problems."""
    from scipy import optimize

    rng = np.random.default_rng(1)
    for n in (1, 2, 3, 5, 6, 7):
        for _ in range(10):
            a = rng.normal(size=(9, n))
            if n > 2:
                a[:, -1] = a[:, 0]  # a repeated column: many supports tie
            b = rng.normal(size=9)
            ours, theirs = nnls(a, b), optimize.nnls(a, b)[0]
            assert (ours >= 0).all()
            assert np.sum((a @ ours - b) ** 2) == pytest.approx(np.sum((a @ theirs - b) ** 2), rel=1e-9, abs=1e-12)


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
    """Fit on 1..6 GPUs, predict 7 and 8: within 15 %, each band finite around its point. (Neither
    truth is inside its 90 % band: the series dips at 6 and recovers at 7 above the 6-GPU per-GPU rate,
    which bounds what lies beyond unless the series rose at its end; issue 33 asks for that bound.)"""
    df = pd.DataFrame({"label": "replica", "workers": [w for w, _ in SEED_001[:6]],
                       "throughput": [t for _, t in SEED_001[:6]], "mode": "weak"})
    p = plan(PlanRequest(df, [7, 8]))
    for w, t in SEED_001[6:]:
        r = p.predictions[p.predictions["workers"] == w].iloc[0]
        assert abs(r["predicted_throughput"] - t) / t < 0.15
        assert r["interval_low"] < r["predicted_throughput"] < r["interval_high"] < 8 * SEED_001[0][1]
    assert p.fits["replica"].held_out_error[p.fits["replica"].chosen] < 0.1
    assert p.next_measurement is not None and p.next_measurement["workers"] in (7, 8)


def test_two_measurements_fit_but_are_not_validated_and_one_is_refused():
    two = pd.DataFrame({"workers": [1, 2], "throughput": [10.0, 18.0]})
    fit = fit_series("", two)
    assert all(v is None for v in fit.held_out_error.values())
    from scalelab.core.errors import DataError

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
    assert cheap["dollars_high"] == pytest.approx(ok["dollars_high"].min()) and cheap["hours_high"] <= 5
    fast = p.recommendations["fastest_within_budget"]
    assert fast["hours_high"] == pytest.approx(c[c["dollars_high"] <= 20]["hours_high"].min())
    # both recommendations lie on the frontier
    assert c[c["recommendation"].notna()]["pareto"].all()


def test_plan_spot_with_interruptions_and_gpu_speed_estimated_or_given():
    df = pd.DataFrame({"workers": [1, 2, 4], "throughput": [100.0, 190.0, 350.0]})
    cat = builtin_catalog()
    p = plan(PlanRequest(df, [8], cat, ["p2.xlarge", "p3.2xlarge"], ["on-demand", "spot"], work=1e6,
                         measured_on="p2.xlarge", interruptions_per_hour=0.5))
    c = p.candidates
    assert dict(zip(c["instance_type"], c["speed_basis"])) == {"p2.xlarge": "measured", "p3.2xlarge": "estimate"}
    assert any("p3.2xlarge: speed estimated from specs, V100 against the measured K80" in n for n in p.notes)
    od = c[(c["market"] == "on-demand") & (c["workers"] == 8) & (c["instance_type"] == "p2.xlarge")].iloc[0]
    sp = c[(c["market"] == "spot") & (c["workers"] == 8) & (c["instance_type"] == "p2.xlarge")].iloc[0]
    assert sp["hours"] > od["hours"] and sp["expected_interruptions"] > 0
    p2 = plan(PlanRequest(df, [8], cat, ["p3.2xlarge"], ["on-demand"], work=1e6, measured_on="p2.xlarge",
                          speed={"V100": 2.0}))
    base = c[(c["workers"] == 1) & (c["market"] == "on-demand") & (c["instance_type"] == "p2.xlarge")].iloc[0]
    v100 = p2.candidates[p2.candidates["workers"] == 1].iloc[0]
    assert v100["predicted_throughput"] == pytest.approx(2 * base["predicted_throughput"])
    assert v100["speed_basis"] == "user" and v100["speed_widening"] == 1.0 and not v100["measured"]


# ---- speed_basis (issue 15): no type priced silently at another type's speed ----------------------

# a sweep measured on this machine's CPU (issue 15: 52,270 words/s on every type)
CPU_SWEEP = pd.DataFrame({"label": "cpu", "workers": [1, 2, 4], "throughput": [52270.0, 98000.0, 180000.0]})
SEED_TYPES = ["p2.xlarge", "g3.4xlarge", "g3.16xlarge"]


def _by_type(p, workers=1):
    c = p.candidates
    return {r["instance_type"]: r for _, r in c[c["workers"] == workers].iterrows()}


def test_cpu_measurements_price_no_type_at_their_speed():
    p = plan(PlanRequest(CPU_SWEEP, [8], builtin_catalog(), SEED_TYPES, work=1e9))
    assert len(p.candidates) == 0
    for name in SEED_TYPES:
        assert any(n.startswith(f"{name}: not priced, its speed cannot be estimated relative to the device") and
                   "--measured-on TYPE" in n and "launch probe" in n for n in p.notes), p.notes


def test_seed_types_get_distinct_speeds_with_their_basis():
    """Measured on p2.xlarge: p2 is measured, the M60 types take seed 004's published K80/M60 ratio
    (not the K80's speed, not a spec ratio), the same per-GPU speed on g3.4xlarge and g3.16xlarge
    (one M60 each per worker)."""
    p = plan(PlanRequest(CPU_SWEEP, [8], builtin_catalog(), SEED_TYPES, work=1e9, measured_on="p2.xlarge"))
    rows = _by_type(p)
    assert {t: r["speed_basis"] for t, r in rows.items()} == {
        "p2.xlarge": "measured", "g3.4xlarge": "published", "g3.16xlarge": "published"}
    ratio = 63923 / 35920  # seed 004: 10 epochs on one p2.xlarge and on one g3.4xlarge
    p2 = rows["p2.xlarge"]["predicted_throughput"]
    assert rows["g3.4xlarge"]["predicted_throughput"] == pytest.approx(ratio * p2, rel=1e-3)
    assert rows["g3.16xlarge"]["predicted_throughput"] == pytest.approx(ratio * p2, rel=1e-3)
    c = p.candidates
    assert c[c["measured"]]["instance_type"].unique().tolist() == ["p2.xlarge"]


def test_estimate_interval_is_wider_by_its_stated_factor():
    p = plan(PlanRequest(CPU_SWEEP, [8], builtin_catalog(), ["p2.xlarge", "g5.xlarge"], work=1e9,
                         measured_on="p2.xlarge"))
    rows = _by_type(p, 8)
    meas, est = rows["p2.xlarge"], rows["g5.xlarge"]
    assert est["speed_widening"] == pytest.approx(2.2) and meas["speed_widening"] == 1.0
    f = est["speed_factor"]
    assert est["interval_low"] == pytest.approx(meas["interval_low"] * f / 2.2)
    assert est["interval_high"] == pytest.approx(meas["interval_high"] * f * 2.2)
    # the time band widens with it: relative spread of hours
    spread = {t: r["hours_high"] / r["hours_low"] for t, r in rows.items()}
    assert spread["g5.xlarge"] > 4 * spread["p2.xlarge"]


def test_seed_004_pair_sets_the_widening():
    """The constants of scalelab/costs/speed.py: on seed 004 an M60 (g3.4xlarge, 35,920 s) was 1.78x a K80
    (p2.xlarge, 63,923 s); the 0.5 blend says 0.83x (a factor 2.1 off, under κ = 2.2) and no
    compute share does better than a factor 1.6 (the floor with probes)."""
    from scalelab.costs.speed import CALIBRATED_FLOOR, UNCALIBRATED_WIDENING, spec_time_ratio

    cat = builtin_catalog()
    k80, m60 = cat.gpu_models["K80"], cat.gpu_models["M60"]
    measured = 63923 / 35920
    blend = 1 / spec_time_ratio(m60, k80, "fp32", 0.5)
    best = max(1 / spec_time_ratio(m60, k80, "fp32", s) for s in np.linspace(0, 1, 101))
    assert blend == pytest.approx(0.83, abs=0.005) and 2.1 < measured / blend < UNCALIBRATED_WIDENING
    assert 1.6 <= measured / best < 1.62 and CALIBRATED_FLOOR == 1.6


def test_user_speed_and_probes():
    cat = builtin_catalog()
    user = plan(PlanRequest(CPU_SWEEP, [8], cat, ["g3.4xlarge"], work=1e9, speed={"M60": 3.0}))
    r = _by_type(user)["g3.4xlarge"]
    assert r["speed_basis"] == "user" and r["predicted_throughput"] == pytest.approx(3.0 * 52270, rel=0.05)
    probes = {"p2.xlarge": 100.0, "g3.4xlarge": 178.0}
    p = plan(PlanRequest(CPU_SWEEP, [8], cat, SEED_TYPES + ["p3.2xlarge"], work=1e9, measured_on="p2.xlarge",
                         probe_speed=probes))
    rows = _by_type(p)
    p2 = rows["p2.xlarge"]["predicted_throughput"]
    assert rows["g3.4xlarge"]["speed_basis"] == "probe"
    assert rows["g3.4xlarge"]["predicted_throughput"] == pytest.approx(1.78 * p2)
    # g3.16xlarge has the probed type's GPU: its speed, a narrow widening
    assert rows["g3.16xlarge"]["speed_basis"] == "estimate" and rows["g3.16xlarge"]["speed_widening"] == 1.1
    assert rows["g3.16xlarge"]["predicted_throughput"] == pytest.approx(1.78 * p2)
    # V100 estimated with the compute share fitted on the probe; the probe missed by 1.61 -> κ 1.61
    assert rows["p3.2xlarge"]["speed_basis"] == "estimate"
    assert rows["p3.2xlarge"]["speed_widening"] == pytest.approx(1.61, abs=0.01)
    assert any("compute share 1.00 fitted on 1 probed type(s)" in n for n in p.notes)


def test_rate_without_gpu_is_user_basis_and_unknown_gpu_is_refused():
    cat = builtin_catalog()
    cat.add_rate("slurm", 0.5, "gpu-hour")
    cat.instances["odd.xlarge"] = type(cat.instance("g5.xlarge"))(name="odd.xlarge", gpus=1, gpu_model="Z9")
    cat.on_demand[("odd.xlarge", "us-east-1")] = cat.price("g5.xlarge")
    p = plan(PlanRequest(CPU_SWEEP, [8], cat, ["slurm", "odd.xlarge"], work=1e9, measured_on="p2.xlarge"))
    assert set(p.candidates["instance_type"]) == {"slurm"} and set(p.candidates["speed_basis"]) == {"user"}
    assert any(n.startswith("slurm: an on-premise rate without a GPU model, priced at the measured speed") for n in p.notes)
    assert any(n.startswith("odd.xlarge: no GPU specs for Z9") for n in p.notes)


def test_probed_rates_without_gpu_model_get_their_probe_speed():
    """launch probe's local variants (and Slurm GPU types) are --rate names without a GPU model: the
    measured one is `measured`, a probed one is priced at its probe's speed, not at the measured
    type's as `user` (seen on this machine: local-2t ran at 1/60 of local-1t's words/s and was priced
    at local-1t's); an unprobed rate is still `user`."""
    cat = builtin_catalog()
    for name in ("local-1t", "local-2t", "local-4t"):
        cat.add_rate(name, 0.5, "node-hour", 2)
    p = plan(PlanRequest(CPU_SWEEP, [1, 2, 4], cat, ["local-1t", "local-2t", "local-4t"], work=1e9,
                         measured_on="local-1t", probe_speed={"local-1t": 30000.0, "local-2t": 500.0}))
    rows = _by_type(p, 2)
    assert {t: r["speed_basis"] for t, r in rows.items()} == {
        "local-1t": "measured", "local-2t": "probe", "local-4t": "user"}
    assert rows["local-2t"]["predicted_throughput"] == pytest.approx(rows["local-1t"]["predicted_throughput"] / 60)
    assert rows["local-4t"]["predicted_throughput"] == pytest.approx(rows["local-1t"]["predicted_throughput"])
    assert not any(n.startswith("local-2t:") for n in p.notes) and any(n.startswith("local-4t:") for n in p.notes)


def test_each_type_is_resolved_from_the_catalog_once_and_carried_through_its_rows(monkeypatch):
    """price() resolves a type into one Candidate (shape, speed, link, prices, interruptions) and makes
    every row of it from that object: the catalog's prices are read once per type and market, however
    many worker counts are priced."""
    cat = builtin_catalog()
    calls: list[tuple[str, str]] = []
    real_price = type(cat).price
    monkeypatch.setattr(type(cat), "price", lambda self, name, market="on-demand", region=None:
                        calls.append((name, market)) or real_price(self, name, market, region))
    request = PlanRequest(CPU_SWEEP, [2, 8, 16], cat, ["p2.xlarge", "p2.8xlarge"], ["on-demand", "spot"], work=1e9,
                          measured_on="p2.xlarge")
    p = plan(request)
    assert sorted(calls) == sorted({(t, m) for t in ("p2.xlarge", "p2.8xlarge") for m in ("on-demand", "spot")})
    cand = resolve_candidate(request, "p2.8xlarge", [])
    assert (cand.name, cand.gpus, cand.speed.basis) == ("p2.8xlarge", 8, "estimate")
    assert cand.instances_for(9) == 2 and cand.gpu_mem_gib == cat.instance("p2.8xlarge").gpu_mem_gib
    rows = p.candidates[(p.candidates["instance_type"] == "p2.8xlarge") & (p.candidates["market"] == "on-demand")]
    assert set(rows["usd_per_hour"]) == {n * cand.usd_per_hour["on-demand"] for n in rows["instances"]}


def test_measure_next_weighs_the_models_the_plan_chooses_among_bounded_by_physics():
    """Jasper mixed b64 on a DGX-2 (DeepLearningExamples): the raw comm fit put 32 GPUs at 213 samples/s after 16
    had measured 567, and 'measure 32: the models disagree most there (76 % apart)' rested on it; the plan's own
    candidates, bounded as its point is, disagree far less there."""
    from scalelab.costs.fitting import FitResult
    from scalelab.costs.model import FittedSeries

    rows = pd.DataFrame({"workers": [1, 4, 8, 16], "nodes": 1, "throughput": [37.6, 146.7, 289.0, 567.0]})
    fit = FittedSeries.fit("jasper", rows, instance_gpus=16)
    gap = fit.disagreement([32], [2])
    raw = FitResult.disagreement(fit, [32], [2])  # the raw NNLS fits' gap, as it was measured: 0.44 here
    assert 0 < gap[0] < 0.4 < raw[0], (gap, raw)
