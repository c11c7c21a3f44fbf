"""The backend-neutral experiment spec.

One `Spec` says everything about a run that does not depend on where it runs: model and preset, data,
engine, layout (nodes x GPUs per node), batch mode, length, threshold, plus a free `backend_options`
mapping that each backend validates itself. It loads from YAML, is overridden by flags, and the
resolved spec is saved as `spec.json` in every run directory, so a run can always be reproduced and
the trainer reads exactly what the launcher decided.

Like submitit's executor parameters, the dataclass fields and their defaults *are* the list of valid
options: an unknown key fails at configuration time and the message lists the valid ones.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from core.errors import SpecError
from core.presets import RNN_KINDS

ENGINES = ("single", "ddp", "horovod")
DATA_KINDS = ("synthetic", "task", "text", "shards")
BATCH_MODES = ("strong", "weak")
OPTIMIZERS = ("adam", "sgd")
DEVICES = ("auto", "cpu", "cuda")
BALANCE_MODES = ("static", "dynamic")
# Where ranks run; `launcher.backend.BACKENDS` maps each name to its implementation.
BACKEND_NAMES = ("local", "slurm", "k8s", "aws")


@dataclass
class DataSpec:
    """Where batches come from. `synthetic` measures throughput; `task` is learnable (convergence);
    `text` reads files (parallel text, plain text or labelled lines, by model family); `shards` reads
    the directory `shards` that `launch prep` wrote (token ids, no tokenising at start-up)."""

    kind: str = "synthetic"
    train_src: str | None = None
    train_tgt: str | None = None
    valid_src: str | None = None
    valid_tgt: str | None = None
    train_samples: int = 4096
    valid_samples: int = 256
    prefetch: int = 2
    bucket: bool = True
    fixed_length: bool = False
    shards: str | None = None


@dataclass
class EngineSpec:
    """Gradient-exchange settings. Defaults are the fast settings measured in docs/benchmarks.md."""

    name: str = "ddp"
    fusion_threshold_mb: float = 64.0
    cycle_time_ms: float = 1.0
    fp16_allreduce: bool = False
    bucket_cap_mb: float = 25.0


@dataclass
class Spec:
    """A complete, backend-neutral description of one training run."""

    model: str = "nmt-tiny"
    rnn: str = "fused"
    model_args: dict[str, Any] = field(default_factory=dict)
    data: DataSpec = field(default_factory=DataSpec)
    engine: EngineSpec = field(default_factory=EngineSpec)
    backend: str = "local"
    backend_options: dict[str, Any] = field(default_factory=dict)
    nodes: int = 1
    gpus_per_node: int = 1
    global_batch: int | None = None
    batch_per_worker: int | None = None
    steps: int | None = 40
    epochs: int | None = None
    warmup_steps: int = 5
    optimizer: str = "adam"
    lr: float = 1e-3
    lr_warmup_steps: int = 0
    lr_ref_batch: int | None = None
    clip_grad_norm: float | None = 5.0
    seed: int = 1234
    val_every: int = 0
    val_batches: int = 4
    loss_threshold: float | None = None
    checkpoint_every: int = 0
    threads: int | None = None
    interop_threads: int | None = None
    independent_replicas: bool = False
    balance: str = "static"
    balance_every: int = 10
    emulate_slowdown: list[float] = field(default_factory=list)
    device: str = "auto"
    name: str | None = None

    # ---- derived values -------------------------------------------------------------------

    @property
    def workers(self) -> int:
        """Total ranks: one per GPU (on a machine without GPUs, one process per "GPU")."""
        return self.nodes * self.gpus_per_node

    @property
    def batch_mode(self) -> str:
        """`weak` when the per-worker batch is fixed (the global batch grows with workers)."""
        return "weak" if self.batch_per_worker is not None else "strong"

    def resolved_global_batch(self, default_batch: int) -> int:
        """Global batch for this layout; `default_batch` is the preset's when neither is given."""
        if self.batch_per_worker is not None:
            return self.batch_per_worker * self.workers
        return self.global_batch if self.global_batch is not None else default_batch

    def per_worker_batch(self, default_batch: int) -> int:
        g = self.resolved_global_batch(default_batch)
        if g % self.workers:
            raise SpecError(
                f"global batch {g} does not split evenly across {self.workers} workers "
                f"({self.nodes} node(s) x {self.gpus_per_node}); choose a global batch that is a "
                f"multiple of {self.workers} (e.g. {max(self.workers, g // self.workers * self.workers)}), "
                "or use --batch-per-worker for weak scaling"
            )
        return g // self.workers

    def lr_scale(self, default_batch: int) -> float:
        """Linear LR scaling (Goyal et al.; Horovod's lr * hvd.size()) relative to `lr_ref_batch`.

        The reference defaults to the batch the LR was chosen for: the per-worker batch in weak
        mode (so the LR grows with the number of workers) and the global batch in strong mode (the
        optimisation problem does not change with the layout, so neither does the LR).
        """
        ref = self.lr_ref_batch
        if ref is None:
            ref = self.batch_per_worker if self.batch_per_worker is not None else self.resolved_global_batch(default_batch)
        return self.resolved_global_batch(default_batch) / ref

    # ---- validation ----------------------------------------------------------------------

    def validate(self) -> "Spec":
        """Check everything that can be checked without touching a backend; raise SpecError."""
        from core.presets import PRESETS  # the trainer owns the presets

        if self.model not in PRESETS:
            raise SpecError(f"unknown model preset {self.model!r}; valid presets: {', '.join(sorted(PRESETS))}")
        _choice("backend", self.backend, BACKEND_NAMES)
        _choice("rnn", self.rnn, RNN_KINDS)
        _choice("engine", self.engine.name, ENGINES)
        _choice("data kind", self.data.kind, DATA_KINDS)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("device", self.device, DEVICES)
        _choice("balance", self.balance, BALANCE_MODES)
        if self.balance_every < 1:
            raise SpecError(f"--balance-every must be >= 1, got {self.balance_every}")
        if self.emulate_slowdown and (len(self.emulate_slowdown) != self.workers or min(self.emulate_slowdown) < 1):
            raise SpecError(
                f"--emulate-slowdown needs one factor >= 1 per worker ({self.workers}), got {self.emulate_slowdown}"
            )
        if self.independent_replicas and self.balance == "dynamic":
            raise SpecError("--independent-replicas and --balance dynamic do not mix: replicas share no batch")
        for name in ("nodes", "gpus_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                flag = "--" + name.replace("_", "-")
                raise SpecError(f"{flag} must be a positive whole number, got {value!r}")
        if self.global_batch is not None and self.batch_per_worker is not None:
            raise SpecError("give either --global-batch (strong scaling) or --batch-per-worker (weak scaling), not both")
        for name in ("global_batch", "batch_per_worker", "steps", "epochs", "threads", "interop_threads"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise SpecError(f"--{name.replace('_', '-')} must be a positive whole number, got {value!r}")
        if self.steps is None and self.epochs is None:
            raise SpecError("give --steps or --epochs (how long to train)")
        for name in ("warmup_steps", "lr_warmup_steps", "val_every", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise SpecError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.val_batches < 1:
            raise SpecError(f"--val-batches must be >= 1, got {self.val_batches}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise SpecError(f"--lr must be a positive number, got {self.lr}")
        if self.loss_threshold is not None and self.val_every == 0:
            raise SpecError("--loss-threshold needs validation: set --val-every N (steps between validations)")
        if self.engine.name == "single" and self.workers != 1:
            raise SpecError(
                f"engine 'single' runs one worker, but the layout has {self.workers} "
                f"({self.nodes} x {self.gpus_per_node}); use --engine ddp or --engine horovod"
            )
        if self.data.kind == "text" and not self.data.train_src:
            raise SpecError("data kind 'text' needs --train-src (and --train-tgt for translation)")
        if (self.data.kind == "shards") != bool(self.data.shards):
            raise SpecError("--data shards reads --shards DIR (a directory written by launch prep): give both, or neither")
        if self.data.kind == "shards" and "://" not in self.data.shards and not Path(self.data.shards, "manifest.json").is_file():
            raise SpecError(f"--shards {self.data.shards} holds no manifest.json: run launch prep --out {self.data.shards} first")
        if self.data.prefetch < 0:
            raise SpecError(f"--prefetch must be >= 0, got {self.data.prefetch}")
        from core.presets import config_with_overrides

        cfg = config_with_overrides(PRESETS[self.model], self.model_args)  # raises SpecError on bad keys
        self.per_worker_batch(cfg.default_batch)  # raises if a strong-scaling batch does not split
        for key in ("train_src", "train_tgt", "valid_src", "valid_tgt"):
            path = getattr(self.data, key)
            if self.data.kind == "text" and path and not Path(path).is_file():
                raise SpecError(f"data file not found: {path} (check --{key.replace('_', '-')})")
        return self

    # ---- (de)serialisation ---------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "spec") -> "Spec":
        return _build(cls, raw, where)

    def with_overrides(self, overrides: dict[str, Any]) -> "Spec":
        """A copy with dotted keys (`engine.name`, `data.kind`, `nodes`) replaced; None means unset."""
        raw = self.to_dict()
        for key, value in overrides.items():
            if value is None:
                continue
            target = raw
            parts = key.split(".")
            for part in parts[:-1]:
                target = target[part]
            target[parts[-1]] = value
        return Spec.from_dict(raw)


def _choice(what: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise SpecError(f"unknown {what} {value!r}; valid: {', '.join(valid)}")


def _build(cls: type, raw: Any, where: str) -> Any:
    """Build dataclass `cls` from a mapping, rejecting unknown keys with the list of valid ones."""
    if not isinstance(raw, dict):
        raise SpecError(f"{where} must be a mapping of option: value, got {type(raw).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise SpecError(
            f"unknown option(s) in {where}: {', '.join(unknown)}; valid options: {', '.join(sorted(known))}"
        )
    kwargs = {}
    for name, value in raw.items():
        f = known[name]
        sub = {"data": DataSpec, "engine": EngineSpec}.get(name) if cls is Spec else None
        if sub is not None:
            kwargs[name] = value if isinstance(value, sub) else _build(sub, value, f"{where}.{name}")
        else:
            kwargs[name] = _coerce(value, f, where)
    return cls(**kwargs)


def _coerce(value: Any, f: dataclasses.Field, where: str) -> Any:
    """Accept what YAML gives (ints for floats); reject obviously wrong types with a clear message."""
    base = str(f.type).split("|")[0].strip()
    if value is None:
        return None
    if base == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"{where}.{f.name} must be a whole number, got {value!r}")
    elif base == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"{where}.{f.name} must be a number, got {value!r}")
        return float(value)
    elif base == "bool":
        if not isinstance(value, bool):
            raise SpecError(f"{where}.{f.name} must be true or false, got {value!r}")
    elif base == "str":
        if not isinstance(value, str):
            raise SpecError(f"{where}.{f.name} must be a string, got {value!r}")
    elif base.startswith("list"):
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
            raise SpecError(f"{where}.{f.name} must be a list of numbers, got {value!r}")
        return [float(v) for v in value]
    elif base.startswith("dict"):
        if not isinstance(value, dict):
            raise SpecError(f"{where}.{f.name} must be a mapping, got {value!r}")
    return value


def load_spec(path: str | os.PathLike) -> Spec:
    """Load a spec from YAML (or JSON); the file may hold only the keys it wants to change."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise SpecError(f"spec file not found: {p} (pass an existing YAML file to --spec)")
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise SpecError(f"spec file {p} is not valid YAML: {exc}") from None
    return Spec.from_dict(raw, where=str(p))


def save_spec(spec: Spec, run_dir: Path) -> Path:
    path = Path(run_dir) / "spec.json"
    path.write_text(spec.to_json() + "\n")
    return path


def read_spec(run_dir: str | os.PathLike) -> Spec:
    path = Path(run_dir) / "spec.json"
    if not path.is_file():
        raise SpecError(f"{run_dir} is not a run directory: {path} is missing")
    try:
        return Spec.from_dict(json.loads(path.read_text()), where=str(path))
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path} is corrupt ({exc}); re-run the experiment or restore the file") from None
