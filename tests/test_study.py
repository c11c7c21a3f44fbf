"""The seeds' studies as recipes (examples/*.yaml): each runs at its `test` scale and ends in the
seed-shaped tables, computed from the runs' records."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from scalelab.core.errors import SpecError
from scalelab.launcher.study import load_study, variant_specs
from tests.conftest import ROOT, launch, only_run_dir, study_made_once

EXAMPLES = ROOT / "examples"


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("seed*.yaml")))
@pytest.mark.parametrize("scale", ["test", "cpu", "seed"])
def test_every_recipe_and_scale_is_valid(name, scale):
    """Every variant x layout of every scale builds a valid spec (checked before anything runs)."""
    try:
        study = load_study(EXAMPLES / name, scale)
    except SpecError as exc:
        if "has no scale" in str(exc):
            pytest.skip(str(exc))
        raise
    assert study.seed_scale.strip(), "every recipe states the scale the seed used"
    if study.kind == "gemm":
        assert study.gemm.get("batches") or scale == "cpu"
        return
    specs = [s for v in study.variants for s in variant_specs(study, v)]
    assert specs and all(s.workers >= 1 for s in specs)


def test_study_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("title: x\nlayout: [1x1]\n")
    with pytest.raises(SpecError, match="unknown key.*layout.*layouts"):
        load_study(bad)
    with pytest.raises(SpecError, match="has no scale 'huge'"):
        load_study(EXAMPLES / "seed001-nmt-data-parallel.yaml", "huge")
    with pytest.raises(SpecError, match="study file not found"):
        load_study(tmp_path / "none.yaml")


def _layout(label: str, nodes: int, gpn: int, words_per_s: float, steps_to_threshold: int | None):
    from scalelab.analysis.scaling import LayoutSummary

    fields = {f: None for f in LayoutSummary.__dataclass_fields__}
    fields.update(label=label, workers=nodes * gpn, nodes=nodes, gpus_per_node=gpn, mode="strong", global_batch=8,
                  steps_measured=4, steps_warmup=0, steps_incomplete=0, words_per_s=words_per_s, samples_per_s=1.0,
                  step_s_mean=0.5, step_s_median=0.5, step_s_p90=0.5, step_s_std=0.0, loss_threshold=1.0,
                  reached_threshold=steps_to_threshold is not None, steps_to_threshold=steps_to_threshold,
                  time_to_threshold_s=30.0 if steps_to_threshold else None,
                  wall_to_threshold_s=45.0 if steps_to_threshold else None)
    return LayoutSummary(**fields)


def _steps(step_s: float) -> pd.DataFrame:
    """Step table of 4 steps, two per epoch, one rank."""
    from scalelab.analysis.scaling import step_table

    return step_table(pd.DataFrame({"rank": 0, "step": [1, 2, 3, 4], "epoch": [0, 0, 1, 1], "step_s": step_s,
                                    "words": 10, "samples": 1}))


def test_seed_tables_from_summaries_and_step_tables():
    """analysis.studies is pure: the tables follow from the summaries and step tables given."""
    from scalelab.analysis.studies import seed_table, study_markdown, study_runs

    data = study_runs([("a/1x1", _layout("a", 1, 1, 100.0, None), _steps(2.0)),
                       ("a/1x2", _layout("a", 1, 2, 150.0, 2), _steps(1.5)),
                       ("b/1x2", _layout("b", 1, 2, 180.0, 3), _steps(1.0))])
    assert list(data.rows["run"]) == ["a/1x1", "a/1x2", "b/1x2"]
    assert list(data.rows["train_s"]) == [8.0, 6.0, 4.0]
    # b has no run at the fewest workers: its speedup is against the first variant's smallest layout
    assert data.rows["speedup"].tolist() == pytest.approx([1.0, 1.5, 1.8])
    # fractional epochs: 2 steps an epoch, so the threshold at step 3 is 1.5 epochs
    assert data.epoch_times["a/1x1"] == [4.0, 4.0] and data.epochs_to == {"a/1x1": None, "a/1x2": 1.0, "b/1x2": 1.5}
    epochs = seed_table("epochs", data, epochs_shown=2)
    assert epochs["total (s)"].tolist() == [8.0, 6.0, 4.0] and epochs["speedup"].tolist() == [1.0, 1.33, 1.0]
    arrangement = seed_table("arrangement", data)
    assert arrangement["Time (min/epoch)"].tolist() == pytest.approx([4 / 60, 3 / 60, 2 / 60], abs=1e-4)
    # a partial last epoch counts as the part it is: 3 steps of 2-step epochs are 1.5 epochs, not 2
    partial = study_runs([("c/1x1", _layout("c", 1, 1, 100.0, None), _steps(2.0).iloc[:3])])
    assert seed_table("arrangement", partial)["Time (min/epoch)"].tolist() == pytest.approx([6.0 / 1.5 / 60], abs=1e-4)
    with pytest.raises(ValueError, match="not 'money'"):
        seed_table("money", data)
    text = study_markdown("T", "one GPU", "strong", ["a", "b"], {"throughput": seed_table("throughput", data)},
                          "report.md")
    assert "## Throughput" in text and "| b | 2 | 4 | 4 | 2.0 | 180.0 | 1.8 |" in text


def test_money_table_prices_from_the_catalog():
    from scalelab.analysis.studies import study_runs
    from scalelab.costs.catalog import builtin_catalog
    from scalelab.costs.studies import price_money_table

    data = study_runs([("a/1x1", _layout("a", 1, 1, 100.0, 2), _steps(2.0)),
                       ("a/2x1", _layout("a", 2, 1, 150.0, None), _steps(400.0))],
                      {"a/1x1": {"wall_s": 50.0}, "a/2x1": {"wall_s": 1700.0}})
    money = price_money_table(data.rows, {("a", "1x1"): "1*p2.xlarge", ("a", "2x1"): "2*p2.xlarge"}, "on-demand",
                              builtin_catalog())
    # both wall time, as every dollar is billed: launch -> last record, and launch -> threshold event
    assert money["Wall seconds"].tolist() == [50.0, 1700.0]
    assert money["Wall seconds to threshold"].tolist()[0] == 45.0 and pd.isna(money["Wall seconds to threshold"][1])
    # p2.xlarge on demand: $0.90/h, per second with a 60-second minimum per instance
    assert money["Total Price ($)"].tolist() == pytest.approx([0.9 * 60 / 3600, round(2 * 0.9 * 1700 / 3600, 4)])
    assert money["Price to threshold ($)"].tolist()[0] == pytest.approx(0.9 * 60 / 3600)
    study = load_study(EXAMPLES / "seed004-sentiment.yaml", "test")
    mixes = study.instance_mixes()
    assert mixes and all(label in {v.label for v in study.variants} for label, _ in mixes)


def _run(tmp_path: Path, name: str) -> Path:
    proc = launch("study", str(EXAMPLES / name), "--scale", "test", "--runs-dir", "runs", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return only_run_dir(tmp_path / "runs")


@pytest.fixture
def seed004(tmp_path_factory) -> Path:
    """Seed 004's study at its test scale, run once in the pytest run; tests/test_study_fixes.py reads it too."""
    return study_made_once(tmp_path_factory, EXAMPLES / "seed004-sentiment.yaml", "--scale", "test")[0]


