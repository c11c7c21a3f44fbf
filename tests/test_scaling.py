"""Tests of analysis.scaling: step table, run summary, scaling table against published numbers.

Reference numbers: shared/seeds/001 (lcy-seso/dl_framework, TensorFlow NMT data parallelism,
commit 636a8d8): per GPU count, "Total time to process 20 batches (s)", "Processing speed
(words/s)" and the published "Speedup ratio" (rounded to 2 decimals). Batch size 360 per GPU, so
these runs are weak-scaling runs in the sense of fixed work per worker.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from scalelab.analysis.scaling import (
    SCALING_COLUMNS,
    STEP_TABLE_COLUMNS,
    LayoutSummary,
    karp_flatt,
    scale_layouts,
    scaling_table,
    step_table,
    RunMeta,
    summarize_run,
)
from scalelab.core.errors import RecordError

# (gpus, total time for 20 batches [s], words/s, published speedup) -- seed 001
SEED_001 = {
    "ps_cudnn_lstm": [
        (1, 28.940, 50007.279, None), (2, 31.380, 92236.723, 1.84), (3, 34.085, 127377.172, 2.55),
        (4, 36.987, 156508.555, 3.13), (5, 37.961, 190614.737, 3.81), (6, 39.321, 220829.452, 4.42),
        (7, 43.179, 234614.995, 4.69), (8, 42.113, 274915.239, 5.50),
    ],
    "ps_dynamic_rnn": [
        (1, 38.036, 38048.046, None), (2, 41.916, 69053.092, 1.81), (3, 45.441, 95543.591, 2.51),
        (4, 48.005, 120588.115, 3.17), (5, 51.378, 140838.851, 3.70), (6, 54.729, 158656.805, 4.17),
        (7, 57.532, 176083.321, 4.63), (8, 61.370, 188651.349, 4.96),
    ],
    "nccl_dynamic_rnn": [
        (1, 38.633, 37460.412, None), (2, 43.087, 67175.406, 1.79), (3, 47.355, 91681.983, 2.45),
        (4, 51.592, 112202.447, 3.00), (5, 55.764, 129761.878, 3.46), (6, 63.535, 136668.138, 3.65),
        (7, 70.506, 143680.666, 3.84), (8, 76.319, 151700.671, 4.05),
    ],
    "replica_cudnn_lstm": [
        (1, 28.210, 51046.074, None), (2, 30.707, 93790.686, 1.84), (3, 32.355, 133520.790, 2.62),
        (4, 32.848, 175351.156, 3.44), (5, 33.270, 216412.574, 4.24), (6, 36.205, 238642.350, 4.68),
        (7, 36.115, 279107.499, 5.47), (8, 37.170, 309930.493, 6.07),
    ],
    "replica_dynamic_rnn": [
        (1, 36.577, 39368.756, None), (2, 40.420, 71252.362, 1.81), (3, 42.965, 100546.336, 2.55),
        (4, 45.313, 127116.260, 3.23), (5, 48.213, 149338.599, 3.79), (6, 51.191, 168780.420, 4.29),
        (7, 54.529, 184857.154, 4.70), (8, 55.707, 206795.206, 5.25),
    ],
}


def _seed_rows(kind: str) -> list[dict]:
    return [
        {"label": name, "workers": g, "time_s": t, "throughput": wps, "published": pub}
        for name, rows in SEED_001.items()
        for g, t, wps, pub in rows
        if kind == "all" or kind == name
    ]


# --------------------------------------------------------------------------------------------------
# step_table / summarize_run on a hand-built run


def _records() -> pd.DataFrame:
    """Two ranks, 4 steps; step 1 is warm-up. Rank 1 is slower in steps 1-3, rank 0 in step 4."""
    rows = []
    # step, rank, warmup, step_s, data, fwd, bwd, exch, opt, samples, words, loss
    spec = [
        (1, 0, True, 5.0, 0.5, 1.0, 3.0, None, 0.5, 10, 100, 4.0),
        (1, 1, True, 6.0, 0.6, 1.0, 4.0, None, 0.4, 10, 110, 4.2),
        (2, 0, False, 1.0, 0.1, 0.3, 0.5, None, 0.1, 10, 100, 3.0),
        (2, 1, False, 2.0, 0.4, 0.4, 1.0, None, 0.2, 10, 120, 3.2),
        (3, 0, False, 1.5, 0.1, 0.4, 0.8, None, 0.2, 10, 100, 2.0),
        (3, 1, False, 2.5, 0.5, 0.5, 1.2, None, 0.3, 10, 100, 2.4),
        (4, 0, False, 3.0, 1.0, 0.5, 1.2, None, 0.3, 10, 100, 1.0),
        (4, 1, False, 1.0, 0.1, 0.2, 0.6, None, 0.1, 10, 100, 1.4),
    ]
    for i, (step, rank, warm, s, d, f, b, e, o, n, w, loss) in enumerate(spec):
        rows.append(dict(kind="step", rank=rank, world=2, time=1000.0 + i, step=step, epoch=0,
                         warmup=warm, step_s=s, data_s=d, forward_s=f, backward_s=b,
                         exchange_s=e, optimizer_s=o, samples=n, words=w, loss=loss, lr=0.1))
    return pd.DataFrame(rows)


META = RunMeta(label="lstm", nodes=1, gpus_per_node=2, workers=2, engine="ddp", rnn="lstm",
               model="lm", batch_mode="strong", global_batch=20, loss_threshold=2.5)


def test_step_table_slowest_rank_sets_time_and_phases():
    st = step_table(_records())
    assert list(st.columns) == list(STEP_TABLE_COLUMNS)
    assert st["step"].tolist() == [1, 2, 3, 4]
    assert st["t_step"].tolist() == [6.0, 2.0, 2.5, 3.0]  # max over ranks, not mean
    assert st["slowest_rank"].tolist() == [1, 1, 1, 0]
    # phases come from the slowest rank of each step
    assert st["data_s"].tolist() == [0.6, 0.4, 0.5, 1.0]
    assert st["backward_s"].tolist() == [4.0, 1.0, 1.2, 1.2]
    assert st["words"].tolist() == [210, 220, 200, 200]
    assert st["samples"].tolist() == [20, 20, 20, 20]
    assert st["loss"].tolist() == pytest.approx([4.1, 3.1, 2.2, 1.2])
    assert st["warmup"].tolist() == [True, False, False, False]
    assert st["ranks"].tolist() == [2, 2, 2, 2]
    assert st["exchange_s"].isna().all()


def test_step_table_ignores_other_kinds_and_keeps_latest_rerun():
    recs = _records()
    extra = pd.DataFrame([
        dict(kind="val", rank=0, step=2, val_loss=9.0, time=2000.0),
        # step 4 of rank 0 re-done after a resume, later and faster: the latest attempt counts
        dict(kind="step", rank=0, world=2, time=3000.0, step=4, epoch=0, warmup=False, step_s=0.5,
             data_s=0.1, forward_s=0.1, backward_s=0.2, exchange_s=None, optimizer_s=0.1,
             samples=10, words=100, loss=1.0),
    ])
    st = step_table(pd.concat([recs, extra], ignore_index=True))
    assert st["step"].tolist() == [1, 2, 3, 4]
    assert st.loc[st["step"] == 4, "t_step"].item() == 1.0  # rank 1's 1.0 s now is the max
    assert st.loc[st["step"] == 4, "slowest_rank"].item() == 1


def test_step_table_leaves_out_ps_server_ranks():
    """`--ps-placement separate`: a server rank's steps (no samples, `role` server) are not a worker's: they
    change neither the work, the ranks counted, nor which rank is the slowest, even when theirs is longest."""
    recs = _records()
    servers = pd.DataFrame([
        dict(kind="step", rank=2, world=3, time=1100.0 + step, step=step, epoch=0, warmup=step == 1, step_s=9.0,
             data_s=0.0, forward_s=0.0, backward_s=8.0, exchange_s=8.0, optimizer_s=1.0, samples=0, words=0,
             loss=None, lr=0.1, role="server")
        for step in (1, 2, 3, 4)
    ])
    st = step_table(pd.concat([recs, servers], ignore_index=True))
    assert st.equals(step_table(recs))
    assert st["ranks"].tolist() == [2, 2, 2, 2] and 2 not in st["slowest_rank"].tolist()


def test_step_table_ties_go_to_lowest_rank_and_missing_column_is_an_error():
    df = pd.DataFrame(dict(rank=[2, 0, 1], step=[1, 1, 1], step_s=[1.0, 1.0, 0.5],
                           data_s=[0.3, 0.1, 0.0], words=[1, 1, 1], samples=[1, 1, 1]))
    st = step_table(df)
    assert st["slowest_rank"].item() == 0 and st["data_s"].item() == 0.1
    with pytest.raises(RecordError, match="step_s"):
        step_table(df.drop(columns="step_s"))


def test_summarize_run_known_answer():
    events = pd.DataFrame([dict(kind="event", event="threshold", step=3, elapsed_s=7.5, val_loss=2.4)])
    val = pd.DataFrame([dict(kind="val", step=2, val_loss=2.9, elapsed_s=3.0),
                        dict(kind="val", step=3, val_loss=2.4, elapsed_s=7.5),
                        dict(kind="val", step=4, val_loss=2.1, elapsed_s=10.5)])
    s = summarize_run(_records(), val, events, META)
    assert isinstance(s, LayoutSummary)
    assert s.steps_measured == 3 and s.steps_warmup == 1  # warm-up step 1 excluded
    total_t = 2.0 + 2.5 + 3.0
    assert s.words_per_s == pytest.approx((220 + 200 + 200) / total_t)
    assert s.samples_per_s == pytest.approx(60 / total_t)
    assert s.step_s_mean == pytest.approx(2.5)
    assert s.step_s_median == pytest.approx(2.5)
    assert s.step_s_p90 == pytest.approx(np.percentile([2.0, 2.5, 3.0], 90))
    assert s.step_s_std == pytest.approx(0.5)
    assert s.share_data == pytest.approx((0.4 + 0.5 + 1.0) / total_t)
    assert s.share_backward == pytest.approx((1.0 + 1.2 + 1.2) / total_t)
    assert s.share_exchange is None  # engine did not expose it
    assert s.final_loss == pytest.approx(1.2)
    assert s.final_val_loss == pytest.approx(2.1)
    assert s.reached_threshold is True
    assert s.time_to_threshold_s == 7.5 and s.steps_to_threshold == 3
    assert (s.label, s.workers, s.mode, s.global_batch) == ("lstm", 2, "strong", 20)


def test_summarize_run_threshold_from_val_records_and_not_reached():
    val = pd.DataFrame([dict(step=2, val_loss=3.0, elapsed_s=3.0),
                        dict(step=4, val_loss=2.2, elapsed_s=9.0)])
    s = summarize_run(_records(), val, None, META)
    assert (s.reached_threshold, s.time_to_threshold_s, s.steps_to_threshold) == (True, 9.0, 4)
    s = summarize_run(_records(), val, None, replace(META, loss_threshold=1.0))
    assert (s.reached_threshold, s.time_to_threshold_s, s.steps_to_threshold) == (False, None, None)
    s = summarize_run(_records(), None, None, replace(META, loss_threshold=None))
    assert s.reached_threshold is None and s.time_to_threshold_s is None


def test_summarize_run_drops_steps_not_finished_by_every_rank():
    recs = _records()
    recs = recs[~((recs["step"] == 4) & (recs["rank"] == 1))]  # interrupted inside step 4
    s = summarize_run(recs, None, None, META)
    assert s.steps_measured == 2 and s.steps_incomplete == 1
    assert s.words_per_s == pytest.approx(420 / 4.5)


def test_summarize_run_only_warmup_raises_with_advice():
    recs = _records()
    recs = recs.assign(warmup=True)
    with pytest.raises(RecordError, match="warmup_steps"):
        summarize_run(recs, None, None, META)


def test_step_table_one_million_records():
    """Sanity at scale (no timing assertion): 1,000,000 records of 8 ranks -> 125,000 steps."""
    ranks, steps = 8, 125_000
    n = ranks * steps
    rng = np.random.default_rng(0)
    step_s = rng.random(n)
    df = pd.DataFrame({
        "rank": np.tile(np.arange(ranks), steps), "step": np.repeat(np.arange(1, steps + 1), ranks),
        "warmup": np.repeat(np.arange(1, steps + 1), ranks) <= 10, "step_s": step_s,
        "data_s": step_s / 10, "forward_s": step_s / 5, "backward_s": step_s / 2, "exchange_s": np.nan,
        "optimizer_s": step_s / 10, "samples": 4, "words": 100, "loss": 1.0, "time": np.arange(n, dtype=float),
        "epoch": 0,
    })
    st = step_table(df)
    assert len(st) == steps
    assert np.allclose(st["t_step"].to_numpy(), step_s.reshape(steps, ranks).max(axis=1))
    assert (st["words"] == 800).all()
    assert np.allclose(st["data_s"], st["t_step"] / 10)  # phases of the slowest rank
    assert int(st["warmup"].sum()) == 10


# --------------------------------------------------------------------------------------------------
# scaling_table against seed 001


def test_scaling_table_reproduces_published_speedups_from_words_per_s():
    rows = [{k: v for k, v in r.items() if k != "time_s"} for r in _seed_rows("all")]
    out = scaling_table(rows)
    assert out["label"].tolist() == [r["label"] for r in rows]  # order kept
    assert out["workers"].tolist() == [r["workers"] for r in rows]
    for name in SEED_001:
        part = out[out["label"] == name]
        assert part.iloc[0]["speedup"] == pytest.approx(1.0)
        pub = part["published"].iloc[1:].astype(float).to_numpy()
        # published ratios are rounded to 2 decimals (half-way cases both ways -> 0.005 + eps)
        assert np.abs(part["speedup"].iloc[1:].to_numpy() - pub).max() <= 0.0051, name
        assert np.allclose(part["efficiency"], part["speedup"] / part["workers"])
    cudnn = out[out["label"] == "ps_cudnn_lstm"]["speedup"].round(2).tolist()
    assert cudnn == [1.0, 1.84, 2.55, 3.13, 3.81, 4.42, 4.69, 5.50]


def test_scaling_table_weak_from_time_matches_words_per_s():
    """Batch 360 per GPU fixed: weak speedup n·t1/tN must equal the words/s ratio."""
    rows = _seed_rows("all")
    by_time = scaling_table([{k: v for k, v in r.items() if k != "throughput"} for r in rows], mode="weak")
    by_tput = scaling_table([{k: v for k, v in r.items() if k != "time_s"} for r in rows], mode="weak")
    assert np.abs(by_time["speedup"] - by_tput["speedup"]).max() <= 0.01
    assert np.abs(by_time["efficiency"] - by_tput["efficiency"]).max() <= 0.01 / 2
    ps = by_time[by_time["label"] == "ps_cudnn_lstm"]
    assert ps["speedup"].iloc[1] == pytest.approx(2 * 28.940 / 31.380)
    assert ps["efficiency"].iloc[1] == pytest.approx(28.940 / 31.380)
    for name in SEED_001:
        part = by_time[by_time["label"] == name]
        pub = part["published"].iloc[1:].astype(float).to_numpy()
        assert np.abs(part["speedup"].iloc[1:].to_numpy() - pub).max() <= 0.0051, name


def test_scaling_table_strong_time_and_throughput_strong_equals_weak():
    out = scaling_table([{"workers": 1, "time_s": 100.0}, {"workers": 4, "time_s": 40.0}])
    assert out["speedup"].tolist() == pytest.approx([1.0, 2.5])
    assert out["efficiency"].tolist() == pytest.approx([1.0, 0.625])
    rows = [{"workers": 2, "throughput": 10.0}, {"workers": 8, "throughput": 30.0}]
    strong, weak = scaling_table(rows, "strong"), scaling_table(rows, "weak")
    assert strong["speedup"].tolist() == weak["speedup"].tolist() == pytest.approx([1.0, 3.0])
    assert strong["n"].tolist() == [1.0, 4.0] and strong["base_workers"].tolist() == [2.0, 2.0]
    assert strong["efficiency"].tolist() == pytest.approx([1.0, 0.75])


def test_scaling_table_base_is_fewest_workers_regardless_of_order():
    out = scaling_table([{"label": "a", "workers": 4, "throughput": 300.0},
                         {"label": "b", "workers": 2, "throughput": 50.0},
                         {"label": "a", "workers": 2, "throughput": 200.0},
                         {"label": "b", "workers": 4, "throughput": 100.0}])
    assert out["label"].tolist() == ["a", "b", "a", "b"]
    assert out["speedup"].tolist() == pytest.approx([1.5, 1.0, 1.0, 2.0])
    assert out["efficiency"].tolist() == pytest.approx([0.75, 1.0, 1.0, 1.0])


def test_scaling_table_rejects_bad_input():
    with pytest.raises(ValueError):
        scaling_table([{"workers": 1}])
    with pytest.raises(ValueError):
        scaling_table([{"workers": 1, "throughput": 1.0}], mode="elastic")
    with pytest.raises(ValueError):
        scaling_table([{"workers": 0, "throughput": 1.0}])


def test_karp_flatt_known_case():
    assert karp_flatt(1.84, 2) == pytest.approx((1 / 1.84 - 0.5) / 0.5)
    assert karp_flatt(4.0, 4) == pytest.approx(0.0)  # linear speedup: no serial part
    assert karp_flatt(1.0, 4) == pytest.approx(1.0)  # no speedup: all serial
    out = scaling_table([{"workers": 1, "throughput": 1.0}, {"workers": 2, "throughput": 1.84}])
    assert math.isnan(out["karp_flatt"].iloc[0])
    assert out["karp_flatt"].iloc[1] == pytest.approx((1 / 1.84 - 0.5) / 0.5)


# --------------------------------------------------------------------------------------------------
# scale_layouts


def _summary(label: str, nodes: int, gpn: int, wps: float) -> LayoutSummary:
    recs = _records()
    s = summarize_run(recs, None, None, replace(META, label=label, nodes=nodes, gpus_per_node=gpn,
                                                 workers=nodes * gpn))
    s.words_per_s = wps
    return s


def test_scale_layouts_uses_words_per_s_and_smallest_single_node_base():
    sums = [_summary("sweep", 2, 2, 300.0), _summary("sweep", 1, 4, 360.0),
            _summary("sweep", 1, 1, 100.0), _summary("sweep", 2, 1, 150.0), _summary("sweep", 1, 2, 190.0)]
    df = scale_layouts(sums)
    assert set(SCALING_COLUMNS) <= set(df.columns)
    assert {"words_per_s", "step_s_mean", "share_data", "nodes"} <= set(df.columns)
    assert "throughput" not in df.columns
    assert list(zip(df["nodes"], df["gpus_per_node"])) == [(1, 1), (1, 2), (2, 1), (1, 4), (2, 2)]
    assert df["speedup"].tolist() == pytest.approx([1.0, 1.9, 1.5, 3.6, 3.0])
    assert df["efficiency"].tolist() == pytest.approx([1.0, 0.95, 0.75, 0.9, 0.75])


def test_run_meta_is_typed_a_misspelt_key_or_an_unknown_mode_fails_where_it_is_written():
    with pytest.raises(TypeError):
        RunMeta(label="x", gpus_per_nodes=2)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="batch_mode must be one of"):
        RunMeta(batch_mode="fixed")
    s = summarize_run(_records(), None, None, replace(META, batch_mode="weak", work_scaling="growing"))
    assert (s.mode, s.batch_scaling, s.work_scaling) == ("weak", "growing", "growing")


def test_a_series_of_one_layout_on_several_workers_has_no_speedup():
    """Its speedup over itself (1.00, 100 %) said nothing and contradicted a study's own tables, which measure
    such a variant against the study's baseline; a series of one layout on one worker is its own base still."""
    from scalelab.analysis.scaling import scaling_table

    rows = [{"label": "a", "workers": 1, "throughput": 100.0}, {"label": "a", "workers": 2, "throughput": 150.0},
            {"label": "arranged", "workers": 2, "throughput": 24.0}, {"label": "single", "workers": 1, "throughput": 90.0}]
    out = scaling_table(rows).set_index("label")
    assert out.loc["a"]["speedup"].tolist() == [1.0, 1.5]
    assert math.isnan(out.loc["arranged", "speedup"]) and math.isnan(out.loc["arranged", "efficiency"])
    assert out.loc["single", "speedup"] == 1.0


@pytest.mark.parametrize("axis, batches, said", [
    ("fixed", (32, 64, 128), "its global batch grew with the workers: each worker kept its batch"),
    ("growing", (64, 64, 64), "its global batch stayed the same: the workers split it"),
    ("fixed", (64, 64, 64), None),       # as labelled
    ("growing", (32, 64, 128), None),    # as labelled
    ("fixed", (32, 48, 80), None),       # neither: not claimed
])
def test_a_series_whose_measured_batch_contradicts_its_axis_is_named(axis, batches, said) -> None:
    """A --script keeping a per-rank batch was labelled strong (scalelab does not choose a script's batch), and its
    2-worker "speedup" was the same steps on twice the data, without a word."""
    from scalelab.analysis.scaling import trust_warnings

    table = pd.DataFrame({"label": ["train.py ddp"] * 3, "workers": [1, 2, 4], "global_batch": list(batches),
                          "batch_scaling": [axis] * 3})
    found = [w for w in trust_warnings(table) if "global batch" in w]
    if said is None:
        assert found == []
    else:
        assert len(found) == 1 and said in found[0], found
        assert f"{batches[0]:,} at 1 worker(s) and {batches[-1]:,} at 4" in found[0]
        assert f"labelled batch {axis}" in found[0]
