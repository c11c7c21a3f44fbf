"""Steps and samples to a loss threshold against the global batch (McCandlish et al. 2018).

    S(B) = S_min · (1 + B_noise / B)        steps to the threshold
    E(B) = E_min · (1 + B / B_noise)        samples to the threshold, E = S·B, E_min = S_min·B_noise

Below B_noise a larger batch saves steps almost in proportion; above it, it mostly costs samples.
So a layout with more workers at a fixed batch per worker (a growing global batch) needs fewer
steps but more samples than the one measured, which is why the planner no longer takes the work to
the threshold as a constant.

Two ways to know the curve (`fit_convergence`):

- **batch-fit**: runs at two or more global batches. S = a + c/B is linear in (a, c) = (S_min,
  E_min), fitted by non-negative least squares on relative errors; B_noise = c/a (infinite when
  a = 0: no sign of diminishing returns in the batches measured).
- **noise-scale**: runs at one batch B0 that reached the threshold, with the noise scale measured in
  them (scalelab/train/noise.py): S_min = S(B0) / (1 + B_noise/B0). B_simple is the paper's cheap estimate
  of B_noise; how far apart the two are is not known in advance (docs/benchmarks.md measures it),
  so this basis carries a wide band.

Intervals at `confidence` come from a smoothed bootstrap: every draw resamples the runs of each
batch (repeats are the measured scatter) and multiplies each by a seed-to-seed factor (their own
spread when a batch has repeats, else `SEED_SPREAD`). The curve's form is an approximation too
(learning-rate warm-up and clipping bend it): how far it misses the measured batches (the lack of
fit, in log steps) is drawn around each prediction, growing as 1 + d with d = log2 of how far
the batch lies outside the measured ones (at least `SEED_SPREAD`: two batches fit exactly).
No end of the band is below one step.

The noise basis is far less sure, and says so: the sweeps measured here (scripts/validate-planner.sh,
docs/benchmarks.md) found B_simple well below the batch where the steps stop halving (under Adam
with the learning rate scaled linearly the samples to the threshold hardly grew up to batch 128,
with B_simple near 60-100 on rnnlm-tiny). So its band spans what is admitted, from perfect
scaling (B_noise unbounded: the samples to the threshold do not grow) to a critical batch
`NOISE_FACTOR` times below B_simple, widened by the seed and form spreads; the point estimate uses
B_simple itself.

Every prediction holds only under the learning-rate rule the runs used (stated in `lr_rule`):
change the rule and the curve changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

from scalelab.core.errors import DataError
from scalelab.costs.fitting import FitError, nnls

__all__ = ["SEED_SPREAD", "NOISE_FACTOR", "CONVERGENCE_COLUMNS", "ConvergenceFit", "fit_convergence",
           "lr_rule", "convergence_rows"]

SEED_SPREAD = 0.06  # relative spread of steps to the threshold between seeds, when not measured
NOISE_FACTOR = 4.0  # the noise basis admits a critical batch down to B_simple / NOISE_FACTOR, and up to unbounded
DRAWS = 2000

#: Columns of a convergence table (one row per run that reached the threshold).
CONVERGENCE_COLUMNS = ("label", "global_batch", "steps_to_threshold", "noise_scale", "lr", "lr_warmup_steps")


@dataclass
class ConvergenceFit:
    """S(B) of one series: the point fit, the bootstrap draws of (S_min, E_min), how it was known."""

    label: str
    basis: str  # "batch-fit" or "noise-scale"
    s_min: float
    e_min: float
    draws: np.ndarray  # (DRAWS, 2): S_min, E_min
    confidence: float
    lr_rule: str
    runs: int
    batches: list[int] = field(default_factory=list)
    noise_scale: float | None = None  # the measured B_simple, when the runs had it
    form_spread: float = 0.0  # how far the curve's form missed the measured batches (log scale)
    form_draws: np.ndarray = field(default_factory=lambda: np.zeros(DRAWS))  # standard normal, one a draw

    @property
    def b_noise(self) -> float:
        """E_min / S_min: the batch where doubling it no longer halves the steps."""
        return self.e_min / self.s_min if self.s_min > 1e-9 * self.e_min else math.inf

    def steps(self, batch: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(predicted, low, high) steps to the threshold at each global batch."""
        b = np.asarray(batch, dtype=float)
        point = self.s_min + self.e_min / b
        each = self.draws[:, :1] + self.draws[:, 1:] / b[None, :]
        reach = 1.0 + np.log2(np.maximum(np.maximum(b / max(self.batches), min(self.batches) / b), 1.0))
        each = each * np.exp(self.form_draws[:, None] * self.form_spread * reach[None, :])
        tail = (1 - self.confidence) / 2 * 100
        low, high = np.percentile(each, tail, axis=0), np.percentile(each, 100 - tail, axis=0)
        # a run takes at least one whole step: the widening went to 0.036 steps at batch 4096 and 0.0 at 1e6.
        # No floor at perfect scaling from the samples measured: the shipped convergence runs (linear LR
        # scaling) took fewer samples at larger batches than at smaller ones, and such a floor cut the
        # held-out coverage from 100 % to 58 % (batch-fit) and 89 % to 28 % (noise-scale) at 90 %
        return np.maximum(point, 1.0), np.maximum(low, 1.0), np.maximum(high, 1.0)

    def predict(self, batch: Sequence[int]) -> pd.DataFrame:
        """One row per global batch: steps and samples to the threshold with their interval."""
        b = np.asarray(batch, dtype=float)
        point, low, high = self.steps(b)
        return pd.DataFrame({
            "label": self.label, "global_batch": b.astype(int), "predicted_steps_to_threshold": point,
            "steps_low": low, "steps_high": high, "predicted_samples_to_threshold": point * b,
            "samples_low": low * b, "samples_high": high * b, "basis": self.basis,
            "b_noise": self.b_noise, "noise_scale": self.noise_scale, "confidence": self.confidence,
            "lr_rule": self.lr_rule, "measured_batches": ",".join(str(x) for x in self.batches),
        })


