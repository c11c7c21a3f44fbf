"""Checkpoints: rank 0 writes, every rank reads.

A checkpoint holds everything a resumed run needs to continue exactly where the uninterrupted run
would have been: model and optimizer state (Adam's step count and moments), the step counter (which
fixes the LR schedule position and, with the batch shares, the data position: batches are a pure
function of (seed, epoch, step), see scalelab/train/data.py), the training time spent so far, the threshold
bookkeeping, every rank's RNG states (dropout; ranks with different batch shares draw different
amounts, so one rank's state would not do for the others) and, under fp16, the gradient scaler's
state (`amp`: the loss scale and its growth counter).

Why only tensors and plain values: checkpoints are loaded with `weights_only=True`, so a file planted
in a run directory is data, never code. A pickled object (a class, a numpy array, a function) is
refused with a message instead of being run.

Why the identity: a checkpoint written by another spec (another model, seed, batch, layout or
precision) would load into the wrong run, or fail deep inside `load_state_dict`; it is refused up
front, naming the fields that differ.

Why bytes first: `torch.save` reports a full disk as an opaque RuntimeError and leaves a truncated
file behind. The checkpoint is serialised in memory, then written with plain file I/O to a temporary
file that is synced and renamed over the previous checkpoint; a failed write removes the temporary
file, keeps the previous checkpoint and says which filesystem is full.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalelab.core.errors import RecordError, shell_word
from scalelab.core.spec import SAVED_SPEC_PRECISION, Spec
from scalelab.core.trajectory import accepted_identity_changes
from scalelab.core.writes import check_inside, free_bytes, mount_point, open_inside, what_it_is

if TYPE_CHECKING:  # imported where used: the launcher checks a checkpoint (`checkpoint_problem`) without PyTorch
    import torch

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT = 2  # 1: before identity and per-rank RNG states (loaded with weights_only=False)
# Identity fields added after format 2 was fixed, with what a checkpoint that lacks them was written with.
IDENTITY_BEFORE = {"precision": SAVED_SPEC_PRECISION}


class CheckpointError(RecordError):
    """A checkpoint cannot be written, or is not one this run may resume from."""


def checkpoint_path(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINT_NAME


def identity(spec: Spec, global_batch: int) -> dict[str, Any]:
    """The settings a checkpoint must share with the run that resumes from it (plain values)."""
    return {
        "model": spec.model, "rnn": spec.rnn, "model_args": dict(spec.model_args), "optimizer": spec.optimizer,
        "seed": spec.seed, "data": spec.data.kind, "global_batch": global_batch, "workers": spec.workers,
        "precision": spec.precision,
        **({"ranks": spec.world} if spec.world != spec.workers else {}),  # ps server ranks: their RNG states
    }


# ---- RNG states --------------------------------------------------------------------------------


def rng_state() -> list[torch.Tensor]:
    """This process's RNG states as uint8 tensors: the CPU generator, then this rank's GPU, if any."""
    import torch

    states = [torch.get_rng_state()]
    if torch.cuda.is_available():
        states.append(torch.cuda.get_rng_state())
    return states


def set_rng_state(states: list[torch.Tensor]) -> None:
    """Set this process's generators. The states are copied first: `torch.set_rng_state` reads a view
    into a larger storage (as loaded from a gathered, saved tensor) from the storage's start, and crashes."""
    import torch

    torch.set_rng_state(states[0].cpu().clone())
    if len(states) > 1 and torch.cuda.is_available():
        torch.cuda.set_rng_state(states[1].cpu().clone())


# ---- save ----------------------------------------------------------------------------------------


def save_checkpoint(run_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **state: Any) -> Path:
    """Write model, optimizer and `state` (plain values: step, rng, ...) atomically; see the module doc."""
    import torch

    path = checkpoint_path(run_dir)
    payload = {"format": FORMAT, "model": unwrap(model).state_dict(), "optimizer": optimizer.state_dict(), **state}
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    write_atomically(path, buffer.getbuffer())
    return path


def write_atomically(path: Path, data: bytes | memoryview) -> None:
    """Replace `path` by `data`, or leave it as it was and raise CheckpointError saying why."""
    tmp = path.with_suffix(".tmp")
    check_inside(path.parent, path)  # a linked checkpoint.pt is refused too (the rename would replace the link)
    try:
        fd = open_inside(path.parent, tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)  # never through a planted link
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())  # the rename must not publish a file whose blocks are not on disk
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(_write_failure(path, exc, len(data))) from None


