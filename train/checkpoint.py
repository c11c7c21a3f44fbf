"""Checkpoints: rank 0 writes, every rank reads.

A checkpoint holds everything needed for a resumed run to continue exactly where the uninterrupted
run would have been: model and optimizer state, the step counter, the training time spent so far,
the threshold bookkeeping and the RNG states (dropout). Data needs no position: batches are a pure
function of (seed, epoch, step), see train/data.py. Writes go to a temporary file then `os.replace`,
so a kill during the write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from core.errors import RecordError

CHECKPOINT_NAME = "checkpoint.pt"


def checkpoint_path(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINT_NAME


def save_checkpoint(run_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **state: Any) -> Path:
    path = checkpoint_path(run_dir)
    tmp = path.with_suffix(".tmp")
    payload = {
        "model": unwrap(model).state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        **state,
    }
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(run_dir: Path, map_location: torch.device | str = "cpu") -> dict[str, Any] | None:
    path = checkpoint_path(run_dir)
    if not path.exists():
        return None
    try:
        return torch.load(path, map_location=map_location, weights_only=False)
    except Exception as exc:  # a truncated or foreign file: say which and what to do
        raise RecordError(f"checkpoint {path} cannot be read ({exc}); delete it to start from scratch") from None


def restore_rng(payload: dict[str, Any]) -> None:
    torch.set_rng_state(payload["rng_cpu"])
    if payload.get("rng_cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(payload["rng_cuda"])


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model inside a DDP wrapper (checkpoints are engine-independent)."""
    return getattr(model, "module", model)
