"""Peak memory of one rank, predicted from the model's shape, the batch per rank, the precision and engine.

Why: a layout that does not fit its GPUs fails at the first step with CUDA's out-of-memory error, after
the instances were paid for. The planner checks every candidate against its GPU's memory (the catalog's
`gpu_memory_gib`) before ranking it, and never recommends one that does not fit.

What is counted (tensors only: PyTorch's `max_memory_allocated`, the figure a rank records on a GPU):
- model state: float32 weights and gradients, Adam's two moments (SGD's momentum), DDP's gradient
  buckets, a low-precision copy of the weights under bf16/fp16 autocast;
- the activations the backward keeps: per recurrent layer and direction, the gates, cell and output of
  every time step (cuDNN's reserve space, oneDNN's workspace: 7 x hidden values per token), the
  embeddings, the attention scores;
- the output layer and its loss, by `--output-loss` (scalelab/train/outloss.py): `full` holds the
  float32 log-softmax of all logits and, in the backward, two more float32 tensors of that size (12
  bytes per logit); `compiled` keeps the logits in the training format; `chunked` one chunk's worth.

The constants come from the project's H100 measurements (shared/reference/gpu-h100-2026-11.md: nmt-seed
bf16 at batches 360 and 720, full and compiled losses), which no part of this file was fitted to beyond
the per-logit and per-token counts above; the CPU's two constants come from an isolated LSTM and the
tiny presets. Checked against measured CPU peaks of other presets in tests/test_memory_prediction.py
and docs/benchmarks.md ("Peak memory per rank"), where the H100 figures are compared too.
"""

from __future__ import annotations

from dataclasses import dataclass

from scalelab.core.engines import known_fact
from scalelab.core.presets import LOSS_CHUNK_ELEMENTS, OUTPUT_LOSSES, ModelConfig

GIB = 1024**3
FORMAT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# Values kept per hidden unit and token by a training LSTM layer and direction: cuDNN's 4 gates, cell,
# hidden and output. On a CPU oneDNN also holds, per direction of a stack, a scratch of about 11 more:
# isolated nn.LSTM forward + backward, peak RSS growth per token and hidden unit: 1 layer 17.3-17.9,
# 2 layers 24.1, 2 bidirectional layers 51.1 (7 x layers x directions + 11 x directions: 18, 25, 50).
LSTM_VALUES_PER_TOKEN = 7
CPU_LSTM_SCRATCH_PER_DIRECTION = 11
# A CPU rank's resident set grows by this much on its first training steps whatever the model (thread
# pools, oneDNN's primitives and scratch, the autograd engine): 26.5-28.6 MiB beyond the predicted tensors
# with the three tiny presets, whose tensors are negligible, on the single, DDP and Horovod engines alike
# (docs/benchmarks.md, "DDP without the compiler's import", stop 66). It was 105 MiB, measured (2026-11-26)
# when every rank imported the compiler (`torch._dynamo`, 73 MiB of it) after its base was taken; since the
# eleventh stop only DDP ranks did (scalelab/train/optim.py), so single and Horovod predictions were 73 MiB
# high, and now none does (scalelab/train/ddp.py). A rank that compiles (`--output-loss compiled` on a
# CPU) still imports it, and more: its prediction is low by at least that much. On a GPU these are not
# tensors and are not counted.
CPU_RUNTIME_BYTES = 28 * 2**20
FULL_LOSS_BYTES_PER_LOGIT = 12  # float32 log-softmax kept + its gradient + the logits' gradient
HEADROOM = 0.9  # a GPU's memory usable by tensors: the CUDA context and the allocator's cache take the rest


@dataclass(frozen=True)
class MemoryPrediction:
    """Predicted peak bytes of one rank, and the parts that make it (bytes)."""

    model_state: float
    activations: float
    output_layer: float
    runtime: float = 0.0  # a CPU process's own growth (CPU_RUNTIME_BYTES); 0 on a GPU

    @property
    def peak_bytes(self) -> float:
        return self.model_state + self.activations + self.output_layer + self.runtime

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    def fits(self, gpu_memory_gib: float) -> bool:
        """True when the peak fits in HEADROOM of a GPU's memory."""
        return self.peak_bytes <= HEADROOM * gpu_memory_gib * GIB


def _lstm_params(input_size: int, hidden: int, layers: int, directions: int) -> int:
    total = 0
    for layer in range(layers):
        in_size = input_size if layer == 0 else directions * hidden
        total += directions * (4 * hidden * (in_size + hidden) + 8 * hidden)
    return total