def fit_convergence(runs: pd.DataFrame, confidence: float = 0.9, label: str = "", seed: int = 0) -> ConvergenceFit:
    """The S(B) curve of one series from its runs that reached the threshold (columns of
    `CONVERGENCE_COLUMNS`; lr and lr_warmup_steps optional): batch-fit with two or more global
    batches, else noise-scale from the runs' measured noise scale."""
    df = runs[pd.to_numeric(runs["steps_to_threshold"], errors="coerce") > 0].copy()
    df["global_batch"] = pd.to_numeric(df["global_batch"]).astype(float)
    df["steps_to_threshold"] = pd.to_numeric(df["steps_to_threshold"]).astype(float)
    name = label or "(unlabelled)"
    if df.empty:
        raise DataError(f"series {name}: no run reached the loss threshold; steps to it cannot be predicted")
    batches = sorted({int(b) for b in df["global_batch"]})
    rng = np.random.default_rng(seed)
    spread = _seed_spread(df)
    rule = lr_rule(df)
    noise = _pooled(df.get("noise_scale"))
    if len(batches) >= 2:
        try:
            s_min, e_min = _fit(df["global_batch"].to_numpy(), df["steps_to_threshold"].to_numpy())
            groups = _batch_groups(df)
            draws = np.array([_fit(*_resample(groups, spread, rng)) for _ in range(DRAWS)])
        except FitError as exc:  # numbers the arithmetic cannot hold: the series named, not numpy's traceback
            raise FitError(f"series {name}: its steps to the threshold could not be fitted: {exc}") from None
        return ConvergenceFit(label, "batch-fit", s_min, e_min, draws, confidence, rule, len(df), batches, noise,
                              max(_lack_of_fit(df, s_min, e_min), SEED_SPREAD), rng.standard_normal(DRAWS))
    if noise is None:
        raise DataError(f"series {name}: every run used global batch {batches[0]} and none measured the "
                        "gradient noise scale; run a second global batch (e.g. twice as large) to fit S(B)")
    b0, s0 = float(batches[0]), float(np.exp(np.log(df["steps_to_threshold"]).mean()))
    s_min = s0 / (1 + noise / b0)
    # half the draws at each end of what is admitted: perfect scaling (1/B_noise = 0) and a critical
    # batch NOISE_FACTOR times below B_simple; S(b0) = s0 in every draw
    inverse = np.where(np.arange(DRAWS) % 2 == 0, 0.0, NOISE_FACTOR / noise)
    s0_draw = s0 * np.exp(rng.normal(0.0, spread / math.sqrt(len(df)), DRAWS))
    draws = np.column_stack([s0_draw * inverse * b0 / (inverse * b0 + 1), s0_draw * b0 / (inverse * b0 + 1)])
    return ConvergenceFit(label, "noise-scale", s_min, s_min * noise, draws, confidence, rule, len(df), batches, noise,
                          SEED_SPREAD, rng.standard_normal(DRAWS))


def _fit(batch: np.ndarray, steps: np.ndarray) -> tuple[float, float]:
    """(S_min, E_min) >= 0 of S = S_min + E_min / B, least squares on relative errors."""
    a = np.column_stack([np.ones_like(batch), 1.0 / batch]) / steps[:, None]
    s_min, e_min = nnls(a, np.ones_like(steps))
    return float(s_min), float(e_min)


