"""The fused output layer and loss (scalelab/train/outloss.py, `--output-loss`): the same loss and
gradients as the two plain lines, on their own and over 30 training steps on every engine."""

from __future__ import annotations

import pytest
import torch

from conftest import horovod_available, launch, made_once, only_run_dir, steps_of
from scalelab.train import outloss
from scalelab.train.outloss import chunked_loss, full_loss, resolve


def _grads(fn, h0, w0, b0, target, dtype):
    h, w, b = (t.clone().requires_grad_() for t in (h0, w0, b0))
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        loss = fn(h, w, b, target)
    loss.backward()
    return [loss.detach(), h.grad, w.grad, b.grad]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("dtype, tolerance", [(None, 1e-5), (torch.bfloat16, 1e-2)])
def test_chunked_gives_the_full_loss_and_gradients_over_several_chunks(monkeypatch, dtype, tolerance):
    """fp32: equal to rounding; bf16: to bf16's rounding (the chunks sum the weight gradient in fp32)."""
    monkeypatch.setenv(outloss.CHUNK_ROWS_ENV, "7")  # 100 rows: 15 chunks, the last one short
    torch.manual_seed(0)
    h0, w0, b0 = torch.randn(100, 16), 0.3 * torch.randn(50, 16), 0.1 * torch.randn(50)
    target = torch.randint(0, 50, (100,))
    target[::9] = 0  # padding: left out of the mean
    full = _grads(full_loss, h0, w0, b0, target, dtype)
    chunked = _grads(chunked_loss, h0, w0, b0, target, dtype)
    assert abs(float(full[0]) - float(chunked[0])) <= 1e-5 * float(full[0])
    for mine, theirs in zip(chunked[1:], full[1:]):
        assert _rel(mine, theirs) <= tolerance
    assert chunked[1][::9].abs().sum() == 0  # padded rows get no gradient


def test_a_machine_that_cannot_compile_falls_back_to_chunked_and_says_why(monkeypatch):
    def broken():
        raise RuntimeError("Compiler: cc is not found")

    monkeypatch.setattr(outloss, "compiled_loss", broken)
    impl, note = resolve("compiled", torch.device("cpu"))
    assert impl == "chunked" and "torch.compile failed on cpu (RuntimeError: Compiler: cc is not found)" in note
    assert resolve("auto", torch.device("cpu")) == ("full", None)  # measured: not faster on a CPU
    assert resolve("chunked", torch.device("cpu")) == ("chunked", None)


@pytest.mark.slow
def test_trying_the_compiler_draws_nothing_from_the_runs_random_stream():
    """The trial compile runs before the model is built: a random draw there changed every compiled run's
    initial weights (its first loss was 2.5e-3 away from the full loss's)."""
    torch.manual_seed(5)
    before = torch.random.get_rng_state()
    resolve("compiled", torch.device("cpu"))
    assert torch.equal(torch.random.get_rng_state(), before)


STEPS = 30  # past the warm-up, long enough to train (the last loss below the first) and to drift if it would


def _losses(tmp_path, name: str, engine: str, ranks: int, loss: str, extra_env: dict | None = None) -> list[float]:
    proc = launch("--engine", engine, "--gpus-per-node", str(ranks), "--model", "nmt-tiny", "--steps", str(STEPS),
                  "--warmup-steps", "1", "--output-loss", loss, "--runs-dir", str(tmp_path / name), "--device", "cpu",
                  cwd=tmp_path, env=extra_env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = steps_of(only_run_dir(tmp_path / name))
    assert len(steps) == STEPS
    return [s["loss"] for s in steps]


def _full_losses(tmp_path_factory, engine: str, ranks: int) -> list[float]:
    """The full loss's curve of one engine, run once in the pytest run (conftest's made_once: once for both
    xdist workers, not once per worker) for the chunked and the compiled comparisons."""
    def make(where):
        _losses(where, "full", engine, ranks, "full")
        return only_run_dir(where / "full")

    run = made_once(tmp_path_factory, ["output-loss-full", engine, str(ranks), str(STEPS)], make)
    return [s["loss"] for s in steps_of(run)]


ENGINES = [("single", 1), ("ddp", 2), ("ps", 2), ("horovod", 2)]


@pytest.mark.slow
@pytest.mark.parametrize("engine, ranks", ENGINES)
def test_chunked_trains_like_full_on_every_engine(tmp_path, tmp_path_factory, engine, ranks):
    if engine == "horovod" and not horovod_available():
        pytest.skip("Horovod is not installed")
    full = _full_losses(tmp_path_factory, engine, ranks)
    chunked = _losses(tmp_path, "chunked", engine, ranks, "chunked", {outloss.CHUNK_ROWS_ENV: "24"})
    worst = max(abs(a - b) / abs(a) for a, b in zip(full, chunked))
    assert worst <= 1e-3, worst
    assert full[-1] < full[0]  # it trained


@pytest.mark.slow
@pytest.mark.parametrize("engine, ranks", [("single", 1), ("ddp", 2)])
def test_compiled_trains_like_full(tmp_path, tmp_path_factory, engine, ranks):
    """torch.compile on the CPU (Inductor's C++ backend): the GPU default, checked where it can run here."""
    full = _full_losses(tmp_path_factory, engine, ranks)
    compiled = _losses(tmp_path, "compiled", engine, ranks, "compiled")
    worst = max(abs(a - b) / abs(a) for a, b in zip(full, compiled))
    assert worst <= 1e-3, worst
