"""The seeds' studies as recipes (examples/*.yaml): each runs at its `test` scale and ends in the
seed-shaped tables, computed from the runs' records."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from core.errors import SpecError
from launcher.study import load_study, variant_specs
from tests.conftest import ROOT, launch, only_run_dir

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


def _run(tmp_path: Path, name: str) -> Path:
    proc = launch("study", str(EXAMPLES / name), "--scale", "test", "--runs-dir", "runs", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return only_run_dir(tmp_path / "runs")


def test_seed001_throughput_table(tmp_path):
    study = _run(tmp_path, "seed001-nmt-data-parallel.yaml")
    table = pd.read_csv(study / "throughput.csv")
    assert list(table["GPU number"]) == [1, 2, 1, 2]
    assert set(table["variant"]) == {"cudnn_lstm all-reduce", "dynamic_rnn independent replicas"}
    assert (table["Batch size (per GPU)"] == 8).all() and (table["Processing speed (words/s)"] > 0).all()
    assert list(table["Speedup ratio"])[::2] == [1.0, 1.0]
    text = (study / "study.md").read_text()
    assert "| GPU number |" in text and "Scale of the seed:" in text and (study / "speedup.png").exists()


def test_seed002_epoch_times(tmp_path):
    study = _run(tmp_path, "seed002-rnnlm-strong-weak.yaml")
    table = pd.read_csv(study / "epochs.csv")
    assert list(table["workers"]) == [1, 2]
    assert (table[["epoch 1 (s)", "epoch 2 (s)", "epoch 3 (s)"]] > 0).all().all()
    assert table["total (s)"].iloc[0] == pytest.approx(table[["epoch 1 (s)", "epoch 2 (s)", "epoch 3 (s)"]].iloc[0].sum(), abs=0.01)


def test_seed004_convergence_arrangement_money(tmp_path):
    study = _run(tmp_path, "seed004-sentiment.yaml")
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
    assert mixed["Total Price ($)"] == pytest.approx((0.90 + 1.14) * max(mixed["Seconds"], 60) / 3600, abs=1e-3)


def test_seed003_gemm_against_batch(tmp_path):
    study = _run(tmp_path, "seed003-gemm-batch.yaml")
    gemm = pd.read_csv(study / "gemm.csv")
    assert len(gemm) == 2 * 3 * 3  # hiddens x batches x (NN, NT, TN)
    assert set(gemm["batch"]) == {1, 16, 33} and (gemm["gflops"] > 0).all()
    steps = pd.read_csv(study / "step.csv")
    assert list(steps["batch"]) == [1, 16, 33] and (steps["words_per_s"] > 0).all()
    text = (study / "study.md").read_text()
    assert "reaches 90% of its best rate at batch" in text and "| 33 |" in text
    assert (study / "gemm.png").read_bytes()[:4] == b"\x89PNG"
