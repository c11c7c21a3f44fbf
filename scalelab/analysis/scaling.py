"""Scaling figures computed from run records: per-step table, per-run summary, strong/weak scaling.

Everything here is a pure function of DataFrames and dicts (no I/O, no printing), so the same code
serves the CLI, `summary.json` and the tests. The record format and the throughput formula are
defined in docs/records.md; this module is their single implementation:

    t_step    = max over ranks of step_s                 (the slowest rank sets the step time)
    words/s   = sum over steps and ranks of words   / sum over steps of t_step
    samples/s = sum over steps and ranks of samples / sum over steps of t_step

over the measured (non-warm-up) steps.

Scaling definitions (standard HPC usage, see shared/reference/README.md):

    speedup     S = throughput(N) / throughput(base)          (or t(base) / t(N) for a fixed problem)
    efficiency  E = S / n,  n = workers / base_workers
    Karp-Flatt  e = (1/S - 1/n) / (1 - 1/n)                  (experimentally determined serial fraction)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from scalelab.core.errors import RecordError
from scalelab.core.spec import BATCH_MODES, BATCH_SCALING, scaling_name

__all__ = [
    "PHASES",
    "STEP_TABLE_COLUMNS",
    "SCALING_COLUMNS",
    "THRESHOLD_COLUMNS",
    "LayoutSummary",
    "RunMeta",
    "step_table",
    "rank_steps",
    "summarize_run",
    "scaling_table",
    "scale_layouts",
    "karp_flatt",
    "threshold_scaling",
    "pooled_noise_scale",
    "BATCH_SCALING",
]

#: Per-step phase timings of a step record (seconds); they add up to (at most) `step_s`.
PHASES: tuple[str, ...] = ("data_s", "forward_s", "backward_s", "exchange_s", "optimizer_s")

#: Columns of the DataFrame returned by `step_table`, in order.
STEP_TABLE_COLUMNS: tuple[str, ...] = (
    "step", "epoch", "warmup", "ranks", "slowest_rank", "t_step",
    "words", "samples", *PHASES, "loss", "lr", "time",
)

#: Columns that `scaling_table` adds to its input.
SCALING_COLUMNS: tuple[str, ...] = ("base_workers", "n", "speedup", "efficiency", "karp_flatt")

#: Columns that `scale_layouts` adds too: speedup and efficiency of the time to the loss threshold.
THRESHOLD_COLUMNS: tuple[str, ...] = ("speedup_to_threshold", "efficiency_to_threshold")

_REQUIRED_STEP_COLUMNS = ("rank", "step", "step_s", "words", "samples")


# --------------------------------------------------------------------------------------------------
# per-step table


def step_table(records: pd.DataFrame) -> pd.DataFrame:
    """Collapse the step records of ONE run (all ranks) into one row per optimizer step.

    Columns (`STEP_TABLE_COLUMNS`): step, epoch, warmup, ranks, slowest_rank, t_step, words,
    samples, data_s, forward_s, backward_s, exchange_s, optimizer_s, loss, lr, time.

    - `t_step` is the maximum `step_s` over ranks: in synchronous data parallelism every rank waits
      for the slowest one at the gradient exchange, so the slowest rank sets the step time.
    - `words` and `samples` are summed over ranks (the work the whole layout did in that step).
    - The phase columns are taken from the slowest rank of the step (`slowest_rank`), NOT averaged.
      Why: they then add up to `t_step` and explain it. Averaging phases over ranks would mix the
      fast ranks' idle time (which shows up as a long `backward_s`/`exchange_s` while they wait
      in the all-reduce) with the slow rank's real work, and the shares would not sum to the step.
      Ties in `step_s` go to the lowest rank, so the choice is deterministic.
    - `loss` is the plain mean of the ranks' losses (`lr` the largest rank's LR: they agree); `warmup` is true if any rank marked the step (or traced it with --profile-steps)
      as warm-up; `ranks` counts the ranks that reported the step (fewer than the world size means
      the run stopped in the middle of that step); `time` is the latest rank's end-of-step time.
    - A step that a rank recorded twice (re-done after resuming from an older checkpoint) keeps
      its latest record (by `time`), so `step` is unique and the table follows the surviving run.

    Rows with another `kind` than "step" are ignored when a `kind` column exists, and so are the steps
    of parameter-server ranks (`role` "server", `--ps-placement separate`): they train on no data, and
    a worker's step already includes waiting for them in the exchange; `ranks` counts workers. The work is
    vectorised (groupbys only, no per-row Python), so a million records take a fraction of a second.

    Raises RecordError when a required column (rank, step, step_s, words, samples) is missing.
    """
    work = rank_steps(records)
    if len(work) == 0:
        return pd.DataFrame({c: pd.Series(dtype=_STEP_DTYPES.get(c, "float64")) for c in STEP_TABLE_COLUMNS})
    grouped = work.groupby("step", sort=True)
    agg = grouped.agg(
        epoch=("epoch", "max"),
        warmup=("warmup", "max"),
        ranks=("rank", "size"),
        words=("words", "sum"),
        samples=("samples", "sum"),
        loss=("loss", "mean"),
        lr=("lr", "max"),
        time=("time", "max"),
    )
    out = agg.join(_slowest_ranks(work, grouped)).reset_index()
    out["warmup"] = out["warmup"].astype(bool)
    out["ranks"] = out["ranks"].astype("int64")
    return out.loc[:, list(STEP_TABLE_COLUMNS)]


def rank_steps(records: pd.DataFrame) -> pd.DataFrame:
    """One row per worker rank and step, as `step_table` reads them: step records only, no ps server ranks,
    `warmup` also where --profile-steps traced the step, and the latest attempt of a step re-done after a
    resume. Why shared: `studies.worker_batches` filtered the records itself and kept profiled steps and
    superseded attempts, so a balanced run's "batch its workers took" read other steps than its throughput."""
    return _latest_attempts(_step_columns(records))


