"""The backend interface: every backend does the same four things.

1. render a request from the spec as a pure function (`submit_dryrun`) - an object whose `render()`
   is exactly what will be sent (command lines + environment, an sbatch script, manifests, EC2
   requests), so `--dry-run` prints it and touches nothing;
2. send it (`schedule`); `submit()` is `schedule(submit_dryrun(...))` as in TorchX, so what was
   printed is what runs;
3. report `status` and `logs`;
4. `cancel`: stop the run and free everything it holds (the caller records it as CANCELLED).

The run's lifecycle is not the backend's: one follow loop (launcher/runner.py) drives every backend
through two optional hooks, `poll` (one tick of the backend's own work while the run is live) and
`finish` (its work once the run has ended), records the run's state in launch.json, and owns the
one interruption path (Ctrl-C, SIGTERM, SIGHUP). A backend therefore has no loop of its own; it
declares what the loop and the sweep need to know: `poll_interval_s` and `queues`.

Backend options follow submitit and TorchX's runopts: each backend names its options type (`Options`,
a `core.options.BackendOptions` dataclass in a module with no heavy imports), whose fields are the
valid options with their defaults, help, flags and checks; `self.options` is an instance, so a bad
key or value fails at configuration time with the valid ones listed. Backends are looked up by name
and imported lazily so that, say, the local backend never imports boto3.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import EngineError, SpecError
from core.options import BackendOptions, Flag
from core.spec import BACKEND_NAMES, Spec

# name -> "module:Class"; the module is imported only when the backend is used.
BACKENDS: dict[str, str] = {
    "local": "launcher.local:LocalBackend",
    "slurm": "slurm.backend:SlurmBackend",
    "k8s": "k8s.backend:KubernetesBackend",
    "aws": "aws.backend:AwsBackend",
}
assert tuple(BACKENDS) == BACKEND_NAMES

# name -> "module:Class" of the backend's options: modules with no heavy imports, which the CLI reads at
# start for the backends' flags and `--backend-opt` keys. Each backend class names the same type.
BACKEND_OPTIONS: dict[str, str] = {
    "local": "launcher.options:LocalOptions",
    "slurm": "slurm.options:SlurmOptions",
    "k8s": "k8s.options:KubernetesOptions",
    "aws": "aws.options:AwsOptions",
}
assert tuple(BACKEND_OPTIONS) == BACKEND_NAMES


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


def _load(ref: str) -> Any:
    """"module:attribute" when that module is part of this installation, else None."""
    module_name, attr = ref.split(":")
    module = import_optional(module_name)
    return getattr(module, attr) if module is not None else None


def options_type(name: str) -> type[BackendOptions] | None:
    """The options type of backend `name`; None for an unknown name or a backend not installed."""
    return _load(BACKEND_OPTIONS[name]) if name in BACKEND_OPTIONS else None


def backend_flags() -> dict[str, list[Flag]]:
    """{backend: its command-line flags} for every installed backend that has some."""
    types = {name: options_type(name) for name in BACKEND_OPTIONS}
    return {name: t.flags() for name, t in types.items() if t is not None and t.flags()}


@dataclass
class Request(ABC):
    """What a backend will send, printable before anything is sent."""

    run_dir: Path

    @abstractmethod
    def render(self) -> str:
        """Exactly what will be sent, as text (shell lines, a script, YAML or JSON)."""


@dataclass
class RunStatus:
    state: str  # one of core.rundir's states: PENDING | RUNNING | COMPLETED | FAILED | CANCELLED | UNKNOWN
    detail: str = ""


class Backend(ABC):
    """One place where runs go: render, schedule, status, logs, cancel (+ the poll and finish hooks)."""

    # The sweep submits every layout before following the first when the backend has a queue (Slurm):
    # the cluster then starts each layout as soon as it can, instead of one job at a time.
    queues: bool = False
    # Seconds between polls once the follow loop has backed off (it polls more often at first), unless
    # the backend has a `poll_s` option: a cluster's controller or a cloud API is asked less often.
    default_poll_s: float = 1.0
    # The ranks import Horovod from this machine's Python (local; Slurm through a shared filesystem),
    # so a Horovod run is checked here before anything starts; other backends bring their own image.
    horovod_here: bool = False

    name: str = ""
    Options: type[BackendOptions] = BackendOptions  # each backend names its own (see BACKEND_OPTIONS)

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = self.resolve_options(options)

    @classmethod
    def resolve_options(cls, options: Mapping[str, Any] | None) -> BackendOptions:
        """The typed options: defaults for what is not given; SpecError for an unknown key or a bad value."""
        if isinstance(options, cls.Options):
            return options
        return cls.Options.parse(options or {}, where="in backend_options")

    def validate(self, spec: Spec) -> None:
        """Every check that needs no remote call, before a run directory exists (Horovod built, layout possible)."""
        if self.horovod_here and spec.engine.name == "horovod":
            check_horovod()
        self.check(spec)

    def check(self, spec: Spec) -> None:
        """The backend's own checks for `validate`."""

    @property
    def poll_interval_s(self) -> float:
        return float(self.options.get("poll_s", self.default_poll_s))

    @abstractmethod
    def submit_dryrun(self, spec: Spec, run_dir: Path) -> Request:
        """Pure: build the request for `spec` writing into `run_dir`; sends nothing."""

    def submit_dryrun_batch(self, spec: Spec, run_dirs: list[Path]) -> list[Request]:
        """Pure: the requests for repeated runs of one spec (`launch sweep --repeats N`), one per run; a
        backend that sends them as one (a Slurm job array) returns one request for them all."""
        return [self.submit_dryrun(spec, run_dir) for run_dir in run_dirs]

    @abstractmethod
    def schedule(self, request: Request) -> str:
        """Send the request; return a handle (job id, process group id) saved in launch.json.

        It starts launch.json afresh (`core.rundir.start_state`), and on failure removes whatever it
        had started before raising.
        """

    def submit(self, spec: Spec, run_dir: Path) -> str:
        return self.schedule(self.submit_dryrun(spec, run_dir))

    @abstractmethod
    def status(self, run_dir: Path) -> RunStatus:
        """The run's state as the backend sees it now (any process may ask, not only the one following)."""

    def poll(self, run_dir: Path) -> RunStatus:
        """One tick of the follow loop: the backend's own work while the run is live, then its status."""
        return self.status(run_dir)

    def finish(self, run_dir: Path, status: RunStatus) -> RunStatus:
        """Work once the run has ended by itself (records back, resources freed); the final status."""
        return status

    @abstractmethod
    def logs(self, run_dir: Path) -> str: ...

    @abstractmethod
    def cancel(self, run_dir: Path) -> None:
        """Stop the run (its ranks checkpoint) and free everything it holds; nothing may be left running."""


def log_text(paths: list[Path]) -> str:
    """Log files as one text, each under a `==> PATH <==` header as `tail` prints several files."""
    return "\n".join(f"==> {p} <==\n" + (p.read_text(errors="replace") if p.exists() else "(no output yet)\n")
                     for p in paths)


def check_horovod() -> None:
    """Horovod with PyTorch and Gloo importable here, else one EngineError that says how to build it."""
    from train.engines import horovod_status

    problem = horovod_status()
    if problem:
        raise EngineError(problem)


def get_backend(name: str, options: dict[str, Any] | None = None) -> Backend:
    if name not in BACKENDS:
        raise SpecError(f"unknown backend {name!r}; valid backends: {', '.join(BACKENDS)}")
    module_name, cls_name = BACKENDS[name].split(":")
    module = import_optional(module_name)
    if module is None:
        raise SpecError(f"the {name} backend is not part of this installation; use --backend local")
    return getattr(module, cls_name)(options)
