"""End-to-end runs on the `local` backend through the real `launch` CLI.

Each test starts real rank processes (torchrun / horovodrun with Gloo on CPU) and checks what they
recorded: two ranks really ran, the engines agree, the threshold stops training, a killed run resumes
to the same parameters.
"""

from __future__ import annotations

import json
import signal

import pytest
import torch

from tests.conftest import launch, needs_horovod, on_cpu_where_gpus_are_short, only_run_dir, read_jsonl, steps_of

pytestmark = pytest.mark.slow  # every test here takes over 5 s on 2 cores (the fast subset: -m 'not slow')

TINY = ["--model", "nmt-tiny", "--data", "task", "--warmup-steps", "1", "--prefetch", "1"]


def _run(tmp_path, *args, env=None):
    runs = tmp_path / "runs"
    proc = launch(*TINY, "--runs-dir", str(runs), *args, cwd=tmp_path, env=env)
    return proc, runs


@pytest.mark.parametrize("engine", ["ddp", "ps", pytest.param("horovod", marks=needs_horovod)])
def test_two_rank_run_writes_records_and_summary(tmp_path, engine):
    proc, runs = _run(tmp_path, "--engine", engine, "--gpus-per-node", "2", "--steps", "6", "--global-batch", "16")
    assert proc.returncode == 0, proc.stderr
    run = only_run_dir(runs)
    for rank in (0, 1):
        recs = read_jsonl(run / "records" / f"rank-{rank}.jsonl")
        start = recs[0]
        assert start["kind"] == "start" and start["world"] == 2 and start["rank"] == rank
        assert start["engine"] == engine and start["batch_this_rank"] == 8
        steps = [r for r in recs if r["kind"] == "step"]
        assert [s["step"] for s in steps] == list(range(1, 7))
        assert all(s["samples"] == 8 and s["step_s"] > 0 for s in steps)
        if engine == "ps":  # push + pull, inside the step (backward_s includes the exchange, as for Horovod)
            assert all(0 < s["exchange_s"] <= s["backward_s"] for s in steps)
        assert steps[0]["warmup"] and not steps[-1]["warmup"]
        assert recs[-1]["kind"] == "event" and recs[-1]["event"] == "end"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["words_per_s"] > 0 and summary["steps_measured"] == 5
    spec = json.loads((run / "spec.json").read_text())
    assert spec["engine"]["name"] == engine and spec["gpus_per_node"] == 2
    assert "words/s" in proc.stdout.replace("\n", " ") or "words" in proc.stdout


def _global_losses(run_dir, world):
    per_rank = [[s["loss"] for s in steps_of(run_dir, r)] for r in range(world)]
    return torch.tensor(per_rank, dtype=torch.float64).mean(dim=0)


def _final_params(run_dir):
    return torch.load(run_dir / "checkpoint.pt", weights_only=False)["model"]


def test_engines_give_the_same_loss_curve(tmp_path):
    """Same seed + same global batch: single (1 rank), DDP, parameter server (1 and 2 shards, state on
    the device or the CPU, shards in the workers or in a server rank) and Horovod (2 ranks) agree."""
    common = ["--steps", "8", "--global-batch", "16", "--lr", "0.01", "--checkpoint-every", "8",
              "--model-arg", "dropout=0"]
    layouts = {"single": ["--engine", "single"], "ddp": ["--engine", "ddp", "--gpus-per-node", "2"],
               "ps": ["--engine", "ps", "--gpus-per-node", "2"],  # one shard (one node), on rank 0
               "ps-2": ["--engine", "ps", "--gpus-per-node", "2", "--ps-shards", "2"],
               # shards' parameters and Adam state in CPU copies that the push fills and the pull reads
               "ps-cpu": ["--engine", "ps", "--gpus-per-node", "2", "--ps-shards", "2", "--ps-state", "cpu"],
               # the shard in a third rank of its own, which trains on no data (rank 2: a server)
               "ps-separate": ["--engine", "ps", "--gpus-per-node", "2", "--ps-placement", "separate"]}
    from tests.conftest import horovod_available

    if horovod_available():
        layouts["horovod"] = ["--engine", "horovod", "--gpus-per-node", "2"]
    curves, params = {}, {}
    for name, args in layouts.items():
        # fixed-length samples: every rank averages over the same number of words, so the mean of
        # the per-rank losses is exactly the global batch's loss
        d = tmp_path / name
        d.mkdir()
        proc, runs = _run(d, *common, *args, "--fixed-length")
        assert proc.returncode == 0, proc.stderr
        run = only_run_dir(runs)
        curves[name] = _global_losses(run, 1 if name == "single" else 2)
        params[name] = _final_params(run)
        if name == "ps-separate":
            server = read_jsonl(run / "records" / "rank-2.jsonl")
            assert server[0]["role"] == "server" and server[0]["world"] == 3 and server[0]["batch_this_rank"] == 0
            steps = [r for r in server if r["kind"] == "step"]
            assert len(steps) == 8 and all(s["role"] == "server" and s["samples"] == s["words"] == 0 for s in steps)
            assert json.loads((run / "summary.json").read_text())["workers"] == 2
    base = curves.pop("single")
    assert len(base) == 8 and base[-1] < base[0]  # it learned something
    for name, curve in curves.items():
        torch.testing.assert_close(curve, base, rtol=1e-4, atol=1e-5, msg=f"{name} loss curve differs")
        for key, value in params["single"].items():
            torch.testing.assert_close(params[name][key], value, rtol=1e-3, atol=1e-5, msg=f"{name}: {key}")


