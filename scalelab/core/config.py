"""Defaults from a config file, as TorchX's `.torchxconfig` and SkyPilot's `~/.sky/config.yaml` give them.

Two files, read in this order, the later winning key by key:
- `$XDG_CONFIG_HOME/scalelab/config.yaml` (`~/.config/scalelab/config.yaml`): a user's defaults everywhere;
- `./scalelab.yaml`: a project's defaults, in the directory `launch` runs in.
`SCALELAB_CONFIG=PATH` replaces both with one file, `SCALELAB_CONFIG=off` reads none (the tests do).

A file is a flat mapping from a command-line option, without its dashes, to a value, e.g.

    backend: slurm
    partition: gpu
    time-limit-min: 60
    bucket: my-runs

Dashes and underscores are the same. A value becomes the option's default in every command that has that
option, shown in `--help` as `[default: VALUE, from FILE]`; a flag given on the command line wins. A
repeatable option (`rate`, `model-arg`, `toleration`, `sbatch-arg`) takes one value or a list. Which keys
exist, and whether a value suits its option, is the command line's business (scalelab/launcher/cli.py checks
them, naming the file and key); this module only reads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from scalelab.core.errors import SpecError

CONFIG_ENV = "SCALELAB_CONFIG"
PROJECT_FILE = "scalelab.yaml"


def config_paths(cwd: Path | None = None) -> list[Path]:
    """The config files that exist, in reading order (a later one wins)."""
    forced = os.environ.get(CONFIG_ENV)
    if forced is not None:
        if forced.strip().lower() in ("", "off", "none"):
            return []
        path = Path(forced).expanduser()
        if not path.exists():
            raise SpecError(f"{CONFIG_ENV}={forced}: no such file; point it at a YAML config file or set it to 'off'")
        return [path]
    home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    found = [home / "scalelab" / "config.yaml", (cwd or Path.cwd()) / PROJECT_FILE]
    return [p for p in found if p.is_file()]


def key_name(key: Any) -> str:
    """A config key as a parameter's name: `time-limit-min`, `--time-limit-min` -> `time_limit_min`."""
    return str(key).strip().lstrip("-").replace("-", "_")


def read_config(paths: list[Path]) -> dict[str, tuple[Any, Path]]:
    """Every key of `paths` (later files win): parameter name -> (value, the file it came from)."""
    from scalelab.core.spec import read_yaml_mapping

    out: dict[str, tuple[Any, Path]] = {}
    for path in paths:
        for key, value in read_yaml_mapping(path, "config file").items():
            if value is None:
                continue  # `key:` alone leaves the built-in default
            _check_shape(path, key, value)
            out[key_name(key)] = (value, path)
    return out


def _check_shape(path: Path, key: Any, value: Any) -> None:
    """A value is a word or a number, or a list of them for a repeatable option (whether the option repeats
    is checked by the command line, which knows the options); a mapping or a nested list never is."""
    items = value if isinstance(value, list) else [value]
    bad = next((item for item in items if isinstance(item, (dict, list)) or item is None), ...)
    if bad is ...:
        return
    what = {dict: "a mapping", list: "a list"}.get(type(bad), "an empty value")
    raise SpecError(f"config file {path}: {key!r} must be one value (a word or a number), or a list of them for a "
                    f"repeatable option such as rate or model-arg, not {what}"
                    f"{' in a list' if isinstance(value, list) else ''}: the file is a flat mapping of options "
                    "to defaults")
