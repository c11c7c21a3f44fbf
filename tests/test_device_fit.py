"""Issue #25 on the CPU: ranks and devices, memory recorded, out-of-memory explained, precision that is
what it says, and a one-rank parameter server that exchanges nothing.

The GPU halves run only where PyTorch sees a GPU; on this machine the device count is faked where the
check is what is tested (the check reads `torch.cuda`, the fake replaces it)."""

from __future__ import annotations

import types

import pytest
import torch

from conftest import launch, only_run_dir, read_jsonl, steps_of
from scalelab.core.devices import check_gpus, gpu_shortage
from scalelab.core.errors import ScalelabError, SpecError
from scalelab.core.spec import EngineSpec, Spec
from scalelab.launcher.local import LocalBackend
from scalelab.train import loop
from scalelab.train.datasets import build_dataset
from scalelab.train.engines import Engine, Placement
from scalelab.train.memory import is_out_of_memory, oom_message
from scalelab.train.models import PRESETS, build_model
from scalelab.train.precision import DTYPES, make_precision


def fake_gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


# ---- ranks and devices ---------------------------------------------------------------------------


def test_the_shortage_message_names_the_gpus_and_both_fixes(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    text = gpu_shortage(2, 1)
    assert "2 ranks would run on this machine, but only 1 GPU is visible there" in text
    assert "--gpus-per-node 1" in text and "--device cpu" in text
    assert gpu_shortage(2, 2) is None and gpu_shortage(4, 0) is None  # enough GPUs; none at all: CPU processes
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert "(CUDA_VISIBLE_DEVICES=3)" in gpu_shortage(2, 1)


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_the_local_launcher_refuses_two_ranks_on_one_gpu_before_any_starts(monkeypatch, device):
    fake_gpus(monkeypatch, 1)
    spec = Spec(model="nmt-tiny", gpus_per_node=2, device=device, engine=EngineSpec(name="ddp"), steps=2)
    with pytest.raises(SpecError, match=r"2 ranks would run on this machine, but only 1 GPU"):
        LocalBackend().check(spec)
    LocalBackend().check(Spec(model="nmt-tiny", gpus_per_node=2, device="cpu", engine=EngineSpec(name="ddp"), steps=2))
    fake_gpus(monkeypatch, 2)
    LocalBackend().check(spec)  # one GPU each: fine


def test_emulated_nodes_count_every_rank_on_this_machine(monkeypatch):
    fake_gpus(monkeypatch, 2)
    spec = Spec(model="nmt-tiny", nodes=2, gpus_per_node=2, engine=EngineSpec(name="ddp"), steps=2)
    with pytest.raises(SpecError, match=r"4 ranks would run on this machine \(2 emulated nodes x 2\)"):
        LocalBackend().check(spec)


@pytest.mark.parametrize("local_world, gpus, refused", [(2, 1, True), (1, 1, False), (4, 8, False), (9, 8, True)])
def test_every_rank_checks_its_node_where_the_launcher_cannot_see_it(monkeypatch, local_world, gpus, refused):
    """Slurm, Kubernetes and AWS start the ranks on nodes the launcher never sees: the rank checks."""
    fake_gpus(monkeypatch, gpus)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    engine = Engine(EngineSpec())
    engine.placement = Placement(rank=0, world=local_world, local_rank=0, local_world=local_world, node_rank=3)
    if refused:
        with pytest.raises(SpecError, match=rf"{local_world} ranks would run on node 3, but only {gpus} GPU"):
            engine.device("auto")
    else:
        assert engine.device("auto").type == "cuda"


def test_the_launchers_checks_import_no_pytorch_where_no_gpu_driver_is():
    """`launch` checks the GPUs and Horovod before any rank starts; where no GPU driver is (a CPU machine)
    neither check imports PyTorch (1-2 s of every launch), and the Horovod check, which asks Horovod's
    PyTorch extension, agrees with importing horovod.torch as the ranks do."""
    import os
    import subprocess
    import sys

    from conftest import ROOT
    from scalelab.core.devices import gpu_driver_present
    from scalelab.train.engines import horovod_status

    if gpu_driver_present():
        pytest.skip("a GPU driver is here: the launcher asks PyTorch how many GPUs it sees")
    code = ("import sys\n"
            "from scalelab.core.spec import EngineSpec, Spec\n"
            "from scalelab.launcher.backend import horovod_build_problem\n"
            "from scalelab.launcher.local import LocalBackend\n"
            "LocalBackend().validate(Spec(model='nmt-tiny', gpus_per_node=2, engine=EngineSpec(name='ddp'), steps=2))\n"
            "print(horovod_build_problem() is None)\n"
            "print(sorted(m for m in ('torch', 'horovod.torch', 'pandas') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    usable, imported = out.stdout.splitlines()
    assert imported == "[]"
    assert usable == str(horovod_status() is None)


def test_the_launchers_horovod_check_says_how_to_build_it_where_it_is_missing_or_broken(monkeypatch, tmp_path):
    """Without Horovod, or with a PyTorch extension that does not load (built against another PyTorch), the
    launcher refuses before any rank starts, with the ranks' own advice."""
    import importlib.util

    from scalelab.core.errors import EngineError
    from scalelab.launcher import backend

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "horovod" else real(name, *a))
    with pytest.raises(EngineError, match=r"Horovod with PyTorch support is not installed \(No module named 'horovod'\); "
                                          r"run scripts/build-horovod.sh"):
        backend.check_horovod()
    fake = tmp_path / "horovod"
    (fake / "torch").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    import sysconfig

    (fake / "torch" / f"mpi_lib_v2{sysconfig.get_config_var('EXT_SUFFIX')}").write_bytes(b"not a library")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: types.SimpleNamespace(origin=str(fake / "__init__.py")) if name == "horovod" else real(name, *a))
    problem = backend.horovod_build_problem()
    assert problem.startswith("Horovod with PyTorch support is not installed (") and "--engine ddp" in problem


