"""`launch bench` writes its measurements as records and renders them; no timing is asserted here
(figures belong in docs/benchmarks.md), only that each part measures what it says."""

from __future__ import annotations

import json

from tests.conftest import launch
from train.bench import knee, step_benchmark


def test_bench_planner_and_report_parts(tmp_path):
    proc = launch("bench", "--only", "planner,report", "--quick", "--out", "b", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    res = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert {r["label"] for r in res["planner"]} >= {"cudnn_lstm parameter server", "dynamic_rnn nccl all-reduce"}
    assert all(0 <= r["mape"] < 1 for r in res["planner"]) and sum(r["chosen"] for r in res["planner"]) == 5
    assert res["report"]["records"] == 100_000 and res["report"]["full_report_s"] > 0
    assert "Planner" in proc.stdout and "Report speed" in proc.stdout


def test_bench_rejects_unknown_parts(tmp_path):
    proc = launch("bench", "--only", "gpu", cwd=tmp_path)
    assert proc.returncode == 2 and "unknown bench part(s) gpu" in proc.stderr


def test_step_benchmark_counts_flops_of_the_real_step():
    r = step_benchmark("rnnlm-tiny", "fused", batch=8, steps=2, threads=1)
    from train.models import PRESETS, build_model

    assert r["flops_per_step"] == build_model(PRESETS["rnnlm-tiny"]).flops_per_step(8)
    assert r["words_per_s"] > 0 and 0 < r["efficiency"] and r["step_s"] >= r["forward_s"]


def test_knee_is_the_smallest_batch_near_the_best():
    rows = [{"hidden": 64, "batch": b, "gflops": g} for b, g in [(1, 5), (16, 50), (32, 95), (64, 100)]]
    assert knee(rows, "hidden", "gflops") == {64: 32}
