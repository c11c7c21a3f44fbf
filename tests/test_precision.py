"""Mixed precision (`--precision`, `--grad-compression`): what a CPU can check.

- the option checks and their messages (fp16 needs a GPU; Horovod has no bf16 exchange);
- under bf16 autocast the loss, the master weights and the gradients stay float32, and the fused LSTM
  runs oneDNN's RNN kernel in bf16 (seen in a profile, not assumed);
- the gradient scaler's logic (scale, unscale, skip on overflow, back off) with PyTorch's CPU scaler,
  and its state through a weights-only checkpoint;
- convergence: on task data bf16 reaches the loss threshold within 1.3x the fp32 steps, per family;
- a 2-rank DDP run exchanging bf16 gradients.

The CUDA paths (fp16 autocast, the CUDA scaler, NCCL with compression) run the same code with another
device type; no GPU is lent to this project, so they are not run here.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch

from scalelab.core.errors import ScalelabError, SpecError
from scalelab.core.presets import PRESETS
from scalelab.core.spec import EngineSpec, Spec, read_spec, save_spec
from tests.conftest import launch, only_run_dir, read_jsonl, steps_of
from tests.test_models import one_thread  # noqa: F401  (the fixture: tiny models on one thread)
from scalelab.train.checkpoint import identity, load_checkpoint, save_checkpoint
from scalelab.train.datasets import build_dataset
from scalelab.train.engines import Engine
from scalelab.train.loop import train
from scalelab.train.models import FusedLSTM, build_model
from scalelab.train.precision import Precision, make_precision

# ---- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, pattern", [
    ({"precision": "fp8"}, "precision must be one of fp32, bf16, fp16, got 'fp8'"),
    ({"precision": "fp16", "device": "cpu"}, "--precision fp16 needs a GPU .* use --precision bf16 on a CPU"),
    ({"engine.compression": "int8"}, "engine.compression must be one of none, fp16, bf16"),
    ({"engine.name": "horovod", "engine.compression": "bf16"}, "Horovod 0.28 cannot all-reduce bf16"),
    ({"engine.fp16_allreduce": True, "engine.compression": "bf16"}, "contradict each other"),
])
def test_precision_options_are_checked(overrides, pattern):
    with pytest.raises(SpecError, match=pattern):
        Spec().with_overrides(overrides).validate()


def test_the_older_fp16_flag_means_fp16_compression():
    assert EngineSpec(fp16_allreduce=True).grad_compression == "fp16"
    assert EngineSpec(compression="bf16").grad_compression == "bf16"
    assert EngineSpec().grad_compression == "none"


def test_a_run_directory_from_before_the_choice_reads_as_fp32(tmp_path):
    save_spec(Spec(precision="bf16"), tmp_path)
    assert read_spec(tmp_path).precision == "bf16"
    raw = json.loads((tmp_path / "spec.json").read_text())
    del raw["precision"]
    (tmp_path / "spec.json").write_text(json.dumps(raw))
    assert read_spec(tmp_path).precision == "fp32"


@pytest.mark.slow
def test_fp16_on_a_cpu_is_one_clear_error(tmp_path):
    with pytest.raises(ScalelabError, match="fp16 needs a GPU .* runs on cpu; use --precision bf16"):
        make_precision("fp16", torch.device("cpu"))
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: fp16 would run")
    proc = launch("--model", "nmt-tiny", "--engine", "single", "--precision", "fp16", "--steps", "3",
                  "--warmup-steps", "1", "--runs-dir", "runs", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "fp16 needs a GPU" in line]
    assert lines and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.gpu
def test_the_cuda_precisions_are_built_for_the_gpu_they_get(monkeypatch):
    """What a CPU can check of the CUDA path: fp16 gets a CUDA gradient scaler, bf16 none, and bf16 on
    a GPU without bf16 arithmetic (K80, M60, V100, T4 in the price catalog) is one clear error."""
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-16GB")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    with pytest.raises(ScalelabError, match="bf16 needs a GPU with bfloat16 arithmetic .* V100.* use --precision fp16"):
        make_precision("bf16", gpu)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    bf16 = make_precision("bf16", gpu)
    assert (bf16.device_type, bf16.dtype, bf16.scaler) == ("cuda", torch.bfloat16, None)
    with pytest.warns(UserWarning) if not torch.cuda.is_available() else contextlib.nullcontext():
        fp16 = make_precision("fp16", gpu)  # without a GPU the CUDA scaler warns and disables itself
    assert (fp16.device_type, fp16.dtype, fp16.scaler._device) == ("cuda", torch.float16, "cuda")


# ---- a CPU without bf16 (AVX2 only): one clear refusal ---------------------------------------------


@pytest.fixture
def cpu_without_bf16(monkeypatch):
    """This machine's CPU as one that cannot build oneDNN's bf16 LSTM, whatever the real one can."""
    import scalelab.train.precision as precision_mod

    def no_bf16_lstm() -> None:
        raise RuntimeError("could not create a primitive descriptor for the LSTM forward propagation primitive. "
                           "Run workload with environment variable ONEDNN_VERBOSE=all")

    monkeypatch.setattr(precision_mod, "_try_fused_lstm_in_bf16", no_bf16_lstm)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    precision_mod.cpu_bf16_problem.cache_clear()
    yield
    precision_mod.cpu_bf16_problem.cache_clear()  # the next test probes the real CPU again


BF16_REFUSAL = (r"--precision bf16 with the fused LSTM \(--rnn fused\) needs a CPU that runs oneDNN's bf16 LSTM .*"
                r"could not create a primitive descriptor.*use --precision fp32, or --rnn stepwise .* AVX-512 BF16/AMX")


@pytest.mark.usefixtures("cpu_without_bf16")
def test_bf16_on_a_cpu_without_it_is_refused_by_the_rank_and_the_launcher():
    from scalelab.launcher.local import LocalBackend

    with pytest.raises(ScalelabError, match=BF16_REFUSAL):
        make_precision("bf16", torch.device("cpu"))  # a rank (any backend): its error record says this
    with pytest.raises(ScalelabError, match=BF16_REFUSAL):  # the local launcher, before any rank starts
        LocalBackend().validate(Spec(precision="bf16", engine=EngineSpec(name="single")).validate())
    assert make_precision("bf16", torch.device("cpu"), rnn="stepwise").dtype == torch.bfloat16  # runs, emulated
    LocalBackend().validate(Spec(precision="bf16", rnn="stepwise", engine=EngineSpec(name="single")).validate())
    LocalBackend().validate(Spec(precision="fp32", engine=EngineSpec(name="single")).validate())


def test_bf16_is_refused_up_front_where_this_cpu_lacks_it(tmp_path):
    """The real CPU, the real launcher: where the fused LSTM cannot run in bf16, `launch` says why
    before any rank starts (no run directory), instead of oneDNN's error from inside a rank."""
    from scalelab.train.precision import cpu_bf16_problem

    if not cpu_bf16_problem("fused"):
        pytest.skip("this CPU trains the fused LSTM in bf16: nothing to refuse")
    proc = launch("--model", "nmt-tiny", "--engine", "single", "--precision", "bf16", "--device", "cpu",
                  "--steps", "3", "--warmup-steps", "1", "--runs-dir", "runs", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert [line for line in proc.stderr.splitlines() if "needs a CPU that runs oneDNN's bf16 LSTM" in line]
    assert not (tmp_path / "runs").exists()


# ---- bf16 on the CPU: dtypes and the kernel that runs ------------------------------------------------


@pytest.mark.usefixtures("one_thread", "needs_cpu_bf16")
@pytest.mark.parametrize("name", ["nmt-tiny", "rnnlm-tiny", "sentiment-tiny"])
def test_bf16_keeps_loss_weights_and_gradients_in_fp32(name):
    cfg = PRESETS[name]
    torch.manual_seed(0)
    model = build_model(cfg, "fused")
    batch = build_dataset("synthetic", cfg, 0).get_batch(0, 0, 8, 0, 8)
    precision = make_precision("bf16", torch.device("cpu"))
    seen = []
    for lstm in (m for m in model.modules() if isinstance(m, FusedLSTM)):
        lstm.register_forward_hook(lambda module, args, out: seen.append(out[0].dtype))
    with precision.autocast():
        loss = model(**batch.inputs)
    precision.backward(loss)
    assert seen and set(seen) == {torch.bfloat16} and loss.dtype == torch.float32
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)
    with torch.no_grad():
        fp32 = model(**batch.inputs)
    assert abs(float(fp32) - float(loss.detach())) < 0.05 * float(fp32)  # the same function, rounded differently


