"""scalelab trainer: LSTM models, data, distributed engines and per-step records."""

# The rank entry points' start and end (scalelab/core/quickexit.py, shared with torchrun's agent).
from scalelab.core.quickexit import collector_paused, exit_without_teardown

__all__ = ["collector_paused", "exit_without_teardown"]