def _write_failure(path: Path, exc: OSError, size: int) -> str:
    kept = "the previous checkpoint is kept" if path.exists() else "no earlier checkpoint exists"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"checkpoint {path} could not be written: the filesystem at {mount_point(path.parent)} is full "
            f"({free_bytes(path.parent)} free, {size:,} bytes needed); {kept}. Free space there and continue with "
            f"`launch resume`, or run with --runs-dir on a filesystem with room"
        )
    return f"checkpoint {path} could not be written ({exc.strerror or exc}); {kept}"


# ---- load and restore ----------------------------------------------------------------------------


def load_checkpoint(run_dir: Path, expect: dict[str, Any], map_location: torch.device | str = "cpu") -> dict[str, Any] | None:
    """The checkpoint of RUN_DIR (None when there is none), refused unless it is plain data of this spec."""
    ckpt = read_checkpoint(run_dir, map_location)
    if ckpt is not None:
        accepted = accepted_identity_changes(run_dir)  # `launch resume --allow-changed` (issue #37)
        check_identity(checkpoint_path(run_dir), ckpt, {k: v for k, v in expect.items() if k not in accepted})
        found = ckpt.get("identity", {})
        if accepted.get("optimizer") and found.get("optimizer") != expect.get("optimizer"):
            ckpt.pop("optimizer", None)  # another optimizer's state does not carry over: it starts afresh
        if accepted.get("global_batch") and found.get("global_batch") != expect.get("global_batch"):
            ckpt.pop("shares", None)  # each rank's share of the old batch: the new batch is split afresh
    return ckpt


def read_checkpoint(run_dir: Path, map_location: torch.device | str = "cpu") -> dict[str, Any] | None:
    """The checkpoint of RUN_DIR as stored (None when there is none), refused (CheckpointError, one line)
    when it is a link, truncated, damaged or more than plain data. The launcher reads it too, before a
    resume of a completed run changes anything."""
    import torch

    path = checkpoint_path(run_dir)
    if not os.path.lexists(path):
        return None
    check_inside(run_dir, path)  # a link to a checkpoint elsewhere is refused, not loaded
    problem = checkpoint_problem(path, full=False)
    if problem:
        raise CheckpointError(f"checkpoint {path} {problem}; {damaged_advice(run_dir)}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL (\S+)", str(exc))
        what = f"it calls {found.group(1)}" if found else "a pickled object"
        raise CheckpointError(
            f"checkpoint {path} holds more than tensors and plain values ({what}); loading it could run code, "
            "so it was not loaded. Delete it unless you know where it came from"
        ) from None
    except Exception as exc:  # noqa: BLE001 - a damaged archive fails in many ways: say which file and what to do
        raise CheckpointError(f"checkpoint {path} cannot be read ({exc}); {damaged_advice(run_dir)}") from None
    return ckpt


def checkpoint_problem(path: Path, full: bool = True) -> str:
    """What makes the file `path` no checkpoint ('is a directory, not a checkpoint file', 'is truncated or not
    a checkpoint'); '' when it looks whole. Without PyTorch: its zip archive is read through and each
    member's checksum compared (`full`), which finds a cut or damaged file without loading it. Why: `launch
    resume` checks the checkpoint before any rank starts, so that a damaged one is one refusal that changes
    nothing, not a run started, failed (a CANCELLED run recorded FAILED) and an advice that led to another
    refusal; a directory named checkpoint.pt was called "truncated"."""
    kind = what_it_is(path)
    if kind != "a regular file":
        return f"is {kind}, not a checkpoint file"
    try:
        if not zipfile.is_zipfile(path):
            return "is truncated or not a checkpoint"
        if full:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
            if bad is not None:
                return f"is damaged (its part {bad} does not match its checksum)"
    except (OSError, zipfile.BadZipFile, EOFError, ValueError, RuntimeError) as exc:
        return f"cannot be read ({exc})"
    return ""


def damaged_advice(run_dir: Path) -> str:
    """What to do about a damaged checkpoint of `run_dir`: advice that works whether or not the run recorded
    steps. Why not "delete it to start from scratch": a run with steps and no checkpoint is refused by
    `launch resume` (its steps would be trained and recorded twice), so that advice led to another refusal."""
    return f"restore it from a copy to continue the run, or {new_run_advice(run_dir)}"


