"""`from scalelab import track`: the recording API of your own training script (issue 34).

    track.step(items=n, loss=x)       after each optimizer step
    track.unit("tokens")              what `items` counts (default samples)
    track.validation(loss=v)          True once --loss-threshold is reached
    track.should_stop()               True after SIGTERM / `launch cancel` / a pre-emption notice
    track.checkpoint_dir, track.resumed

Every call is a no-op outside `launch run --script ...`. The implementation (no PyTorch) is
scalelab/train/track.py; this module only names it where a user looks for it.
"""

from __future__ import annotations

from typing import Any

from scalelab.train import track as _track
from scalelab.train.track import TrackError, active, should_stop, step, unit, validation

__all__ = ["step", "unit", "validation", "should_stop", "active", "checkpoint_dir", "resumed", "TrackError"]


def __getattr__(name: str) -> Any:
    """`checkpoint_dir` and `resumed`, as the runner set them (read when asked, not copied at import)."""
    if name in ("checkpoint_dir", "resumed"):
        return getattr(_track, name)
    raise AttributeError(f"module 'scalelab.track' has no attribute {name!r}")
