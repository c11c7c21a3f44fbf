"""The planner on data it never saw: the published corpus, leave-one-table-out calibration of the
throughput bands (scalelab/costs/calibration.py), their physical bounds, and seed 004's cheapest."""

from __future__ import annotations

import math
from importlib.resources import files

import numpy as np
import pandas as pd
import pytest

from scalelab.core.errors import DataError
from scalelab.costs.calibration import (
    CANDIDATES,
    CAPPED,
    MARGINS,
    all_tasks,
    band_ceiling,
    calibrate,
    candidate_predictions,
    coverage,
    coverage_summary,
    next_count,
    origin_of,
    predict_band,
    reference_tables,
)
from scalelab.costs.catalog import builtin_catalog
from scalelab.costs.planner import PlanRequest, plan
from conftest import made_once


def test_the_corpus_names_a_source_for_every_table_and_spans_kepler_to_hopper_and_64_gpus():
    sources = pd.read_csv(files("scalelab.costs.data.corpus") / "SOURCES.csv")
    tables = reference_tables()
    corpus = {t for t in tables if not t.startswith("seed")}
    assert len(corpus) >= 12 and corpus == set(sources["table"])
    pinned = sources["source"].str.contains("@[0-9a-f]{40}:", regex=True)  # repository@commit:path
    thread = sources["source"].str.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+")  # a user's thread
    assert (pinned | thread).all()
    assert sources["origin"].notna().all() and sources["origin"].nunique() >= 8  # independent origins (issue 33)
    gpus = " ".join(sources["gpu"])
    assert all(g in gpus for g in ("Kepler", "Pascal", "Volta", "Ampere", "Hopper"))
    most = max(int(rows["workers"].max()) for series in tables.values() for rows in series.values())
    multi = [t for t, series in tables.items() if any((rows["nodes"] > 1).any() for rows in series.values())]
    assert most >= 64 and len(multi) >= 3


def coverage_once(tmp_path_factory, confidence: float) -> pd.DataFrame:
    """`coverage(confidence)`, computed once in the pytest run (conftest's made_once) and read back by every
    worker that asks: the nested leave-one-origin-out takes 6-9 s of CPU at each confidence, and a module
    fixture made the 90 % one again on every worker that ran one of its tests."""
    def make(where):
        path = where / "coverage.pkl"
        coverage(confidence).to_pickle(path)
        return path

    return pd.read_pickle(made_once(tmp_path_factory, ["calibration-coverage", repr(confidence)], make))


@pytest.fixture(scope="module")
def loso(tmp_path_factory) -> pd.DataFrame:
    return coverage_once(tmp_path_factory, 0.9)


@pytest.mark.slow
def test_leaving_one_whole_source_out_meets_the_issue_bar(loso):
    """Issue 33: fits on 3+ counts hold >= 88 % at 90 % with a mean error at most 0.9x the naive trend
    rule's; fits on 2 counts hold >= 88 % with a median half-width of at most 20 %; every bound finite;
    each origin judged with a calibration made without it, its margin too (nested leave-one-origin-out,
    docs/benchmarks.md); the 2-count point is no worse than the naive trend rule."""
    by_k = coverage_summary(loso, ["k_class"]).set_index("k_class")
    three, two = by_k.loc["3+"], by_k.loc["2"]
    assert three["coverage"] >= 0.88 and three["mape"] <= 0.9 * three["naive_mape"]
    assert three["median_half_width"] <= 0.2
    assert two["coverage"] >= 0.88 and two["median_half_width"] <= 0.2 and two["mape"] <= two["naive_mape"]
    assert set(loso["margin"]) <= set(MARGINS)
    assert two["infinite"] == 0 and three["infinite"] == 0
    assert loso["table"].nunique() == len(reference_tables())
    assert set(loso["origin"]) == {origin_of(t) for t in reference_tables()}


