"""`launch bench` writes its measurements as records and renders them; no timing is asserted here
(figures belong in docs/benchmarks.md), only that each part measures what it says."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import launch
from scalelab.train.bench import step_benchmark, step_profile


@pytest.mark.slow
def test_bench_planner_and_report_parts(tmp_path):
    proc = launch("bench", "--only", "planner,report", "--quick", "--out", "b", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    res = json.loads((tmp_path / "b" / "bench.json").read_text())
    levels = res["planner"]["levels"]
    assert [lv["confidence"] for lv in levels] == [0.8, 0.9]
    from scalelab.costs.calibration import all_tasks, origin_of, reference_tables

    for planner in levels:  # every shipped table (seeds and published corpus), each source left out whole
        assert {r["table"] for r in planner["throughput_by_series"]} == set(reference_tables())
        assert {r["origin"] for r in planner["throughput_by_origin"]} == {origin_of(t) for t in reference_tables()}
        assert 0 <= planner["throughput"]["mape"] < 1 and planner["throughput"]["predictions"] == len(all_tasks())
        assert sorted(r["fit_counts"] for r in planner["throughput_by_fit_counts"]) == [2, 3, 4, 5, 6, 7]
        assert {r["k_class"] for r in planner["throughput_by_k_class"]} == {"2", "3+"}
        assert all(r["naive_mape"] > 0 for r in planner["throughput_by_k_class"])
        assert {r["basis"] for r in planner["steps"]} == {"batch-fit", "noise-scale"}
    # a band at 90 % is wider than at 80 %
    assert levels[1]["throughput"]["median_half_width"] > levels[0]["throughput"]["median_half_width"]
    assert res["report"]["records"] == 100_000 and res["report"]["full_report_s"] > 0
    # the coverage per table and per k is printed, not only written to bench.json
    assert "per source" in proc.stdout and "per k" in proc.stdout and "per class of fits" in proc.stdout
    assert "seed001" in proc.stdout and "node-decay" in proc.stdout
    assert "Issue 33's layouts through the planner" in proc.stdout
    assert "Report speed" in proc.stdout


def test_launch_overhead_reads_the_run_directory(tmp_path):
    """Launch to rank 0's first step: launch.json's start time, and the first step record's end time
    minus its duration (written by the real writer, in the real layout)."""
    from scalelab.core.records import RecordWriter
    from scalelab.core.rundir import RunPaths, write_json
    from scalelab.core.spec import Spec, save_spec
    from scalelab.launcher.bench import launch_overhead

    run = tmp_path / "1x2"
    run.mkdir()
    save_spec(Spec(gpus_per_node=2), run)
    write_json(RunPaths(run).launch, {"started": 100.0})
    for rank in (1, 0):
        w = RecordWriter(run, rank, 2)
        w.write("start", global_batch=8)
        for step, end in ((1, 103.0), (2, 104.0)):  # rank 1 ends each step a second later
            w.write("step", time=end + rank, step=step, warmup=step == 1, step_s=0.5, words=10, samples=2)
        w.close()
    assert launch_overhead(run) == {"workers": 2, "seconds_to_first_step": 2.5}


@pytest.mark.slow
def test_bench_rejects_unknown_parts(tmp_path):
    proc = launch("bench", "--only", "gpu", cwd=tmp_path)
    assert proc.returncode == 2 and "unknown bench part(s) gpu" in proc.stderr


@pytest.mark.usefixtures("needs_cpu_bf16")
def test_step_benchmark_times_each_precision_against_the_best_matmul_rate():
    rows = step_benchmark("rnnlm-tiny", "fused", batch=8, steps=2, threads=1, precisions=("fp32", "bf16"))
    from scalelab.train.models import PRESETS, build_model

    assert [r["precision"] for r in rows] == ["fp32", "bf16"]
    for r in rows:
        assert r["flops_per_step"] == build_model(PRESETS["rnnlm-tiny"]).flops_per_step(8)
        assert r["words_per_s"] > 0 and 0 < r["efficiency"] and r["step_s"] >= r["forward_s"]
        assert r["matmul_flops_per_s"] == max(r["matmul_fp32_flops_per_s"], r["matmul_bf16_flops_per_s"])
        assert r["efficiency"] == r[f"efficiency_{r['matmul_precision']}_matmul"]
        assert r["speedup_vs_fp32"] > 0
    assert rows[0]["speedup_vs_fp32"] == 1.0


@pytest.mark.usefixtures("needs_cpu_bf16")
def test_step_profile_names_the_ops_of_each_precision():
    rows = step_profile("rnnlm-tiny", "fused", steps=1, threads=1, top=40)
    ops = {r["op"]: r for r in rows}
    assert rows[-1]["op"] == "all ops" and rows[-1]["bf16_ms"] > 0 and rows[-1]["fp32_ms"] > 0
    if torch.backends.mkldnn.is_available():  # oneDNN's fused LSTM, in both precisions
        assert ops["aten::mkldnn_rnn_layer"]["fp32_calls"] >= 1 and ops["aten::mkldnn_rnn_layer"]["bf16_calls"] >= 1
    assert ops["aten::copy_"]["bf16_calls"] > ops["aten::copy_"]["fp32_calls"]  # autocast's casts


@pytest.mark.slow
def test_per_rank_bench_entry_points_under_torchrun(tmp_path):
    """`python -m scalelab.train.bench allreduce|ddp-buckets` as `launch bench` starts them: 2 ranks, real Gloo.
    Each rank leaves with os._exit, without the interpreter's teardown (where Gloo's threads once aborted a
    rank that had written its results): an atexit handler planted in every rank never runs."""
    import subprocess
    import sys

    from scalelab.core.net import free_port
    from tests.conftest import ROOT

    site = tmp_path / "site"  # sitecustomize: a rank of the bench that runs atexit handlers leaves a mark
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import atexit, os, sys\n"
        "def _mark():\n"
        "    if sys.argv and sys.argv[0].endswith(os.path.join('train', 'bench.py')):\n"
        f"        open(os.path.join({str(tmp_path)!r}, f'teardown-{{os.getpid()}}'), 'w').close()\n"
        "atexit.register(_mark)\n")
    env = {**__import__("os").environ, "PYTHONPATH": f"{site}:{ROOT}", "OMP_NUM_THREADS": "1"}
    for args, out in ((["allreduce", "--engine", "ddp", "--sizes-mb", "1", "--repeats", "2"], "ar.json"),
                      (["allreduce", "--engine", "ddp", "--sizes-mb", "1", "--repeats", "2", "--compression", "bf16"],
                       "ar-bf16.json"),
                      (["ddp-buckets", "rnnlm-tiny", "--bucket-caps-mb", "1,25", "--compression", "fp16"], "ddp.json")):
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                               "--master-addr=127.0.0.1", f"--master-port={free_port()}", "-m", "scalelab.train.bench", *args,
                               "--out", str(tmp_path / out)], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert not list(tmp_path.glob("teardown-*")), "a rank ran the interpreter's teardown instead of os._exit"
    ar = json.loads((tmp_path / "ar.json").read_text())
    assert ar[0]["ranks"] == 2 and ar[0]["busbw"] == ar[0]["algbw"] * 2 * (2 - 1) / 2
    assert [r["compression"] for r in json.loads((tmp_path / "ar-bf16.json").read_text())] == ["bf16"]
    ddp = json.loads((tmp_path / "ddp.json").read_text())
    assert [r["bucket_cap_mb"] for r in ddp] == [1.0, 25.0] and ddp[0]["compression"] == "fp16"
    assert all(r["exposed_exchange_s"] == r["step_with_exchange_s"] - r["step_without_exchange_s"] for r in ddp)
