"""One rank per GPU: the check that two ranks never share a device.

Why here: NCCL cannot run two ranks of one communicator on one GPU ("Duplicate GPU detected",
"ncclCommInitRank failed: invalid usage"), and the user would read torchrun's or horovodrun's failure
dump instead of what to change. The local launcher sees the machine its ranks run on and checks before
any rank starts; on Slurm, Kubernetes and AWS only the rank sees its node, so every rank checks again
(`scalelab.train.engines.Engine.device`) and reports the same message through its error record.
"""

from __future__ import annotations

import os
import sys

from scalelab.core.errors import SpecError

# Set by a launcher that gives every rank its own GPU through CUDA_VISIBLE_DEVICES (the Slurm rank wrapper,
# which checked the node's GPUs against its ranks first): such a rank sees one GPU, cuda:0, and is right to.
GPU_PINNED_ENV = "SCALELAB_GPU_PINNED"

# A GPU PyTorch can see needs its driver's device node: NVIDIA's (/dev/nvidiactl, /dev/nvidiaN, also inside
# containers), AMD ROCm's (/dev/kfd) or WSL's (/dev/dxg). Where none exists, the count is 0 without
# importing PyTorch, which costs the launcher 1-2 s of every `launch` on a CPU machine. A process that
# has imported PyTorch already (a rank) asks it.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")


def gpu_shortage(ranks: int, gpus: int, where: str = "this machine", flag: str = "--gpus-per-node") -> str | None:
    """The one message for `ranks` GPU ranks on `where`, which has `gpus` visible GPUs; None when they fit.

    A machine without GPUs is not short: `--device auto` runs the ranks there as CPU processes.
    """
    if gpus <= 0 or ranks <= gpus:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    return (
        f"{ranks} ranks would run on {where}, but only {gpus} GPU{'s' if gpus != 1 else ''} "
        f"{'are' if gpus != 1 else 'is'} visible there{seen}, and two ranks cannot share one GPU; "
        f"use {flag} {gpus} (one rank per GPU), or --device cpu to run the {ranks} ranks as processes on the CPU"
    )


def no_gpu(where: str = "this machine") -> str:
    """The one message for `--device cuda` where PyTorch sees no GPU: the local launcher says it before any rank
    starts (`check_gpus`), a rank on a node the launcher cannot see says it from there."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    return f"--device cuda was asked for, but PyTorch sees no GPU on {where}{seen}; use --device cpu"


def check_gpus(ranks: int, device: str, where: str = "this machine", flag: str = "--gpus-per-node") -> None:
    """Raise the one SpecError when `device` (auto, cuda) puts `ranks` ranks on fewer visible GPUs, or `cuda`
    asks for a GPU where there is none (it was said by the ranks once started: exit 1, a run directory left)."""
    if device == "cuda" and visible_gpus() == 0:
        raise SpecError(no_gpu(where))
    if device == "cpu" or ranks <= 1:  # one rank always fits: on its GPU, or on the CPU where there is none
        return
    problem = gpu_shortage(ranks, visible_gpus(), where, flag)
    if problem:
        raise SpecError(problem)


def gpu_driver_present() -> bool:
    """Whether a GPU driver's device node exists here; without one no GPU is visible to PyTorch."""
    return any(os.path.exists(node) for node in GPU_DEVICE_NODES)


def visible_gpus() -> int:
    """The GPUs PyTorch sees here (CUDA_VISIBLE_DEVICES applies); PyTorch is imported only where a driver is."""
    if "torch" not in sys.modules and not gpu_driver_present():
        return 0
    import torch  # only a launcher on a GPU machine and the ranks pay for the import

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