def _step_columns(records: pd.DataFrame) -> pd.DataFrame:
    """The step records' fields as numeric columns (absent optional fields all NaN, warmup False)."""
    missing = [c for c in _REQUIRED_STEP_COLUMNS if c not in records.columns]
    if missing:
        raise RecordError(
            f"step records lack the column(s) {', '.join(missing)}; "
            "they must follow docs/records.md (kind 'step')"
        )
    df = records
    if "kind" in df.columns:
        df = df[df["kind"] == "step"]
    if "role" in df.columns:
        df = df[df["role"] != "server"]  # ps server ranks: no samples, not workers (docs/records.md)
    cols: dict[str, Any] = {"rank": pd.to_numeric(df["rank"]).to_numpy(), "step": pd.to_numeric(df["step"]).to_numpy()}
    for col in ("step_s", "words", "samples", "loss", "lr", "time", "epoch", *PHASES):
        cols[col] = _float(df, col)
    if "warmup" in df.columns:
        cols["warmup"] = df["warmup"].fillna(False).astype(bool).to_numpy()
    else:
        cols["warmup"] = np.zeros(len(df), dtype=bool)
    if "profiled" in df.columns:  # steps traced by --profile-steps ran slower: not timed, like warm-up
        cols["warmup"] = cols["warmup"] | df["profiled"].fillna(False).astype(bool).to_numpy()
    work = pd.DataFrame(cols)
    if work["step_s"].isna().any() or work["step"].isna().any() or work["rank"].isna().any():
        raise RecordError("step records with an empty rank, step or step_s: the record files are corrupt")
    return work


def _latest_attempts(work: pd.DataFrame) -> pd.DataFrame:
    """A (rank, step) seen twice is a step re-done after a resume: keep the latest attempt (by time)."""
    if not work.duplicated(["rank", "step"]).any():
        return work
    return (
        work.sort_values(["rank", "step", "time"], kind="stable", na_position="first")
        .drop_duplicates(["rank", "step"], keep="last")
    )


def _slowest_ranks(work: pd.DataFrame, grouped: pd.core.groupby.DataFrameGroupBy) -> pd.DataFrame:
    """Per step (the index): slowest_rank, t_step and its phases. The slowest rank is the one whose
    step_s equals the step's maximum, the lowest such rank on a tie (two cythonised groupbys; a
    lexsort of all rows is ~20x slower)."""
    is_max = work["step_s"].to_numpy() == grouped["step_s"].transform("max").to_numpy()
    slowest = work[is_max].groupby("step", sort=True)["rank"].idxmin()
    slow = work.loc[slowest.to_numpy()].set_index("step")
    return slow[["rank", "step_s", *PHASES]].rename(columns={"rank": "slowest_rank", "step_s": "t_step"})


_STEP_DTYPES = {"step": "int64", "warmup": "bool", "ranks": "int64", "slowest_rank": "int64"}


def _float(df: pd.DataFrame, col: str) -> np.ndarray:
    """Column as float64 (None -> NaN); all-NaN when the column is absent (an optional field)."""
    if col not in df.columns:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[col], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)


# --------------------------------------------------------------------------------------------------
# per-run summary