@pytest.mark.slow
def test_seed001_throughput_table(tmp_path):
    study = _run(tmp_path, "seed001-nmt-data-parallel.yaml")
    table = pd.read_csv(study / "throughput.csv")
    assert list(table["GPU number"]) == [1, 2, 1, 2, 1, 2]
    assert set(table["variant"]) == {"cudnn_lstm all-reduce", "cudnn_lstm parameter server",
                                     "dynamic_rnn independent replicas"}
    assert (table["Batch size (per GPU)"] == 8).all() and (table["Processing speed (words/s)"] > 0).all()
    assert list(table["Speedup ratio"])[::2] == [1.0, 1.0, 1.0]
    text = (study / "study.md").read_text()
    assert "| GPU number |" in text and "Scale of the seed:" in text and (study / "speedup.png").exists()


@pytest.mark.slow
def test_seed002_epoch_times(tmp_path):
    study = _run(tmp_path, "seed002-rnnlm-strong-weak.yaml")
    table = pd.read_csv(study / "epochs.csv")
    assert list(table["workers"]) == [1, 2]
    assert (table[["epoch 1 (s)", "epoch 2 (s)", "epoch 3 (s)"]] > 0).all().all()
    assert table["total (s)"].iloc[0] == pytest.approx(table[["epoch 1 (s)", "epoch 2 (s)", "epoch 3 (s)"]].iloc[0].sum(), abs=0.01)


@pytest.mark.slow
def test_seed004_convergence_arrangement_money(seed004):
    study = seed004
    conv = pd.read_csv(study / "convergence.csv")
    assert set(conv["layout"]) >= {"1x1", "1x2", "2x1"}
    assert conv["threshold"].eq(0.65).all()
    # same global batch and seed on every layout: the same curve, so the same step reaches the threshold
    assert conv["reached"].all() and conv["steps to threshold"].nunique() == 1
    assert (conv["time to threshold (s)"] > 0).all() and (conv["epochs to threshold"] > 0).all()
    arr = pd.read_csv(study / "arrangement.csv")
    assert (arr["Time (min/epoch)"] > 0).all()
    thr = pd.read_csv(study / "throughput.csv")
    base = thr.loc[0, "Processing speed (words/s)"]  # strong scaling 1x1: every speedup is against it
    assert thr["Speedup ratio"].tolist() == pytest.approx((thr["Processing speed (words/s)"] / base).round(2).tolist(), abs=0.011)
    money = pd.read_csv(study / "money.csv")
    mixed = money[money["Instances"] == "1*p2.xlarge+1*g3.4xlarge"].iloc[0]
    # dollars from the catalog: (0.90 + 1.14) $/h, per second with a 60-second minimum per instance
    assert mixed["Total Price ($)"] == pytest.approx((0.90 + 1.14) * max(mixed["Wall seconds"], 60) / 3600,
                                                     abs=1e-3)


@pytest.mark.slow
def test_seed003_gemm_against_batch(tmp_path):
    study = _run(tmp_path, "seed003-gemm-batch.yaml")
    gemm = pd.read_csv(study / "gemm.csv")
    assert len(gemm) == 2 * 3 * 3  # hiddens x batches x (NN, TN, NT)
    assert set(gemm["batch"]) == {1, 16, 33} and (gemm["gflops"] > 0).all()
    steps = pd.read_csv(study / "step.csv")
    assert list(steps["batch"]) == [1, 16, 33] and (steps["words_per_s"] > 0).all()
    text = (study / "study.md").read_text()
    # advice where the points were steady; on a busy machine, a line saying there is none
    assert ("reaches 90% of its best rate at batch" in text or "no batch was measured steadily" in text) and "| 33 |" in text
    assert (study / "gemm.png").read_bytes()[:4] == b"\x89PNG"
