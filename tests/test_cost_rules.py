"""The cost rules of issue 14, each as a known answer: dollars to the threshold bill the wall time
from the launch to the threshold event; the work to it is what was processed (warm-up steps
included, warm-up time not added); a job's spot interruptions are the sum over its instances and
checkpoint writes are paid; and the two axes of a scaling table (global batch, total work) are
read apart. Also `launch plan --predict-batch` through the real CLI, from a CSV and from runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from scalelab.analysis.scaling import RunMeta, summarize_run
from scalelab.costs.billing import run_cost, spot_expected_seconds
from scalelab.costs.catalog import builtin_catalog
from scalelab.costs.tables import read_scaling_csv, scaling_from_table
from tests.conftest import launch


@pytest.fixture(autouse=True)
def _prices(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "no-user-prices.json"))


def _steps(n: int = 6, warmup: int = 2) -> pd.DataFrame:
    """One rank, 2 s a step, 8 samples of 10 words, steps 1..n ending at 1000 + 2·step."""
    return pd.DataFrame([dict(kind="step", rank=0, world=1, step=i, epoch=0, warmup=i <= warmup, step_s=2.0,
                              samples=8, words=80, loss=1.0, lr=0.01, time=1000.0 + 2 * i) for i in range(1, n + 1)])


def test_work_to_threshold_is_what_was_processed_and_wall_time_runs_from_the_launch():
    events = pd.DataFrame([dict(kind="event", event="threshold", step=4, elapsed_s=8.0, time=1011.0)])
    meta = RunMeta(label="x", workers=1, batch_mode="weak", global_batch=8, loss_threshold=0.5, launched_at=990.0,
                   lr_warmup_steps=3)
    s = summarize_run(_steps(), None, events, meta)
    # steps 1-4, the two warm-up steps included: they trained the model too
    assert (s.steps_to_threshold, s.samples_to_threshold, s.words_to_threshold) == (4, 32, 320)
    # billed from the launch (990) to the threshold event (1011): start-up and validation are paid
    assert s.wall_to_threshold_s == 21.0 and s.time_to_threshold_s == 8.0
    assert s.startup_s == 1000.0 - 990.0  # the first step began at 1002 - 2
    assert (s.batch_scaling, s.lr, s.lr_warmup_steps) == ("growing", 0.01, 3)


def test_spot_interruptions_are_per_instance_and_checkpoint_writes_are_paid():
    cat = builtin_catalog()
    one = run_cost(3600, "1*p2.xlarge", cat, "spot", interruptions_per_hour=0.1, checkpoint_interval_s=600, restart_s=0)
    eight = run_cost(3600, "8*p2.xlarge", cat, "spot", interruptions_per_hour=0.1, checkpoint_interval_s=600, restart_s=0)
    # one instance: 0.1 an hour, each losing 300 s on average; eight: 0.8 an hour
    assert one.seconds == pytest.approx(3600 / (1 - 0.1 * 300 / 3600))
    assert eight.seconds == pytest.approx(3600 / (1 - 0.8 * 300 / 3600))
    assert eight.expected_interruptions == pytest.approx(8 * 0.1 * eight.hours)
    # 30 s to write a checkpoint every 600 s of work: 5 % more time, and half a write lost per interruption
    assert spot_expected_seconds(3600, 0.0, 600, 0, checkpoint_write_s=30) == pytest.approx(3600 * 1.05)
    assert spot_expected_seconds(3600, 1.0, 600, 60, checkpoint_write_s=30) == pytest.approx(
        3600 * 1.05 / (1 - (315 + 60) / 3600))


def test_the_two_axes_of_a_scaling_table_are_read_apart(tmp_path):
    """Batch per card fixed (the global batch grows) but the same 3 epochs (the work is fixed): time
    halves on two workers, so the efficiency is 99 %, not the 198 % that reading it as `weak` gave."""
    f = tmp_path / "t.csv"
    f.write_text("label,workers,time_s,batch_scaling,work_scaling\nx,1,100,growing,fixed\nx,2,50.5,growing,fixed\n")
    table = scaling_from_table(read_scaling_csv(f))
    assert table["efficiency"].tolist() == pytest.approx([1.0, 100 / 50.5 / 2])
    old = tmp_path / "old.csv"
    old.write_text("workers,time_s,mode\n1,100,weak\n2,101,weak\n")  # the older column: both axes grow
    df = read_scaling_csv(old)
    assert df["batch_scaling"].tolist() == ["growing"] * 2 and df["work_scaling"].tolist() == ["growing"] * 2
    assert scaling_from_table(df)["efficiency"].tolist() == pytest.approx([1.0, 100 / 101])
    bad = tmp_path / "bad.csv"
    bad.write_text("workers,throughput,batch_scaling\n1,10,weak\n")
    r = launch("report", "--from-csv", str(bad), cwd=tmp_path)
    assert r.returncode == 2 and "column 'batch_scaling': expected fixed or growing" in r.stderr


@pytest.mark.slow
def test_plan_predict_batch_from_a_convergence_table(tmp_path):
    f = tmp_path / "conv.csv"
    rows = ["label,global_batch,steps_to_threshold,seed,lr"]
    for b, s in ((16, 790), (16, 750), (16, 800), (32, 340), (32, 325), (32, 340)):
        rows.append(f"rnnlm,{b},{s},{len(rows)},{0.001 * b / 16}")
    f.write_text("\n".join(rows) + "\n")
    r = launch("plan", "--from-csv", str(f), "--predict-batch", "64,128", "--format", "json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [row["global_batch"] for row in out] == [64, 128]
    for row in out:
        assert {"global_batch", "predicted_steps_to_threshold", "steps_low", "steps_high",
                "predicted_samples_to_threshold", "basis", "lr_rule"} <= set(row)
        assert row["basis"] == "batch-fit" and row["steps_low"] < row["predicted_steps_to_threshold"] < row["steps_high"]
        assert row["predicted_samples_to_threshold"] == pytest.approx(row["predicted_steps_to_threshold"] * row["global_batch"])
        assert row["lr_rule"].startswith("linear scaling")
    r = launch("plan", "--from-csv", str(f), "--predict-batch", "64,x", cwd=tmp_path)
    assert r.returncode == 2 and "--predict-batch takes global batches" in r.stderr


def _run_with_threshold(root: Path, name: str, batch: int, steps_to_thr: int, noise: float) -> Path:
    """A finished one-worker run that reached its threshold at `steps_to_thr`, launched at t=990."""
    from scalelab.core.rundir import RunPaths, write_json
    from scalelab.core.spec import Spec, save_spec

    run = root / name
    (run / "records").mkdir(parents=True)
    save_spec(Spec(model="rnnlm-tiny", global_batch=batch, steps=steps_to_thr, val_every=steps_to_thr,
                   loss_threshold=0.5, engine={"name": "single"}), run)
    write_json(RunPaths(run).launch, {"started": 990.0})
    recs = [{"kind": "start", "rank": 0, "world": 1, "time": 999.0, "global_batch": batch, "model": "rnnlm-tiny"}]
    for i in range(1, steps_to_thr + 1):
        recs.append({"kind": "step", "rank": 0, "world": 1, "step": i, "epoch": 0, "warmup": i <= 2, "step_s": 0.01,
                     "samples": batch, "words": batch * 15, "loss": 1.0, "lr": 0.001 * batch / 16,
                     "noise_trace": noise, "noise_grad_sq": 1.0, "time": 1000.0 + 0.01 * i})
    recs.append({"kind": "val", "rank": 0, "world": 1, "step": steps_to_thr, "epoch": 0, "val_loss": 0.49,
                 "elapsed_s": 0.01 * steps_to_thr, "time": 1001.0 + 0.01 * steps_to_thr})
    recs.append({"kind": "event", "rank": 0, "world": 1, "event": "threshold", "step": steps_to_thr,
                 "elapsed_s": 0.01 * steps_to_thr, "val_loss": 0.49, "time": 1001.0 + 0.01 * steps_to_thr})
    (run / "records" / "rank-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return run


@pytest.mark.slow
def test_plan_predict_batch_from_runs_states_the_basis_and_the_rule(tmp_path):
    one = _run_with_threshold(tmp_path, "b16", 16, 80, noise=40.0)
    r = launch("plan", str(one), "--predict-batch", "32,64", "--format", "json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["basis"] for row in rows] == ["noise-scale", "noise-scale"] and rows[0]["noise_scale"] == 40.0
    # S_min = 80 / (1 + 40/16); S(64) = S_min (1 + 40/64)
    assert rows[1]["predicted_steps_to_threshold"] == pytest.approx(80 / 3.5 * (1 + 40 / 64))
    assert rows[0]["label"] == "rnnlm-tiny to loss 0.5"
    two = _run_with_threshold(tmp_path, "b32", 32, 45, noise=40.0)
    rows = json.loads(launch("plan", str(one), str(two), "--predict-batch", "64", "--format", "json",
                             cwd=tmp_path).stdout)
    assert rows[0]["basis"] == "batch-fit" and rows[0]["measured_batches"] == "16,32"
    c = launch("cost", str(one), "--instances", "p2.xlarge", "--format", "json", cwd=tmp_path)
    assert c.returncode == 0, c.stderr
    cost = json.loads(c.stdout)[0]
    # from the launch (990) to the threshold event (1001.8): 11.8 s, billed as the 60 s minimum
    assert cost["wall_to_threshold_s"] == pytest.approx(11.8) and cost["dollars_to_threshold"] == pytest.approx(0.9 / 60)


@pytest.mark.parametrize("nodes,gpus,text,want", [
    (1, 2, "g5.xlarge", "2*g5.xlarge"),        # 1-GPU instances: one per GPU
    (2, 4, "g3.16xlarge", "2*g3.16xlarge"),    # 4-GPU instances: one per node
    (2, 1, "g3.16xlarge", "2*g3.16xlarge"),    # a node is rented whole, however few GPUs it uses
    (1, 8, "g3.16xlarge", "2*g3.16xlarge"),    # ceil(8 / 4) on one node
    (1, 8, "slurm", "8*slurm"),                # a GPU-hour rate: one unit per GPU
    (1, 2, "k8s", "1*k8s"),                    # a node-hour@4 rate: the node
    (2, 1, "1*p2.xlarge+1*g3.4xlarge", "1*p2.xlarge+1*g3.4xlarge"),  # an explicit mix: as written
])
def test_one_instance_count_per_layout(nodes, gpus, text, want):
    from scalelab.costs.billing import instances_for
    from scalelab.costs.catalog import load_catalog

    cat = load_catalog(rates=["slurm=0.45/gpu-hour", "k8s=3.2/node-hour@4"])
    assert str(instances_for(nodes, gpus, text, cat)) == want


def test_the_one_function_bills_60_s_per_instance_and_adds_no_interruptions_to_a_measured_time():
    cat = builtin_catalog()
    cat.set_interruptions("p2.xlarge", 1.0)
    ten = run_cost(10, "2*p2.xlarge", cat)
    assert ten.billed_seconds == 60 and ten.dollars == pytest.approx(2 * 0.9 * 60 / 3600)
    expected = run_cost(3600, "1*p2.xlarge", cat, "spot", checkpoint_interval_s=600, restart_s=0)
    measured = run_cost(3600, "1*p2.xlarge", cat, "spot", checkpoint_interval_s=600, restart_s=0, measured=True)
    assert expected.seconds == pytest.approx(3600 / (1 - 300 / 3600)) and measured.seconds == 3600