@dataclass
class LayoutSummary:
    """What one run (one layout) measured: throughput, step-time statistics, phases, convergence.

    Throughput follows docs/records.md over the measured (non-warm-up, complete) steps. Phase
    shares are fractions of the summed step time, from the slowest rank of each step (see
    `step_table`); `share_exchange` is None when the engine does not expose the exchange wait.
    Fields that cannot be known are None (never NaN), so `asdict` is directly JSON-serialisable.
    """

    label: str
    workers: int
    nodes: int
    gpus_per_node: int
    engine: str | None
    rnn: str | None
    model: str | None
    mode: str  # strong, weak, or both axes where they differ (core.spec.scaling_name)
    global_batch: int | None
    steps_measured: int
    steps_warmup: int
    steps_incomplete: int
    # None when no step was measured: the loss threshold was reached inside the warm-up
    words_per_s: float | None
    samples_per_s: float | None
    step_s_mean: float | None
    step_s_median: float | None
    step_s_p90: float | None
    step_s_std: float | None
    share_data: float | None
    share_forward: float | None
    share_backward: float | None
    share_exchange: float | None
    share_optimizer: float | None
    final_loss: float | None
    final_val_loss: float | None
    loss_threshold: float | None
    reached_threshold: bool | None
    time_to_threshold_s: float | None
    steps_to_threshold: int | None
    # what was processed until the threshold (warm-up steps included: they trained too), the wall
    # time from the launch to the threshold event (start-up, validation and checkpoints included:
    # they are paid), and the launch's start-up until the first step began
    samples_to_threshold: int | None = None
    words_to_threshold: int | None = None
    wall_to_threshold_s: float | None = None
    startup_s: float | None = None
    # the gradient noise scale B_simple (samples) pooled over ranks and the later half of the steps
    # up to the threshold (or the end); how the global batch changes with the workers; the LR of
    # the last step and the steps of LR warm-up (the rule the convergence was measured under)
    noise_scale: float | None = None
    steps_per_epoch: int | None = None
    batch_scaling: str | None = None
    work_scaling: str | None = None  # fixed / growing as the sweep set it (spec.work_scaling); None outside a sweep
    lr: float | None = None
    lr_warmup_steps: int | None = None
    # the step of the first validation: a threshold reached there is only known to lie before it
    first_val_step: int | None = None
    precision: str | None = None  # fp32 / bf16 / fp16; None in summaries written before the choice existed
    # the largest peak memory of any rank (docs/records.md `mem_peak_bytes`) and which measure it is
    peak_mem_bytes: int | None = None
    mem_kind: str | None = None
    # what a --script run's items count ("images", `track.unit`; "samples" unless it said): its words_per_s
    # and samples_per_s are that unit per second. None for the built-in trainer: words.
    unit: str | None = None
    # what sets this run's series apart from the other series of the same report that share its model, RNN,
    # precision, engine and batch mode (spec.json's dotted keys: {"data.prefetch": 0}); the label names the
    # same fields. None where nothing does: a run alone, or runs that differ only in layout
    # (analysis.results.series_labels)
    settings: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (for summary.json and DataFrames)."""
        return asdict(self)


@dataclass(frozen=True)
class RunMeta:
    """What a run's summary takes from outside its step, validation and event records: the spec's
    layout and choices and the start records' batch facts (`analysis.results.summarize_loaded` fills
    it from a run directory). Typed, so a misspelt key fails where it is written rather than reading
    as None; what is not known stays None. `workers` defaults to nodes x gpus_per_node, else to the
    ranks seen."""

    label: str = ""
    nodes: int | None = None
    gpus_per_node: int | None = None
    workers: int | None = None
    engine: str | None = None
    rnn: str | None = None
    precision: str | None = None
    model: str | None = None
    batch_mode: str = "strong"  # core.spec.BATCH_MODES; its batch axis is core.spec.BATCH_SCALING's
    work_scaling: str | None = None  # fixed / growing, set by a sweep
    global_batch: int | None = None
    loss_threshold: float | None = None
    launched_at: float | None = None  # time.time() of the launch
    lr_warmup_steps: int | None = None
    steps_per_epoch: int | None = None
    unit: str | None = None  # a --script run's unit (LayoutSummary.unit)

    def __post_init__(self) -> None:
        if self.batch_mode not in BATCH_MODES:
            raise ValueError(f"batch_mode must be one of {BATCH_MODES}, got {self.batch_mode!r}")


def summarize_run(
    step_records: pd.DataFrame,
    val_records: pd.DataFrame | None,
    events: pd.DataFrame | None,
    meta: RunMeta,
    steps: pd.DataFrame | None = None,
) -> LayoutSummary:
    """Summarise one run from its records and `meta` (what the records do not say: `RunMeta`); `steps` is
    `step_table(step_records)` where the caller has it already (`launch plan` also draws its loss curves).

    Measured steps are those not marked warm-up and reported by every rank: a step that only some
    ranks finished (the run was interrupted inside it) has no meaningful slowest-rank time.

    Convergence: the first `threshold` event (lowest step) gives `time_to_threshold_s`
    (its `elapsed_s`: training time excluding validation) and `steps_to_threshold`; without such an
    event, the first validation record with `val_loss <= loss_threshold` is used. `reached_threshold`
    is None when no threshold is configured or no validation ran (nothing to judge by), else a bool.
    `final_loss` is the mean training loss of the last step; `final_val_loss` the last validation.

    A run that reached its loss threshold before any measured step (at a validation inside the
    warm-up) is a success: its time and steps to the threshold stand, while its throughput and step
    times were not measured (None; `steps_measured` 0, and `trust_warnings` says so).
    Raises RecordError when no measured step exists otherwise, because every figure would be undefined.
    """
    mode = meta.batch_mode
    steps = step_table(step_records) if steps is None else steps
    threshold = _float_or_none(meta.loss_threshold)
    reached, t_thr, s_thr = _threshold(val_records, events, threshold)
    measured, counts = _measured_steps(steps, meta.label or "?", early_threshold=bool(reached) and s_thr is not None)
    return LayoutSummary(
        label=meta.label,
        **_layout_of(meta, ranks_seen=int(steps["ranks"].max())),
        engine=meta.engine,
        rnn=meta.rnn,
        model=meta.model,
        mode=scaling_name(BATCH_SCALING[mode], meta.work_scaling),  # both axes where they differ, as the label
        global_batch=_int_or_none(meta.global_batch),
        **counts,
        **_rates_and_step_times(measured),
        **_phase_shares(measured),
        final_loss=_float_or_none(steps["loss"].iloc[-1]),
        final_val_loss=_final_val_loss(val_records),
        loss_threshold=threshold,
        reached_threshold=reached,
        time_to_threshold_s=t_thr,
        steps_to_threshold=s_thr,
        **_work_to(steps, s_thr),
        **_wall_times(step_records, events, s_thr, _float_or_none(meta.launched_at)),
        noise_scale=pooled_noise_scale(step_records, s_thr),
        steps_per_epoch=_int_or_none(meta.steps_per_epoch),
        batch_scaling=BATCH_SCALING[mode],
        work_scaling=meta.work_scaling,
        lr=_float_or_none(steps["lr"].iloc[-1]) if "lr" in steps.columns else None,
        lr_warmup_steps=_int_or_none(meta.lr_warmup_steps),
        first_val_step=_first_val_step(val_records),
        precision=meta.precision,
        **_peak_memory(step_records),
        unit=meta.unit,
    )


def _peak_memory(step_records: pd.DataFrame) -> dict[str, Any]:
    """The largest `mem_peak_bytes` over every rank and step (the rank that needs the most decides
    whether a layout fits), with its `mem_kind`; None for records written before memory was recorded."""
    if "mem_peak_bytes" not in step_records.columns:
        return {"peak_mem_bytes": None, "mem_kind": None}
    peaks = pd.to_numeric(step_records["mem_peak_bytes"], errors="coerce")
    if peaks.isna().all():
        return {"peak_mem_bytes": None, "mem_kind": None}
    row = step_records.loc[peaks.idxmax()]
    kind = row.get("mem_kind")
    return {"peak_mem_bytes": int(peaks.max()), "mem_kind": kind if isinstance(kind, str) else None}


def _first_val_step(val_records: pd.DataFrame | None) -> int | None:
    if val_records is None or not len(val_records) or "step" not in val_records.columns:
        return None
    return _int_or_none(pd.to_numeric(val_records["step"], errors="coerce").min())


# ---- results that cannot be trusted -------------------------------------------------------------

#: Fewer measured steps than this make every timing a guess (warm-up effects, one slow step).
MIN_MEASURED_STEPS = 10
#: A step-time standard deviation over this share of the mean: the machine was busy or the run unsteady.
MAX_STEP_SPREAD = 0.20


#: What a run whose measured steps counted no items lacks, and how a script records them (`trust_warnings`, and
#: the caption of a table that shows such a run: the summary a `launch --script` run ends with).
NO_ITEMS = ("measured steps counted no items (0 samples), so it has no throughput, speedup or efficiency; "
            "pass the items each step processed: track.step(items=len(batch), ...)")


def outside_text(value: float, low: float, high: float, decimals: int = 2, most: int = 12) -> str:
    """`value`, which lies outside [low, high], with as few decimals from `decimals` on as show it outside:
    a serial fraction of 1.003 read "1.00 is outside [0, 1]", a warning whose own number contradicted it."""
    for places in range(decimals, most + 1):
        text = f"{value:.{places}f}"
        if not low <= float(text) <= high:
            return text
    return repr(value)


def trust_warnings(table: pd.DataFrame) -> list[str]:
    """What in a scaling table (`scale_layouts`) cannot be trusted, one sentence per finding, as data
    so every report (terminal, Markdown, JSON) shows the same words."""
    out: list[str] = []
    for _, row in table.iterrows():
        who = f"{row.get('label') or 'run'} at {row.get('workers')} worker(s)"
        measured = _int_or_none(row.get("steps_measured"))
        if measured == 0:  # summarize_run allows it only for a run that reached its threshold
            out.append(f"{who}: reached the loss threshold at step {_int_or_none(row.get('steps_to_threshold'))}, "
                       f"inside its {_int_or_none(row.get('steps_warmup'))} warm-up step(s): its time to the "
                       "threshold stands, its throughput was not measured past warm-up (no words/s, step time or "
                       "speedup); to measure it too, lower --warmup-steps")
        elif measured is not None and measured < MIN_MEASURED_STEPS:
            out.append(f"{who}: only {measured} measured step(s) (fewer than {MIN_MEASURED_STEPS}); "
                       "its timings are not reliable: run more steps (--steps; a --script's own argument after "
                       "`--`)")
        if measured and _float_or_none(row.get("words_per_s")) is None:  # _rates_and_step_times: 0 items
            out.append(f"{who}: its {NO_ITEMS}")
        mean, std = _float_or_none(row.get("step_s_mean")), _float_or_none(row.get("step_s_std"))
        if mean and std is not None and std / mean > MAX_STEP_SPREAD:
            out.append(f"{who}: step times spread {std / mean:.0%} around their mean (over "
                       f"{MAX_STEP_SPREAD:.0%}): the machine was busy or the steps uneven")
        serial = _float_or_none(row.get("karp_flatt"))
        speedup, rate = _float_or_none(row.get("speedup")), _float_or_none(row.get("words_per_s"))
        if serial is not None and speedup is not None and 0 < speedup < 1 and rate:
            # a slowdown, not an odd serial part (the README's own first job got "noise, or a different workload")
            unit = row.get("unit") if isinstance(row.get("unit"), str) else "words"
            out.append(f"{who}: Karp-Flatt serial fraction {outside_text(serial, 0, 1)} is outside [0, 1] because "
                       f"throughput drops from {_int_or_none(row.get('base_workers'))} to "
                       f"{_int_or_none(row.get('workers'))} workers ({rate / speedup:,.0f} -> {rate:,.0f} {unit}/s, "
                       f"speedup {outside_text(speedup, 1, math.inf)}): negative scaling (a busy host, "
                       "oversubscribed cores or a slow link), not a serial part")
        elif serial is not None and not 0 <= serial <= 1:
            out.append(f"{who}: Karp-Flatt serial fraction {outside_text(serial, 0, 1)} is outside [0, 1]: the speedup "
                       "is not explained by a serial part (noise, or a different workload per layout)")
        reached, first = _int_or_none(row.get("steps_to_threshold")), _int_or_none(row.get("first_val_step"))
        if reached is not None and first is not None and reached <= first:
            out.append(f"{who}: the loss threshold was reached at the first validation (step {reached}); "
                       "the time to the threshold is only an upper bound: validate more often (--val-every)")
    return out + _batch_against_axis(table)


def _batch_against_axis(table: pd.DataFrame) -> list[str]:
    """A series whose measured global batch contradicts its batch axis, one sentence each. Why: a --script that
    keeps a per-rank batch was reported as strong scaling (a fixed global batch), since scalelab does not choose
    a script's batch; its 2-worker "speedup" was the same steps on twice the data."""
    need = {"label", "workers", "global_batch", "batch_scaling"}
    if table.empty or not need <= set(table.columns):
        return []
    out = []
    for label, rows in table.groupby("label", sort=False):
        rows = rows.dropna(subset=["global_batch"]).sort_values("workers")
        if len(rows) < 2 or rows["workers"].nunique() < 2:
            continue
        first, last = rows.iloc[0], rows.iloc[-1]
        n = float(last["workers"]) / float(first["workers"])
        grew = float(last["global_batch"]) / float(first["global_batch"])
        axis = str(first["batch_scaling"])
        if axis == "fixed" and abs(grew / n - 1) <= 0.1:
            seen = "grew with the workers: each worker kept its batch (weak scaling in the batch)"
        elif axis == "growing" and abs(grew - 1) <= 0.1:
            seen = "stayed the same: the workers split it (strong scaling in the batch)"
        else:
            continue
        tail = ": its speedup is throughput, not the same job done faster" if axis == "fixed" else ""
        out.append(f"{label}: its global batch {seen}, {int(first['global_batch']):,} at {int(first['workers'])} "
                   f"worker(s) and {int(last['global_batch']):,} at {int(last['workers'])}, but the series is "
                   f"labelled batch {axis}{tail}")
    return out



