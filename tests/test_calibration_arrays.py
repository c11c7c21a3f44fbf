"""The planner's validation on arrays (tenth stop): `_levels` sorts each origin's held-out scores once
for every level it tries, `_point_models` takes its columns from the frame once, and the bootstrap of
`fit_convergence` splits its runs by batch once. Each is checked here against the definition it
replaced (written out in the test), on data made to have ties, several origins and capped classes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from scalelab.costs import calibration as cal
from scalelab.costs.convergence import _batch_groups, _resample


def _scores(seed: int, n: int = 120) -> tuple[np.ndarray, np.ndarray, cal.Upper]:
    rng = np.random.default_rng(seed)
    scores = np.round(rng.normal(0.0, 1.0, n), 1)  # rounded: many ties, as real scores of equal tasks have
    origins = rng.choice(np.array(["a", "b", "c", "d", "e"]), size=n)
    up = (scores * 0.3, np.abs(rng.normal(0.2, 0.1, n)), np.abs(rng.normal(1.0, 0.3, n)), np.abs(rng.normal(0.5, 0.2, n)))
    return scores, origins, up


def _coverage_by_definition(scores, origins, level, up=None) -> float:
    """Each origin's tasks judged by the band `_band_at` makes from every other origin's scores."""
    covered = 0
    for o in np.unique(origins):
        out = origins == o
        lo, hi = cal._band_at(scores[~out], cal._origin_weights(origins[~out]), level, up is not None)
        above = scores[out] <= hi + 1e-12 if up is None else cal._upper_ok(tuple(a[out] for a in up), hi)
        covered += int(((scores[out] >= lo - 1e-12) & above).sum())
    return covered / len(scores)


@pytest.mark.parametrize("capped", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_held_out_coverage_is_the_leave_one_origin_out_definition_at_every_level(seed, capped):
    scores, origins, up = _scores(seed)
    up = up if capped else None
    parts = cal._held_out(scores, origins, up)
    levels = [0.5, 0.8, 0.9, 0.95, 0.99, 1.0]
    got = [cal._held_out_coverage(parts, level) for level in levels]
    assert got == [_coverage_by_definition(scores, origins, level, up) for level in levels]
    assert got == sorted(got) and got[0] < got[-1]  # wider bands never cover less


def test_a_band_from_a_sorted_table_is_the_band_of_the_scores():
    scores, origins, _ = _scores(3)
    table = cal._quantile_table(scores, cal._origin_weights(origins))
    for level in (0.6, 0.9, 1.0):
        for capped in (False, True):
            assert cal._band_from(table, level, capped) == cal._band_at(scores, np.ones(len(scores)), level, capped)
    assert cal._band_from(table, 1.0) == (min(0.0, scores.min()), max(0.0, scores.max()))


def test_the_mean_error_per_origin_is_pandas_mean_of_means():
    part = cal.all_tasks()
    codes = np.unique(part["origin"].to_numpy(str), return_inverse=True)[1]
    preds = {m: part["pred_" + m].to_numpy(float) for m in cal.CANDIDATES}
    true = part["true"].to_numpy(float)
    for model in [*cal.CANDIDATES[:3], tuple(cal.CANDIDATES[:2])]:
        members = [model] if isinstance(model, str) else list(model)
        pred = np.exp(np.mean([np.log(part["pred_" + m].to_numpy(float)) for m in members], axis=0))
        want = pd.Series(np.abs(np.log(pred / true))).groupby(part["origin"].to_numpy(str)).mean().mean()
        assert cal._mean_error(preds, true, codes, model) == pytest.approx(want, rel=1e-12)


def test_the_bootstrap_draws_are_those_of_a_split_made_at_every_draw():
    df = pd.DataFrame({"global_batch": [64.0, 64.0, 64.0, 128.0, 128.0, 256.0],
                       "steps_to_threshold": [900.0, 950.0, 880.0, 520.0, 540.0, 300.0]})

    def by_definition(rng):
        b, s = [], []
        for batch, part in df.groupby("global_batch"):
            pick = rng.choice(part["steps_to_threshold"].to_numpy(), size=len(part), replace=True)
            b.extend([batch] * len(part))
            s.extend(pick * np.exp(rng.normal(0.0, 0.05, len(part))))
        return np.asarray(b, dtype=float), np.asarray(s, dtype=float)

    groups = _batch_groups(df)
    assert [g[0] for g in groups] == [64.0, 128.0, 256.0]
    a, b = np.random.default_rng(7), np.random.default_rng(7)
    for _ in range(20):
        got, want = _resample(groups, 0.05, a), by_definition(b)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
