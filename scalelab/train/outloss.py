"""The output layer and its loss, fused so the full float32 logits never exist (`--output-loss`).

Why: the NMT and LM models end in a projection to the vocabulary and a cross-entropy over it. Written
as two lines (`linear`, then `cross_entropy(logits.float())`), autocast runs the softmax over all
B x T x V logits in float32, forward and backward: on an H100, nmt-seed's 360 x 100 x 50,000 logits
took 23% of a bf16 step and 20 of its 23.4 GiB (shared/reference/gpu-h100-2026-11.md), and batch
1440 ran out of memory. Three ways to compute the same loss and gradients:

- ``full``: the two lines, as before.
- ``chunked``: a custom autograd function over chunks of rows: each chunk's logits are made in the
  training format, reduced to a log-sum-exp in float32 and dropped; the backward makes them again
  (one more projection GEMM) to form the gradient. Memory: one chunk's logits instead of all of them.
  Plain PyTorch, so it runs wherever PyTorch does.
- ``compiled``: the two lines under `torch.compile`: Inductor fuses the projection's epilogue, the
  float32 softmax and its backward into a few kernels (on the H100: 72 -> 50 ms a step, 23.4 -> 6.6
  GiB). Needs a working compiler (Triton for CUDA, a C++ compiler for the CPU); where compiling fails
  the run falls back to ``chunked`` and says why in its start record.
- ``auto`` (default): ``compiled`` on a GPU (1.22-1.46x a whole nmt-seed step on H100s), ``full`` on a
  CPU, where neither of the others was faster in steady state and compiling costs every rank seconds
  to minutes at its start (docs/benchmarks.md, "The output layer and its loss").

All three take the mean over the targets that are not padding, like `cross_entropy(ignore_index=PAD)`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from scalelab.core.presets import LOSS_CHUNK_ELEMENTS, OUTPUT_LOSSES, PAD_ID  # noqa: F401  (the names --output-loss takes)

CHUNK_ROWS_ENV = "SCALELAB_LOSS_CHUNK_ROWS"  # test aid: force small chunks on tiny models

LossFn = Callable[[Tensor, Tensor, Tensor | None, Tensor], Tensor]


def full_loss(hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor) -> Tensor:
    """Mean cross-entropy of `linear(hidden)` against `target`, the float32 logits all at once."""
    logits = F.linear(hidden, weight, bias)
    return F.cross_entropy(logits.float(), target, ignore_index=PAD_ID)


def chunk_rows(vocab: int) -> int:
    """Rows per chunk: LOSS_CHUNK_ELEMENTS logits (nmt-seed's 50,000 words: 335 rows), or what the test aid says."""
    forced = os.environ.get(CHUNK_ROWS_ENV)
    return max(1, int(forced)) if forced else max(1, LOSS_CHUNK_ELEMENTS // vocab)


def _low_format(device_type: str) -> torch.dtype | None:
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Forward: per chunk, logits in `dtype`, float32 log-sum-exp, summed loss; saves only the inputs and
    one float per row. Backward: per chunk, logits again, softmax - one-hot, then the three gradients."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, dtype: torch.dtype,
                rows: int) -> Tensor:
        device_type = hidden.device.type
        with torch.autocast(device_type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            b = bias.to(dtype) if bias is not None else None
            valid = target != PAD_ID
            lse = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            for lo in range(0, h.shape[0], rows):
                logits = F.linear(h[lo:lo + rows], w, b).float()
                lse[lo:lo + rows] = torch.logsumexp(logits, dim=-1)
                picked = logits.gather(1, target[lo:lo + rows, None]).squeeze(1)
                total += ((lse[lo:lo + rows] - picked) * valid[lo:lo + rows]).sum()
        ctx.save_for_backward(hidden, weight, bias, target, lse)
        ctx.dtype, ctx.rows, ctx.count = dtype, rows, valid.sum().clamp(min=1)
        return total / ctx.count

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        hidden, weight, bias, target, lse = ctx.saved_tensors
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(ctx.dtype), weight.to(ctx.dtype)
            b = bias.to(ctx.dtype) if bias is not None else None
            scale = (grad_out / ctx.count).float()
            grad_h = torch.empty_like(hidden)
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device)
            for lo in range(0, h.shape[0], ctx.rows):
                hi = min(lo + ctx.rows, h.shape[0])
                p = torch.exp(F.linear(h[lo:hi], w, b).float() - lse[lo:hi, None])  # softmax
                p.scatter_add_(1, target[lo:hi, None], torch.full((hi - lo, 1), -1.0, device=p.device))
                p *= ((target[lo:hi] != PAD_ID).float() * scale)[:, None]
                grad_b += p.sum(0)
                low = p.to(ctx.dtype)
                grad_h[lo:hi] = (low @ w).to(hidden.dtype)
                grad_w += (low.t() @ h[lo:hi]).float()
        return (grad_h, grad_w.to(weight.dtype), grad_b.to(bias.dtype) if bias is not None else None,
                None, None, None)


def chunked_loss(hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor) -> Tensor:
    """The same loss as `full_loss` without the float32 logits: see `_ChunkedLinearCrossEntropy`."""
    dtype = _low_format(hidden.device.type) or torch.float32
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, bias, target, dtype, chunk_rows(weight.shape[0]))


@functools.lru_cache(maxsize=None)
def compiled_loss() -> LossFn:
    """`full_loss` under `torch.compile` (one compiled function per process; shapes may vary)."""
    return torch.compile(full_loss, dynamic=None)


def resolve(name: str, device: torch.device) -> tuple[str, str | None]:
    """The implementation `name` means on `device`, and a note when it is not what was asked for.

    `compiled` is tried once on a tiny input before training starts, so a machine that cannot compile
    falls back to `chunked` at once and says why, instead of failing at the first step."""
    want = ("compiled" if device.type == "cuda" else "full") if name == "auto" else name
    if want != "compiled":
        return want, None
    try:
        h = torch.linspace(-1, 1, 32, device=device).reshape(4, 8).requires_grad_()  # no random draw: the run's
        w = torch.linspace(-1, 1, 128, device=device).reshape(16, 8).requires_grad_()  # seed decides its weights
        compiled_loss()(h, w, None, torch.tensor([1, 2, 0, 3], device=device)).backward()
    except Exception as exc:  # noqa: BLE001 - any compiler failure means: use the plain-PyTorch path
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        return "chunked", f"torch.compile failed on {device.type} ({type(exc).__name__}: {reason}); using chunked"
    return "compiled", None


LOSSES: dict[str, Callable[[], LossFn]] = {
    "full": lambda: full_loss,
    "chunked": lambda: chunked_loss,
    "compiled": compiled_loss,
}


def loss_function(impl: str) -> LossFn:
    """The loss function of a resolved implementation name (not `auto`)."""
    return LOSSES[impl]()
