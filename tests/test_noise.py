"""The gradient noise scale (scalelab/train/noise.py): the estimator on gradients with a known noise scale,
the meter's two ways of getting a small and a large batch's gradient (the data-parallel hooks and
the one-worker probe), and a real two-worker run whose records and summary carry it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from scalelab.analysis.scaling import pooled_noise_scale
from scalelab.train.noise import NoiseMeter, Smoother, estimate


def test_estimate_solves_the_two_expectations_exactly():
    trace, grad_sq = 40.0, 2.0  # E|g_b|^2 = |G|^2 + tr/b
    small, big = grad_sq + trace / 4, grad_sq + trace / 32
    assert estimate(small, big, 4, 32) == pytest.approx((trace, grad_sq))
    with pytest.raises(ValueError, match="b_small < b_big"):
        estimate(1.0, 1.0, 8, 8)


def test_known_noise_scale_from_ranks_against_their_average():
    """Per-sample gradients G + N(0, s^2 I) in d dimensions: B_simple = d s^2 / |G|^2 = 64. Four ranks
    of 8 samples each against their average, smoothed over steps as the meter does."""
    rng = np.random.default_rng(0)
    d, s = 256, 1.0
    true_g = np.full(d, s / 8)  # |G|^2 = d s^2 / 64
    smoother, traces, grads = Smoother(beta=0.99), [], []
    for _ in range(3000):
        samples = true_g + rng.normal(0.0, s, size=(32, d))
        local = samples.reshape(4, 8, d).mean(axis=1)
        avg = local.mean(axis=0)
        for g in local:  # every rank's own estimate, as each rank records it
            t, g2 = estimate(float(g @ g), float(avg @ avg), 8, 32)
            smoother.update(t, g2)
            traces.append(t)
            grads.append(g2)
    assert smoother.scale == pytest.approx(64.0, rel=0.15)
    assert sum(traces) / sum(grads) == pytest.approx(64.0, rel=0.05)  # what reports pool


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


class _Loss(torch.nn.Module):
    """A model called like the trainer's: keyword inputs, the mean loss back."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _model()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((self.net(x).squeeze(-1) - y) ** 2).mean()


def _sq(grads) -> float:
    return float(sum((g.double() ** 2).sum() for g in grads))


def test_one_worker_probe_is_the_half_batch_and_changes_nothing():
    model = _Loss()
    x, y = torch.randn(16, 6), torch.randn(16)
    meter = NoiseMeter(model, world=1, global_batch=16, exchanging=True, probe_every=2)
    model.zero_grad()
    model(x=x, y=y).backward()
    before = [p.grad.clone() for p in model.parameters()]
    rng = torch.get_rng_state()
    assert meter.exchanged(model, {"x": x, "y": y}, 16, step=1) == 0.0 and meter.fields() == {}  # not a probe step
    seconds = meter.exchanged(model, {"x": x, "y": y}, 16, step=2)
    assert seconds > 0
    assert all(torch.equal(a, p.grad) for a, p in zip(before, model.parameters()))  # the update is untouched
    assert torch.equal(rng, torch.get_rng_state())
    half = torch.autograd.grad(model(x=x[:8], y=y[:8]), list(model.parameters()))
    fields = meter.fields()
    want = estimate(_sq(half), _sq(before), 8, 16)
    assert fields["noise_trace"] == pytest.approx(want[0], rel=1e-4)
    assert fields["noise_grad_sq"] == pytest.approx(want[1], rel=1e-4, abs=1e-6)
    assert fields["noise_s"] == seconds and set(fields) == {"noise_scale", "noise_trace", "noise_grad_sq", "noise_s"}


def test_one_worker_beside_ps_server_ranks_probes_as_alone():
    """`--ps-placement separate` with one worker: the world is 2, but only one rank has data, so there is
    no second gradient to compare; the worker probes half its batch (a server has none: it never probes)."""
    model = _Loss()
    x, y = torch.randn(16, 6), torch.randn(16)
    meter = NoiseMeter(model, world=2, global_batch=16, exchanging=True, probe_every=2, workers=1)
    assert not meter.data_parallel and NoiseMeter(model, world=2, global_batch=16, exchanging=True).data_parallel
    model.zero_grad()
    model(x=x, y=y).backward()
    assert meter.exchanged(model, {"x": x, "y": y}, 16, step=2) > 0 and "noise_trace" in meter.fields()
    assert meter.exchanged(model, {}, 0, step=4) == 0.0 and meter.fields() == {}  # a server rank's step


