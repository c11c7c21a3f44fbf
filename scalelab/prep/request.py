"""What one prep run is asked to do, checked before any worker starts; saved as RUN_DIR/prep.json.

Like the training `Spec`, the dataclass fields are the valid options; backend options are a mapping
each cluster kind declares with defaults in `prep.clusters.OPTIONS` (unknown ones are refused with
the list of valid ones).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scalelab.core.errors import SpecError
from scalelab.core.presets import PRESETS, ModelConfig, config_with_overrides
from scalelab.core.spec import BACKEND_NAMES, BATCH_MODES
from scalelab.prep.corpus import ROLES, Storage, flag, is_remote

PREP_FILE = "prep.json"  # marks a prep run (or a sweep of prep runs) for `launch report`


# what distributed's address parser takes: [PROTOCOL://]HOST:PORT ('not-a-url' was a ValueError traceback
# from inside distributed, after the run directory was made)
SCHEDULER_ADDRESS = re.compile(r"^(?:(?:tcp|tls|ucx|ws|wss|inproc)://)?(?:\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):\d{1,5}/?$")


@dataclass
class PrepRequest:
    """One prep run: the corpus, the model it is cut for, where shards go, and the Dask cluster."""

    model: str
    inputs: dict[str, list[str]]  # input key (train, valid, train_src, ...) -> files, globs or URLs
    out: str
    workers: int = 2
    backend: str = "local"
    backend_options: dict[str, Any] = field(default_factory=dict)
    model_args: dict[str, Any] = field(default_factory=dict)
    shard_size: int = 50_000
    block_mb: float = 16.0
    valid_fraction: float = 0.05
    lines_limit: int | None = None  # weak scaling: only the first lines of the training corpus
    mode: str = "strong"
    scheduler: str | None = None  # address of a running Dask scheduler instead of starting a cluster
    name: str | None = None

    @property
    def config(self) -> ModelConfig:
        return config_with_overrides(PRESETS[self.model], self.model_args)

    @property
    def storage(self) -> Storage:
        """fsspec options for remote URLs: the aws options that name the S3 endpoint and region."""
        opts = self.backend_options if self.backend == "aws" else {}
        client = {k: opts[k] for k in ("endpoint_url", "region_name") if opts.get(k)}
        return Storage({"client_kwargs": client} if client else {})

    def validate(self) -> "PrepRequest":
        """Raise SpecError on anything wrong that needs no file access; return self."""
        if self.model not in PRESETS:
            raise SpecError(f"unknown model preset {self.model!r}; valid presets: {', '.join(sorted(PRESETS))}")
        family = self.config.family  # raises SpecError on bad --model-arg
        required, optional = ROLES[family]
        given = {k for k, v in self.inputs.items() if v}
        unknown = sorted(given - set(required) - set(optional))
        if unknown:
            raise SpecError(f"{', '.join(flag(k) for k in unknown)} do(es) not apply to {family} ({self.model}): "
                            f"give {', '.join(flag(k) for k in required + optional)}")
        missing = [flag(k) for k in required if k not in given]
        if missing:
            raise SpecError(f"prep for {family} needs {' and '.join(missing)}")
        if family == "nmt" and ("valid_src" in given) != ("valid_tgt" in given):
            raise SpecError("give both --valid-src and --valid-tgt, or neither")
        _choice("backend", self.backend, BACKEND_NAMES)
        _choice("mode", self.mode, BATCH_MODES)
        for name in ("workers", "shard_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"--{name.replace('_', '-')} must be a positive whole number, got {value!r}")
        if not 0.0 < self.block_mb <= 4096:
            raise SpecError(f"--block-mb must be above 0 and at most 4096, got {self.block_mb}")
        if not 0.0 < self.valid_fraction < 1.0:
            raise SpecError(f"--valid-fraction must be between 0 and 1, got {self.valid_fraction}")
        if self.scheduler is not None and not SCHEDULER_ADDRESS.match(self.scheduler):
            raise SpecError(f"--scheduler {self.scheduler!r} is not a Dask scheduler address: give "
                            "tcp://HOST:PORT (e.g. tcp://10.0.0.5:8786), or leave it out to start a cluster")
        if self.lines_limit is not None and self.lines_limit < 1:
            raise SpecError(f"--lines-per-worker must be a positive whole number, got {self.lines_limit}")
        if self.backend == "aws" and not self.out.startswith("s3://"):
            raise SpecError(f"--backend aws writes shards to S3: give --out s3://BUCKET/PREFIX, not {self.out!r}")
        return self

    def keys(self, split: str) -> tuple[str, ...]:
        """The input keys of `split` (train or valid) in role order, () when the split has no files."""
        required, optional = ROLES[self.config.family]
        keys = required if split == "train" else optional
        return keys if all(self.inputs.get(k) for k in keys) else ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe_out(self) -> str:
        return self.out if is_remote(self.out) else str(Path(self.out).resolve())


def _choice(what: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise SpecError(f"unknown {what} {value!r}; valid: {', '.join(valid)}")


def read_request(run_dir: Path) -> dict[str, Any]:
    """prep.json of a prep run or sweep, as saved."""
    path = Path(run_dir) / PREP_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"{run_dir} is not a prep run directory: {path} is missing") from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path} is corrupt ({exc.msg}); re-run launch prep") from None
