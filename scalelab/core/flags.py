"""The command-line flags that several commands share, declared once: `launch run`, `sweep`, `memory`, `prep`.

Why here, in core: the commands that take a model, an engine or a runs directory live in three layers
(`launch run` and `sweep` in launcher/, `launch memory` in costs/, `launch prep` in prep/), and imports run
one way (core -> train -> analysis -> costs -> launcher -> backends), so the one declaration has to sit
below all of them. When `launch memory` and `launch prep` declared their own `--model` and `--engine`
they drifted from `launch run`'s (issue 35: memory defaulted to nmt-seed and horovod, run to nmt-tiny
and ddp), as TorchX's runopts and submitit's keyword defaults exist to prevent.

Two kinds of flag, one table each:
- the spec's flags (`SPEC_FLAGS`), generated from the fields of `Spec` that declare one with `option()`
  (scalelab/core/spec.py: flag, type, choices, help and default in the field). Their click default is
  None, so a flag not given leaves the spec file's value or the field's default: a command without a
  spec file reads its values through `spec_from_flags`, which fills in the field's default;
- the options that are no spec field (`COMMON`: --model-arg, --backend-opt, --runs-dir, --dry-run, --spec).
  --runs-dir follows one rule everywhere (`runids.runs_root`: the flag, else $SCALELAB_RUNS_DIR, else a config
  file's runs-dir, else ./runs); the commands that look runs up there take it from `runs_dir_lookup_option`.

A command takes its flags by name with `shared_flags("--model", "--engine", ...)`; it may make one that has
no default required (`required=("--batch-per-worker",)`), never give it another default or help (`launch
memory` fills a missing --batch-per-worker with the model's batch after parsing, and says so).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import click

from scalelab.core.checks import InputFile, OutputDir
from scalelab.core.options import Flag, coerce_path, option_flags
from scalelab.core.rundir import DEFAULT_RUNS_ROOT
from scalelab.core.runids import RUNS_DIR_ENV, runs_dir_callback
from scalelab.core.spec import DATA_KINDS, Spec, check_preset

SPEC_FLAGS: list[Flag] = option_flags(Spec)
_BY_NAME: dict[str, Flag] = {flag.name: flag for flag in SPEC_FLAGS}


class DataFlag(click.ParamType):
    """`--data KIND`, or `--data shards:DIR`: the spelling of `launch prep`'s issue, the same as
    `--data shards --shards DIR` (split by the launcher's `_data_flag`). Refused here, with the kinds
    listed: another kind with a colon, or `shards:` with no directory."""

    name = "kind"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "[" + "|".join(DATA_KINDS) + "|shards:DIR]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        kind, colon, directory = str(value).partition(":")
        if kind in DATA_KINDS and (not colon or (kind == "shards" and directory.strip())):
            return str(value)
        if kind == "shards":
            self.fail("--data shards:DIR needs the directory launch prep wrote after the colon "
                      "(or give --data shards --shards DIR)", param, ctx)
        self.fail(f"{value!r} is not one of {', '.join(DATA_KINDS)}, or shards:DIR", param, ctx)


# The one spec flag whose click type is not its field's own (it also takes `shards:DIR`).
_CLICK_TYPES: dict[str, Callable[[], click.ParamType]] = {"data.kind": DataFlag}

# Options that are no spec field: flag -> (parameter name, click keyword arguments). Callables, so that
# each command gets its own click types.
COMMON: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
    "--spec": ("spec_file", lambda: {"type": InputFile("spec file"), "help": "YAML spec; flags override it."}),
    "--model-arg": ("model_args", lambda: {
        "multiple": True, "metavar": "KEY=VALUE",
        "help": "Override a preset field, e.g. --model-arg hidden_size=256 (repeatable)."}),
    "--backend-opt": ("backend_opts", lambda: {
        "multiple": True, "metavar": "KEY=VALUE",
        "help": "Backend option (repeatable); unknown ones are listed with the valid ones."}),
    "--runs-dir": ("runs_dir", lambda: {
        "type": OutputDir("--runs-dir"), "default": None, "callback": runs_dir_callback,
        "help": f"Where run directories are created [default: ${RUNS_DIR_ENV}, else a config file's runs-dir, "
                f"else ./{DEFAULT_RUNS_ROOT}]."}),
    "--dry-run": ("dry_run", lambda: {
        "is_flag": True, "help": "Print exactly what would be started (job script, manifest or command) and "
                                 "start nothing; run and sweep also say on stderr what it would cost."}),
}


def runs_dir_lookup_option() -> Callable:
    """--runs-dir of the commands that find runs there (ls, status, logs, cancel, resume): the directory short
    ids and the newest run are looked up in, by the rule `--runs-dir` of `launch run` creates them by
    (`runids.runs_root`). Eager, so that it is read before RUN_DIR, whose short id it resolves; not
    created or checked for writing, as nothing is made there."""
    return click.option("--runs-dir", "runs_dir", type=click.Path(file_okay=False), default=None, is_eager=True,
                        callback=runs_dir_callback,
                        help=f"The runs directory this command looks in [default: ${RUNS_DIR_ENV}, "
                             f"else a config file's runs-dir, else ./{DEFAULT_RUNS_ROOT}].")


def spec_flag_option(flag: Flag, required: bool = False) -> Callable:
    """The click option of one spec field's flag. Its default is None (an on/off pair too: neither given),
    so the spec file's value or the field's default stands; the help already says that default."""
    kwargs: dict[str, Any] = {"help": flag.help, "metavar": flag.metavar, "required": required}
    if flag.kind is bool:
        kwargs["default"] = None
    else:
        make = _CLICK_TYPES.get(flag.key)
        kwargs["type"] = make() if make else (click.Choice(flag.choices) if flag.choices else flag.kind)
    return click.option(flag.decl, param_name(flag), **kwargs)


def param_name(flag: Flag) -> str:
    """The click parameter a spec flag sets: its dotted key with `__` (`engine.name` -> `engine__name`)."""
    return flag.key.replace(".", "__")


def common_option(name: str, required: bool = False) -> Callable:
    """The click option of one of the COMMON flags."""
    param, kwargs = COMMON[name]
    return click.option(name, param, required=required, **kwargs())


def shared_flags(*names: str, required: Iterable[str] = ()) -> Callable:
    """A decorator adding the named shared flags (spec flags by their flag, `--engine`, or COMMON ones), in
    the order given; `required` names those the command cannot do without."""
    unknown = [n for n in names if n not in _BY_NAME and n not in COMMON]
    if unknown:
        raise ValueError(f"no shared flag {', '.join(unknown)}")  # a programming error, found at import
    must = set(required)
    defaulted = [n for n in must if n not in _BY_NAME or "[default" in _BY_NAME[n].help]
    if defaulted:  # required where `launch run` has a default would be a second, contradicting declaration
        raise ValueError(f"{', '.join(defaulted)} has a default: a command cannot require it")

    def decorate(func: Callable) -> Callable:
        for name in reversed(names):
            make = common_option(name, name in must) if name in COMMON else spec_flag_option(_BY_NAME[name], name in must)
            func = make(func)
        return func

    return decorate


def spec_flag_values(params: dict[str, Any], flags: Iterable[Flag] = SPEC_FLAGS) -> dict[str, Any]:
    """{spec key: value} of the spec flags given (not None), typed and checked as the Spec declares them,
    each error saying which flag it came from."""
    out = {}
    for flag in flags:
        value = params.get(param_name(flag))
        if value is not None:
            out[flag.key] = coerce_path(Spec, flag.key, value, f"from {flag.name}", text=True)
    return out


def spec_from_flags(params: dict[str, Any]) -> Spec:
    """A Spec of the spec flags a command without a spec file was given, the fields' defaults for the rest:
    how `launch memory` and `launch prep` read `--model`, `--engine`, `--backend` with run's defaults."""
    spec = Spec().with_overrides(spec_flag_values(params))
    check_preset(spec.model)
    return spec


def shared_flag_names() -> list[str]:
    """Every flag a command can take from here, for the test that commands sharing a flag agree on it."""
    return [*_BY_NAME, *COMMON]
