"""The unit of work that flows from data to model.

A `Batch` carries the model's keyword inputs plus the two counts that throughput is measured in:
`samples` (sentences / sequences / documents) and `words` (target words for translation, predicted
tokens for the language model, input tokens for the classifier). Counting is done once, here, so the
trainer and the reports never have to know which model produced a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Batch:
    inputs: dict[str, torch.Tensor]
    samples: int
    words: int
    meta: dict = field(default_factory=dict)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        """Move every tensor to `device` (non_blocking pays off only from pinned host memory)."""
        moved = {k: v.to(device, non_blocking=non_blocking) for k, v in self.inputs.items()}
        return Batch(moved, self.samples, self.words, self.meta)

    def pin_memory(self) -> "Batch":
        return Batch({k: v.pin_memory() for k, v in self.inputs.items()}, self.samples, self.words, self.meta)