def _work_to(steps: pd.DataFrame, step: int | None) -> dict[str, int | None]:
    """samples_to_threshold and words_to_threshold: what every rank processed in steps 1..`step`."""
    if step is None:
        return {"samples_to_threshold": None, "words_to_threshold": None}
    done = steps[steps["step"] <= step]
    return {"samples_to_threshold": int(done["samples"].sum()), "words_to_threshold": int(done["words"].sum())}


def _wall_times(step_records: pd.DataFrame, events: pd.DataFrame | None, step: int | None,
                launched_at: float | None) -> dict[str, float | None]:
    """wall_to_threshold_s (launch to the threshold event) and startup_s (launch to the start of
    the first step), when the launch time is known."""
    out: dict[str, float | None] = {"wall_to_threshold_s": None, "startup_s": None}
    if launched_at is None:
        return out
    if "time" in step_records.columns and len(step_records):
        begun = pd.to_numeric(step_records["time"], errors="coerce") - pd.to_numeric(step_records["step_s"])
        begun = begun[begun >= launched_at]  # a resumed run's earlier launches began before its latest (-14 s)
        out["startup_s"] = float(begun.min()) - launched_at if len(begun) else None
    if step is not None and events is not None and len(events) and "event" in events.columns:
        ev = events[(events["event"] == "threshold") & (pd.to_numeric(events.get("step"), errors="coerce") == step)]
        if len(ev) and "time" in ev.columns:
            out["wall_to_threshold_s"] = float(pd.to_numeric(ev["time"]).max()) - launched_at
    return out


