"""Memory a rank used, and the one message for running out of it.

What is recorded (`mem_peak_bytes` in every step record, `mem_kind` saying which measure):
- on a GPU, `torch.cuda.max_memory_allocated`: the tensors PyTorch's allocator handed out at their
  peak. It leaves out the CUDA context and the allocator's cached but unused blocks, so it is what a
  model, a batch and a precision need, comparable across machines, and what the planner predicts
  (scalelab/costs/memory.py);
- on a CPU, the process's peak resident set (`getrusage`'s ru_maxrss): the whole process, Python and
  PyTorch's libraries included, because that is what a machine's memory must hold. `mem_base_bytes`
  in the start record is the resident set before the model was built, so the training's own share
  (peak - base) can be compared with a prediction.
"""

from __future__ import annotations

import re
import resource
import sys

import torch

MEM_KIND = {"cuda": "cuda_max_allocated", "cpu": "max_rss"}


def current_rss_bytes() -> int:
    """The process's resident set now (Linux /proc; the peak so far elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, IndexError, ValueError):
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """The process's peak resident set: ru_maxrss is KiB on Linux, bytes on macOS."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def peak_bytes(device: torch.device) -> int:
    """This rank's peak memory so far on `device` (see the module docstring for what each counts)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return peak_rss_bytes()


def memory_fields(device: torch.device) -> dict[str, object]:
    """The step record's memory fields."""
    return {"mem_peak_bytes": peak_bytes(device), "mem_kind": MEM_KIND.get(device.type, "max_rss")}


_GIB = 1024**3
_ASKED = re.compile(r"[Tt]ried to allocate ([\d.]+) ([KMGT]i?B|bytes)")
_FREE = re.compile(r"([\d.]+) ([KMGT]i?B|bytes) is free")
_UNIT = {"bytes": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def _bytes(match: re.Match[str] | None) -> float | None:
    return float(match.group(1)) * _UNIT[match.group(2)] if match else None


def oom_message(exc: BaseException, batch_per_rank: int, precision: str, device: torch.device,
                step: int | None = None) -> str:
    """One line for a CUDA out-of-memory error: the batch per rank, what was asked and free, the fixes.

    PyTorch's own message is a paragraph about `PYTORCH_CUDA_ALLOC_CONF` under a traceback; the user
    needs to know which of their flags to change.
    """
    text = str(exc)
    asked, free = _bytes(_ASKED.search(text)), _bytes(_FREE.search(text))
    where = f"{device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" and torch.cuda.is_available() else "")
    total = _total_gib(device)
    parts = [f"out of memory on {where}" + (f" at step {step}" if step else "")
             + f" with a batch of {batch_per_rank} per rank in {precision}"]
    if asked is not None:
        parts.append(f"it asked for {asked / _GIB:.2f} GiB more" + (f" with {free / _GIB:.2f} GiB free" if free is not None else "")
                     + (f" of {total:.1f} GiB" if total else ""))
    fixes = ["a smaller --batch-per-worker (or the same --global-batch over more ranks: --gpus-per-node/--nodes)"]
    if precision == "fp32":
        fixes.append("--precision bf16 (half the activations)")
    fixes.append("`launch memory --batch-per-worker N` to see the predicted peak per rank on each GPU type")
    return "; ".join(parts) + "; fixes: " + ", or ".join(fixes)


def _total_gib(device: torch.device) -> float | None:
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(device).total_memory / _GIB


def is_out_of_memory(exc: BaseException) -> bool:
    """True for PyTorch's out-of-memory errors (torch.OutOfMemoryError, and the RuntimeError older code raises)."""
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(exc, oom)) or (isinstance(exc, RuntimeError) and "out of memory" in str(exc))
