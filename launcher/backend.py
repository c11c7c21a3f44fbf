"""The backend interface: every backend does the same four things.

1. render a request from the spec as a pure function (`submit_dryrun`) - an object whose `render()`
   is exactly what will be sent (command lines + environment, an sbatch script, manifests, EC2
   requests), so `--dry-run` prints it and touches nothing;
2. send it (`schedule`); `submit()` is `schedule(submit_dryrun(...))` as in TorchX, so what was
   printed is what runs;
3. report `status` and `logs`;
4. `cancel`.

Backend options follow submitit: each backend declares its valid options with defaults in
`OPTIONS`; unknown options fail at configuration time, listing the valid ones. Backends are looked up
by name and imported lazily so that, say, the local backend never imports boto3.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from core.errors import SpecError
from core.spec import BACKEND_NAMES, Spec

# name -> "module:Class"; the module is imported only when the backend is used.
BACKENDS: dict[str, str] = {
    "local": "launcher.local:LocalBackend",
    "slurm": "slurm.backend:SlurmBackend",
    "k8s": "k8s.backend:KubernetesBackend",
    "aws": "aws.backend:AwsBackend",
}
assert tuple(BACKENDS) == BACKEND_NAMES

# Backend-specific command-line flags. Each module named here holds only
# `FLAGS: list[tuple[flag, option_key, click_kwargs]]` (no heavy imports: the CLI loads them at start);
# a flag sets `backend_options[option_key]` and is accepted only with its own --backend.
BACKEND_FLAG_MODULES: dict[str, str] = {"slurm": "slurm.flags", "k8s": "k8s.flags", "aws": "aws.flags"}


def import_optional(module_name: str):
    """Import a module of an optional part (a backend, a command); None when that part is absent.

    Only the module itself being missing means "absent": a missing dependency *inside* it is a real
    error and propagates.
    """
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name not in (module_name, module_name.split(".")[0]):
            raise
        return None


def backend_flags() -> dict[str, list[tuple[str, str, dict[str, Any]]]]:
    """{backend: FLAGS} for every backend whose flags module exists."""
    modules = {name: import_optional(module) for name, module in BACKEND_FLAG_MODULES.items()}
    return {name: list(module.FLAGS) for name, module in modules.items() if module is not None}


@dataclass
class Request(ABC):
    """What a backend will send, printable before anything is sent."""

    run_dir: Path

    @abstractmethod
    def render(self) -> str:
        """Exactly what will be sent, as text (shell lines, a script, YAML or JSON)."""


@dataclass
class RunStatus:
    state: str  # PENDING | RUNNING | COMPLETED | FAILED | CANCELLED | UNKNOWN
    detail: str = ""


class Backend(ABC):
    name: str = ""
    OPTIONS: dict[str, Any] = {}

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self.options = self.resolve_options(options or {})

    @classmethod
    def resolve_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(options) - set(cls.OPTIONS))
        if unknown:
            valid = ", ".join(f"{k} (default {v!r})" for k, v in cls.OPTIONS.items()) or "none"
            raise SpecError(f"unknown {cls.name} backend option(s): {', '.join(unknown)}; valid options: {valid}")
        return {**cls.OPTIONS, **options}

    def validate(self, spec: Spec) -> None:
        """Backend-specific checks that need no remote call (e.g. Horovod built, layout possible)."""

    @abstractmethod
    def submit_dryrun(self, spec: Spec, run_dir: Path) -> Request:
        """Pure: build the request for `spec` writing into `run_dir`; sends nothing."""

    @abstractmethod
    def schedule(self, request: Request) -> str:
        """Send the request; return a handle (job id, process group id) saved in launch.json."""

    def submit(self, spec: Spec, run_dir: Path) -> str:
        return self.schedule(self.submit_dryrun(spec, run_dir))

    @abstractmethod
    def wait(self, run_dir: Path, on_poll: Callable[[], None] | None = None) -> RunStatus:
        """Block until the run ends, calling `on_poll` regularly (progress display)."""

    @abstractmethod
    def status(self, run_dir: Path) -> RunStatus: ...

    @abstractmethod
    def logs(self, run_dir: Path) -> str: ...

    @abstractmethod
    def cancel(self, run_dir: Path) -> None: ...


def get_backend(name: str, options: dict[str, Any] | None = None) -> Backend:
    if name not in BACKENDS:
        raise SpecError(f"unknown backend {name!r}; valid backends: {', '.join(BACKENDS)}")
    module_name, cls_name = BACKENDS[name].split(":")
    module = import_optional(module_name)
    if module is None:
        raise SpecError(f"the {name} backend is not part of this installation; use --backend local")
    return getattr(module, cls_name)(options)