def test_loss_threshold_stops_training(tmp_path):
    proc, runs = _run(tmp_path, "--engine", "single", "--steps", "400", "--lr", "0.01",
                      "--val-every", "10", "--loss-threshold", "3.0")
    assert proc.returncode == 0, proc.stderr
    run = only_run_dir(runs)
    recs = read_jsonl(run / "records" / "rank-0.jsonl")
    thr = [r for r in recs if r.get("event") == "threshold"]
    assert len(thr) == 1 and thr[0]["val_loss"] <= 3.0
    vals = [r for r in recs if r["kind"] == "val"]
    assert all(v["val_loss"] > 3.0 for v in vals[:-1])  # it stopped at the first validation under
    assert steps_of(run)[-1]["step"] == thr[0]["step"] < 400
    summary = json.loads((run / "summary.json").read_text())
    assert summary["reached_threshold"] is True and summary["steps_to_threshold"] == thr[0]["step"]
    assert 0 < summary["time_to_threshold_s"]


def test_threshold_never_reached_is_recorded(tmp_path):
    proc, runs = _run(tmp_path, "--engine", "single", "--steps", "4", "--val-every", "2", "--loss-threshold", "0.0001")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((only_run_dir(runs) / "summary.json").read_text())
    assert summary["reached_threshold"] is False and summary["time_to_threshold_s"] is None


def test_killed_run_resumes_to_the_same_parameters(tmp_path):
    args = ["--engine", "single", "--steps", "12", "--checkpoint-every", "4", "--lr", "0.01", "--model-arg", "dropout=0.1"]
    whole_dir, killed_dir = tmp_path / "whole", tmp_path / "killed"
    whole_dir.mkdir(), killed_dir.mkdir()
    proc, runs = _run(whole_dir, *args)
    assert proc.returncode == 0, proc.stderr
    whole = only_run_dir(runs)

    proc, runs = _run(killed_dir, *args, env={"SCALELAB_FAIL_AT_STEP": "6"})
    assert proc.returncode != 0 and "failed" in proc.stderr
    killed = only_run_dir(runs)
    assert [s["step"] for s in steps_of(killed)] == list(range(1, 7))
    assert torch.load(killed / "checkpoint.pt", weights_only=False)["step"] == 4

    proc = launch("resume", str(killed), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    recs = read_jsonl(killed / "records" / "rank-0.jsonl")
    assert any(r.get("event") == "resume" and r["step"] == 4 for r in recs)
    assert [s["step"] for s in steps_of(killed)][-8:] == list(range(5, 13))
    a, b = _final_params(whole), _final_params(killed)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0, msg=key)


def test_text_data_two_ranks(tmp_path):
    """Parallel text files (one sentence a line, as WMT) through the real loader on 2 DDP ranks."""
    words = "the cat dog sat on a mat and ran far away".split()
    src = [" ".join(words[(i + k) % len(words)] for k in range(3 + i % 5)) for i in range(200)]
    (tmp_path / "train.src").write_text("\n".join(src) + "\n")
    (tmp_path / "train.tgt").write_text("\n".join(" ".join(reversed(s.split())) for s in src) + "\n")
    proc, runs = _run(tmp_path, "--data", "text", "--train-src", "train.src", "--train-tgt", "train.tgt",
                      "--engine", "ddp", "--gpus-per-node", "2", "--steps", "4", "--global-batch", "8",
                      "--val-every", "2")
    assert proc.returncode == 0, proc.stderr
    run = only_run_dir(runs)
    for rank in (0, 1):
        steps = steps_of(run, rank)
        assert len(steps) == 4 and all(3 < s["words"] / s["samples"] <= 8 for s in steps)  # real sentence lengths
    vals = [r for r in read_jsonl(run / "records" / "rank-0.jsonl") if r["kind"] == "val"]
    vals1 = [r for r in read_jsonl(run / "records" / "rank-1.jsonl") if r["kind"] == "val"]
    assert [v["val_loss"] for v in vals] == [v["val_loss"] for v in vals1]  # averaged across ranks


