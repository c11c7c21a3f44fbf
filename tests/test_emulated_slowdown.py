"""--emulate-slowdown F makes a rank look as a device F times slower would in its records, so the dynamic
balancer gives it ~1/F of the speed of the others.

Why: the whole emulated extra (forward and backward, 3 x (F - 1) x the forward) was slept after the forward and
timed in `forward_s`, which the balancer measures speed from: a 1.78x slower worker measured 3.3x slower and
got shares of ~[16, 48] of 64 where ~[23, 41] balance it. The trainer runs here in this process on a fake
clock (each clock read 1 s later than the last, each sleep adding its seconds), so nothing depends on the
machine's speed.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from conftest import steps_of

from scalelab.core.spec import Spec, save_spec
from scalelab.train import loop
from scalelab.train.loop import ShareSchedule, rebalance


def _last_step(tmp_path, monkeypatch, slowdown: float) -> dict:
    """The last step record of a 3-step run (engine single, 32 samples a step) on the fake clock."""
    run_dir = tmp_path / f"x{slowdown}"
    run_dir.mkdir()
    spec = Spec.from_dict({"model": "sentiment-tiny", "engine": {"name": "single"}, "steps": 3, "warmup_steps": 1,
                           "data": {"kind": "task", "train_samples": 128, "prefetch": 0}, "global_batch": 32,
                           "threads": 1, "emulate_slowdown": [slowdown]}).validate()
    save_spec(spec, run_dir)
    clock = SimpleNamespace(now=0.0)

    def tick(device) -> float:
        clock.now += 1.0
        return clock.now

    monkeypatch.setattr(loop, "_clock", tick)
    monkeypatch.setattr(loop, "time", SimpleNamespace(sleep=lambda s: setattr(clock, "now", clock.now + s),
                                                      perf_counter=time.perf_counter))
    loop.train(run_dir)
    return steps_of(run_dir)[-1]


@pytest.mark.parametrize("factor", [1.78, 3.0])
def test_a_slower_device_is_that_much_slower_in_forward_and_backward(tmp_path, monkeypatch, factor):
    base, slow = _last_step(tmp_path, monkeypatch, 1.0), _last_step(tmp_path, monkeypatch, factor)
    unit = base["forward_s"]  # the forward of the fake clock: one tick
    assert slow["forward_s"] == pytest.approx(factor * unit, rel=1e-3)  # what the balancer measures: F x, not 1 + 3(F-1)
    assert slow["backward_s"] - base["backward_s"] == pytest.approx(2 * (factor - 1) * unit, rel=1e-3)
    assert slow["emulated_s"] == pytest.approx(3 * (factor - 1) * unit, rel=1e-3) and "emulated_s" not in base


def _rebalanced(record: dict, allgather) -> list[dict]:
    """The rebalance events of one rank whose last step is `record` (every step rebalances); `allgather` stands
    in for the engine's: this rank's speed in, every rank's out."""
    events: list[dict] = []
    run = SimpleNamespace(spec=SimpleNamespace(balance="dynamic", balance_every=1, data=SimpleNamespace(prefetch=0)),
                          world=2, global_batch=64, engine=SimpleNamespace(allgather=allgather))
    out = SimpleNamespace(event=lambda kind, **fields: events.append(fields))
    rebalance(run, SimpleNamespace(shares=ShareSchedule([]), step=1), record, out)
    return events


def test_the_balancer_gives_a_1_78x_slower_worker_its_share(tmp_path, monkeypatch):
    """Rank 0 1.78x slower, rank 1 not (`--emulate-slowdown 1.78,1 --global-batch 64`): the shares rebalance
    computes from their step records are [23, 41] (64 / 2.78 = 23.0), not [16, 48]."""
    slow, fast = _last_step(tmp_path, monkeypatch, 1.78), _last_step(tmp_path, monkeypatch, 1.0)
    handed_in: list[float] = []
    _rebalanced(fast, lambda mine: handed_in.append(mine) or [mine, mine])  # rank 1's speed, as it hands it in
    events = _rebalanced(slow, lambda mine: [mine, handed_in[0]])  # rank 0 gathers both
    assert events[-1]["shares"] == [23, 41], events[-1]