def pooled_noise_scale(step_records: pd.DataFrame, until_step: int | None = None) -> float | None:
    """B_simple = Σ tr(Σ) / Σ |G|² over every rank's per-step estimates (scalelab/train/noise.py) in the later
    half of steps 1..`until_step` (default: all steps). Why pooled sums, not a mean of ratios:
    each step's |G|² is a noisy difference that can be near zero or negative, so ratios explode;
    the sums are unbiased and their ratio consistent. Why the later half: B_simple grows as the
    loss falls, and the steps to a threshold are spent mostly near it; the first steps' large
    gradients would drag it down. None without estimates, or with a non-positive pooled |G|² or tr(Σ):
    both are estimated as differences, and a short run's can come out negative (a noise scale of -2.56
    samples was shown, which no batch has)."""
    if not {"noise_trace", "noise_grad_sq"} <= set(step_records.columns):
        return None
    df = step_records
    if "kind" in df.columns:
        df = df[df["kind"] == "step"]
    step = pd.to_numeric(df["step"], errors="coerce")
    last = float(step.max()) if until_step is None else float(until_step)
    window = df[(step > last / 2) & (step <= last)]
    trace = pd.to_numeric(window["noise_trace"], errors="coerce")
    grad_sq = pd.to_numeric(window["noise_grad_sq"], errors="coerce")
    ok = trace.notna() & grad_sq.notna()
    if not ok.any() or float(grad_sq[ok].sum()) <= 0 or float(trace[ok].sum()) <= 0:
        return None
    return float(trace[ok].sum()) / float(grad_sq[ok].sum())


class UnmeasuredError(RecordError):
    """A run with step records of which none was measured (all warm-up, or left incomplete by a rank).

    Its own type, with the counts, so that a --script run, whose length its script decides and no spec
    check could refuse up front, gets a note saying how to measure it instead of this error
    (`analysis.results.summary_or_facts`); the built-in trainer's `--steps` is refused before it starts."""

    def __init__(self, message: str, recorded: int, warmup: int) -> None:
        super().__init__(message)
        self.recorded, self.warmup = recorded, warmup


