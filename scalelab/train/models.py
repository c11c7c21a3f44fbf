"""LSTM models whose recurrent layers come in two interchangeable implementations.

Why two: the scaling study this tool grew from compared TensorFlow's fused cuDNN LSTM with
`dynamic_rnn`, which runs one LSTM cell per time step from a loop. Both are kept here so the same
experiment can be run with either and the difference in throughput measured:

- ``"fused"``: `torch.nn.LSTM` (cuDNN on a GPU). Padding is not packed away: padded positions are
  processed like any others and masked later (loss, attention, pooling). On variable-length input
  the reverse direction of a bidirectional layer therefore reads the padding first, like
  TensorFlow's `CudnnLSTM` without sequence lengths.
- ``"stepwise"``: `StepwiseLSTM`, a Python loop over time steps calling the `nn.LSTMCell` kernel,
  layer by layer and direction by direction. It honours sequence lengths: state stops at the last
  valid position and the reverse direction reads each sequence backwards from its own end.

Both store their parameters under `nn.LSTM`'s names and shapes (`weight_ih_l0`, `bias_hh_l1_reverse`,
...), so a checkpoint written with one loads into the other, parameter counts are identical, and on
fixed-length input the two compute the same function.

Every model's `forward(**batch.inputs)` returns the mean training loss, and `flops_per_step`
estimates the arithmetic of one training step for the throughput reports.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, _VF, nn

from scalelab.core.errors import SpecError
from scalelab.train.outloss import loss_function
from scalelab.core.presets import (  # noqa: F401  (the configs live in core; re-exported for the trainer)
    BOS_ID,
    EOS_ID,
    FAMILIES,
    NUM_SPECIALS,
    PAD_ID,
    PRESETS,
    RNN_KINDS,
    TRAIN_FLOPS_FACTOR,
    UNK_ID,
    ModelConfig,
    config_with_overrides,
)


def linear_flops(in_features: int, out_features: int, rows: int) -> float:
    """Forward FLOPs of `rows` vector-matrix products: one multiply-add counts as 2 FLOPs."""
    return 2.0 * rows * in_features * out_features


def lstm_matmul_flops(
    input_size: int,
    hidden_size: int,
    num_layers: int,
    steps: int,
    batch: int,
    bidirectional: bool = False,
) -> float:
    """Forward matmul FLOPs of a stacked LSTM over `steps` time steps.

    Per layer, direction and step the four gates cost ``2 * batch * (in + H) * 4H`` (input and
    recurrent matmuls); layers above the first take the ``D * H`` outputs of the layer below.
    Element-wise gate arithmetic is ignored: it is O(H), the matmuls O(H^2).
    """
    directions = 2 if bidirectional else 1
    total = 0.0
    for layer in range(num_layers):
        in_size = input_size if layer == 0 else directions * hidden_size
        total += directions * steps * linear_flops(in_size + hidden_size, 4 * hidden_size, batch)
    return total


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars: what the gradient exchange moves each step."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------------------------
# Recurrent layers
# --------------------------------------------------------------------------------------------


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The low-precision format autocast runs `device_type`'s ops in now, None when autocast is off."""
    if not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