def test_data_parallel_hooks_read_the_local_gradient_before_the_exchange():
    """Rank 0 of two: its backward runs on its 8 samples (the hooks see that gradient); the exchange
    is stood in for by writing the 16-sample average into .grad, as DDP and Horovod do."""
    model = _Loss()
    x, y = torch.randn(16, 6), torch.randn(16)
    local = torch.autograd.grad(model(x=x[:8], y=y[:8]), list(model.parameters()))
    full = torch.autograd.grad(model(x=x, y=y), list(model.parameters()))
    meter = NoiseMeter(model, world=2, global_batch=16, exchanging=True)  # hooks on every parameter
    model.zero_grad()
    model(x=x[:8], y=y[:8]).backward()  # the hooks fire here
    for p, g in zip(model.parameters(), full):
        p.grad = g.clone()
    assert meter.exchanged(model, {}, 8, step=1) == 0.0
    fields = meter.fields()
    want = estimate(_sq(local), _sq(full), 8, 16)
    assert fields["noise_trace"] == pytest.approx(want[0], rel=1e-4)
    assert fields["noise_grad_sq"] == pytest.approx(want[1], rel=1e-4, abs=1e-6)
    assert "noise_s" not in fields
    # a loss scale (mixed precision) multiplies both gradients: the estimate is the same
    model.zero_grad()
    (model(x=x[:8], y=y[:8]) * 1024.0).backward()
    for p, g in zip(model.parameters(), full):
        p.grad = g.clone() * 1024.0
    meter.exchanged(model, {}, 8, step=2, loss_scale=1024.0)
    assert meter.fields()["noise_trace"] == pytest.approx(want[0], rel=1e-3)


def test_pooled_noise_scale_uses_the_later_half_up_to_the_threshold():
    import pandas as pd

    recs = pd.DataFrame({"kind": "step", "step": [1, 2, 3, 4, 5, 6], "noise_trace": [1.0, 1.0, 10.0, 30.0, 50.0, 99.0],
                         "noise_grad_sq": [1.0, 1.0, 1.0, 0.5, 0.5, 0.0]})
    assert pooled_noise_scale(recs, until_step=4) == pytest.approx(40.0 / 1.5)  # steps 3 and 4
    assert pooled_noise_scale(recs) == pytest.approx(179.0 / 1.0)  # steps 4-6
    assert pooled_noise_scale(recs.assign(noise_grad_sq=-1.0)) is None
    # a short run's pooled tr(Σ) can come out negative too (nmt-tiny, 10 steps: -2.56 was shown): no noise scale
    assert pooled_noise_scale(recs.assign(noise_trace=[-1.99, -4.02, -1.0, -2.0, -3.0, -1.0])) is None
    assert pooled_noise_scale(recs.drop(columns=["noise_trace"])) is None


@pytest.mark.slow
def test_a_two_worker_run_records_and_summarises_the_noise_scale(tmp_path):
    from tests.conftest import launch, only_run_dir, steps_of

    proc = launch("run", "--model", "rnnlm-tiny", "--data", "task", "--engine", "ddp", "--gpus-per-node", "2",
                  "--global-batch", "16", "--steps", "24", "--warmup-steps", "2", "--runs-dir", "runs", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = only_run_dir(tmp_path / "runs")
    for rank in (0, 1):
        steps = steps_of(run, rank)
        assert all(isinstance(s["noise_trace"], float) and "noise_s" not in s for s in steps)
        assert steps[-1]["noise_scale"] is None or steps[-1]["noise_scale"] > 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["noise_scale"] is None or summary["noise_scale"] > 0
    assert "noise_scale" in summary and summary["batch_scaling"] == "fixed"