def _measured_steps(steps: pd.DataFrame, label: str, early_threshold: bool = False) -> tuple[pd.DataFrame, dict[str, int]]:
    """(measured steps, their counts): steps not marked warm-up and reported by every rank. None
    measured is an error, unless the run stopped at its loss threshold (`early_threshold`) first."""
    if steps.empty:
        raise RecordError(
            f"no step records in run {label!r}: the run did not complete a single "
            "step; check its logs/ and run it again"
        )
    complete = steps["ranks"] == int(steps["ranks"].max())
    warm = steps["warmup"]
    measured = steps[~warm & complete]
    if measured.empty and not early_threshold:
        raise UnmeasuredError(
            f"no measured steps in run {label!r}: {len(steps)} step(s) recorded, "
            f"{int(warm.sum())} of them warm-up. Timings exclude warm-up steps; "
            "run more steps than warmup_steps (raise --steps or lower warmup_steps).",
            recorded=len(steps), warmup=int(warm.sum()),
        )
    counts = {"steps_measured": int(len(measured)), "steps_warmup": int(warm.sum()),
              "steps_incomplete": int((~complete).sum())}
    return measured, counts


def _layout_of(meta: RunMeta, ranks_seen: int) -> dict[str, int]:
    """workers, nodes, gpus_per_node from `meta`; workers default to nodes x gpus_per_node, else to
    the ranks seen; one node of all the workers when the layout is not given."""
    nodes = _int_or_none(meta.nodes)
    gpn = _int_or_none(meta.gpus_per_node)
    workers = _int_or_none(meta.workers)
    if workers is None:
        workers = nodes * gpn if nodes is not None and gpn is not None else ranks_seen
    return {"workers": int(workers), "nodes": nodes if nodes is not None else 1,
            "gpus_per_node": gpn if gpn is not None else int(workers)}


#: The summary's figures of the measured steps: None for a run that reached its threshold in warm-up.
_UNMEASURED = ("words_per_s", "samples_per_s", "step_s_mean", "step_s_median", "step_s_p90", "step_s_std",
               *("share_" + phase.removesuffix("_s") for phase in PHASES))


def _rates_and_step_times(measured: pd.DataFrame) -> dict[str, float | None]:
    """words/s and samples/s over the measured steps (docs/records.md), and step-time statistics;
    None without a measured step. A rate is None too where the measured steps counted no items (a script's
    `track.step(items=0)`): 0 items/s is no throughput to scale (its speedup divided by zero), and
    `trust_warnings` says how to record one."""
    t = measured["t_step"].to_numpy(dtype=float)
    if not len(t):
        return dict.fromkeys(_UNMEASURED[:6])
    total_t = float(t.sum())
    words, samples = float(measured["words"].sum()), float(measured["samples"].sum())
    return {
        "words_per_s": words / total_t if words > 0 else None,
        "samples_per_s": samples / total_t if samples > 0 else None,
        "step_s_mean": float(t.mean()),
        "step_s_median": float(np.median(t)),
        "step_s_p90": float(np.percentile(t, 90)),
        # sample standard deviation; a single measured step has no spread to estimate -> 0.0
        "step_s_std": float(t.std(ddof=1)) if len(t) > 1 else 0.0,
    }


def _phase_shares(measured: pd.DataFrame) -> dict[str, float | None]:
    """share_<phase>: the phase's time over the summed step time; None when no step recorded it."""
    total_t = float(measured["t_step"].to_numpy(dtype=float).sum())
    if not len(measured):
        return {"share_" + phase.removesuffix("_s"): None for phase in PHASES}
    shares = {}
    for phase in PHASES:
        vals = measured[phase]
        shares["share_" + phase.removesuffix("_s")] = None if vals.isna().all() else float(vals.sum()) / total_t
    return shares


def _by_step(val_records: pd.DataFrame) -> pd.DataFrame:
    return val_records.sort_values("step", kind="stable") if "step" in val_records.columns else val_records


def _final_val_loss(val_records: pd.DataFrame | None) -> float | None:
    if val_records is None or not len(val_records) or "val_loss" not in val_records.columns:
        return None
    return _float_or_none(_by_step(val_records)["val_loss"].iloc[-1])


def _threshold(
    val_records: pd.DataFrame | None, events: pd.DataFrame | None, threshold: float | None
) -> tuple[bool | None, float | None, int | None]:
    """(reached, elapsed_s, step) of the first time validation loss went <= threshold."""
    if events is not None and len(events) and "event" in events.columns:
        ev = events[events["event"] == "threshold"]
        if len(ev):
            first = ev.sort_values("step", kind="stable").iloc[0] if "step" in ev.columns else ev.iloc[0]
            return True, _float_or_none(first.get("elapsed_s")), _int_or_none(first.get("step"))
    if threshold is None:
        return None, None, None
    if val_records is None or not len(val_records) or "val_loss" not in val_records.columns:
        return None, None, None
    v = _by_step(val_records)
    hits = v[pd.to_numeric(v["val_loss"], errors="coerce") <= threshold]
    if hits.empty:
        return False, None, None
    first = hits.iloc[0]
    return True, _float_or_none(first.get("elapsed_s")), _int_or_none(first.get("step"))