class FusedLSTM(nn.LSTM):
    """`nn.LSTM` (batch_first) that accepts and ignores `lengths`, so models can call either RNN.

    Subclassing keeps `nn.LSTM`'s parameter names and its cuDNN kernel unchanged.

    Under autocast the layer runs in autocast's format itself, with autocast off around the call: on
    CUDA, autocast's own LSTM rule runs cuDNN's float16 kernels whatever format was asked for, so
    `--precision bf16` ran the recurrent layers in float16 with no loss scale (shared/reference/
    gpu-h100-2026-11.md). The float32 weights are cast per call, as autocast casts them; their
    gradients come back in float32.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        dropout: float = 0.0,
        bidirectional: bool = False,
    ) -> None:
        super().__init__(
            input_size, hidden_size, num_layers=num_layers, batch_first=True,
            dropout=dropout if num_layers > 1 else 0.0, bidirectional=bidirectional,
        )

    def forward(  # type: ignore[override]
        self,
        input: Tensor,
        hx: tuple[Tensor, Tensor] | None = None,
        lengths: Tensor | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        low = autocast_dtype(input.device.type)
        if low is None:
            return super().forward(input, hx)
        with torch.autocast(input.device.type, enabled=False):  # the call below runs in `low` itself
            weights = cast_flat([getattr(self, n) for n in self._flat_weights_names], low)
            if hx is None:
                zeros = input.new_zeros(self.num_layers * (2 if self.bidirectional else 1), input.size(0),
                                        self.hidden_size, dtype=low)
                hx = (zeros, zeros)
            output, h, c = _VF.lstm(input.to(low), (hx[0].to(low), hx[1].to(low)), weights, self.bias,
                                    self.num_layers, self.dropout, self.training, self.bidirectional,
                                    self.batch_first)
            return output, (h, c)


def cast_flat(params: list[Tensor], low: torch.dtype) -> list[Tensor]:
    """`params` in `low`: views of one new buffer laid out as their own float32 buffer is, where they
    share one; else each cast alone. Gradients come back to `params` in float32.

    On CUDA, `nn.LSTM` keeps its weights as views of one buffer in cuDNN's layout (flattened when the
    module moves to the GPU), and cuDNN takes weights laid out so as they are. Weights cast one by one
    it copies into a new buffer on every call; and handed to `nn.LSTM.forward` (as
    `functional_call` did) they make the module flatten them again, and its own float32 weights again
    at the next call (issue 36: cuDNN re-flattened the cast weights every step). One cast of the whole
    buffer, views at the same offsets, and `_VF.lstm` called directly: nothing is copied or flattened.
    """
    first = params[0]
    storage = first.untyped_storage()
    if all(p.untyped_storage().data_ptr() == storage.data_ptr() and p.is_contiguous() and p.dtype == first.dtype
           for p in params):
        return list(_CastFlat.apply(low, *params))
    return [p.to(low) for p in params]


class _CastFlat(torch.autograd.Function):
    """Forward: the whole float32 buffer behind `params` cast once, one view per parameter at its own
    offset. Backward: each view's gradient cast back to its parameter's format (slicing views in
    autograd instead would build a full-size zero buffer per parameter in the backward)."""

    @staticmethod
    def forward(ctx, low: torch.dtype, *params: Tensor) -> tuple[Tensor, ...]:
        first = params[0]
        size = first.untyped_storage().nbytes() // first.element_size()
        whole = first.new_empty(0).set_(first.untyped_storage(), 0, (size,))
        buffer = whole.to(low)
        ctx.formats = [p.dtype for p in params]
        return tuple(buffer[p.storage_offset():p.storage_offset() + p.numel()].view(p.shape) for p in params)

    @staticmethod
    def backward(ctx, *grads: Tensor) -> tuple[Tensor | None, ...]:
        return (None, *(None if g is None else g.to(f) for g, f in zip(grads, ctx.formats)))


def reverse_padded(x: Tensor, lengths: Tensor | None) -> Tensor:
    """Reverse each sequence of `x` [B, T, ...] within its own length; padding stays in place.

    Applying it twice gives `x` back. Without lengths it is a plain flip over time.
    """
    if lengths is None:
        return x.flip(1)
    T = x.size(1)
    steps = torch.arange(T, device=x.device).unsqueeze(0)  # [1, T]
    rev = lengths.to(x.device).unsqueeze(1) - 1 - steps  # [B, T]
    index = torch.where(rev >= 0, rev, steps.expand_as(rev))
    index = index.view(*index.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(1, index)


class StepwiseLSTM(nn.Module):
    """A multi-layer (bi)LSTM run one time step at a time, like TensorFlow's `dynamic_rnn`.

    Call signature and outputs match `nn.LSTM(batch_first=True)`: `forward(input [B,T,I],
    hx=(h0, c0) [L*D,B,H] or None)` returns `(output [B,T,D*H], (h_n, c_n))`, plus an optional
    `lengths` [B]: with it, state is carried unchanged past each sequence's end, outputs there are
    zero, `h_n`/`c_n` are the states at the last valid position, and the reverse direction starts
    at each sequence's own last token. Each step is `nn.LSTMCell`'s computation (`torch.lstm_cell`,
    gate order i, f, g, o); parameters are named and shaped as in `nn.LSTM`, so state dicts are
    interchangeable with `FusedLSTM`. Dropout, as in `nn.LSTM`, is applied between layers only.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        dropout: float = 0.0,
        bidirectional: bool = False,
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.dropout = dropout
        self.bidirectional = bidirectional
        self.batch_first = True
        directions = 2 if bidirectional else 1
        self._names: list[tuple[str, str, str, str]] = []
        for layer in range(num_layers):
            in_size = input_size if layer == 0 else directions * hidden_size
            for direction in range(directions):
                sfx = f"_l{layer}" + ("_reverse" if direction == 1 else "")
                names = (f"weight_ih{sfx}", f"weight_hh{sfx}", f"bias_ih{sfx}", f"bias_hh{sfx}")
                shapes = ((4 * hidden_size, in_size), (4 * hidden_size, hidden_size),
                          (4 * hidden_size,), (4 * hidden_size,))
                for name, shape in zip(names, shapes):
                    self.register_parameter(name, nn.Parameter(torch.empty(shape)))
                self._names.append(names)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Same initialisation, in the same order, as `nn.LSTM`: U(-1/sqrt(H), 1/sqrt(H))."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for names in self._names:
            for name in names:
                nn.init.uniform_(getattr(self, name), -bound, bound)

    def _run_direction(
        self, x: Tensor, h: Tensor, c: Tensor, names: tuple[str, str, str, str],
        valid: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        w_ih, w_hh, b_ih, b_hh = (getattr(self, n) for n in names)
        low = autocast_dtype(x.device.type)
        if low is not None:  # like FusedLSTM: the cells in autocast's format (they would stay float32)
            with torch.autocast(x.device.type, enabled=False):
                cast = [t.to(low) for t in (x, h, c, w_ih, w_hh, b_ih, b_hh)]
                return self._run_direction_in(*cast, valid)
        return self._run_direction_in(x, h, c, w_ih, w_hh, b_ih, b_hh, valid)

    @staticmethod
    def _run_direction_in(
        x: Tensor, h: Tensor, c: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor,
        valid: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        outputs = []
        for t in range(x.size(1)):
            h_new, c_new = torch.lstm_cell(x[:, t], (h, c), w_ih, w_hh, b_ih, b_hh)
            if valid is None:
                h, c = h_new, c_new
                outputs.append(h_new)
            else:
                m = valid[:, t : t + 1]
                h = torch.where(m, h_new, h)
                c = torch.where(m, c_new, c)
                outputs.append(h_new * m.to(h_new.dtype))
        return torch.stack(outputs, dim=1), h, c

    def forward(
        self,
        input: Tensor,
        hx: tuple[Tensor, Tensor] | None = None,
        lengths: Tensor | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        B, T, _ = input.shape
        directions = 2 if self.bidirectional else 1
        if hx is None:
            zeros = input.new_zeros(self.num_layers * directions, B, self.hidden_size)
            hx = (zeros, zeros)
        h0, c0 = hx
        valid = None
        if lengths is not None:
            lengths = lengths.to(input.device)
            valid = torch.arange(T, device=input.device).unsqueeze(0) < lengths.unsqueeze(1)
        layer_input = input
        h_n: list[Tensor] = []
        c_n: list[Tensor] = []
        for layer in range(self.num_layers):
            outs = []
            for direction in range(directions):
                idx = layer * directions + direction
                x = layer_input if direction == 0 else reverse_padded(layer_input, lengths)
                out, h, c = self._run_direction(x, h0[idx], c0[idx], self._names[idx], valid)
                if direction == 1:
                    out = reverse_padded(out, lengths)
                outs.append(out)
                h_n.append(h)
                c_n.append(c)
            layer_input = torch.cat(outs, dim=-1) if directions == 2 else outs[0]
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, self.dropout, training=True)
        return layer_input, (torch.stack(h_n), torch.stack(c_n))

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
            f"bidirectional={self.bidirectional}, dropout={self.dropout}"
        )


def make_lstm(
    rnn: str,
    input_size: int,
    hidden_size: int,
    num_layers: int = 1,
    dropout: float = 0.0,
    bidirectional: bool = False,
) -> nn.Module:
    """The one place an RNN implementation is chosen; unknown names are a spec error."""
    if rnn == "fused":
        return FusedLSTM(input_size, hidden_size, num_layers, dropout, bidirectional)
    if rnn == "stepwise":
        return StepwiseLSTM(input_size, hidden_size, num_layers, dropout, bidirectional)
    raise SpecError(f"unknown rnn implementation {rnn!r}: use one of {', '.join(RNN_KINDS)}")


def _length_mask(lengths: Tensor, max_len: int) -> Tensor:
    """[B, max_len] bool, true at valid positions."""
    return torch.arange(max_len, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


class Seq2Seq(nn.Module):
    """Encoder-decoder translation model with Luong ("general") attention.

    Encoder: embedding + (bi)LSTM; bidirectional outputs are projected 2H -> H. Decoder:
    embedding + LSTM from a zero state, attention over the encoder outputs (masked by
    `src_lengths`), `tanh(W_c [context; h])`, projection to the vocabulary. Without attention the
    decoder's initial hidden state (every layer) is the masked mean of the encoder outputs, so the
    decoder still sees the source. There is no input feeding, so the fused decoder stays one cuDNN
    call.
    """

    def __init__(self, cfg: ModelConfig, rnn: str = "fused") -> None:
        super().__init__()
        self.config = cfg
        self.rnn = rnn
        H = cfg.hidden_size
        self.src_embed = nn.Embedding(cfg.vocab_size, cfg.embed_size, padding_idx=PAD_ID)
        self.tgt_embed = nn.Embedding(cfg.vocab_size, cfg.embed_size, padding_idx=PAD_ID)
        self.encoder = make_lstm(rnn, cfg.embed_size, H, cfg.enc_layers, cfg.dropout,
                                 cfg.bidirectional)
        self.enc_proj = nn.Linear(2 * H, H, bias=False) if cfg.bidirectional else None
        self.decoder = make_lstm(rnn, cfg.embed_size, H, cfg.dec_layers, cfg.dropout)
        if cfg.attention:
            self.attn_score = nn.Linear(H, H, bias=False)
            self.attn_combine = nn.Linear(2 * H, H, bias=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.out = nn.Linear(H, cfg.vocab_size)

    def encode(self, src: Tensor, src_lengths: Tensor) -> Tensor:
        """Encoder outputs [B, S, H] (after the 2H -> H projection when bidirectional)."""
        memory, _ = self.encoder(self.drop(self.src_embed(src)), lengths=src_lengths)
        if self.enc_proj is not None:
            memory = self.enc_proj(memory)
        return memory

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        """Mean cross-entropy over the non-pad tokens of `tgt_out`."""
        cfg = self.config
        memory = self.encode(src, src_lengths)
        mask = _length_mask(src_lengths.to(src.device), src.size(1))  # [B, S]
        hx = None
        if not cfg.attention:
            weights = mask.to(memory.dtype).unsqueeze(-1)
            mean = (memory * weights).sum(1) / weights.sum(1).clamp(min=1.0)
            h0 = mean.unsqueeze(0).expand(cfg.dec_layers, -1, -1).contiguous()
            hx = (h0, torch.zeros_like(h0))
        dec_out, _ = self.decoder(self.drop(self.tgt_embed(tgt_in)), hx)
        if cfg.attention:
            scores = torch.bmm(dec_out, self.attn_score(memory).transpose(1, 2))  # [B, T, S]
            scores = scores.masked_fill(~mask.unsqueeze(1), torch.finfo(scores.dtype).min)
            context = torch.bmm(torch.softmax(scores, dim=-1), memory)
            dec_out = torch.tanh(self.attn_combine(torch.cat([context, dec_out], dim=-1)))
        hidden = self.drop(dec_out)
        return self.output_loss(hidden.reshape(-1, hidden.size(-1)), self.out.weight, self.out.bias, tgt_out.reshape(-1))

    def flops_per_step(self, batch_size: int) -> float:
        """Training FLOPs for `batch_size` full-length pairs (src_len x tgt_len), 3x forward."""
        cfg = self.config
        B, S, T, H = batch_size, cfg.src_len, cfg.tgt_len, cfg.hidden_size
        f = lstm_matmul_flops(cfg.embed_size, H, cfg.enc_layers, S, B, cfg.bidirectional)
        f += lstm_matmul_flops(cfg.embed_size, H, cfg.dec_layers, T, B)
        if cfg.bidirectional:
            f += linear_flops(2 * H, H, B * S)
        if cfg.attention:
            f += linear_flops(H, H, B * S)  # keys W_a h_s
            f += 2 * 2.0 * B * T * S * H  # scores and context
            f += linear_flops(2 * H, H, B * T)  # combine
        f += linear_flops(H, cfg.vocab_size, B * T)
        return TRAIN_FLOPS_FACTOR * f


class RNNLM(nn.Module):
    """Word-level LSTM language model: predict `targets[t]` from `tokens[:t+1]`."""

    def __init__(self, cfg: ModelConfig, rnn: str = "fused") -> None:
        super().__init__()
        self.config = cfg
        self.rnn = rnn
        self.embed = nn.Embedding(cfg.vocab_size, cfg.embed_size, padding_idx=PAD_ID)
        self.lstm = make_lstm(rnn, cfg.embed_size, cfg.hidden_size, cfg.num_layers, cfg.dropout)
        self.drop = nn.Dropout(cfg.dropout)
        self.out = nn.Linear(cfg.hidden_size, cfg.vocab_size)

    def forward(self, tokens: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy over the non-pad targets."""
        out, _ = self.lstm(self.drop(self.embed(tokens)))
        hidden = self.drop(out)
        return self.output_loss(hidden.reshape(-1, hidden.size(-1)), self.out.weight, self.out.bias, targets.reshape(-1))

    def flops_per_step(self, batch_size: int) -> float:
        """Training FLOPs for `batch_size` sequences of `seq_len` tokens, 3x forward."""
        cfg = self.config
        f = lstm_matmul_flops(cfg.embed_size, cfg.hidden_size, cfg.num_layers, cfg.seq_len,
                              batch_size)
        f += linear_flops(cfg.hidden_size, cfg.vocab_size, batch_size * cfg.seq_len)
        return TRAIN_FLOPS_FACTOR * f


class SentimentClassifier(nn.Module):
    """LSTM document classifier.

    Features: the forward direction's output at each document's last valid token (`lengths - 1`),
    concatenated, when bidirectional, with the reverse direction's output at position 0 (where the
    reverse pass ends). Reading the forward output at `lengths - 1` is exact for both RNN
    implementations, because the forward pass has not yet seen the padding there.
    """

    def __init__(self, cfg: ModelConfig, rnn: str = "fused") -> None:
        super().__init__()
        self.config = cfg
        self.rnn = rnn
        self.embed = nn.Embedding(cfg.vocab_size, cfg.embed_size, padding_idx=PAD_ID)
        self.lstm = make_lstm(rnn, cfg.embed_size, cfg.hidden_size, cfg.num_layers, cfg.dropout,
                              cfg.bidirectional)
        self.drop = nn.Dropout(cfg.dropout)
        directions = 2 if cfg.bidirectional else 1
        self.classifier = nn.Linear(directions * cfg.hidden_size, cfg.num_classes)

    def forward(self, tokens: Tensor, lengths: Tensor, labels: Tensor) -> Tensor:
        """Mean cross-entropy over the documents of the batch."""
        H = self.config.hidden_size
        out, _ = self.lstm(self.drop(self.embed(tokens)), lengths=lengths)
        last = (lengths.to(out.device) - 1).clamp(min=0)
        index = last.view(-1, 1, 1).expand(-1, 1, H)
        features = out[..., :H].gather(1, index).squeeze(1)
        if self.config.bidirectional:
            features = torch.cat([features, out[:, 0, H:]], dim=-1)
        logits = self.classifier(self.drop(features))
        return F.cross_entropy(logits.float(), labels)

    def flops_per_step(self, batch_size: int) -> float:
        """Training FLOPs for `batch_size` documents of `seq_len` tokens, 3x forward."""
        cfg = self.config
        f = lstm_matmul_flops(cfg.embed_size, cfg.hidden_size, cfg.num_layers, cfg.seq_len,
                              batch_size, cfg.bidirectional)
        directions = 2 if cfg.bidirectional else 1
        f += linear_flops(directions * cfg.hidden_size, cfg.num_classes, batch_size)
        return TRAIN_FLOPS_FACTOR * f


_MODELS: dict[str, type[nn.Module]] = {
    "nmt": Seq2Seq,
    "rnnlm": RNNLM,
    "sentiment": SentimentClassifier,
}


def build_model(cfg: ModelConfig, rnn: str = "fused", output_loss: str = "full") -> nn.Module:
    """The model for `cfg.family` with the chosen RNN implementation ("fused" or "stepwise") and output
    loss (a resolved name of scalelab/train/outloss.py: full, chunked or compiled; the vocabulary
    models use it, the classifier's two-class output has no large logits to fuse)."""
    if rnn not in RNN_KINDS:
        raise SpecError(f"unknown rnn implementation {rnn!r}: use one of {', '.join(RNN_KINDS)}")
    model = _MODELS[cfg.family](cfg, rnn)
    model.output_loss = loss_function(output_loss)
    return model


def copy_weights(src: nn.Module, dst: nn.Module) -> None:
    """Copy every parameter of `src` into `dst` (e.g. fused -> stepwise: the names coincide)."""
    dst.load_state_dict(src.state_dict())