def _start_long_run(tmp_path):
    """`launch` of a 2-rank DDP run in the background, once both ranks have trained a few steps."""
    import os
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    fg = subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", *on_cpu_where_gpus_are_short(
                           (*TINY, "--runs-dir", str(runs), "--engine", "ddp", "--gpus-per-node", "2", "--steps", "100000"))],
                          cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    try:  # both ranks' files: rank 1's can be there before rank 0's (a suite run of 2026-12-02 read it too soon)
        while time.time() < deadline and not (runs.exists() and any(runs.glob("*/records/rank-1.jsonl"))
                                              and any(runs.glob("*/records/rank-0.jsonl"))):
            assert fg.poll() is None, fg.communicate()
            time.sleep(0.5)
        run = only_run_dir(runs)
        while time.time() < deadline and (len(_steps_so_far(run, 0)) < 3 or len(_steps_so_far(run, 1)) < 3):
            time.sleep(0.5)
    except BaseException:  # the run must not train on for minutes: SIGTERM cancels it as the tests below do
        fg.terminate()
        fg.communicate(timeout=120)
        raise
    return fg, run


def _steps_so_far(run, rank: int) -> list[dict]:
    """The step records of a rank that is still writing them: its last line, without its newline yet, is one
    being written now and is left out (steps_of would fail on it)."""
    text = (run / "records" / f"rank-{rank}.jsonl").read_text()
    complete = text[:text.rfind("\n") + 1]
    return [r for r in map(json.loads, filter(str.strip, complete.splitlines())) if r["kind"] == "step"]


def _processes_of(run) -> list[str]:
    """Every process on this machine with the run directory in its command line (the ranks, torchrun). By its
    whole path: two workers' runs started in the same second have the same name (one test then saw the other's)."""
    import psutil

    return [" ".join(p.info["cmdline"]) for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"] and any(str(run) in arg for arg in p.info["cmdline"])]


def _assert_stopped_with_a_checkpoint(run) -> None:
    assert _processes_of(run) == []
    recs = read_jsonl(run / "records" / "rank-0.jsonl")
    assert [r["signal"] for r in recs if r.get("event") == "interrupted"] == [15]  # the ranks got SIGTERM
    assert torch.load(run / "checkpoint.pt", weights_only=False)["step"] == steps_of(run)[-1]["step"]


def test_cancel_stops_every_process_and_keeps_a_checkpoint(tmp_path):
    fg, run = _start_long_run(tmp_path)
    try:
        proc = launch("cancel", str(run), cwd=tmp_path)
        assert proc.returncode == 0 and "CANCELLED" in proc.stdout, proc.stderr
        _, err = fg.communicate(timeout=120)
    finally:
        fg.kill()
    assert fg.returncode == 1 and "was cancelled" in err and "launch resume" in err
    info = json.loads((run / "launch.json").read_text())
    assert info["state"] == "CANCELLED" and "launch cancel" in info["detail"]
    _assert_stopped_with_a_checkpoint(run)
    assert launch("status", str(run), cwd=tmp_path).stdout.count("CANCELLED") == 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_to_launch_cancels_the_run(tmp_path, sig):
    """SIGTERM (a job scheduler, `kill`) and SIGHUP (the terminal closed) take the Ctrl-C path: the
    ranks checkpoint and stop, the run is recorded CANCELLED, `launch` exits 128 + the signal."""
    fg, run = _start_long_run(tmp_path)
    try:
        fg.send_signal(sig)
        _, err = fg.communicate(timeout=120)
    finally:
        fg.kill()
    assert fg.returncode == 128 + sig, err
    assert "interrupted; every process of the run was stopped" in err and "Traceback" not in err, err
    info = json.loads((run / "launch.json").read_text())
    assert info["state"] == "CANCELLED" and signal.Signals(sig).name in info["detail"], info
    assert info["run_dir"] == str(run.absolute()) and all(log.startswith("/") for log in info["log_files"])
    _assert_stopped_with_a_checkpoint(run)
    assert "CANCELLED" in launch("status", str(run), cwd=tmp_path).stdout