def new_run_advice(run_dir: Path, what: str = "the same spec") -> str:
    return f"start a new run of {what}: launch run --spec {shell_word(Path(run_dir) / 'spec.json')}"


def check_identity(path: Path, ckpt: Any, expect: dict[str, Any]) -> None:
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(
            f"checkpoint {path} was written by another version of scalelab (format "
            f"{ckpt.get('format', 1) if isinstance(ckpt, dict) else '?'}, this one reads {FORMAT}); "
            f"{damaged_advice(path.parent)}"
        )
    found = {**IDENTITY_BEFORE, **ckpt.get("identity", {})}
    differ = [f"{k} {expect[k]!r} here, {found.get(k)!r} in the checkpoint" for k in expect if found.get(k) != expect[k]]
    if differ:
        raise CheckpointError(
            f"checkpoint {path} belongs to a different run ({'; '.join(differ)}); resume the run it was written "
            f"by, or {new_run_advice(path.parent)}"
        )


def restore(ckpt: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int,
            run_dir: Path | None = None) -> None:
    """Model, optimizer (after any engine wrapping: Horovod's wrapper builds a fresh optimizer) and RNG. A model
    that does not fit is one line summarising its tensors (`shape_changes`), not PyTorch's line per tensor, with
    advice that works: "delete it to start from scratch" was refused next (steps recorded, no checkpoint)."""
    saved = ckpt.get("model") if isinstance(ckpt.get("model"), dict) else {}
    differ = shape_changes(_shapes(saved), _shapes(unwrap(model).state_dict()))
    advice = (f"{new_run_advice(run_dir, 'the model its spec.json now describes')}, or put back the model settings "
              "the checkpoint was written with and resume" if run_dir else
              "resume with the spec the checkpoint was written with, or start a new run")
    try:
        if differ:
            raise ValueError(differ)
        unwrap(model).load_state_dict(ckpt["model"])
        if "optimizer" in ckpt:  # absent: the optimizer was changed at this resume (--allow-changed optimizer)
            optimizer.load_state_dict(ckpt["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:
        said = " ".join(str(exc).split())
        raise CheckpointError(f"the checkpoint does not fit this model or optimizer ({said[:300]}); {advice}") from None
    set_rng_state(ckpt["rng"][rank])


def _shapes(state: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(value.shape) for name, value in state.items() if hasattr(value, "shape")}


def shape_changes(saved: dict[str, tuple[int, ...]], here: dict[str, tuple[int, ...]], shown: int = 2) -> str:
    """'' when the tensors `saved` (a checkpoint's, name -> shape) fit those `here`; else one line: how many
    differ in shape, are missing or are extra, the first `shown` of each named. Why a summary: PyTorch's
    message is a line per tensor (16 for nmt-tiny with another hidden size), ending in the advice."""
    def listed(names: list[str], what: Any) -> str:
        more = f", and {len(names) - shown} more" if len(names) > shown else ""
        return ", ".join(what(n) for n in names[:shown]) + more

    def dims(shape: tuple[int, ...]) -> str:
        return "[" + ", ".join(map(str, shape)) + "]"

    resized = [n for n in saved if n in here and saved[n] != here[n]]
    missing, extra = [n for n in here if n not in saved], [n for n in saved if n not in here]
    parts = []
    if resized:
        parts.append(f"{len(resized)} of its {len(saved)} tensors have other shapes, saved -> now (" +
                     listed(resized, lambda n: f"{n} {dims(saved[n])} -> {dims(here[n])}") + ")")
    if missing:
        parts.append(f"{len(missing)} tensors of the model are not in it ({listed(missing, str)})")
    if extra:
        parts.append(f"{len(extra)} of its tensors are not in the model ({listed(extra, str)})")
    return "; ".join(parts)


def model_shapes(model: str, model_args: dict[str, Any], rnn: str) -> dict[str, tuple[int, ...]]:
    """The tensors (name -> shape) of the built-in model `model` with `model_args` and `rnn`, built on PyTorch's
    meta device (no memory, no data): what the launcher compares before a resume that changes the model."""
    import torch

    from scalelab.train.models import PRESETS, build_model, config_with_overrides

    with torch.device("meta"):
        built = build_model(config_with_overrides(PRESETS[model], model_args), rnn)
    return _shapes(built.state_dict())


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model inside a DDP wrapper (checkpoints are engine-independent)."""
    return getattr(model, "module", model)