def _float_or_none(x: Any) -> float | None:
    if x is None:
        return None
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _int_or_none(x: Any) -> int | None:
    f = _float_or_none(x)
    return None if f is None else int(f)


# --------------------------------------------------------------------------------------------------
# scaling


def karp_flatt(speedup: float | np.ndarray, n: float | np.ndarray) -> float | np.ndarray:
    """Karp-Flatt serial fraction e = (1/S - 1/n) / (1 - 1/n); NaN where n == 1 (undefined).

    Why report it: efficiency falls with n even for a constant serial part; e stays flat then,
    and a growing e points at overhead that grows with the worker count (communication).
    """
    s = np.asarray(speedup, dtype=float)
    m = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where(m == 1, np.nan, (1.0 / s - 1.0 / m) / (1.0 - 1.0 / m))
    return float(e) if e.ndim == 0 else e


def scaling_table(
    rows: Sequence[dict[str, Any]] | pd.DataFrame,
    mode: str = "strong",
    series: str | Sequence[str] = "label",
) -> pd.DataFrame:
    """Speedup, efficiency and Karp-Flatt serial fraction per series, relative to its smallest layout.

    `rows` have `workers` and either `throughput` (work per second, e.g. words/s) or `time_s`
    (wall time of a job); `throughput` is used when both are present. Rows are grouped into series
    by the `series` column(s) (default `label`; absent -> all rows form one series). The base of a
    series is its row with the fewest workers (the first such row in input order on a tie), and
    n = workers / base_workers. Columns added (`SCALING_COLUMNS`): base_workers, n, speedup,
    efficiency, karp_flatt. Input columns and row order are kept.

    - Throughput:  speedup = throughput / base_throughput; efficiency = speedup / n — in both modes.
      Why the same formula serves weak scaling: with fixed work W per worker per step, throughput_1
      = W / t1 and throughput_N = N·W / tN, so throughput_N / (N·throughput_1) = t1 / tN, which is
      exactly the weak-scaling efficiency; and with a fixed global problem (strong), the throughput
      ratio is t1 / tN, the strong speedup. Throughput thus needs no mode.
    - time_s, strong (same total work): speedup = t_base / t; efficiency = speedup / n.
    - time_s, weak (same work per worker, total grows with n): speedup = n·t_base / t (the
      "scaled" speedup: n times the work in t instead of t_base), efficiency = t_base / t.

    Karp-Flatt e = (1/S - 1/n)/(1 - 1/n) is NaN for n == 1.
    Raises ValueError on an unknown mode, missing columns, or non-positive workers/throughput/time.
    """
    if mode not in BATCH_MODES:
        raise ValueError(f"mode must be one of {BATCH_MODES}, got {mode!r}")
    df = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    metric = _metric_column(df)
    if df.empty:
        for c in SCALING_COLUMNS:
            df[c] = pd.Series(dtype="float64")
        return df
    workers = pd.to_numeric(df["workers"], errors="raise").astype(float).to_numpy()
    value = pd.to_numeric(df[metric], errors="coerce").astype(float).to_numpy()
    if (workers <= 0).any() or np.isnan(workers).any():
        raise ValueError("workers must be positive")
    if (value <= 0).any():
        raise ValueError(f"{metric} must be positive (NaN marks a failed run)")
    base = _base_rows(df, _series_columns(df, series), workers, value)
    # a base of -1 (a row without a figure: no base) reads the NaN appended at the end
    base_value, base_workers = np.append(value, np.nan)[base], np.append(workers, np.nan)[base]
    n = workers / base_workers
    if metric == "throughput":
        speedup = value / base_value
        efficiency = speedup / n
    elif mode == "strong":
        speedup = base_value / value
        efficiency = speedup / n
    else:  # time_s, weak
        efficiency = base_value / value
        speedup = n * efficiency
    alone = _alone_on_many(base, workers)
    speedup, efficiency = np.where(alone, np.nan, speedup), np.where(alone, np.nan, efficiency)
    df["base_workers"] = base_workers
    df["n"] = n
    df["speedup"] = speedup
    df["efficiency"] = efficiency
    df["karp_flatt"] = karp_flatt(speedup, n)
    return df


def _alone_on_many(base: np.ndarray, workers: np.ndarray) -> np.ndarray:
    """Rows that are their series' only layout, on more than one worker: their speedup over themselves (1.00,
    100 %) says nothing, and beside a study's own tables, which measure such a variant ("2x1 arranged", "the
    dynamic balancer") against the study's baseline, it contradicted them (1.00 against 0.24). Shown as none."""
    index = np.arange(len(base))
    own_base = base == index
    counts = np.bincount(base[base >= 0], minlength=len(base)) if len(base) else np.zeros(0, dtype=int)
    return own_base & (counts[np.clip(base, 0, None)] == 1) & (workers > 1)


def _metric_column(df: pd.DataFrame) -> str:
    """throughput when the rows have it, else time_s; ValueError when workers or both are missing."""
    if "workers" not in df.columns:
        raise ValueError("scaling_table needs a 'workers' column")
    for metric in ("throughput", "time_s"):
        if metric in df.columns:
            return metric
    raise ValueError("scaling_table needs a 'throughput' or a 'time_s' column")


def _series_columns(df: pd.DataFrame, series: str | Sequence[str]) -> list[str]:
    """The series columns that `df` has (none: all rows are one series)."""
    keys = [series] if isinstance(series, str) else list(series)
    return [k for k in keys if k in df.columns]


