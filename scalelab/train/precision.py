"""Mixed precision: the number format of a training step, in one place (`--precision`).

- ``fp32``: every step in float32, as before there was a choice.
- ``bf16``: forward and backward under `torch.autocast` in bfloat16, on the CPU (oneDNN's bf16 kernels,
  the fused LSTM included) and on GPUs (cuDNN). bfloat16 has float32's exponent range, so gradients
  cannot underflow and no scaler is needed. oneDNN builds its bf16 LSTM only on CPUs with AVX-512
  (bf16 in hardware: AVX-512 BF16, AMX); on an AVX2-only CPU it cannot, so `cpu_bf16_problem` tries
  it once and a run is refused up front with what to do instead (`--rnn stepwise` runs there, emulated).
- ``fp16``: autocast in float16 with a gradient scaler (GPU only): float16's range is small enough
  that small gradients flush to zero unless the loss is scaled up first and the gradients down after.

What stays float32 whatever the precision, and why:
- master weights and gradients: autocast casts the weights to the low format inside each op and its
  backward casts the gradients back, so the optimizer, gradient clipping and any statistic computed
  from the gradients (the noise-scale estimate) see float32 gradients, unscaled (`unscale`);
- the loss: the models compute cross-entropy on `logits.float()`;
- validation: run without autocast, so the loss threshold judges every precision by the same function
  of the weights, and time-to-threshold compares precisions fairly;
- the gradient exchange, unless `--grad-compression` says otherwise (scalelab/train/engines.py).

The scaler's state goes into checkpoints as plain numbers (`state_dict`), so a resumed fp16 run
continues with the scale the interrupted one had reached.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch

from scalelab.core.errors import ScalelabError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """Autocast for forward passes and, with a scaler (fp16), the scaled backward and the guarded update.

    The loop calls, in order: `autocast()` around the forward, `backward(loss)`, `unscale(optimizer)`
    after the exchange and before anything reads the gradients, `step(optimizer, update)`.
    """

    def __init__(self, name: str, device_type: str, scaler: torch.amp.GradScaler | None = None) -> None:
        self.name = name
        self.dtype = DTYPES[name]
        self.device_type = device_type
        self.scaler = scaler

    def autocast(self, cache: bool = True) -> contextlib.AbstractContextManager:
        """The context of a training forward pass: autocast to `dtype`, or nothing for fp32. `cache=False`
        while a CUDA graph is captured (torch.cuda.graphs: autocast's weight-cast cache must be off)."""
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype, cache_enabled=cache)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients by the loss scale (fp16), so what follows reads true fp32 gradients."""
        if self.scaler:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, update: Callable[..., Any]) -> tuple[bool, Any]:
        """Apply the update through `update(optimizer, step_function)` (the engine's step); with a
        scaler, skip it when a gradient is not finite and adapt the scale. (True when it was applied,
        what `update` returned: the seconds of a parameter server's pull).

        Every rank decides alike: the gradients were all-reduced before `unscale`, so an overflow on
        one rank is an overflow on all of them. Not so on a parameter server, where each rank holds only
        its shards' gradients: the spec refuses fp16 with `--engine ps`.
        """
        if not self.scaler:
            return True, update(optimizer)
        before = self.scaler.get_scale()
        out = update(optimizer, self.scaler.step)
        self.scaler.update()
        return not self.scaler.get_scale() < before, out  # the scale backs off only after an overflow

    def record(self, applied: bool) -> dict[str, Any]:
        """The step record's fields for the scaler (none without one)."""
        if not self.scaler:
            return {}
        return {"loss_scale": float(self.scaler.get_scale()), "skipped": not applied}

    def state_dict(self) -> dict[str, Any] | None:
        """The scaler's state as plain numbers (a checkpoint is loaded weights-only), None without one."""
        return dict(self.scaler.state_dict()) if self.scaler else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scaler and state:
            self.scaler.load_state_dict(state)


def make_precision(name: str, device: torch.device, rnn: str = "fused") -> Precision:
    """The precision `name` on `device` for the `rnn` kind; a ScalelabError where that device cannot run it."""
    if name == "fp16" and device.type != "cuda":
        raise ScalelabError(
            f"--precision fp16 needs a GPU (its gradient scaler is CUDA-only here), but this rank runs on "
            f"{device}; use --precision bf16 on a CPU"
        )
    if name == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise ScalelabError(
            f"--precision bf16 needs a GPU with bfloat16 arithmetic (compute capability 8.0 or newer: A10G, "
            f"A100, ...), but {torch.cuda.get_device_name(device)} would only emulate it, slower than fp32; "
            "use --precision fp16 there"
        )
    if name == "bf16" and device.type == "cpu":
        check_cpu_precision(name, rnn)
    scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None
    return Precision(name, device.type, scaler)


def check_cpu_precision(name: str, rnn: str, device: str = "cpu") -> None:
    """Raise the one clear ScalelabError where this machine's CPU would train `rnn` in precision `name`
    and cannot (`device`: the spec's, `auto` runs on the CPU where there is no GPU). The local launcher
    calls it before any rank starts, each rank again for its own machine."""
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return  # the ranks run on a GPU (--device cuda without one: the engine says so)
    if name == "fp16":
        raise ScalelabError("--precision fp16 needs a GPU (its gradient scaler is CUDA-only here), but this "
                            "machine has none; use --precision fp32, or bf16 where the CPU runs it")
    problem = cpu_bf16_problem(rnn) if name == "bf16" else None
    if problem:
        raise ScalelabError(problem)


@functools.lru_cache(maxsize=None)
def cpu_bf16_problem(rnn: str = "fused") -> str | None:
    """None when this CPU runs the `rnn` kind under bf16 autocast, else why not and what to do.

    Tried, not guessed from flags: oneDNN decides when it builds its LSTM primitive whether the CPU's
    instructions can run it in bf16, and on an AVX2-only CPU it cannot ("could not create a primitive
    descriptor"). The stepwise RNN's cells stay float32 under autocast and its matrix products are
    emulated in bf16 where there is no hardware for them: it runs anywhere, only slower.
    """
    if rnn != "fused":
        return None
    try:
        _try_fused_lstm_in_bf16()
    except RuntimeError as exc:
        flags = cpu_flags() & {"avx512_bf16", "amx_bf16", "avx512f"}
        return (
            f"--precision bf16 with the fused LSTM (--rnn fused) needs a CPU that runs oneDNN's bf16 LSTM (AVX-512, best with AVX-512 BF16 or AMX), "
            f"but this one has {torch.backends.cpu.get_cpu_capability()} "
            f"({', '.join(sorted(flags)) or 'no avx512f, avx512_bf16 or amx_bf16'} in /proc/cpuinfo) and oneDNN "
            f"cannot build the fused bf16 LSTM here ({str(exc).split('.')[0]}); use --precision fp32, or "
            "--rnn stepwise (bf16 emulated, slower than fp32), or a machine with AVX-512 BF16/AMX or a GPU "
            "with bf16 (compute capability 8.0+)"
        )
    return None


def _try_fused_lstm_in_bf16() -> None:
    """A tiny fused LSTM forward and backward under CPU bf16 autocast: the kernels a bf16 run needs."""
    with torch.random.fork_rng(devices=[]):  # the trial draws random weights: leave the run's stream alone
        lstm = torch.nn.LSTM(4, 4, batch_first=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, _ = lstm(torch.randn(2, 3, 4))
        out.float().sum().backward()


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none: not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()