@pytest.mark.usefixtures("one_thread", "needs_cpu_bf16")
def test_the_fused_lstm_runs_onednn_rnn_in_bf16_under_autocast():
    """The fast path, seen in a profile: `aten::mkldnn_rnn_layer` (oneDNN's RNN primitive) runs, forward
    and backward, and its output is bf16; no per-time-step cell appears."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("PyTorch was built without oneDNN")
    from torch.profiler import ProfilerActivity, profile

    lstm = build_model(PRESETS["rnnlm-tiny"], "fused").lstm
    x = torch.randn(4, 16, 32, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, _ = lstm(x)
        out.float().sum().backward()
    ops = {e.key for e in prof.key_averages()}
    assert out.dtype == torch.bfloat16
    assert {"aten::mkldnn_rnn_layer", "aten::mkldnn_rnn_layer_backward"} <= ops, sorted(ops)
    assert "aten::lstm_cell" not in ops and x.grad.dtype == torch.float32


# ---- the gradient scaler (fp16's), with PyTorch's CPU scaler --------------------------------------


def _scaled(init_scale=2.0**10, growth_interval=2):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    return model, optimizer, Precision("fp16", "cpu", scaler)


def _step(model, optimizer, precision, poison=False):
    model.zero_grad(set_to_none=True)
    with precision.autocast():
        loss = model(torch.ones(3, 4)).float().pow(2).mean()
    precision.backward(loss)
    if poison:
        model.weight.grad[0, 0] = float("inf")
    precision.unscale(optimizer)
    grads = [p.grad.clone() for p in model.parameters()]
    applied, _ = precision.step(optimizer, Engine(EngineSpec()).step)
    return loss, grads, applied


def test_scaler_unscales_applies_and_grows():
    model, optimizer, precision = _scaled()
    reference = torch.nn.Linear(4, 2)
    reference.load_state_dict(model.state_dict())
    loss, grads, applied = _step(model, optimizer, precision)
    with torch.autocast("cpu", dtype=torch.float16):
        ref_loss = reference(torch.ones(3, 4)).float().pow(2).mean()
    ref_loss.backward()
    assert float(loss.detach()) == float(ref_loss.detach())  # the loss itself is not scaled
    assert applied and precision.record(applied) == {"loss_scale": 2.0**10, "skipped": False}
    torch.testing.assert_close(grads[0], reference.weight.grad)  # unscaled: the true fp32 gradient
    _step(model, optimizer, precision)
    assert precision.scaler.get_scale() == 2.0**11  # growth_interval clean steps: the scale doubles


def test_scaler_skips_the_update_on_overflow_and_backs_off():
    model, optimizer, precision = _scaled()
    before = [p.detach().clone() for p in model.parameters()]
    _, _, applied = _step(model, optimizer, precision, poison=True)
    assert not applied and precision.record(applied) == {"loss_scale": 2.0**9, "skipped": True}
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert optimizer.state_dict()["state"] == {}  # Adam never stepped


def test_scaler_state_survives_a_weights_only_checkpoint(tmp_path):
    model, optimizer, precision = _scaled(growth_interval=3)
    for poison in (False, True, False):
        _step(model, optimizer, precision, poison)
    spec = Spec()
    save_checkpoint(tmp_path, model, optimizer, identity=identity(spec, 16), step=3, amp=precision.state_dict())
    ckpt = load_checkpoint(tmp_path, identity(spec, 16))  # weights_only=True: plain numbers only
    _, _, fresh = _scaled()
    fresh.load_state_dict(ckpt["amp"])
    assert fresh.scaler.state_dict() == precision.scaler.state_dict() == {
        "scale": 2.0**9, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3, "_growth_tracker": 1}


def test_a_checkpoint_of_another_precision_is_refused(tmp_path):
    from scalelab.train.checkpoint import CheckpointError

    model, optimizer, _ = _scaled()
    save_checkpoint(tmp_path, model, optimizer, identity=identity(Spec(precision="fp32"), 16), step=1)
    with pytest.raises(CheckpointError, match="precision 'bf16' here, 'fp32' in the checkpoint"):
        load_checkpoint(tmp_path, identity(Spec(precision="bf16"), 16))
    old = identity(Spec(), 16)
    del old["precision"]  # written before the field: it was fp32
    save_checkpoint(tmp_path, model, optimizer, identity=old, step=1)
    assert load_checkpoint(tmp_path, identity(Spec(precision="fp32"), 16))["step"] == 1


# ---- convergence: bf16 against fp32 on task data, each model family -------------------------------


def _steps_to_threshold(root: Path, model: str, precision: str, lr: float, threshold: float) -> int | None:
    """The trainer's own loop, in this process (engine single): steps until the validation loss (fp32)
    first reaches `threshold`, None when it does not within 200 steps."""
    run = root / f"{model}-{precision}"
    run.mkdir()
    spec = Spec.from_dict({"model": model, "precision": precision, "engine": {"name": "single"}, "steps": 200,
                           "data": {"kind": "task", "prefetch": 0}, "warmup_steps": 1, "lr": lr, "threads": 1,
                           "val_every": 5, "loss_threshold": threshold}).validate()
    save_spec(spec, run)
    train(run)
    events = [r for r in read_jsonl(run / "records" / "rank-0.jsonl") if r.get("event") == "threshold"]
    return events[0]["step"] if events else None


@pytest.mark.usefixtures("one_thread", "needs_cpu_bf16")
@pytest.mark.parametrize("model, lr, threshold", [("nmt-tiny", 0.02, 3.3), ("rnnlm-tiny", 0.01, 1.0),
                                                  ("sentiment-tiny", 0.01, 0.45)])
def test_bf16_reaches_the_threshold_within_1_3x_the_fp32_steps(tmp_path, model, lr, threshold):
    fp32 = _steps_to_threshold(tmp_path, model, "fp32", lr, threshold)
    bf16 = _steps_to_threshold(tmp_path, model, "bf16", lr, threshold)
    assert fp32 is not None and bf16 is not None, (fp32, bf16)
    assert bf16 <= 1.3 * fp32, f"bf16 took {bf16} steps, fp32 {fp32}"
    assert read_jsonl(tmp_path / f"{model}-bf16" / "records" / "rank-0.jsonl")[0]["precision"] == "bf16"


# ---- a distributed run exchanging bf16 gradients ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("needs_cpu_bf16")
def test_ddp_exchanges_bf16_gradients(tmp_path):
    proc = launch("--model", "nmt-tiny", "--data", "task", "--engine", "ddp", "--gpus-per-node", "2",
                  "--precision", "bf16", "--grad-compression", "bf16", "--steps", "4", "--warmup-steps", "1",
                  "--global-batch", "16", "--lr", "0.01", "--runs-dir", "runs", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = only_run_dir(tmp_path / "runs")
    start = read_jsonl(run / "records" / "rank-1.jsonl")[0]
    assert (start["precision"], start["grad_compression"]) == ("bf16", "bf16")
    assert start["grad_bytes"] == 2 * start["params"]
    losses = [s["loss"] for s in steps_of(run, 1)]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert "bf16" in json.loads((run / "summary.json").read_text())["label"]
