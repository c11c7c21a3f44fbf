"""One rank per GPU: the check that two ranks never share a device.

Why here: NCCL cannot run two ranks of one communicator on one GPU ("Duplicate GPU detected",
"ncclCommInitRank failed: invalid usage"), and the user would read torchrun's or horovodrun's failure
dump instead of what to change. The local launcher sees the machine its ranks run on and checks before
any rank starts; on Slurm, Kubernetes and AWS only the rank sees its node, so every rank checks again
(`scalelab.train.engines.Engine.device`) and reports the same message through its error record.
"""

from __future__ import annotations

import os

from scalelab.core.errors import SpecError

# Set by a launcher that gives every rank its own GPU through CUDA_VISIBLE_DEVICES (the Slurm rank wrapper,
# which checked the node's GPUs against its ranks first): such a rank sees one GPU, cuda:0, and is right to.
GPU_PINNED_ENV = "SCALELAB_GPU_PINNED"


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


def check_gpus(ranks: int, device: str, where: str = "this machine", flag: str = "--gpus-per-node") -> None:
    """Raise the one SpecError when `device` (auto, cuda) puts `ranks` ranks on fewer visible GPUs."""
    if device == "cpu":
        return
    import torch  # only the launcher's check and the ranks pay for the import

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    problem = gpu_shortage(ranks, gpus, where, flag)
    if problem:
        raise SpecError(problem)