def test_each_origin_is_judged_with_a_calibration_made_without_it():
    whole = calibrate(0.9)
    tasks = all_tasks()

    def own(frame: pd.DataFrame, k: str) -> pd.DataFrame:
        """The tasks of class k's band within one node: a capped class is calibrated as a whole."""
        part = frame[frame["k_class"] == k]
        return part if k in CAPPED else part[~part["crosses_nodes"]]

    assert all(whole[k].tables == own(tasks, k)["table"].nunique() for k in ("2", "3+"))
    some = origin_of(next(iter(reference_tables())))
    held = tasks[tasks["origin"] == some]
    without = calibrate(0.9, some)
    for k in ("2", "3+"):
        c = without[k]
        assert c.tables == whole[k].tables - own(held, k)["table"].nunique()
        assert c.origins == whole[k].origins - int(len(own(held, k)) > 0)
    assert all(0.9 <= c.level <= 1.0 and c.lo <= 0 <= c.hi for c in without.values())
    assert set(whole) == {"2", "3+", "2 across nodes", "3+ across nodes"}
    assert all(set(c.members) <= set(CANDIDATES) and c.model == "&".join(c.members) for c in whole.values())
    # the naive rule competes: its held-out error is measured like every other model's
    assert all(math.isfinite(c.errors["naive"]) and math.isfinite(c.errors[c.model]) for c in whole.values())


def test_a_fold_chooses_its_margin_without_the_origin_it_leaves_out(monkeypatch):
    """The margin is chosen by leaving one origin out among the training origins only: altering the
    held-out origin's measurements (its series collapsing to a third) leaves that fold's margins and
    bands as they were, while the calibration that trains on that origin moves."""
    import scalelab.costs.calibration as cal

    held = "nvidia-dle"
    tasks = cal.all_tasks()
    assert held in set(tasks["origin"])
    before = cal._choose_margins(0.9, frozenset({held}))
    bands = cal.calibrate(0.9, held)
    trained = cal._by_margin(0.9, frozenset())
    assert set(before) == {"2", "3+"} and set(before.values()) <= set(MARGINS)
    assert all(c.margin == before[k.removesuffix(cal.ACROSS)] for k, c in bands.items())
    altered = tasks.copy()
    mine = altered["origin"] == held
    altered.loc[mine, "true"] = altered.loc[mine, "true"] / 3
    monkeypatch.setattr(cal, "all_tasks", lambda: altered)
    for cached in (cal._by_margin, cal.calibrate):
        cached.cache_clear()
    try:
        assert cal._choose_margins(0.9, frozenset({held})) == before
        assert cal.calibrate(0.9, held) == bands
        moved = cal._by_margin(0.9, frozenset())
        assert any((moved[m]["2"].lo, moved[m]["3+"].lo) != (trained[m]["2"].lo, trained[m]["3+"].lo) for m in MARGINS)
    finally:
        monkeypatch.undo()
        for cached in (cal._by_margin, cal.calibrate):
            cached.cache_clear()


def test_two_count_fits_combine_two_models_and_reach_up_to_the_physical_cap():
    """Issue 33, fits on two counts: the point is the geometric mean of the two models of least held-out
    error (which one leads flips with the source left out), and the band's high end beyond the counts
    is physics' cap (the last per-GPU rate carried forward, raised by the measurement's noise), its low
    end as far down as the sources left out needed; fits on three or more keep one model."""
    fitted = pd.DataFrame({"workers": [1, 2], "throughput": [100.0, 180.0]})
    wanted = [8, 16]
    cal = calibrate(0.9)
    two, three = cal["2"], cal["3+"]
    assert two.capped and len(two.members) == 2 and not three.capped and len(three.members) == 1
    preds = candidate_predictions(fitted, wanted)
    a, b = (np.asarray(preds[m], dtype=float) for m in two.members)
    band = predict_band(fitted, wanted)
    assert np.allclose(band["predicted"], np.sqrt(a * b))
    assert np.allclose(band["high"], band_ceiling(fitted, wanted, two.hi))
    # the cap by hand: 90 per GPU (the last rate), noise δ·(r + 0.05) with r = log(100/90) per doubling
    assert np.allclose(band["high"], np.array(wanted) * 90.0 * math.exp(two.hi * 0.5 * (math.log(100 / 90) + 0.05)))
    assert (band["low"] < band["predicted"]).all() and (band["model"] == two.model).all()