def _lack_of_fit(df: pd.DataFrame, s_min: float, e_min: float) -> float:
    """Root mean square of log(measured / fitted) steps over the batches measured (their geometric
    means): the curve's own miss where it was fitted, which grows when it extrapolates."""
    means = np.exp(np.log(df["steps_to_threshold"]).groupby(df["global_batch"]).mean())
    fitted = s_min + e_min / means.index.to_numpy(dtype=float)
    return float(np.sqrt(np.mean(np.log(means.to_numpy() / fitted) ** 2)))


def _batch_groups(df: pd.DataFrame) -> list[tuple[float, np.ndarray]]:
    """Each global batch (ascending) with its runs' steps to the threshold: split once, not once a draw
    (the split was most of `launch bench --only planner`'s convergence time)."""
    return [(float(batch), part["steps_to_threshold"].to_numpy()) for batch, part in df.groupby("global_batch")]


def _resample(groups: list[tuple[float, np.ndarray]], spread: float,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One bootstrap sample: each batch's runs (`_batch_groups`) drawn with replacement, each times a seed factor."""
    b, s = [], []
    for batch, steps in groups:
        pick = rng.choice(steps, size=len(steps), replace=True)
        b.extend([batch] * len(steps))
        s.extend(pick * np.exp(rng.normal(0.0, spread, len(steps))))
    return np.asarray(b, dtype=float), np.asarray(s, dtype=float)


def _seed_spread(df: pd.DataFrame) -> float:
    """The pooled standard deviation of log steps within batches that have repeats, at least half
    of SEED_SPREAD (three repeats can look alike by chance); SEED_SPREAD without repeats."""
    logs = np.log(df["steps_to_threshold"])
    groups = [g for _, g in logs.groupby(df["global_batch"]) if len(g) > 1]
    if not groups:
        return SEED_SPREAD
    dof = sum(len(g) - 1 for g in groups)
    pooled = math.sqrt(sum(((g - g.mean()) ** 2).sum() for g in groups) / dof)
    return max(pooled, SEED_SPREAD / 2)


def _pooled(values: pd.Series | None) -> float | None:
    """The median of the runs' measured noise scales (None when none measured one)."""
    if values is None:
        return None
    v = pd.to_numeric(values, errors="coerce").dropna()
    v = v[v > 0]
    return float(v.median()) if len(v) else None


def lr_rule(runs: pd.DataFrame) -> str:
    """The learning-rate rule the runs followed, read from their LR and global batch: constant,
    linear scaling with the batch, or neither (then each run's LR is listed)."""
    if "lr" not in runs.columns or pd.to_numeric(runs["lr"], errors="coerce").isna().all():
        return "unknown (the runs did not record their learning rate)"
    lr = pd.to_numeric(runs["lr"], errors="coerce").to_numpy(dtype=float)
    batch = runs["global_batch"].to_numpy(dtype=float)
    warm = pd.to_numeric(runs.get("lr_warmup_steps", pd.Series(dtype=float)), errors="coerce").dropna()
    warmup = f", {int(warm.max())} steps of warm-up" if len(warm) and warm.max() > 0 else ""
    smallest = int(np.argmin(batch))
    if np.allclose(lr, lr[0], rtol=0.01):
        return f"constant: lr {lr[0]:g} at every global batch{warmup}"
    if np.allclose(lr / batch, lr[smallest] / batch[smallest], rtol=0.01):
        return (f"linear scaling: lr {lr[smallest]:g} at global batch {int(batch[smallest])}, "
                f"in proportion to it{warmup}")
    pairs = sorted({(int(b), float(x)) for b, x in zip(batch, lr)})
    return "mixed: " + ", ".join(f"lr {x:g} at batch {b}" for b, x in pairs) + warmup


def convergence_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The convergence table of a runs' summary table (analysis.scaling.scale_layouts), one row per
    run that reached its threshold. A series is a model preset and a threshold ("rnnlm-tiny to
    loss 0.5"): the steps to a loss depend on the model, the data and the learning-rate rule, not
    on the engine or the layout."""
    if "steps_to_threshold" not in table.columns:
        return pd.DataFrame(columns=list(CONVERGENCE_COLUMNS))
    reached = table[pd.to_numeric(table["steps_to_threshold"], errors="coerce") > 0]
    if not len(reached):  # no run reached its threshold: no rows (an empty text + float column is a TypeError)
        return pd.DataFrame(columns=list(CONVERGENCE_COLUMNS))
    out = pd.DataFrame({c: reached[c] if c in reached.columns else None for c in CONVERGENCE_COLUMNS})
    model = reached["model"].astype(str) if "model" in reached.columns else pd.Series("", index=reached.index)
    out["label"] = model + " to loss " + reached["loss_threshold"].map(lambda x: f"{float(x):g}")
    for extra in ("workers", "samples_to_threshold"):
        if extra in reached.columns:
            out[extra] = reached[extra]
    return out.reset_index(drop=True)
