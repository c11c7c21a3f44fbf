"""Dynamic load balancing (mixed hardware) and independent replicas."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import launch, only_run_dir, read_jsonl, steps_of
from scalelab.train.balance import equal_shares, offsets, proportional_shares


def test_proportional_shares():
    assert proportional_shares(32, [3.0, 1.0]) == [24, 8]
    assert sum(proportional_shares(101, [1.0, 2.0, 3.5])) == 101
    assert proportional_shares(8, [1e9, 1.0]) == [7, 1]  # nobody drops below one sample
    assert proportional_shares(9, [1.0, float("nan"), 1.0]) == equal_shares(9, 3) == [3, 3, 3]
    assert offsets([3, 5, 2]) == [(0, 3), (3, 8), (8, 10)]
    with pytest.raises(ValueError):
        proportional_shares(1, [1.0, 1.0])


@pytest.mark.slow
def test_dynamic_balance_keeps_the_global_gradient(tmp_path):
    """A 28x slower worker gets a smaller share, every step still covers the whole global batch, and
    because each rank's loss is weighted by its share the loss curve equals the 1-process run's."""
    common = ["--model", "rnnlm-tiny", "--data", "task", "--fixed-length", "--global-batch", "32", "--steps", "12",
              "--warmup-steps", "1", "--lr", "0.01", "--model-arg", "dropout=0"]
    (tmp_path / "one").mkdir(), (tmp_path / "two").mkdir()
    proc = launch(*common, "--engine", "single", "--runs-dir", "runs", cwd=tmp_path / "one")
    assert proc.returncode == 0, proc.stderr
    # 28x, not 3x: a window's speeds come from 3 forwards of about 0.5 ms on the fast rank. The slow rank's
    # timed forward is F x the fast one's (its emulated backward is timed in backward_s, not there), so at 3x a
    # preemption of some 3 ms of the fast rank on a busy machine could invert the shares; at 28x, about 45 ms.
    # (It costs the slow rank about 6 s of sleep, most of it after its first, slow forward.)
    proc = launch(*common, "--engine", "ddp", "--gpus-per-node", "2", "--balance", "dynamic", "--balance-every", "3",
                  "--emulate-slowdown", "1,28", "--runs-dir", "runs", cwd=tmp_path / "two")
    assert proc.returncode == 0, proc.stderr
    single, balanced = only_run_dir(tmp_path / "one" / "runs"), only_run_dir(tmp_path / "two" / "runs")
    r0, r1 = steps_of(balanced, 0), steps_of(balanced, 1)
    assert all(a["samples"] + b["samples"] == 32 for a, b in zip(r0, r1))
    assert r1[-1]["samples"] < 16 < r0[-1]["samples"]  # the slow worker ended with less
    events = [r for r in read_jsonl(balanced / "records" / "rank-0.jsonl") if r.get("event") == "rebalance"]
    assert events and all(sum(e["shares"]) == 32 for e in events)
    weighted = torch.tensor([(a["loss"] * a["samples"] + b["loss"] * b["samples"]) / 32 for a, b in zip(r0, r1)],
                            dtype=torch.float64)
    base = torch.tensor([s["loss"] for s in steps_of(single)], dtype=torch.float64)
    torch.testing.assert_close(weighted, base, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_independent_replicas_do_not_exchange(tmp_path):
    """Same seed and data: with exchange, rank 0 ends with the parameters of the averaged gradient;
    as an independent replica it ends with parameters trained on its own half of each batch only."""
    args = ["--model", "rnnlm-tiny", "--data", "task", "--engine", "ddp", "--gpus-per-node", "2", "--steps", "5",
            "--warmup-steps", "1", "--checkpoint-every", "5", "--lr", "0.01", "--runs-dir", "runs"]
    params = {}
    for mode in ("--independent-replicas", "--exchange"):
        (tmp_path / mode).mkdir()
        proc = launch(*args, mode, cwd=tmp_path / mode)
        assert proc.returncode == 0, proc.stderr
        run = only_run_dir(tmp_path / mode / "runs")
        start = read_jsonl(run / "records" / "rank-1.jsonl")[0]
        assert start["independent_replicas"] is (mode == "--independent-replicas")
        assert len(steps_of(run, 1)) == 5
        params[mode] = torch.load(run / "checkpoint.pt", weights_only=False)["model"]
    differs = [k for k in params["--exchange"] if not torch.equal(params["--exchange"][k], params["--independent-replicas"][k])]
    assert differs, "independent replicas ended with the exchanged parameters"