def _series_key(df: pd.DataFrame, keys: list[str]) -> pd.Series:
    """One string per row naming its series (the key columns joined)."""
    return df[keys].astype(str).agg("\x1f".join, axis=1)


def _base_rows(df: pd.DataFrame, keys: list[str], workers: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Position of each row's base: the row of its series with the fewest workers, the first one
    in input order on a tie (idxmin returns the first); among the rows with a figure (`value` not
    NaN), -1 for the rows without one."""
    pos = pd.RangeIndex(len(df))
    measured = ~np.isnan(value)
    if not measured.all():  # rows without a figure (a run stopped at its threshold in warm-up) are no base
        base = np.full(len(df), -1)
        some = np.flatnonzero(measured)
        if len(some):
            part = _base_rows(df.iloc[some], keys, workers[some], value[some])
            base[some] = some[part]
        return base
    if keys:
        groups = pd.Series(_series_key(df, keys).to_numpy(), index=pos)
    else:
        groups = pd.Series(np.zeros(len(df), dtype=int), index=pos)
    base_pos = pd.Series(workers, index=pos).groupby(groups, sort=False).idxmin()
    return groups.map(base_pos).to_numpy()


def scale_layouts(
    summaries: Iterable[LayoutSummary], series: str | Sequence[str] = "label",
    extra: Sequence[Mapping[str, Any]] | None = None,
) -> pd.DataFrame:
    """The scaling table of a sweep: one row per run, summary columns plus `SCALING_COLUMNS` and
    `THRESHOLD_COLUMNS` (`threshold_scaling`: the same ratios of the time to the loss threshold).

    Speedup is the ratio of `words_per_s` (see `scaling_table` for why this is right in both
    modes). Runs are grouped into series by `series` (default `label`: give every run of one sweep
    the same label and let nodes/gpus_per_node tell the layouts apart; reports label runs that differ in
    any setting but the layout apart, `analysis.results.series_labels`). Rows come sorted by series
    (in order of first appearance), then workers, then nodes, so the base of a series is its
    smallest layout and, among equal worker counts, the one with the fewest nodes (e.g. 1x2 rather
    than 2x1: no inter-node traffic). `extra`: more columns of each run, in the order of `summaries`
    (the report's dollars, priced above this layer).
    """
    records = [s.to_dict() for s in summaries]
    if extra is not None:
        records = [{**r, **e} for r, e in zip(records, extra)]
    if not records:
        cols = list(LayoutSummary.__dataclass_fields__) + list(SCALING_COLUMNS) + list(THRESHOLD_COLUMNS)
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame(records)
    for col in _UNMEASURED:  # None (not measured past warm-up) as NaN, even where every run has None
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    keys = _series_columns(df, series)
    if keys:
        key = _series_key(df, keys)
        df["_series"] = pd.Categorical(key, categories=list(dict.fromkeys(key)), ordered=True)
    else:
        df["_series"] = 0
    df = df.sort_values(["_series", "workers", "nodes"], kind="stable").drop(columns="_series")
    df = df.reset_index(drop=True)
    modes = set(df["mode"])  # a scaling name (strong, weak, batch-growing-work-fixed)
    mode = modes.pop() if len(modes) == 1 and modes <= set(BATCH_MODES) else "strong"  # throughput: no matter
    out = scaling_table(df.assign(throughput=df["words_per_s"]), mode=mode, series=keys)
    out = out.drop(columns="throughput")
    out["speedup_to_threshold"], out["efficiency_to_threshold"] = threshold_scaling(out, keys)
    return out


def threshold_scaling(rows: pd.DataFrame, keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(speedup, efficiency) of the time to the loss threshold against the smallest layout of each series:
    t_base / t and that over n = workers / base workers, NaN where either run did not reach the threshold.

    Why beside the throughput's: data parallelism can slow convergence (more samples per step, fewer steps'
    worth of updates), so seed 004 measures speedup and efficiency from both the run time and the time to
    its loss threshold, and finds the latter lower. Each series' base is `scaling_table`'s (`_base_rows`: its
    row with the fewest workers, the first on a tie; `rows` come sorted by series, workers, nodes from
    `scale_layouts`); a series of one layout on several workers compares nothing and has none (`_alone_on_many`)."""
    n_rows = len(rows)
    speedup, efficiency = np.full(n_rows, np.nan), np.full(n_rows, np.nan)
    if not n_rows or "time_to_threshold_s" not in rows.columns:
        return speedup, efficiency
    reached = rows["reached_threshold"].fillna(False).astype(bool).to_numpy() if "reached_threshold" in rows \
        else np.ones(n_rows, dtype=bool)
    time = pd.to_numeric(rows["time_to_threshold_s"], errors="coerce").to_numpy(dtype=float)
    time = np.where(reached & (time > 0), time, np.nan)
    workers = pd.to_numeric(rows["workers"], errors="coerce").to_numpy(dtype=float)
    # every row is a base candidate (a base that did not reach the threshold makes its series' ratios NaN)
    base = _base_rows(rows, list(keys), workers, np.zeros(n_rows))
    speedup = time[base] / time
    efficiency = speedup / (workers / workers[base])
    alone = _alone_on_many(base, workers)
    return np.where(alone, np.nan, speedup), np.where(alone, np.nan, efficiency)