def parameter_count(cfg: ModelConfig) -> int:
    """Trainable scalars of the model `cfg` builds (scalelab/train/models.py), by formula."""
    V, E, H = cfg.vocab_size, cfg.embed_size, cfg.hidden_size
    D = 2 if cfg.bidirectional else 1
    if cfg.family == "nmt":
        total = 2 * V * E + _lstm_params(E, H, cfg.enc_layers, D) + _lstm_params(E, H, cfg.dec_layers, 1)
        total += 2 * H * H if cfg.bidirectional else 0
        total += 3 * H * H if cfg.attention else 0
        return total + H * V + V
    if cfg.family == "rnnlm":
        return V * E + _lstm_params(E, H, cfg.num_layers, 1) + H * V + V
    return V * E + _lstm_params(E, H, cfg.num_layers, D) + D * H * cfg.num_classes + cfg.num_classes


def _activations(cfg: ModelConfig, batch: int, fmt: int, device: str) -> float:
    """Bytes the backward keeps besides the output layer: LSTM steps, embeddings, attention."""
    H, E, B = cfg.hidden_size, cfg.embed_size, batch
    D = 2 if cfg.bidirectional else 1
    def stack(layers: int, directions: int) -> float:  # bytes per token of one LSTM stack
        scratch = CPU_LSTM_SCRATCH_PER_DIRECTION * directions if device == "cpu" else 0
        return (LSTM_VALUES_PER_TOKEN * layers * directions + scratch) * H * fmt

    if cfg.family == "nmt":
        S, T = cfg.src_len, cfg.tgt_len
        total = B * S * (stack(cfg.enc_layers, D) + E * fmt) + B * T * (stack(cfg.dec_layers, 1) + E * fmt)
        if cfg.attention:
            total += B * T * S * 4 * 3 + B * T * H * fmt * 4  # scores, softmax, mask (float32); context, combine
        return total
    return B * cfg.seq_len * (stack(cfg.num_layers, D) + E * fmt)


def _output_rows(cfg: ModelConfig, batch: int) -> int:
    return batch * (cfg.tgt_len if cfg.family == "nmt" else cfg.seq_len) if cfg.family != "sentiment" else 0


def _output_layer(cfg: ModelConfig, batch: int, fmt: int, output_loss: str) -> float:
    rows, V, H = _output_rows(cfg, batch), cfg.vocab_size, cfg.hidden_size
    if not rows:
        return 0.0
    if output_loss == "full":
        return FULL_LOSS_BYTES_PER_LOGIT * rows * V
    if output_loss == "compiled":
        return fmt * rows * V
    chunk = min(rows, max(1, LOSS_CHUNK_ELEMENTS // V)) * V
    return 10 * chunk + 6 * V * H  # a chunk's logits, softmax and its low copy; W's low copy and float32 gradient


def overflows(fits: object) -> bool:
    """True for a candidate row marked as not fitting its GPU (`fits_memory` False); unknown (None, NaN) is not."""
    return fits is False or (isinstance(fits, (bool, int, float)) and fits == 0)


@dataclass(frozen=True)
class MemoryModel:
    """What a series of runs trains, as far as its memory goes: the model's shape and how it is trained."""

    config: ModelConfig
    precision: str = "fp32"
    engine: str = "single"
    output_loss: str = "auto"
    optimizer: str = "adam"

    def peak(self, batch_per_rank: int, device: str = "cuda") -> MemoryPrediction:
        return predict_peak(self.config, batch_per_rank, self.precision, self.engine, self.output_loss,
                            self.optimizer, device)


def predict_peak(cfg: ModelConfig, batch_per_rank: int, precision: str = "fp32", engine: str = "single",
                 output_loss: str = "full", optimizer: str = "adam", device: str = "cuda") -> MemoryPrediction:
    """The peak tensor bytes of one worker rank; `output_loss` as resolved for `device` (auto: compiled
    on a GPU, full on a CPU)."""
    if output_loss not in OUTPUT_LOSSES:
        raise ValueError(f"unknown output loss {output_loss!r}")
    if output_loss == "auto":
        output_loss = "compiled" if device == "cuda" else "full"
    fmt = FORMAT_BYTES[precision]
    P = parameter_count(cfg)
    state = P * (4 + 4 + (8 if optimizer == "adam" else 4))  # weights, gradients, optimizer moments
    state += P * 4 if known_fact(engine, "gradient_copy") else 0  # DDP's buckets: a second copy of the gradients
    state += P * 2 if precision != "fp32" else 0  # autocast's low-precision copy of the weights
    return MemoryPrediction(state, _activations(cfg, batch_per_rank, fmt, device),
                            _output_layer(cfg, batch_per_rank, fmt, output_loss),
                            CPU_RUNTIME_BYTES if device == "cpu" else 0.0)
