"""A training step's forward and backward as one CUDA graph (`--cuda-graph`, issue 36).

Why: on a GPU an LSTM step is thousands of small kernels (cuDNN runs each layer's recurrence as one or
more kernels per time step: nmt-seed's batch-360 step launches ~5,000), and the host cannot launch them
as fast as the GPU runs them. On an H200 the GPU was busy 37 ms of a 51 ms step; the same forward and
backward captured once and replayed took 33 ms against 59 ms eagerly (docs/benchmarks.md). A replay
launches the whole recorded work with one call.

What a graph needs, and so when the trainer uses one (`usable`): a CUDA device; the same tensor shapes
every step (the graph replays fixed addresses: inputs are copied into tensors it owns, and a batch of
another shape runs eagerly); no host synchronisation inside (the loss is read after the replay); no
gradient exchange inside the backward (DDP's and Horovod's hooks, the parameter server's push: those
engines run eagerly); no fp16 loss scaling (its skip-on-overflow is a host decision).

The optimizer, gradient clipping, the noise probe and validation stay eager, after the replay, on the
gradients the graph wrote: the parameters are updated in place, so the graph always reads the current
weights. Forward and backward are one replay, so their times are recorded together as `forward_s` with
`backward_s` null and `graphed: true`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from scalelab.train.engines import Engine

GRAPH_MODES = ("auto", "off")
EAGER_STEPS_FIRST = 2  # eager steps before capturing: cuDNN's plans, compiled kernels and workspaces exist


def why_not(mode: str, device: torch.device, engine: Engine, precision: str, rnn: str, slowdown: float) -> str | None:
    """None when this rank's steps can be captured, else why not (recorded in the start record)."""
    if mode == "off":
        return "--cuda-graph off"
    if device.type != "cuda":
        return "not on a GPU"
    if not engine.graphable():
        return f"{engine.name} exchanges gradients inside the backward"
    if precision == "fp16":
        return "fp16's gradient scaler decides on the host"
    if rnn != "fused":
        return "the stepwise RNN is not captured"
    if slowdown != 1.0:
        return "--emulate-slowdown times the forward on the host"
    return None


def _signature(inputs: dict[str, torch.Tensor]) -> tuple:
    return tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(inputs.items()))


class StepGraph:
    """Forward and backward of `model` on one input shape, captured after `EAGER_STEPS_FIRST` eager steps.

    `forward_backward(inputs)` returns the loss tensor (the graph's own, overwritten by the next replay),
    or None when this step must run eagerly (too early, another shape, or capture failed: `note` says why).
    """

    def __init__(self, model: torch.nn.Module, autocast: Callable[[], Any]) -> None:
        """`autocast`: the precision's autocast context with its weight cache off."""
        self.model, self.autocast = model, autocast
        self.eager_steps = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: dict[str, torch.Tensor] = {}
        self.loss: torch.Tensor | None = None
        self.shape: tuple | None = None
        self.captured_at: int | None = None
        self.failed = False  # capturing failed: every step runs eagerly
        self.note: str | None = None  # what the step record says about it, once

    def forward_backward(self, inputs: dict[str, torch.Tensor], step: int) -> torch.Tensor | None:
        if self.failed:
            return None
        if self.graph is None:
            if self.eager_steps < EAGER_STEPS_FIRST:
                self.eager_steps += 1
                return None
            self._capture(inputs, step)
            if self.graph is None:
                return None
        elif _signature(inputs) != self.shape:
            return None
        for name, value in inputs.items():
            self.static[name].copy_(value, non_blocking=True)
        self.graph.replay()
        return self.loss

    def _step(self) -> torch.Tensor:
        with self.autocast():
            loss = self.model(**self.static)
        loss.backward()
        return loss

    def _capture(self, inputs: dict[str, torch.Tensor], step: int) -> None:
        """Capture; a failure leaves the steps eager, with the reason in `note` (said once)."""
        self.static = {k: v.clone() for k, v in inputs.items()}
        self.shape = _signature(inputs)
        try:
            self.graph, self.captured_at = self._record(), step
        except Exception as exc:  # noqa: BLE001 - any capture failure: train on, eagerly
            self.failed = True
            self.note = f"capture failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); steps run eagerly"
            self.graph, self.static, self.loss = None, {}, None
            self.model.zero_grad(set_to_none=True)

    def _record(self) -> torch.cuda.CUDAGraph:
        """One warm-up forward and backward on a side stream (as torch.cuda.graphs asks), then the capture.
        The warm-up's gradients are thrown away; the replay that follows computes this step's."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.model.zero_grad(set_to_none=True)
            self._step()
        torch.cuda.current_stream().wait_stream(side)
        self.model.zero_grad(set_to_none=True)  # the captured backward makes the gradients it writes
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # the prefetch thread pins memory
            self.loss = self._step()
        return graph

    @property
    def owns_grads(self) -> bool:
        """Once captured, the gradients are the graph's tensors: an eager step zeroes them in place."""
        return self.graph is not None

    def take_note(self) -> str | None:
        """What went wrong capturing, once (for the step record), then None."""
        note, self.note = self.note, None
        return note
