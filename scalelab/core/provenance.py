"""Where the numbers came from: host, CPU and GPU model, software versions, source commit.

Why recorded by the ranks and not looked up by the report: a report is often made on another machine
(a laptop, CI) months later, and what matters is the machine and software that ran. So every rank's
`start` record carries its host, CPU and GPU model (ranks of one run may sit on different machines),
and rank 0's the versions and the git commit of the scalelab source it ran (docs/records.md); the
HTML report reads them back. Standard library only (core has no PyTorch): the rank passes in its GPU
model and PyTorch version.
"""

from __future__ import annotations

import os
import platform
import stat
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["machine", "software", "version", "git_commit", "cpu_model"]


def version(dist: str) -> str | None:
    """The installed version of a distribution, None when it is not installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def git_commit(path: Path | None = None) -> str | None:
    """The commit of the scalelab source (this package's directory), None outside a git checkout (an
    installed wheel, an AWS node); "+dirty" when tracked files differ from it."""
    where = str(path or Path(__file__).resolve().parent)
    try:
        head = subprocess.run(["git", "-C", where, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", where, "diff", "--quiet", "HEAD", "--"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.returncode == 1 else "")


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def machine(gpu_model: str | None) -> dict[str, Any]:
    """The fields every rank's start record carries about where it ran (and where its output went)."""
    return {"host": platform.node() or None, "cpu_model": cpu_model(), "gpu_model": gpu_model, **output_files()}


def output_files() -> dict[str, str]:
    """{"stdout": PATH, "stderr": PATH} of this process where each is a regular file (torchrun's per-rank
    stdout.log / stderr.log under its --log-dir, srun's task files); nothing for a pipe or a terminal
    (horovodrun, a plain start). Why: `launch logs` reads a rank's whole lines from its own files, and only the
    rank knows which files are its own where several torchrun agents (emulated nodes) share one log folder."""
    out = {}
    for name, fd in (("stdout", 1), ("stderr", 2)):
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                out[name] = os.path.realpath(f"/proc/self/fd/{fd}")
        except OSError:  # closed, or no /proc (not Linux): not said
            continue
    return out


def software(torch_version: str) -> dict[str, Any]:
    """The fields rank 0's start record carries about what ran (versions, the source's commit)."""
    return {"scalelab_version": version("scalelab"), "torch_version": torch_version,
            "horovod_version": version("horovod"), "python_version": platform.python_version(),
            "git_commit": git_commit()}