@pytest.mark.gpu
@pytest.mark.slow
def test_the_cli_refuses_before_any_rank_starts(tmp_path):
    """Without a GPU here the refusal is not reachable from the CLI; this checks the CPU path still runs
    two ranks, and (on a machine with one GPU) that the message reaches the user as one line."""
    proc = launch("--engine", "ddp", "--gpus-per-node", "2", "--model", "nmt-tiny", "--steps", "3", "--warmup-steps", "1",
                  "--runs-dir", "runs", "--device", "auto", cwd=tmp_path)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if 0 < gpus < 2:
        assert proc.returncode != 0 and "Traceback" not in proc.stderr and "but only 1 GPU" in proc.stderr
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    else:
        assert proc.returncode == 0, proc.stderr


# ---- memory --------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine, ranks", [("single", 1), ("ddp", 2), ("ps", 2), ("horovod", 2)])
@pytest.mark.slow
def test_every_rank_records_its_peak_memory_and_the_report_shows_it(tmp_path, engine, ranks):
    from conftest import horovod_available

    if engine == "horovod" and not horovod_available():
        pytest.skip("Horovod is not installed")
    proc = launch("--engine", engine, "--gpus-per-node", str(ranks), "--model", "nmt-tiny", "--steps", "4",
                  "--warmup-steps", "1", "--runs-dir", "runs", "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = only_run_dir(tmp_path / "runs")
    for rank in range(ranks):
        records = read_jsonl(run / "records" / f"rank-{rank}.jsonl")
        base = next(r for r in records if r["kind"] == "start")["mem_base_bytes"]
        peaks = [r["mem_peak_bytes"] for r in records if r["kind"] == "step"]
        assert {r["mem_kind"] for r in records if r["kind"] == "step"} == {"max_rss"}
        assert 50 * 2**20 < base < peaks[0] and peaks == sorted(peaks)  # a peak never shrinks
    report = launch("report", str(run), "--out", str(tmp_path / "rep"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    table = (tmp_path / "rep" / "report.md").read_text()
    assert "| peak mem/rank |" in table and " MiB RSS |" in table


OOM_TEXT = ("CUDA out of memory. Tried to allocate 26.82 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
            "16.50 GiB is free. Including non-PyTorch memory, this process has 62.68 GiB memory in use.")


def test_an_out_of_memory_error_becomes_one_line_with_the_batch_and_the_fixes():
    exc = torch.OutOfMemoryError(OOM_TEXT)
    assert is_out_of_memory(exc) and not is_out_of_memory(RuntimeError("shape mismatch"))
    text = oom_message(exc, 1440, "bf16", torch.device("cpu"), step=1)
    assert "\n" not in text
    assert "batch of 1440 per rank in bf16" in text and "at step 1" in text
    assert "asked for 26.82 GiB more with 16.50 GiB free" in text
    assert "--batch-per-worker" in text and "--precision bf16" not in text  # already bf16: not a fix
    assert "--precision bf16" in oom_message(exc, 1440, "fp32", torch.device("cpu"))


def test_the_loop_turns_an_out_of_memory_step_into_the_rank_error(monkeypatch):
    def step(run, progress, stream):
        raise torch.OutOfMemoryError(OOM_TEXT)

    monkeypatch.setattr(loop, "train_step", step)
    run = types.SimpleNamespace(per_rank=720, spec=types.SimpleNamespace(precision="fp32"), device=torch.device("cpu"))
    with pytest.raises(ScalelabError, match=r"out of memory on cpu at step 5 with a batch of 720 per rank in fp32") as info:
        loop.guard_memory(run, types.SimpleNamespace(step=4), iter(()))
    assert info.value.__cause__ is None and info.value.__suppress_context__


# ---- precision -----------------------------------------------------------------------------------


def _devices_and_precisions() -> list:  # (device, precision, rnn), or a pytest.param of them
    cases = [("cpu", p, rnn) for p in ("fp32", "bf16") for rnn in ("fused", "stepwise")]
    if torch.cuda.is_available():
        cases += [pytest.param("cuda", p, rnn, marks=pytest.mark.gpu) for p in ("fp32", "bf16", "fp16")
                  for rnn in ("fused", "stepwise")]
    return cases


@pytest.mark.parametrize("device, name, rnn", _devices_and_precisions())
def test_the_recurrent_layers_run_in_the_precision_asked_for(device, name, rnn):
    """bf16 means bfloat16 in the LSTMs too: under CUDA autocast `nn.LSTM` ran cuDNN's float16 kernels."""
    from scalelab.train.precision import cpu_bf16_problem

    if device == "cpu" and name == "bf16" and cpu_bf16_problem(rnn):
        pytest.skip(cpu_bf16_problem(rnn))
    cfg = PRESETS["nmt-tiny"]
    torch.manual_seed(0)
    model = build_model(cfg, rnn).to(device)
    batch = build_dataset("synthetic", cfg, 0).get_batch(0, 0, 8, 0, 8).to(torch.device(device))
    seen: dict[str, torch.dtype] = {}
    for label in ("encoder", "decoder"):
        getattr(model, label).register_forward_hook(lambda m, a, out, label=label: seen.__setitem__(label, out[0].dtype))
    precision = make_precision(name, torch.device(device), rnn)
    with precision.autocast():
        loss = model(**batch.inputs)
    precision.backward(loss)
    assert seen == {"encoder": DTYPES[name], "decoder": DTYPES[name]}
    assert all(p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)
    assert model.encoder.weight_ih_l0.grad is not None  # the gradients reach the float32 weights


# ---- the parameter server on one rank ------------------------------------------------------------


@pytest.mark.slow
def test_a_one_rank_parameter_server_exchanges_nothing(tmp_path):
    proc = launch("--engine", "ps", "--gpus-per-node", "1", "--model", "nmt-tiny", "--steps", "4", "--warmup-steps", "1", "--runs-dir", "runs",
                  "--device", "cpu", "--checkpoint-every", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    steps = steps_of(only_run_dir(tmp_path / "runs"))
    assert len(steps) == 4 and all(s["exchange_s"] == 0.0 for s in steps)
    assert all(s["loss"] is not None and s["loss"] > 0 for s in steps)