def test_sibling_tables_of_one_source_share_an_origin():
    """Leaving one table out let its siblings teach the model their shape: tables of one publisher,
    suite or thread are one origin, and the seeds are each their own."""
    assert origin_of("seed004_sentiment_scaling.csv") == origin_of("seed004_emr_preprocessing.csv") == "seed004"
    assert origin_of("seed001_nmt_scaling.csv") == "seed001"
    sources = pd.read_csv(files("scalelab.costs.data.corpus") / "SOURCES.csv")
    by_origin = sources.assign(o=sources["table"].map(origin_of)).groupby("o")["table"].nunique()
    assert by_origin.max() >= 2  # some source gave several tables, which leave together


def _random_series(seed: int) -> tuple[list[float], int]:
    """Per-GPU efficiencies in [0.3, 1.1] (super-linear too) at 2-5 counts, from 2^start GPUs."""
    rng = np.random.default_rng(seed)
    return list(rng.uniform(0.3, 1.1, size=int(rng.integers(2, 6)))), int(rng.integers(0, 3))


@pytest.mark.parametrize("seed", range(40))
def test_bands_are_finite_and_physically_bounded(seed):
    """No prediction above linear scaling from the best measured per-GPU rate, nor, beyond the most
    measured count, above the last measured per-GPU rate (a rise at its end included); no band
    above linear scaling; more GPUs never predicted below the most measured count while the measured
    throughput never fell; every bound finite and positive, with two counts too."""
    effs, start = _random_series(seed)
    counts = [2 ** (start + i) for i in range(len(effs))]
    thr = [c * 100.0 * e for c, e in zip(counts, effs)]
    fitted = pd.DataFrame({"workers": counts, "throughput": thr})
    wanted = np.array([counts[0], counts[-1] * 2, counts[-1] * 8])
    band = predict_band(fitted, wanted)
    rates = [t / c for t, c in zip(thr, counts)]
    best = max(rates)
    assert np.isfinite(band[["predicted", "low", "high"]].to_numpy()).all() and (band["low"] > 0).all()
    assert (band["high"] <= wanted * best * (1 + 1e-9)).all()
    assert (band["predicted"] <= wanted * best * (1 + 1e-9)).all()
    beyond = band[band["workers"] > counts[-1]]
    assert (beyond["predicted"] <= beyond["workers"] * rates[-1] * (1 + 1e-9)).all()
    if all(b >= a for a, b in zip(thr, thr[1:])):
        assert (beyond["predicted"] >= thr[-1] * (1 - 1e-9)).all()
    assert (band["low"] <= band["predicted"]).all() and (band["predicted"] <= band["high"]).all()


def test_per_gpu_efficiency_never_recovers_beyond_the_measurements():
    """Seed 001's published 1-8 GPUs, whose 7 -> 8 step is a noisy uptick: beyond 8 neither the point
    nor the band's high end may give a GPU more than the last measured rate (its noise allowance
    included, flat in the count); before 2026-12-06 the high end climbed back to linear scaling from
    the 1-GPU rate at 128 GPUs."""
    counts = list(range(1, 9))
    thr = [50007.279, 92236.723, 127376.7, 156508.555, 190615.0, 220829.0, 234615.0, 274915.0]
    fitted = pd.DataFrame({"workers": counts, "throughput": thr})
    wanted = np.array([16, 32, 64, 128])
    band = predict_band(fitted, wanted, nodes=wanted // 8)
    per_gpu_high = band["high"].to_numpy() / wanted
    assert (band["predicted"] <= wanted * thr[-1] / 8 * (1 + 1e-9)).all()
    assert np.all(np.diff(per_gpu_high) <= 1e-9 * per_gpu_high[:-1])
    assert per_gpu_high[-1] < 0.8 * thr[0]  # far from linear scaling from 1 GPU


@pytest.mark.parametrize("confidence", [0.8, 0.9])
def test_the_same_gpus_on_more_nodes_are_never_predicted_faster(confidence):
    """The network paid for the first time never speeds a step up: 16 and 32 GPUs beyond a table
    measured on one node get no higher a band on 2 and 4 nodes than on one (the crossing class was
    calibrated apart and its high end came out above the other's)."""
    fitted = pd.DataFrame({"workers": [1, 2, 4, 8], "nodes": 1, "throughput": [100.0, 190.0, 350.0, 640.0]})
    wanted = [16, 32]
    one = predict_band(fitted, wanted, nodes=[1, 1], confidence=confidence)
    more = predict_band(fitted, wanted, nodes=[2, 4], confidence=confidence)
    assert (more["high"].to_numpy() <= one["high"].to_numpy() * (1 + 1e-9)).all()
    assert (more["low"].to_numpy() <= one["low"].to_numpy() * (1 + 1e-9)).all()
    for cls in ("2", "3+"):
        same, across = calibrate(confidence)[cls], calibrate(confidence)[cls + " across nodes"]
        assert across.hi <= same.hi and across.lo <= same.lo


def test_a_measured_drop_is_followed_not_clipped():
    """Issue 33: 45,197 words/s on 1 worker and 10,237 on 2 (a busy machine): 2 workers are what was
    measured, inside their own band; 4 continue the drop instead of being lifted to the 1-worker rate."""
    measured = pd.DataFrame({"label": "s", "workers": [1, 2], "throughput": [45197.0, 10237.0]})
    p = plan(PlanRequest(measured, [2, 4]))
    rows = p.predictions.set_index("workers")
    assert rows.loc[2, "interval_low"] <= 10237.0 <= rows.loc[2, "interval_high"]
    assert rows.loc[2, "predicted_throughput"] == pytest.approx(10237.0) and rows.loc[2, "basis"] == "measured"
    assert rows.loc[4, "predicted_throughput"] <= 10237.0  # the drop continues; nothing lifts it back
    assert rows.loc[4, "interval_low"] < 10237.0 and rows.loc[4, "interval_high"] <= 4 * 45197.0
    assert any("drops from 1 to 2 workers" in n for n in p.notes)


def test_counts_beyond_a_table_of_8_gpu_nodes_are_planned_on_8_gpu_nodes():
    measured = pd.DataFrame({"label": "s", "workers": [8, 16, 32], "nodes": [1, 2, 4],
                             "throughput": [8000.0, 15500.0, 30000.0]})
    rows = plan(PlanRequest(measured, [64, 128, 256])).predictions.set_index("workers")
    assert rows.loc[64, "nodes"] == 8 and rows.loc[128, "nodes"] == 16 and rows.loc[256, "nodes"] == 32
    assert rows.loc[16, "nodes"] == 2  # measured layouts keep their nodes


def test_a_model_that_disagrees_with_a_measurement_says_so():
    """Measured 1, 2, 4 then a collapse at 8: the plan uses the measurement and names the disagreement."""
    measured = pd.DataFrame({"label": "s", "workers": [1, 2, 4, 8], "throughput": [100.0, 198.0, 390.0, 200.0]})
    p = plan(PlanRequest(measured, [8, 16]))
    assert p.predictions.set_index("workers").loc[8, "predicted_throughput"] == pytest.approx(200.0)
    assert any("at 8 workers the measurement" in n and "uses the measurement" in n for n in p.notes)


def test_two_counts_say_which_third_count_narrows_the_band():
    fitted = pd.DataFrame({"workers": [1, 2], "throughput": [100.0, 180.0]})
    assert next_count(fitted, [4, 8, 16]) == 4
    assert next_count(pd.DataFrame({"workers": [1, 2, 4], "throughput": [1.0, 2.0, 3.0]}), [8]) is None
    with pytest.raises(DataError, match="two or more GPU counts"):
        predict_band(pd.DataFrame({"workers": [4], "throughput": [1.0]}), [8])


def test_seed_004_cheapest_is_not_the_unmeasured_k80_when_its_band_allows_it_to_be_slower():
    """Fitted on seed 004's 1 and 2 x g3.4xlarge rows, priced on g3.4xlarge, g3.16xlarge and
    p2.xlarge without a deadline: the K80's speed is a spec estimate whose band allows it to be the
    slower (seed 004 measured 0.56x the M60), so the cheapest is judged at the band's bad end."""
    df = pd.DataFrame({"label": "s", "workers": [1, 2], "nodes": [1, 2], "throughput": [1 / 35920, 1 / 24316]})
    p = plan(PlanRequest(df, [1, 2, 4, 8], builtin_catalog(), ["g3.4xlarge", "g3.16xlarge", "p2.xlarge"], work=1.0,
                         measured_on="g3.4xlarge"))
    k80 = p.candidates[p.candidates["instance_type"] == "p2.xlarge"]
    assert (k80["speed_basis"] != "measured").all() and (k80["interval_low"] < k80["predicted_throughput"] / 1.13).all()
    assert p.recommendations["cheapest"]["instance_type"] != "p2.xlarge"
    assert any("measuring 4 GPUs would narrow it" in n for n in p.notes)


def test_speeds_across_gpu_types_come_from_published_measurements_before_specs():
    """Seed 004 measured a K80 at 0.56x an M60; specs said 1.13x. The published ratio wins, at the
    run's kind of arithmetic, and a type of the measured chip is not looked up."""
    from scalelab.costs.speed import published_ratio, resolve_speed

    cat = builtin_catalog()
    k80 = resolve_speed(cat.instance("p2.xlarge"), cat.instance("g3.4xlarge"), cat, {}, {}, "fp32")
    assert k80.basis == "published" and k80.factor == pytest.approx(35920 / 63923, rel=1e-3) and k80.widening >= 1.3
    fp32, mixed = published_ratio("A100-80GB", "V100", "fp32"), published_ratio("A100", "V100-32GB", "bf16")
    assert fp32[0] == pytest.approx(83214 / 21860, rel=1e-3) and mixed[0] == pytest.approx(140909 / 76438, rel=1e-3)
    assert published_ratio("V100", "A100", "fp32")[0] == pytest.approx(21860 / 83214, rel=1e-3)
    assert published_ratio("H100", "A100", "fp32") is None  # none published here: specs, widened, instead
    h100 = published_ratio("H100", "A100-80GB", "bf16")  # Lambda's five fp16 models: median 30,841 / 17,918
    assert h100[0] == pytest.approx(30841 / 17918, rel=1e-3) and h100[1] == pytest.approx(1.3)


def test_a_measured_1x2_layout_billed_per_gpu_hour_stays_measured_as_1x2():
    cat = builtin_catalog()
    cat.add_rate("lab", 0.5, "gpu-hour")
    df = pd.DataFrame({"label": "s", "workers": [1, 2, 4], "nodes": [1, 1, 1], "throughput": [100.0, 190.0, 360.0]})
    c = plan(PlanRequest(df, [1, 2, 4, 8], cat, ["lab"], work=1e6, measured_on="lab")).candidates.set_index("workers")
    assert c.loc[2, "instances"] == 2 and c.loc[2, "measured"]  # two GPU-hours an hour, on the one measured node
    assert c.loc[2, "predicted_throughput"] == pytest.approx(190.0, rel=1e-6)
    assert c.loc[4, "predicted_throughput"] == pytest.approx(360.0, rel=1e-6) and not c.loc[8, "measured"]
    assert c.loc[2, "dollars"] == pytest.approx(1e6 / 190.0 / 3600 * 2 * 0.5, rel=1e-3)  # whole seconds billed


def test_time_tables_show_their_throughput_not_zero(tmp_path):
    """A table in seconds (time_s) has throughputs far below 1 (runs per second): shown, not 0."""
    from scalelab.costs.cli import _plan_tables

    df = pd.DataFrame({"label": "s", "workers": [1, 2, 4], "throughput": [1 / 35920, 1 / 24316, 1 / 13156]})
    p = plan(PlanRequest(df, [8]))
    title, rows, fmt = _plan_tables(p)[0]
    shown = fmt["predicted /s"](rows["predicted /s"].iloc[-1])  # each cell formatted by itself (number_text)
    assert float(shown) > 0 and "e" not in shown


def test_one_registry_names_every_model_the_planner_can_use():
    """Issue 33: worker-count and layout models in one registry; each name is a model the code computes."""
    from scalelab.costs.calibration import candidate_predictions
    from scalelab.costs.registry import REGISTRY, names
    from scalelab.costs.steptime import STEP_MODELS

    fitted = pd.DataFrame({"workers": [1, 2, 4], "nodes": [1, 1, 2], "throughput": [100.0, 190.0, 330.0]})
    assert set(candidate_predictions(fitted, [8], [2])) == set(names("worker-count"))
    assert set(STEP_MODELS) == set(names("layout", choosable=True)) and "steptime-scaled" in names("layout")
    assert all(m.kind in ("worker-count", "layout") and m.what for m in REGISTRY.values())


@pytest.mark.slow
def test_the_tasks_are_kept_in_a_cache_keyed_by_the_corpus_and_read_back_exactly(tmp_path, monkeypatch):
    """`launch plan` reads the published tables' tasks from a file instead of fitting them again (seconds);
    the file read back equals the fit, a damaged one is made anew, and "off" keeps none."""
    import scalelab.costs.calibration as cal

    monkeypatch.setenv(cal.CACHE_ENV, str(tmp_path))
    fresh = cal.all_tasks.__wrapped__()
    [path] = tmp_path.glob("calibration-tasks-*.csv")
    again = cal.all_tasks.__wrapped__()
    pd.testing.assert_frame_equal(fresh, again, check_dtype=False, check_exact=True)
    path.write_text("garbage\\n\\x00\\x01")
    assert len(cal.all_tasks.__wrapped__()) == len(fresh)
    margins = cal._shipped_margins(0.9)  # the shipped margins: chosen once, kept beside the tasks
    [kept] = tmp_path.glob("calibration-margins-*.json")
    assert cal._shipped_margins(0.9) == margins == cal._choose_margins(0.9, frozenset())
    kept.write_text("{not json")
    assert cal._shipped_margins(0.9) == margins
    monkeypatch.setenv(cal.CACHE_ENV, "off")
    assert cal._tasks_cache() is None and cal._margins_cache() is None


def test_counts_beyond_one_full_node_go_on_more_nodes_and_odd_sizes_stay_on_one():
    """1-8 GPUs on one node: 16 and 32 are placed on 2 and 4 nodes of 8 (a full node), with a note; 1-6 GPUs
    (no full node) or 1-2 stay on one node, and the note says how to place them."""
    eight = pd.DataFrame({"label": "s", "workers": [1, 2, 4, 8], "nodes": 1, "throughput": [100.0, 195.0, 380.0, 740.0]})
    p = plan(PlanRequest(eight, [16, 32]))
    rows = p.predictions.set_index("workers")
    assert rows.loc[16, "nodes"] == 2 and rows.loc[32, "nodes"] == 4 and rows.loc[8, "nodes"] == 1
    assert any("nodes of 8 GPUs" in n for n in p.notes)
    six = pd.DataFrame({"label": "s", "workers": [1, 2, 3, 6], "throughput": [100.0, 195.0, 280.0, 540.0]})
    p = plan(PlanRequest(six, [12]))
    assert p.predictions.set_index("workers").loc[12, "nodes"] == 1
    assert any("on one node" in n and "--predict NODESxGPUS" in n for n in p.notes)


def test_two_layouts_of_one_count_are_two_rows_each_its_own_measurement():
    """Review of issue 33: 4 GPUs on 1 node (400/s) and on 2 nodes (300/s) were merged into one row whose
    'measured' was their mean and whose band passed linear scaling."""
    measured = pd.DataFrame({"label": "s", "workers": [4, 4, 8], "nodes": [1, 2, 2], "throughput": [400.0, 300.0, 560.0]})
    rows = plan(PlanRequest(measured, [16])).predictions.set_index(["workers", "nodes"])
    assert rows.loc[(4, 1), "predicted_throughput"] == 400.0 and rows.loc[(4, 1), "measured_throughput"] == 400.0
    assert rows.loc[(4, 2), "predicted_throughput"] == 300.0 and rows.loc[(4, 2), "basis"] == "measured"
    assert (rows["interval_high"] <= rows.index.get_level_values("workers") * 100.0 * (1 + 1e-9)).all()
    assert rows.loc[(16, 4), "basis"] == "model"  # 4 GPUs per node: the most measured on one node


@pytest.mark.parametrize("confidence", [0.5, 0.8])
@pytest.mark.slow
def test_a_lower_confidence_gives_narrower_bands_that_hold_about_as_asked(confidence, loso):
    """Review of issue 33: the band's inner levels started at 0.9, so 50 % and 80 % bands were 90 % ones."""
    lower = coverage_summary(coverage(confidence), ["k_class"]).set_index("k_class")
    ninety = coverage_summary(loso, ["k_class"]).set_index("k_class")
    for k in ("2", "3+"):
        assert lower.loc[k, "median_half_width"] < ninety.loc[k, "median_half_width"]
        assert lower.loc[k, "coverage"] >= confidence - 0.05


def test_a_count_between_measured_ones_gets_the_interpolations_band_not_a_measured_counts():
    """CSC's DDP benchmark on Puhti (mvsjober/ml-benchmarks results.md, a source the planner never saw): 1, 2
    and 8 GPUs measured, 4 predicted. Its band was [1,108, 1,154] (a measured count's ±2 %), 8 % below the
    published 1,249.31; now it is the band learnt on counts left out between measured ones, [1,083, 1,224]:
    2 % short still (a hard case: the per-GPU rate at 2 GPUs is below both neighbours'), where the 280 such
    predictions of the corpus hold theirs 90 % of the time (the next test)."""
    from scalelab.costs.calibration import predict_band

    fitted = pd.DataFrame({"workers": [1, 2, 8], "nodes": [1, 1, 2], "throughput": [329.27, 520.80, 2465.86]})
    b = predict_band(fitted, [4, 8], [1, 2]).set_index("workers")
    measured_width = (b.loc[8, "high"] - b.loc[8, "low"]) / b.loc[8, "predicted"]
    assert (b.loc[4, "high"] - b.loc[4, "low"]) / b.loc[4, "predicted"] > 2 * measured_width  # it was that band (1x); 2.9x now
    assert b.loc[4, "high"] > 1200 and b.loc[4, "low"] < 1100, b  # was [1,108, 1,154]


@pytest.mark.slow
def test_counts_between_measured_ones_hold_their_band_on_sources_left_out():
    """Every shipped series' inner counts, each left out and predicted with the band learnt without its
    source: about 90 % held (69 % with a measured count's band); docs/benchmarks.md has the figures."""
    from scalelab.costs.calibration import interior_coverage

    c = interior_coverage(0.9)
    assert len(c) > 200 and c["origin"].nunique() >= 10
    assert c["covered"].mean() >= 0.85, c.groupby("origin")["covered"].mean()


def test_a_dense_tables_last_step_does_not_decide_the_decay_alone():
    """Seed 001's parameter-server cuDNN series, 1-8 GPUs (per-GPU 50,007 -> 34,364 words/s, a 31 % loss) ends in
    a noisy 7 -> 8 uptick. The decay models took their loss per doubling from the last step alone: +2.5 % per
    GPU, clipped to no loss, so 16-64 GPUs came out exactly linear from 8 (2,199,322 at 64), and without the
    7-GPU row they came out 1,339,396: one noisy point moved the 64-GPU plan by 64 % and flipped the
    recommendation. The loss is now measured over the last doubling (4 -> 8), with the row or without it."""
    from scalelab.costs.calibration import predict_band

    rates = {1: 50007.279, 2: 92236.723, 3: 127377.172, 4: 156508.555, 5: 190614.737, 6: 220829.452,
             7: 234614.995, 8: 274915.239}
    full = pd.DataFrame({"workers": list(rates), "nodes": 1, "throughput": list(rates.values())})
    no7 = full[full["workers"] != 7]
    wanted = [16, 32, 64]
    a = predict_band(full, wanted, [2, 4, 8])["predicted"].to_numpy()
    b = predict_band(no7, wanted, [2, 4, 8])["predicted"].to_numpy()
    assert np.all(np.abs(a / b - 1) < 0.05), (a, b)
    linear = np.array(wanted) * rates[8] / 8
    assert np.all(a < 0.9 * linear), (a, linear)  # the loss measured 4 -> 8 goes on, as it did 1 -> 8
