"""`launch`: run, sweep and report data-parallel LSTM experiments.

    launch --backend local --nodes 1 --gpus-per-node 2 --model nmt-tiny      (= launch run ...)
    launch sweep --workers 1,2 --mode strong --model nmt-tiny
    launch report runs/sweep-...

A spec comes from `--spec FILE.yaml` (optional), overridden by flags, validated before anything runs,
and saved as RUN_DIR/spec.json. Errors the user can fix print one line and exit 2; Ctrl-C (or SIGTERM,
SIGHUP) stops every process of the run, records it as CANCELLED and exits 128 + the signal (130).
"""

from __future__ import annotations

import difflib
import itertools
import json
import re
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from scalelab.core.checks import InputFile, OutputDir
from scalelab.core.errors import ScalelabError, SpecError, shell_word
from scalelab.core.flags import (  # noqa: F401
    SPEC_FLAGS,
    DataFlag,
    runs_dir_lookup_option,
    shared_flags,
    spec_flag_option,
    spec_flag_values,
)
from scalelab.core.options import Flag, parse_pairs  # noqa: F401  (prep imports it here)
from scalelab.core.presets import model_overrides
from scalelab.core.runids import RunDir
from scalelab.core.rundir import (ACTIVE, GEMM_FILE, PENDING, STUDY_FILE, RunPaths, discard_unlaunched, dryrun_dir,
                                  is_sweep, new_run_dir)
from scalelab.core.spec import (
    BATCH_MODES,
    SCALING_AXES,
    Spec,
    load_spec,
    read_spec,
)
from scalelab.core.terminal import break_name, make_console, prose_lines, visible_text, wrap_help_at_spaces
from scalelab.core.writes import WriteError, is_write_failure, unnamed_write_failure, writing
from scalelab.launcher import __version__
from scalelab.launcher.backend import (backend_flags, get_backend, has_checkpoint, import_optional,
                                      no_checkpoint_advice, options_type)
from scalelab.costs.rates import named_rates, rate_options
from scalelab.launcher.pricing import guard, price_options, show_quote
from scalelab.launcher.runner import INTERRUPTED, detaching, err_console, execute, start_detached

console = make_console()


# ---- the default-command group: `launch --flags` means `launch run --flags` --------------------


# Commands that live with the code they drive, imported only when used: name -> "module:attribute".
LAZY_COMMANDS: dict[str, str] = {
    "cost": "scalelab.costs.cli:cost_cmd",
    "plan": "scalelab.costs.cli:plan_cmd",
    "memory": "scalelab.costs.memory_cli:memory_cmd",
    "bench": "scalelab.launcher.bench:bench_cmd",
    "gpu-check": "scalelab.launcher.gpucheck:gpu_check_cmd",
    "study": "scalelab.launcher.study:study_cmd",
    "probe": "scalelab.launcher.probe:probe_cmd",
    "aws": "scalelab.aws.cli:aws_group",
    "prep": "scalelab.prep.cli:prep_cmd",
}
# Their one-line help for `launch --help`, so listing the commands imports none of them (importing them all
# loads PyTorch and pandas: 5-8 s). tests/test_cli_errors.py checks each against the command's own help.
LAZY_HELP: dict[str, str] = {
    "cost": "Dollars per run: hours x catalog price, billed per second with a 60-second minimum.",
    "plan": "Predict throughput, steps, time and dollars to the loss threshold of untried layouts and global "
            "batches, and say which layout to buy.",
    "memory": "Predict a rank's peak GPU memory for a model, batch, precision and engine, and which GPUs it fits.",
    "bench": "Measure the trainer's compute efficiency, all-reduce bandwidth, scaling, launch overhead, planner "
             "accuracy and report speed on this machine; print tables and write bench.json.",
    "gpu-check": "Check everything that needs a GPU (device, matrix rates, nmt-seed words/s and memory, refusal, "
                 "NCCL, GPU tests, bench) and write gpu-check.json and gpu-check.md.",
    "study": "Run a seed's study (examples/*.yaml) and write its tables (study.md, CSV) and scaling report.",
    "probe": "Measure candidate instance types on your own spec: 1 GPU, a whole instance, two instances.",
    "aws": "Housekeeping for runs on AWS (--backend aws).",
    "prep": "Normalise, tokenise and shard a corpus on Dask; records and a scaling table like training's.",
}
# Run directories of other kinds than training runs, told by a file they hold: file -> "module:function",
# the function taking (paths, out, fmt) as `report_dirs` does.
LAZY_REPORTS: dict[str, str] = {"prep.json": "scalelab.prep.report:report_dirs",
                                 GEMM_FILE: "scalelab.launcher.study:report_gemm"}  # seed 003's GEMM study
# Sweep directories of a kind told by a file they hold: file -> "module:function" taking the directory,
# called after `launch resume` has continued its runs.
LAZY_RESUMED: dict[str, str] = {"probe.json": "scalelab.launcher.probe:show_probe"}
# `launch resume STUDY`: "module:function" taking (the study directory, --allow-changed), imported by name as the
# study command is (scalelab.launcher.study imports this module's console)
STUDY_RESUME = "scalelab.launcher.study:resume_and_show"


# The flags of the lazy commands that no eager command has, so that a config file key meant for them is known
# without importing them (tests/test_config_file.py checks it against the commands themselves).
LAZY_FLAGS = frozenset({
    "block_mb", "budget", "checkpoint_interval_s", "checkpoint_write_s", "confidence", "deadline_h", "force",
    "gradient_mb", "instance_types", "instances", "interruptions_per_hour", "intra_gbps", "lines_per_worker",
    "link_sizes_mb", "list", "market", "measured_on", "only", "predict", "predict_batch", "predict_workers",
    "probe_steps", "quick", "refresh", "restart_s", "run_id", "scale", "scheduler", "shard_size", "skip", "speed",
    "total_s", "train", "valid", "valid_fraction", "work"})


def option_params(command: click.Command) -> dict[str, list[click.Option]]:
    """Flag (as a config key: `time_limit_min`) -> the options it names, in `command` and, for a group, in
    its loaded subcommands."""
    out: dict[str, list[click.Option]] = {}
    for param in command.params:
        if isinstance(param, click.Option) and param.name:
            for opt in (*param.opts, *param.secondary_opts):
                if opt.startswith("--"):
                    out.setdefault(opt[2:].replace("-", "_"), []).append(param)
    for sub in getattr(command, "commands", {}).values():
        for key, params in option_params(sub).items():
            out.setdefault(key, []).extend(params)
    return out


def option_keys(command: click.Command) -> dict[str, list[str]]:
    """Flag (as a config key: `time_limit_min`) -> the names of the parameters it sets, in `command` and,
    for a group, in its loaded subcommands."""
    return {key: [p.name for p in params if p.name] for key, params in option_params(command).items()}


class ConfigDefaults(dict):
    """Defaults from the config files (scalelab/core/config.py) as click's `default_map`, one for every
    command: click asks it for a parameter's default by the parameter's name (`key in map`, `map[key]`) and
    for a subcommand's map by the command's name (`map.get(name)`), which is this same map. The names of the
    parameters of lazily loaded commands are learned when they load (`learn`).

    A repeatable option's default is a list (one value in the file is a list of one: click wanted an
    iterable); a list for an option that takes one value is an error naming the file and key when a command
    reads that option (a key such as train-src repeats in `launch prep` and not in `launch run`)."""

    def __init__(self, config: dict[str, tuple[Any, Path]]) -> None:
        super().__init__()
        self.config = config  # config key -> (value, file)
        self.param_names: set[str] = set()
        self.source: dict[str, Path] = {}
        self.key_of: dict[str, str] = {}  # parameter name -> its config key
        self.problem: dict[str, str] = {}  # parameter name -> why its configured value cannot be its default
        self.helping = False  # only help is shown: a problem is warned about (`defaults_for`), not raised

    def learn(self, command: click.Command, options: dict[str, list[click.Option]] | None = None) -> None:
        """The configured defaults of `command`'s options; `options` is its `option_params` when the caller has
        walked the option tree already (`config_defaults`)."""
        for key, params in (option_params(command) if options is None else options).items():
            self.param_names.update(p.name for p in params if p.name)
            if key in self.config:
                value, path = self.config[key]
                for param in params:
                    self._set(param, key, value, path)

    def _set(self, param: click.Option, key: str, value: Any, path: Path) -> None:
        name = str(param.name)
        self[name] = (value if isinstance(value, list) else [value]) if param.multiple else value
        self.source[name], self.key_of[name] = path, key
        if isinstance(value, list) and not param.multiple:
            self.problem[name] = one_value_problem(path, key)
        elif isinstance(param.type, click.types.IntParamType) and any(
                isinstance(v, float) for v in (value if isinstance(value, list) else [value])):
            # click's int type truncates 40.5 to 40: refused, as the same value in a spec file is
            shown = next(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, float))
            self.problem[name] = blame(path, key, f"expected a whole number, got {shown!r}")

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key) and not (self.helping and key in self.problem)

    def __getitem__(self, key: Any) -> Any:
        if key in self.problem:
            raise SpecError(self.problem[key])
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:  # type: ignore[override]
        if key in self:
            return self[key]
        return default if key in self.param_names else self  # a subcommand's name: the same defaults

    def refuse_problems(self, command: click.Command) -> None:
        """Refuse a bad configured value of one of `command`'s options, even where a flag replaces it (the file
        is wrong all the same); a command without such an option runs, and help only warns (`defaults_for`)."""
        if self.helping:
            return
        for param in command.params:
            if param.name in self.problem:
                raise SpecError(self.problem[param.name])


def one_value_problem(path: Path, key: str) -> str:
    shown = key.replace("_", "-")
    return (f"config file {path}: {shown!r} must be one value (a word or a number), not a list: --{shown} is "
            "not repeatable here (a list is for options such as rate, model-arg, sbatch-arg)")


def config_defaults() -> ConfigDefaults | None:
    """The config files' defaults for every command, or None without a file; a key that is no option of any
    command is one error naming the file and the options there are; so is a bad value (`check_config`)."""
    from scalelab.core.config import config_paths, read_config

    config = read_config(config_paths())
    if not config:
        return None
    options = option_params(main)  # the option tree walked once, for learning, the unknown keys and the values
    defaults = ConfigDefaults(config)
    defaults.learn(main, options)
    known = set(options) | LAZY_FLAGS
    unknown = sorted(k for k in config if k not in known)
    if unknown:
        path = config[unknown[0]][1]
        close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        raise SpecError(f"config file {path}: {', '.join(unknown)} is no option of any command"
                        + (f" (did you mean {close[0]!r}?)" if close else "")
                        + "; keys are options without their dashes, e.g. backend, partition, time-limit-min, "
                          "bucket (`launch run --help` lists them)")
    check_config(config, defaults, options)
    return defaults


def check_config(config: dict[str, tuple[Any, Path]], defaults: ConfigDefaults,
                 options: dict[str, list[click.Option]] | None = None) -> None:
    """Check the values of the spec's, the backends' and --model-arg/--backend-opt's keys before any command
    runs, as their flags are checked, each error naming the file and key. Why: a bad value was blamed on a flag
    nobody typed (`lr: -1` said "(from --lr)", `steps: nan` "Invalid value for '--steps'"). A bad value is
    refused by the commands that have its option (`ConfigDefaults.problem`, `refuse_problems`), not by every
    command: `steps: nan` broke `launch ls` and `launch --help`. The other keys' values are checked by the command that reads them
    (`config_blame` names the file there): one key can differ between commands (`format: html` suits report,
    not ls), as can a list (`ConfigDefaults`). `options`: `option_params(main)`, if the caller has it."""
    for key, params in (option_params(main) if options is None else options).items():
        if key not in config:
            continue
        value, path = config[key]
        for name, param in {str(p.name): p for p in params if p.multiple or not isinstance(value, list)}.items():
            if name in defaults.problem:
                continue
            try:
                _check_value(param, key, value)
            except click.BadParameter as exc:
                defaults.problem[name] = blame(path, key, exc.message)
            except SpecError as exc:
                defaults.problem[name] = blame(path, key, str(exc))


def _check_value(param: click.Option, key: str, value: Any) -> None:
    """One configured value read as its flag's would be: click's type, then the field's type and checks."""
    from scalelab.core.flags import param_name
    from scalelab.core.options import coerce_path

    name = str(param.name)
    spec_keys = {param_name(flag): flag.key for flag in SPEC_FLAGS}
    if name not in spec_keys and not name.startswith("bopt__") and name not in ("model_args", "backend_opts"):
        return
    typed = param.type_cast_value(None, (value if isinstance(value, list) else [value]) if param.multiple else value)
    if name.startswith("bopt__"):
        _, backend, field = name.split("__", 2)
        options_type(backend).coerce({field: list(typed) if param.multiple else typed}, text=True)
    elif name in spec_keys and type(param.type).__module__.startswith("click"):  # not --data's own type
        coerce_path(Spec, spec_keys[name], typed, text=True)
    elif name in ("model_args", "backend_opts"):
        pairs = parse_pairs(tuple(typed), key.replace("_", "-"))
        if name == "model_args":
            model_overrides(pairs)


def blame(path: Path, key: str, message: str) -> str:
    """A configured value's problem, saying the file and the key (unless the message already names it)."""
    shown = key.replace("_", "-")
    named = message.startswith((key, shown, f"'{shown}'")) or f"(--{shown})" in message
    return f"config file {path}: {message if named else f'{shown}: {message}'}"


def config_blame(exc: click.ClickException) -> str | None:
    """A value click refused that came from a config file, as "config file F: KEY: problem", or None:
    click said "Invalid value for '--steps'", a flag the user never typed."""
    from click.core import ParameterSource

    param, ctx = getattr(exc, "param", None), getattr(exc, "ctx", None)
    defaults = getattr(ctx, "default_map", None)
    if not isinstance(exc, click.BadParameter) or param is None or not isinstance(defaults, ConfigDefaults):
        return None
    if param.name not in defaults.source or ctx.get_parameter_source(param.name) != ParameterSource.DEFAULT_MAP:
        return None
    return blame(defaults.source[param.name], defaults.key_of[param.name], exc.message)


class DefaultGroup(click.Group):
    """A group whose first argument, when it is not a command name, goes to `run`; some commands load lazily."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        names = set(self.commands) | set(LAZY_COMMANDS)
        if args and args[0] not in names and args[0] not in ("--help", "-h", "--version"):
            if not args[0].startswith("-"):  # `run` takes no arguments: a first word is a mistyped command
                from scalelab.launcher.owncode import script_hint

                hint = script_hint(args, whole=True)  # `launch train.py`, as torchrun takes it
                if hint:
                    raise click.UsageError(hint)
                close = difflib.get_close_matches(args[0], sorted(names), n=1, cutoff=0.6)
                hint = f"did you mean `launch {close[0]}`?" if close else f"commands: {', '.join(sorted(names))}"
                raise click.UsageError(f"no command {args[0]!r}; {hint}")
            args = ["run", *args]
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | {n for n in LAZY_COMMANDS if _installed(LAZY_COMMANDS[n])})

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of `launch --help`, the lazy commands' lines from LAZY_HELP (nothing imported)."""
        limit = formatter.width - 6 - max(len(n) for n in self.list_commands(ctx))
        rows = [(n, self.commands[n].get_short_help_str(limit) if n in self.commands
                 else click.Command(n, help=LAZY_HELP[n]).get_short_help_str(limit)) for n in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None and isinstance(ctx.default_map, ConfigDefaults):
            ctx.default_map.refuse_problems(command)
        return name, command, rest

    def get_command(self, ctx: click.Context, name: str):
        if name in self.commands or name not in LAZY_COMMANDS:
            return self.commands.get(name)
        module_name, attr = LAZY_COMMANDS[name].split(":")
        module = import_optional(module_name)
        command = getattr(module, attr) if module is not None else None
        if command is not None and isinstance(ctx.default_map, ConfigDefaults):
            ctx.default_map.learn(command)  # its options' defaults from the config files
        return command


def _installed(ref: str) -> bool:
    """Whether the module of "module:attribute" is part of this installation, found without importing it."""
    import importlib.util

    try:
        return importlib.util.find_spec(ref.split(":")[0]) is not None
    except ModuleNotFoundError:
        return False


wrap_help_at_spaces()


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="launch")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Train LSTM models data-parallel on a chosen layout and measure how they scale.

    \b
    Start here:
      one run, local processes:
        launch --model nmt-tiny --engine horovod --gpus-per-node 2
      a strong-scaling sweep:
        launch sweep --model nmt-tiny --workers 1,2
      its speedup / efficiency table:
        launch report runs/sweep-*
      your own training script (or --module pkg.mod):
        launch --script train.py --gpus-per-node 2 -- --lr 0.1

    `launch` with options and no command is `launch run`. See `launch run --help` for every option.
    """
    from scalelab.launcher.backend import fleet_of

    ctx.obj = {"fleet_of": fleet_of}  # how each backend pays for its nodes, for `launch cost` (costs/ names none)


class GroupedCommand(click.Command):
    """`--help` with the common options first and each backend's options in a section of its own: about
    40 backend flags listed before --model hid the options every run needs."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {"Options": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            name = param.name or ""
            title = f"{name.split('__')[1]} backend options" if name.startswith("bopt__") else "Options"
            sections.setdefault(title, []).append(_with_config_default(record, name, ctx))
        for title, rows in sections.items():
            with formatter.section(title):
                formatter.write_dl(rows)


def _with_config_default(record: tuple[str, str], name: str, ctx: click.Context) -> tuple[str, str]:
    """A help line whose default comes from a config file says so: `[default: gpu, from ./scalelab.yaml]`."""
    defaults = ctx.default_map
    if not isinstance(defaults, ConfigDefaults) or name not in defaults.source or name in defaults.problem:
        return record  # a configured value the command would refuse: the warning above the help says so
    text = re.sub(r"\s*\[default: [^\]]*\]", "", record[1])
    value = defaults[name]
    shown = ", ".join(map(str, value)) if isinstance(value, list) else value  # a repeatable option's values
    return record[0], f"{text} [default: {shown}, from {defaults.source[name]}]"


# ---- options shared by run and sweep -------------------------------------------------------------


def _data_flag(params: dict[str, Any]) -> dict[str, Any]:
    """`--data shards:DIR` as `--data shards --shards DIR`; naming two different directories is an error."""
    kind, colon, directory = (params.get("data__kind") or "").partition(":")
    if not colon:
        return params
    if params.get("data__shards") not in (None, directory):
        raise SpecError(f"--data shards:{directory} and --shards {params['data__shards']} name two shards "
                        "directories: give one of them")
    return {**params, "data__kind": kind, "data__shards": directory}

# The spec's flags (generated from the fields of `Spec` that declare one with `option()`: scalelab/core/spec.py) and
# the options that are no spec field are declared once in scalelab/core/flags.py, shared with `launch memory` and
# `launch prep`; only the backends' flags are made here.
RUN_COMMON = ("--spec", "--model-arg", "--backend-opt", "--runs-dir", "--dry-run")


def spec_options(func):
    """The spec flags, every backend's flags (generated from its options type) and the common ones."""
    for flag in reversed(SPEC_FLAGS):
        func = spec_flag_option(flag)(func)
    for backend, flags in reversed(list(backend_flags().items())):
        for flag in reversed(flags):
            func = _backend_flag(backend, flag)(func)
    func = shared_flags(*RUN_COMMON)(func)
    return price_options(func)


def _backend_flag(backend: str, flag: Flag):
    """The click option of one backend option's flag; it sets `backend_options[flag.key]`.

    A flag whose option holds a list or a mapping is repeatable, one item each time, in the grammar of
    --backend-opt: the option's `parse` reads each text (`--toleration nvidia.com/gpu:NoSchedule`), so click
    takes text for an item that is no number (a toleration's mapping: click's `dict` type was the error
    "dictionary update sequence element #0 has length 1")."""
    kwargs: dict[str, Any] = {"help": f"[{backend}] {flag.help}"}
    if flag.kind is bool:
        kwargs["default"] = None  # an on/off pair: None when neither is given
    else:
        kind = flag.kind if flag.kind in (str, int, float) else str
        kwargs.update(type=kind, multiple=flag.multiple, metavar=flag.metavar)
    return click.option(flag.decl, f"bopt__{backend}__{flag.key}", **kwargs)


def build_spec(params: dict[str, Any]) -> Spec:
    """YAML (if any) < flags; every value typed and checked with where it came from; then validate."""
    spec_file = params.get("spec_file")
    spec = load_spec(spec_file) if spec_file else Spec()
    in_file: set[str] | None = None  # the keys the spec file sets (`_file_keys`), read once, where needed
    configured = _from_config(params)
    if configured:  # a config file's default yields to the spec file's own value (built-in < config < spec < flag)
        in_file = _file_keys(spec_file) if spec_file else set()
        params = {k: (None if k in configured and _spec_key(k) in in_file else v) for k, v in params.items()}
    overrides = _spec_flag_values(params)
    if "global_batch" in overrides and "batch_per_worker" in overrides:
        raise SpecError("--global-batch (strong scaling) and --batch-per-worker (weak scaling) were both given; "
                        "pass one of them")
    if "global_batch" in overrides:  # a flag wins over the spec file's value of the other key
        spec.batch_per_worker = None
    if "batch_per_worker" in overrides:
        spec.global_batch = None
    spec = spec.with_overrides(overrides)
    if spec.epochs is not None and not _steps_chosen(params, configured, in_file):
        spec.steps = None  # --epochs alone runs its epochs: the default 40 steps (or a config file's) caps nothing
    if params.get("model_args"):
        pairs = parse_pairs(params["model_args"], "--model-arg")
        spec.model_args = {**spec.model_args, **model_overrides(pairs, "from --model-arg")}
    spec.backend_options = _backend_options(spec, params)
    _drop_configured_unread(spec, params)
    from scalelab.launcher.owncode import apply

    return apply(spec, params).validate()  # --script / --module: checked, resolved, the arguments after `--`


def _steps_chosen(params: dict[str, Any], configured: set[str], in_file: set[str] | None) -> bool:
    """Whether this run's steps were chosen for it: --steps typed, or `steps` in its spec file (`in_file`: its
    keys where `build_spec` read them already, else None). Why: with --epochs, only a chosen length is a second
    bound (whichever ends first); the built-in default (40) or a config file's default steps meant for runs that
    give no length would end the epochs early, and did, silently."""
    if params.get("steps") is not None and "steps" not in configured:
        return True
    if not params.get("spec_file"):
        return False
    return "steps" in (in_file if in_file is not None else _file_keys(params["spec_file"]))


def _drop_configured_unread(spec: Spec, params: dict[str, Any]) -> None:
    """A config file's default that this run's other choices leave unread (`fusion-threshold-mb: 32` for a
    project's Horovod runs, in a --engine ddp run) is meant for other runs: set back to the built-in default,
    not refused as the same flag typed is (`Spec.unread_settings`), as another backend's options are ignored."""
    configured = {name for name in _from_config(params) if params.get(name) not in (None, ())}
    for unread in spec.unread_settings():
        if unread.key.replace(".", "__") in configured:  # the click parameter of a dotted key (flags.param_name)
            spec.drop_setting(unread.key)


def _from_config(params: dict[str, Any]) -> set[str]:
    """The parameters whose value is a config file's default (scalelab/core/config.py), not a flag given."""
    ctx = click.get_current_context(silent=True)
    if ctx is None or not isinstance(ctx.default_map, ConfigDefaults):
        return set()
    from click.core import ParameterSource

    return {name for name in params if ctx.get_parameter_source(name) == ParameterSource.DEFAULT_MAP}


def _config_source(name: str) -> str:
    """Where parameter `name`'s value came from when a config file gave it: `from config file F, key KEY`."""
    defaults = click.get_current_context().default_map
    assert isinstance(defaults, ConfigDefaults)
    return f"from config file {defaults.source[name]}, key {defaults.key_of[name].replace('_', '-')}"


def _spec_key(param_name: str) -> str:
    return param_name.replace("__", ".")


def _file_keys(path: str) -> set[str]:
    """The dotted keys a spec file sets, with every prefix (`engine: horovod` sets `engine`, so engine.name)."""
    from scalelab.core.spec import read_yaml_mapping

    keys: set[str] = set()

    def walk(mapping: dict[str, Any], prefix: str) -> None:
        for key, value in mapping.items():
            dotted = f"{prefix}{key}"
            keys.add(dotted)
            if isinstance(value, dict):
                walk(value, dotted + ".")
    walk(read_yaml_mapping(path, "spec file"), "")
    return keys | {k for key in keys for k in _prefixes(key)}


def _prefixes(key: str) -> list[str]:
    parts = key.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _spec_flag_values(params: dict[str, Any]) -> dict[str, Any]:
    """{spec key: value} of the spec flags given, typed and checked as the Spec declares them."""
    return spec_flag_values(_data_flag(params))


def _backend_options(spec: Spec, params: dict[str, Any]) -> dict[str, Any]:
    """Spec file < --backend-opt < backend flags, each typed and checked against the backend's options
    with where it came from; a backend's flag with another --backend is an error."""
    where = f"in spec file {params['spec_file']}" if params.get("spec_file") else ""
    configured = _from_config(params)
    opts_from = _config_source("backend_opts") if "backend_opts" in configured else "from --backend-opt"
    sources = [(spec.backend_options, where, False),
               (parse_pairs(params.get("backend_opts") or (), "--backend-opt"), opts_from, True)]
    for backend, flags in backend_flags().items():
        for flag in flags:
            name = f"bopt__{backend}__{flag.key}"
            value = params.get(name)
            if value is None or value == ():
                continue
            if name in configured:  # a config file's default: for its backend only, below the spec file
                if spec.backend == backend and flag.key not in (spec.backend_options or {}):
                    sources.insert(0, ({flag.key: list(value) if isinstance(value, tuple) else value},
                                       "from the config file", True))
                continue
            if spec.backend != backend:
                raise SpecError(f"{flag.name} is an option of --backend {backend}, not of --backend {spec.backend}")
            sources.append(({flag.key: list(value) if isinstance(value, tuple) else value}, f"from {flag.name}", False))
    options = options_type(spec.backend)  # None: an unknown backend, which validate() names
    merged: dict[str, Any] = {}
    came_from: dict[str, str] = {}
    for raw, source, text in sources:
        typed = options.coerce(raw, source, text=text) if options is not None else raw
        merged.update(typed)
        came_from.update(dict.fromkeys(typed, source))
    for key, (needs, words, instead) in (options.unread(merged) if options is not None else {}).items():
        if came_from.get(key, "").startswith(("from the config file", "from config file")):
            del merged[key]  # a config file's default meant for other runs (`max-price` for spot ones)
            continue
        flag = next((f.name for f in options.flags() if f.key == key), "")
        value = f"{merged[key]:g}" if isinstance(merged[key], float) else merged[key]
        given = f"{flag} {value}" if flag else f"{key}={value}"
        raise SpecError(f"{given} is for {needs} ({words}), not {instead}; add {needs} or leave {flag or key} out")
    return merged


# ---- run -----------------------------------------------------------------------------------------


DETACH_HELP = ("Start the run and return at once, with no launcher following it (its ranks do not stop when "
               "this process ends; on Slurm: submit the job and return, as sbatch does). `launch status` follows "
               "it and records how it ended, `launch cancel` stops it. Local and Slurm backends; not for sweeps.")


SCRIPT_ARGS = click.argument("script_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- SCRIPT_ARGS...]")


def rank_output_option(f):
    from scalelab.launcher.echo import RANK_OUTPUT_HELP

    return click.option("--rank-output", metavar="all|none|RANKS", help=RANK_OUTPUT_HELP)(f)


def echoed_ranks(value: str | None, spec: Spec, detach: bool) -> frozenset[int]:
    """The ranks whose output `launch` shows as it follows the run (`--rank-output`; default: all of a script's,
    none of the built-in trainer's, which prints only a failure's traceback: its one-line error says it); a value
    with --detach is refused: nothing follows a detached run."""
    from scalelab.launcher.echo import ALL, NONE, parse_rank_output

    if value is not None and detach:
        raise SpecError(f"--rank-output {value} shows the ranks' output while the launcher follows the run, and "
                        "with --detach nothing follows it: drop one (`launch logs RUN -f` shows a detached run's)")
    default = ALL if spec.script or spec.module else NONE
    return frozenset() if detach else parse_rank_output(default if value is None else value, spec.world)


@main.command("run", cls=GroupedCommand)
@spec_options
@click.option("--detach", is_flag=True, help=DETACH_HELP)
@rank_output_option
@SCRIPT_ARGS
def run_cmd(detach: bool, rank_output: str | None, **params: Any) -> None:
    """Run one training job on the chosen layout and print its summary.

    The run directory (spec, per-rank records, logs, summary) is printed at the end;
    `launch report RUN_DIR` turns it into tables (and plots: --plots, --format html). With --script
    FILE (or --module MOD) the ranks run your own code instead of a built-in model; its arguments follow `--`.
    """
    spec = build_spec(params)
    backend = get_backend(spec.backend, spec.backend_options)
    echo = echoed_ranks(rank_output, spec, detach)
    if detach:
        detaching(backend)
    if params["dry_run"]:
        backend.check_dry_run(spec)
        run_dir = dryrun_dir(Path(params["runs_dir"]), run_name_of(spec))
        text = backend.submit_dryrun(spec, run_dir).render()
        click.echo(text, nl=not text.endswith("\n"))  # exactly the request: a script's last newline is its own
        show_quote([(spec, 1)], params)
        return
    backend.validate(spec)
    guard([(spec, 1)], params)
    run_dir = new_run_dir(Path(params["runs_dir"]), run_name_of(spec))
    try:
        run_and_show(backend, spec, run_dir, detach, echo)
    except (ScalelabError, OSError) as exc:
        # a full or read-only disk before the launch, a submission Slurm refused, a cloud or cluster that cannot be
        # reached: leave no run directory that was never launched (no launch.json; `launch ls` listed a refused one
        # as NEW for ever), or say how to remove it where it cannot be
        if isinstance(exc, OSError) and not is_write_failure(exc):
            raise
        left = discard_unlaunched(run_dir)
        if left and len(exc.args) == 1 and isinstance(exc, ScalelabError):
            exc.args = (f"{exc}{left}",)
        raise


def run_and_show(backend, spec: Spec, run_dir: Path, detach: bool, echo: frozenset[int] = frozenset()) -> None:
    """Follow the run to its summary, showing the output of the ranks in `echo`, or start it detached and say
    how to follow and stop it."""
    if not detach:
        print_summary(run_dir, execute(backend, spec, run_dir, echo=echo))
        return
    start_detached(backend, spec, run_dir)
    try:
        now = backend.status(run_dir)
        state = now.detail or now.state
    except ScalelabError:  # the job is queued; only asking its state failed (an sacct/squeue hiccup)
        state = "submitted"
    from scalelab.core.runids import short_id

    short = short_id(run_dir)
    rid = shell_word(short)  # the short id where it is unique: the lines ran to ~150 columns
    lines = [("", f"started {run_dir} detached: no launcher follows it ({state})."),
             ("  follow it:  ", f"launch status {rid}   launch logs {rid}"),
             ("  stop it:    ", f"launch cancel {rid}   ({_stopped_how(spec, short)})"),
             ("  once ended: ", f"launch status {rid} records how it ended (and its summary), launch report {rid} "
                            "reports it")]
    commands = tuple(f"launch {c} {rid}" for c in ("status", "logs", "cancel", "resume", "report"))
    for lead, text in lines:  # wrapped between words, a path and a command whole
        console.print(escape(prose_lines(lead, text, console.width, whole=commands)), highlight=False,
                      soft_wrap=True)


def _stopped_how(spec: Spec, run_dir: Path | str) -> str:
    """What a cancel does to the run's ranks and how `launch resume` goes on: the built-in trainer checkpoints; a
    script gets SIGTERM and is started again, resuming from whatever it saved itself."""
    if spec.own_code:
        return f"its ranks get SIGTERM; launch resume {shell_word(run_dir)} starts {spec.script_label} again"
    return f"its ranks checkpoint; launch resume {shell_word(run_dir)} continues"


def print_summary(run_dir: Path, summary: Any) -> None:
    """The end of a completed run: its scaling row, or the note of a --script run without step records, wrapped
    at words to the terminal as `launch report` wraps it (it was one 321-character line)."""
    if isinstance(summary, dict):  # a --script run without step records (runner.write_summary)
        console.print(escape(prose_lines("note: ", summary["note"], console.width)), highlight=False, soft_wrap=True)
        _run_directory_line(run_dir, "logs")
        return
    from scalelab.analysis.report import print_scaling
    from scalelab.analysis.scaling import scale_layouts

    print_scaling(scale_layouts([summary]), console=console)
    _run_directory_line(run_dir, "report")


def run_name_of(spec: Spec) -> str:
    """The name of a run's directory before its date (`--name`, else model-engine-NxG), its dry run's too
    (NAME-DRYRUN): the dry run printed the model alone, so its Slurm job name was not the one submitted."""
    return spec.name or f"{spec.model}-{spec.engine.name}-{spec.nodes}x{spec.gpus_per_node}"


def _run_directory_line(run_dir: Path, command: str) -> None:
    """`run directory: PATH  (launch report ID)`, the short id where it is unique, wrapped between words with the
    path whole: with the path twice it ran past 80 columns."""
    from scalelab.core.runids import short_id

    hint = f"(launch {command} {shell_word(short_id(run_dir))})"
    text = f"{run_dir}  {hint}"
    console.print(escape(prose_lines("run directory: ", text, console.width, whole=(hint,))), highlight=False,
                  soft_wrap=True)


# ---- resume --------------------------------------------------------------------------------------


@main.command("resume")
@click.argument("run_dir", type=RunDir())
@runs_dir_lookup_option()
@click.option("--detach", is_flag=True, help=DETACH_HELP)
@rank_output_option
@click.option("--allow-changed", "allow_changed", multiple=True, metavar="FIELD",
              help="Go on although spec.json changes FIELD (lr, optimizer, model_args, global_batch, precision, "
                   "data, ...; a --script run's: script, script_args) since the run last ran; the change is recorded and `launch report` says from which "
                   "step. Repeatable. Without it such a change is refused, naming each field.")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED, metavar="")
def resume_cmd(run_dir: str, runs_dir: str, detach: bool, rank_output: str | None,
               allow_changed: tuple[str, ...], script_args: tuple[str, ...]) -> None:
    """Continue RUN_DIR from its last checkpoint with the spec it was started with. RUN_DIR may be a short id
    (a unique prefix or suffix of its name under the runs directory).

    A sweep directory: its layouts that did not complete are continued (from their checkpoints) or
    started, then the sweep is reported. A study directory: the same for each of its variants' sweeps,
    then its tables are written. A run that still runs is refused: `launch cancel` it first.
    A spec.json edited since the run last ran in a field that changes how it trains is refused unless
    --allow-changed names the field.
    """
    path = Path(run_dir)
    from scalelab.core.trajectory import allowed_fields

    if script_args:  # `launch resume RUN -- --steps 95`: click's "unexpected extra arguments" said nothing of how
        raise SpecError(f"launch resume takes no arguments for the script ({' '.join(map(shell_word, script_args))}): "
                        f"it runs as {shell_word(path / 'spec.json')} says; to change them, edit `script_args` there "
                        "and resume with --allow-changed script_args")
    allowed_fields(allow_changed)  # a misspelt field is refused whatever the run's state (a completed one returned first)
    study = (path / STUDY_FILE).is_file()
    if is_sweep(path) or study:
        from scalelab.launcher.sweep import resume_sweep

        what = "study" if study else "sweep"
        if rank_output is not None:
            raise SpecError(f"--rank-output {rank_output} is for one run: a {what}'s layouts are followed by their "
                            "progress (`launch logs LAYOUT_DIR -f` shows a layout's output)")
        if detach:
            raise SpecError(f"--detach is not for a {what}: its layouts run one after another, which takes a "
                            "launcher following them; resume it without --detach")
        if study:
            module, attr = STUDY_RESUME.split(":")
            getattr(import_optional(module), attr)(path, allow_changed)
            return
        from scalelab.launcher.layouts import restore_missing_layouts

        for name in restore_missing_layouts(path):  # deleted by hand: made again from sweep.json and a sibling's spec
            console.print(f"layout {name} of {path} was missing: made again from sweep.json and its sibling "
                          "layouts' spec; it starts from the beginning", highlight=False, soft_wrap=True)
        report_dirs([resume_sweep(path, allow_changed)], out=path, fmt="table")
        for marker, target in LAZY_RESUMED.items():  # e.g. a probe: its figures and cost with the runs resumed
            if (path / marker).is_file():
                module, attr = target.split(":")
                getattr(import_optional(module), attr)(path)
        return
    refuse_not_a_run(path, "launch resume", takes_sweeps=True)  # a study, a prep: what it is and what to do, not "spec.json is missing"
    spec = read_spec(path).validate(stored=True)  # a --script run from before the trainer-only refusal resumes
    echo = echoed_ranks(rank_output, spec, detach)
    from scalelab.core.trajectory import check_resume, record_changes
    from scalelab.launcher.runner import nothing_to_resume, refuse_model_change, refuse_restart

    done = nothing_to_resume(path, spec)  # a COMPLETED run: left byte-for-byte as it is
    if done:
        console.print(done, highlight=False, soft_wrap=True)
        return
    changed = check_resume(path, spec, allow_changed)  # an edited lr, batch, ...: refused unless allowed
    refuse_model_change(path, spec, changed)  # allowed, but the checkpoint's tensors would not fit the new model
    backend = get_backend(spec.backend, spec.backend_options)
    refuse_restart(backend, path, spec)  # steps recorded, no checkpoint: it would train them again
    if detach:
        detaching(backend)
    backend.validate(spec)
    if changed:
        step = record_changes(path, changed)
        console.print(f"spec changed from step {step}: " + "; ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items()),
                      highlight=False, soft_wrap=True)
    run_and_show(backend, spec, path, detach, echo)


# ---- sweep ---------------------------------------------------------------------------------------


@main.command("sweep", cls=GroupedCommand)
@spec_options
@click.option("--workers", type=str, help="Worker counts on one node, e.g. 1,2 (same as --layouts 1x1,1x2).")
@click.option("--layouts", type=str, help="Layouts NODESxGPUS, e.g. 1x1,1x2,2x1.")
@click.option("--batch-scaling", type=click.Choice(SCALING_AXES),
              help="How the global batch changes with the workers: fixed (split over them: --global-batch) or "
                   "growing (every worker keeps --batch-per-worker) [default: fixed, or as --mode says].")
@click.option("--work-scaling", type=click.Choice(SCALING_AXES),
              help="How the total work changes with the workers: fixed (the same job: the steps shrink as the "
                   "batch grows) or growing (the same work per worker) [default: as the batch axis, or --mode].")
@click.option("--mode", type=click.Choice(BATCH_MODES),
              help="Shorthand for both axes: strong = fixed, fixed; weak = growing, growing. An axis flag that "
                   "contradicts it is refused.")
@click.option("--repeats", type=click.IntRange(1, 1000), default=1, show_default=True,
              help="Runs of each layout (repeated measurements: LAYOUT-r0, -r1, ...); one job array on Slurm.")
@SCRIPT_ARGS
def sweep_cmd(workers: str | None, layouts: str | None, batch_scaling: str | None, work_scaling: str | None,
              mode: str | None, repeats: int, **params: Any) -> None:
    """Run the same spec over several layouts and print the scaling table.

    Two axes: the global batch (fixed: --global-batch or the preset's, split over the workers;
    growing: --batch-per-worker or the preset's on every worker) and the total work (fixed: the same
    samples on every layout; growing: the same samples per worker); --steps and --epochs are those of
    the fewest workers. --mode strong is both fixed, --mode weak both growing. Every layout is
    checked before the first one runs, and every run records both axes.
    """
    from scalelab.core.spec import scaling_name
    from scalelab.launcher.sweep import (parse_layouts, refuse_layout_flags, repeat_dirs, run_sweep, sweep_axes,
                                         sweep_specs)

    if not workers and not layouts:
        raise SpecError("give --workers (e.g. 1,2) or --layouts (e.g. 1x1,1x2,2x1)")
    refuse_layout_flags(params.get("nodes"), params.get("gpus_per_node"), workers, layouts)
    base = build_spec({**params, "nodes": None, "gpus_per_node": None})
    axes = sweep_axes(mode, batch_scaling, work_scaling, base)
    specs = sweep_specs(base, parse_layouts(workers, layouts), batch_scaling=axes[0], work_scaling=axes[1])
    mode = scaling_name(*axes)  # "strong", "weak", else both axes: the directory's name, as the reports' mode
    backend = get_backend(base.backend, base.backend_options)
    if params["dry_run"]:  # named as the real sweep's directory, DRYRUN for its date and time
        dry = dryrun_dir(Path(params["runs_dir"]), base.name or f"sweep-{base.model}-{mode}")
        backend = backend.for_sweep(dry.name)
        backend.check_dry_run(base)
        for spec in specs:
            run_dir = dry / f"{spec.nodes}x{spec.gpus_per_node}"
            for request in backend.submit_dryrun_batch(spec, repeat_dirs(run_dir, repeats)):
                click.echo(request.render())
        show_quote([(spec, repeats) for spec in specs], params)
        return
    backend.validate(base)
    guard([(spec, repeats) for spec in specs], params)
    sweep_dir = run_sweep(backend, specs, Path(params["runs_dir"]), base.name or f"sweep-{base.model}-{mode}", repeats)
    report_dirs([sweep_dir], out=sweep_dir, fmt="table", rates=params.get("rates") or (),
                prices_file=params.get("prices_file"))  # priced as its preview was


# ---- report --------------------------------------------------------------------------------------


@main.command("report")
@click.argument("run_dirs", nargs=-1, type=RunDir())
@click.option("--from-csv", "from_csv", type=InputFile("--from-csv file"),
              help="A published scaling table instead of runs: label (opt.), workers, nodes (opt.), throughput or time_s, mode (opt.).")
@click.option("--compare", is_flag=True, help="A B: two report directories (or report.json files); what changed from A to B, in percent.")
@click.option("--out", type=OutputDir("--out"), help="Where report.md, report.json and plots go [default: the one run, sweep or study directory given; "
                   "for several, RUNS/.reports/report-DATE, which `runs/*` globs do not match].")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown", "html"]), default="table", show_default=True,
              help="What to print; report.md and report.json are written in every case; html writes "
                   "report.html (one self-contained page, its plots inside) and prints its path.")
@click.option("--plots", is_flag=True, help="Also draw speedup.png and throughput.png beside report.md, linked from it "
                                            "(`launch sweep` and `launch study` always do).")
@rate_options
def report_cmd(run_dirs: tuple[str, ...], from_csv: str | None, compare: bool, out: str | None, fmt: str,
               plots: bool, rates: tuple[str, ...], prices_file: str | None) -> None:
    """Throughput, speedup, efficiency and dollars per layout from the runs' records.

    RUN_DIRS are run, sweep or study directories (their runs are all taken). Speedup is relative to
    the layout with the fewest workers; the slowest rank sets each step's time. Dollars per run and to
    the loss threshold: a cloud run at the catalog's price, an on-premise one at --rate or the prices
    file's rate (none: no dollars), billed as `launch cost` bills. With --from-csv FILE the rows of FILE
    are used instead (speedup relative to the fewest workers of the same label).
    """
    where = out or (run_dirs[0] if run_dirs else from_csv) or "."
    made = out is not None and not Path(out).exists()
    prices = {"rates": rates, "prices_file": prices_file}
    try:
        with writing(where, "the report", "or give --out a writable directory with room"):
            write_report(run_dirs, from_csv, compare, out, fmt, prices, plots)
    except WriteError:
        if made:  # what this report put there is incomplete
            shutil.rmtree(out, ignore_errors=True)
        raise


def write_report(run_dirs: tuple[str, ...], from_csv: str | None, compare: bool, out: str | None, fmt: str,
                 prices: dict[str, Any] | None = None, plots: bool = False) -> None:
    if compare:
        return compare_reports(run_dirs, fmt)
    if bool(from_csv) == bool(run_dirs):
        raise SpecError("give RUN_DIRS (run or sweep directories) or --from-csv FILE (one of the two)")
    if from_csv:
        from scalelab.costs.cli import report_from_csv

        report_from_csv(from_csv, Path(out) if out else None, fmt, plots)
        return
    for marker, target in LAZY_REPORTS.items():
        if all((Path(p) / marker).is_file() for p in run_dirs):
            module, attr = target.split(":")
            return getattr(import_optional(module), attr)([Path(p) for p in run_dirs], Path(out) if out else None, fmt)
    report_dirs([Path(p) for p in run_dirs], Path(out) if out else None, fmt, **(prices or {}), plots=plots)


def compare_reports(paths: tuple[str, ...], fmt: str) -> None:
    """Print the change from report A to report B per layout, as JSON or a table of percentages."""
    from scalelab.analysis.compare import COMPARED, compare_tables, load_table
    from scalelab.analysis.report import to_json_records

    if len(paths) != 2 or not all((Path(p) / "report.json").is_file() or Path(p).name == "report.json" for p in paths):
        raise SpecError("--compare takes two reports A B: directories holding report.json (`launch report` writes them)")
    a, b = load_table(Path(paths[0])), load_table(Path(paths[1]))
    for column in ("model", "engine", "precision"):  # a change across unrelated runs is not a speed-up
        seen = [sorted(set(map(str, t[column].dropna()))) if column in t.columns else [] for t in (a, b)]
        if seen[0] and seen[1] and seen[0] != seen[1]:
            err_console.print(f"[yellow]warning:[/] the reports compare different {column}s ({', '.join(seen[0])} "
                              f"against {', '.join(seen[1])}): the changes are not those of one {column}",
                              highlight=False, soft_wrap=True)
    diff = compare_tables(a, b)
    if fmt == "json":
        click.echo(json.dumps(to_json_records(diff), indent=2))
        return
    import pandas as pd
    from rich.table import Table

    table = Table(title=f"From {paths[0]} to {paths[1]}")
    table.add_column("workers", justify="right")
    shown = [(c, what) for c, what in COMPARED if f"{c}_change_pct" in diff]
    for _, what in shown:
        table.add_column(f"{what} change", justify="right")
    for _, r in diff.iterrows():
        table.add_row(str(int(r["workers"])), *("—" if pd.isna(r[f"{c}_change_pct"]) else f"{r[f'{c}_change_pct']:+.1f} %"
                                                for c, _ in shown))
    console.print(table)


def report_dirs(paths: list[Path], out: Path | None, fmt: str, rates: tuple[str, ...] = (),
                prices_file: str | None = None, plots: bool = True) -> None:
    """The report of runs (`launch report`, and after a sweep); `plots`: speedup.png and throughput.png too
    (matplotlib: most of the time of a report that prints text, so `launch report` draws them on --plots only)."""
    from scalelab.analysis.results import build_report
    from scalelab.core.errors import RecordError

    try:
        report = build_report(paths, out, report_pricer(rates, prices_file), plots=plots)
    except RecordError:
        facts = unmeasured_facts(paths)
        if facts is None:
            raise
        show_unmeasured(facts, fmt)
        return
    for warning in report.warnings:  # prose, wrapped between words as the notes are (it ran to 196 columns)
        lines = prose_lines("warning: ", warning, err_console.width)
        err_console.print("[yellow]warning:[/]" + escape(lines[len("warning:"):]), highlight=False, soft_wrap=True)
    if fmt == "json":
        click.echo(report.json_text)
    elif fmt == "markdown":
        click.echo(report.markdown_path.read_text())
    elif fmt == "html":
        # absolute, whatever form it was made in, so that it opens from any directory (`xdg-open "$(launch report
        # --format html ...)"`): it was relative for one directory and absolute for several
        click.echo(str(write_html_report(report, paths).resolve()))
    else:
        from scalelab.analysis.report import print_scaling

        print_scaling(report.table, console=console)
        for note in report.notes:  # prose: wrapped between words, a path whole
            console.print(escape(prose_lines("note: ", note, console.width)), highlight=False, soft_wrap=True)
        plot = f"  plot: {report.plot_path}" if report.plot_path else ""
        line = f"report: {report.markdown_path}{plot}"
        if len(line) > console.width and plot:  # a line each, paths whole (a sweep's ran to ~150 columns)
            line = f"report: {report.markdown_path}\nplot:   {report.plot_path}"
        console.print(escape(line), highlight=False, soft_wrap=True)


def unmeasured_facts(paths: list[Path]) -> list[dict[str, Any]] | None:
    """The summaries of completed --script runs that measured nothing (no `track.step`: their wall time, exit status
    and a note saying how to measure, `runner.write_summary`) where every path is one; else None. Why: `launch
    report` of such a run was an error (exit 2, nothing on stdout for --format json) for a run that did what its
    script asked."""
    from scalelab.core.rundir import RunPaths, read_json

    facts = []
    for path in paths:
        try:
            summary = read_json(RunPaths(Path(path)).summary, "summary", dict)
        except (ScalelabError, OSError):
            return None
        if summary.get("steps_measured") != 0 or "note" not in summary:
            return None
        facts.append(summary)
    return facts


def show_unmeasured(facts: list[dict[str, Any]], fmt: str) -> None:
    """What a report says of runs with nothing measured: their facts as JSON, else each one's note."""
    if fmt == "json":
        click.echo(json.dumps(facts, indent=2))
        return
    for summary in facts:
        console.print(escape(prose_lines("note: ", summary["note"], console.width)), highlight=False, soft_wrap=True)


def report_pricer(rates: tuple[str, ...] = (), prices_file: str | None = None):
    """The report's dollars of one run (`costs.expected.recorded_cost`, what `launch cost` shows): its fleet
    priced by the catalog with the prices file and --rate (a bare rate prices the run's own backend), one
    catalog per backend and region; a run no rate prices gets none, and a note saying how to give one."""
    from scalelab.costs.catalog import DEFAULT_REGION, load_catalog
    from scalelab.costs.expected import fleet_pricing, recorded_cost
    from scalelab.launcher.backend import fleet_of

    catalogs: dict[tuple[str, str], Any] = {}
    load_catalog(prices_file, named_rates(rates, ["local"]))  # a bad prices file: said before any run is read

    def price(run, summary) -> dict[str, Any]:
        try:
            fleet = fleet_of(run.spec)
            key = (run.spec.backend, fleet.region or DEFAULT_REGION)
            if key not in catalogs:
                catalogs[key] = load_catalog(prices_file, named_rates(rates, [run.spec.backend]), key[1])
            found = fleet_pricing(run.spec, fleet, catalogs[key])
        except ScalelabError as exc:  # a type the catalog lacks: this run unpriced, the report still made
            found = None
            err_console.print(f"[yellow]warning:[/] {run.run_dir}: no price ({escape(str(exc))})", highlight=False)
        row = recorded_cost(run, found, summary.wall_to_threshold_s)
        return {k: row[k] for k in REPORT_COST_COLUMNS}

    return price


#: The columns of a report row that say what the run cost (the rest of `launch cost`'s row is in it already).
REPORT_COST_COLUMNS = ("instances", "market", "usd_per_hour", "billed_seconds", "dollars", "dollars_to_threshold",
                       "price_basis", "price_note")


def write_html_report(report, paths: list[Path]) -> Path:
    """report.html beside report.md, with each run's cost as the report priced it (its `dollars` column);
    for one study, titled by it and with its seed-shaped tables (the CSVs `launch study` wrote)."""
    from scalelab.analysis.runhtml import cost_points, write_run_html
    from scalelab.core.records import load_run
    from scalelab.core.rundir import read_json

    runs = [load_run(r) for r in report.runs]
    points = cost_points(report.table)
    title, tables = "Scaling report", []
    if len(paths) == 1 and (paths[0] / STUDY_FILE).exists():
        import pandas as pd

        title = f"Study: {read_json(paths[0] / STUDY_FILE, STUDY_FILE, dict).get('title') or paths[0].name}"
        tables = [(csv.stem, pd.read_csv(csv)) for csv in sorted(paths[0].glob("*.csv"))]
    return write_run_html(report.markdown_path.parent, title, report.table, runs, points, " ".join(report.notes),
                          report.warnings, tables)


# ---- status, logs, cancel ------------------------------------------------------------------------


def refuse_not_a_run(path: Path, command: str, takes_sweeps: bool = False) -> None:
    """A sweep, study, prep or GEMM study given to a command that takes one run (`launch logs`, `launch resume` of a
    prep) is one error saying what it is and what to give instead: it said "is not a run directory: spec.json is
    missing", true and no help. Anything else is left to `read_spec`'s error. `takes_sweeps`: the command takes a
    sweep as well (`launch cancel`, `launch resume`), so a sweep is left to it and a study's sweeps are offered."""
    from scalelab.core.rundir import sweep_runs
    from scalelab.launcher.inventory import kind_of

    if (path / "spec.json").exists() or not path.is_dir():
        return
    kind, word = kind_of(path), shell_word(path)
    if kind == "study" and takes_sweeps:
        raise ScalelabError(f"{path} is a study, not a run: `{command}` takes one of its sweeps or one layout of one "
                            f"(`launch status {word}` lists them; name one as {word}/VARIANT_DIR or "
                            f"{word}/VARIANT_DIR/LAYOUT)")
    if kind == "sweep" and not takes_sweeps:
        names = [p.name for p in sweep_runs(path)]
        first = f" (`{command} {shell_word(path / names[0])}`)" if names else ""
        raise ScalelabError(f"{path} is a sweep, not a run: `{command}` takes one of its layouts{first}; its layouts: "
                            f"{', '.join(names) or 'none'} (`launch status {word}` shows how each stands)")
    if kind == "study":
        raise ScalelabError(f"{path} is a study, not a run: `{command}` takes one layout of one of its sweeps "
                            f"(`launch status {word}` lists them; name one as {word}/VARIANT_DIR/LAYOUT)")
    if kind in ("prep", "gemm"):
        what = "a prep (made by `launch prep`)" if kind == "prep" else "a GEMM study"
        also = ("; a prep is not resumed: run the same `launch prep` again" if command.endswith("resume") and kind == "prep"
                else "; it has no ranks to cancel: Ctrl-C stops it in the terminal that runs it"
                if command.endswith("cancel") else f"; its records are under {shell_word(path / 'records')}"
                if kind == "prep" else "")
        raise ScalelabError(f"{path} is {what}, not a training run: `launch status {word}` shows its state and "
                            f"`launch report {word}` its figures{also}")


def _backend_of(run_dir: str):
    spec = read_spec(Path(run_dir))
    return get_backend(spec.backend, spec.backend_options), Path(run_dir)


def rows_table(rows: list[dict[str, Any]], title: str | None = None, width: int | None = None):
    """A rich table of inventory rows for a terminal `width` columns wide (the console's: $COLUMNS):
    numbers never wrap; the narrower the terminal, the more of the least needed columns go (every one is
    in --format json)."""
    from rich.table import Table

    from scalelab.launcher.inventory import age, cell
    from scalelab.launcher.progress import duration

    columns = [("name", "left", lambda r: r["name"]), ("backend", "left", lambda r: cell(r["backend"])),
               ("layout", "left", lambda r: cell(r["layout"])), ("state", "left", lambda r: r["state"]),
               ("steps", "right", _steps_cell),
               ("loss", "right", lambda r: "—" if r.get("loss") is None else f"{r['loss']:.3f}"),
               (_rate_header(rows), "right", lambda r: _rate_cell(r, rows)),
               ("ETA", "right", lambda r: "—" if r.get("eta_s") is None else duration(r["eta_s"])),
               ("cost $", "right", lambda r: cell(r["cost_usd"], 2)), ("age", "right", lambda r: age(r["age_s"]))]
    if any(r.get("variant") for r in rows):  # a study's layouts: each variant's sweep has a 1x1 of its own
        columns.insert(1, ("variant", "left", lambda r: cell(r.get("variant"))))
    # the others only where some row has a value (JSON has all); the cost always, a dash saying no price is known
    keep = ("name", "variant", "backend", "layout", "state", "steps", "cost $")
    columns = [c for c in columns if c[0] in keep or any(c[2](r) != "—" for r in rows)]
    width = width or console.width or 100

    def natural(cols: list, name_at_most: int = 1 << 30) -> int:  # 3 columns between cells (padding, rule, padding)
        return sum(min(name_at_most if h == "name" else 1 << 30, max([len(h)] + [len(get(r)) for r in rows]))
                   for h, _, get in cols) + 3 * (len(cols) - 1)

    # least needed first, until every cell fits on one line; then names may fold (at 30 characters at least)
    # before the backend and the cost go: at 100 columns they stay beside run names of 37 characters
    for drop in ("loss", "age", "ETA", "cost $", "backend"):
        if natural(columns, 1 << 30 if drop in ("loss", "age", "ETA") else 30) <= width:
            break
        columns = [c for c in columns if c[0] != drop]
    from rich import box

    # no vertical rules: 2 columns between cells instead of 3, so a run's name stays on one line at 100 columns
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for header, justify, _ in columns:
        table.add_column(header, justify=justify, no_wrap=header != "name", overflow="fold" if header == "name" else "ellipsis")
    room = width - natural([c for c in columns if c[0] != "name"]) - 3  # what is left for the names
    for row in rows:
        table.add_row(*(escape(break_name(get(row), room) if header == "name" else get(row))
                        for header, _, get in columns))
    return table


def _units(rows: list[dict[str, Any]]) -> set[str]:
    return {r.get("unit") or "words" for r in rows if r.get("words_per_s") is not None}


def _rate_header(rows: list[dict[str, Any]]) -> str:
    """"words/s", a --script run's own unit ("images/s": issue 34), or "throughput" where the rows count different
    things (each cell then names its unit per second: "82,016 tokens/s"; the header "per s" read as no unit)."""
    units = _units(rows)
    return f"{units.pop()}/s" if len(units) == 1 else "words/s" if not units else "throughput"


def _rate_cell(row: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    from scalelab.launcher.inventory import cell

    text = cell(row["words_per_s"])
    return text if len(_units(rows)) <= 1 or text == "—" else f"{text} {row.get('unit') or 'words'}/s"


def _steps_cell(row: dict[str, Any]) -> str:
    """"40/200" (step of total), the step alone when the total is not known, or —."""
    from scalelab.launcher.inventory import cell

    steps, total = row.get("steps"), row.get("total_steps")
    return f"{steps:,}/{total:,}" if steps is not None and total else cell(steps)


def print_rows(rows: list[dict[str, Any]], fmt: str, title: str | None = None) -> None:
    """Rows as JSON, or as a table as wide as the terminal ($COLUMNS), so names wrap no more than they must."""
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    if title:  # a line of its own, whole: as the table's title it was folded to the table's width
        console.print(escape(title), highlight=False, soft_wrap=True)
    console.print(rows_table(rows, None, console.width))


@main.command("ls")
@runs_dir_lookup_option()
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def ls_cmd(runs_dir: str, fmt: str) -> None:
    """Runs, sweeps and studies under the runs directory, newest first: backend, layout, state (asked of
    the backend while recorded as active), steps, words/s, cost so far where a price is known, age."""
    from scalelab.core.runids import nothing_ran_yet
    from scalelab.launcher.inventory import inventory

    rows = [] if nothing_ran_yet(Path(runs_dir)) else inventory(Path(runs_dir))  # no ./runs yet: none ran here
    if not rows and fmt == "table":
        console.print(f"no runs under {runs_dir}", highlight=False)
        return
    print_rows(rows, fmt)
    for row in rows if fmt == "table" else []:  # a damaged summary.json: the row's figures are its records'
        if row.get("note"):
            console.print(f"note: {escape(row['name'])}: {escape(row['note'])}", highlight=False)


@main.command("status")
@click.argument("run_dir", type=RunDir(), required=False)
@runs_dir_lookup_option()
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def status_cmd(run_dir: str | None, runs_dir: str, fmt: str) -> None:
    """State of a run (RUNNING, COMPLETED, FAILED, CANCELLED) as its backend reports it, where it is (step
    of total, last loss, words/s, ETA) and its owner; of a sweep or study, every layout. RUN_DIR may be a
    short id (a unique prefix or suffix of its name under the runs directory; one that matches several
    runs is refused, listing them); without it, the newest run, sweep or study there (`launch ls` lists
    them all).

    A run that ended with no launcher following it (--detach, or its launcher was killed) gets its end
    recorded now, and its summary when it completed.
    """
    from scalelab.core.runids import newest_run_dir
    from scalelab.launcher.inventory import describe, kind_of

    run_dir = run_dir if run_dir is not None else str(newest_run_dir(Path(runs_dir)))
    kind = kind_of(Path(run_dir))
    if fmt == "json" or kind not in ("run", None):  # a sweep, a study, a GEMM study, a prep run or sweep
        row = describe(Path(run_dir))
        if fmt == "json":
            click.echo(json.dumps(row, indent=2))
        else:
            print_rows(row.get("layouts") or [row], fmt, title=f"{row['kind']} {row['path']}: {row['state']}")
            for layout in row.get("layouts") or []:  # a layout waiting in the queue: why
                if layout.get("note"):
                    console.print(f"note: {escape(layout['name'])}: {escape(layout['note'])}", highlight=False)
            if row.get("note"):  # a sweep stopped part way: how far it got, what continues it
                console.print(f"note: {escape(row['note'])}", highlight=False, soft_wrap=True)
        return
    _run_status(run_dir)


def _run_status(run_dir: str) -> None:
    from scalelab.core.lock import owner_of
    from scalelab.launcher.runner import settle

    from scalelab.launcher.progress import snapshot_of

    backend, path = _backend_of(run_dir)
    st = settle(backend, path)
    console.print(f"{path}: [bold]{st.state}[/] {escape(st.detail)}", highlight=False, soft_wrap=True)
    dropped: list[str] = []
    snap = snapshot_of(path, st.state, dropped)
    queued = st.detail if st.state == PENDING else None  # waiting in its backend's queue: said, no ETA
    if snap is not None:  # where it is (or where it stopped), from its records, as its state has it
        if st.state not in ACTIVE or queued:
            snap.eta_s = None
        snap.queued = queued
        console.print(f"  {snap.line()}", highlight=False, soft_wrap=True)
    elif st.state in ACTIVE:  # before its first step: how many ranks are up, or that it waits in the queue
        from scalelab.launcher.progress import watch_run

        watch = watch_run(path)
        watch.queued = queued
        watch.poll()
        console.print(f"  {watch.starting()}", highlight=False, soft_wrap=True)
    if dropped:  # said, not silently left out of the step and loss above (`launch report` refuses such records)
        more = f" (and {len(dropped) - 1} more)" if len(dropped) > 1 else ""
        err_console.print(f"[yellow]warning:[/] unreadable record lines, left out of the status: "
                          f"{escape(dropped[0])}{more}; fix or delete them (`launch report {escape(str(path))}` "
                          "refuses them)", highlight=False, soft_wrap=True)
    owner = owner_of(path)
    if owner is not None:
        console.print(f"  followed by launcher pid {owner.pid} on {owner.host}, started "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(owner.start_time))}: "
                      f"{escape(shlex.join(owner.cmdline))}", highlight=False, soft_wrap=True)
    elif st.state in ACTIVE:
        console.print(f"  no launcher follows it (started with --detach, or its launcher was killed): "
                      f"`launch cancel {shell_word(path)}` stops it", highlight=False, soft_wrap=True)


@main.command("logs")
@click.argument("run_dir", type=RunDir(), required=False)
@runs_dir_lookup_option()
@click.option("--rank", type=int, help="Only this rank: its log lines and its records (step, loss, phase times, "
              "validation, events), streamed with -f.")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new lines and the run's progress until it ends (Ctrl-C stops following only).")
def logs_cmd(run_dir: str | None, runs_dir: str, rank: int | None, follow: bool) -> None:
    """Print the logs of a run (launcher and ranks) and where it is: step of total, loss, words/s and ETA
    from its records, so a run started with --detach, or on another backend, can be followed from any
    terminal (`launch logs RUN -f` until it ends). RUN_DIR may be a short id: a unique prefix or suffix
    of the run directory's name under the runs directory; without it, the newest run there (as `launch
    status`; `launch cancel` and `launch resume` always need RUN_DIR)."""
    from scalelab.core.runids import newest_run_dir
    from scalelab.launcher.inventory import RankLines
    from scalelab.launcher.inventory import follow as follow_logs
    from scalelab.launcher.progress import watch_run
    from scalelab.launcher.runner import settle

    if run_dir is None:
        run_dir = str(newest_run_dir(Path(runs_dir)))
        try:
            refuse_not_a_run(Path(run_dir), "launch logs")
        except ScalelabError as exc:
            raise ScalelabError(f"the newest under {runs_dir}: {exc}") from None
    else:
        refuse_not_a_run(Path(run_dir), "launch logs")
    backend, path = _backend_of(run_dir)
    if rank is not None and not 0 <= rank < read_spec(path).world:
        raise ScalelabError(f"--rank {rank}: the run has ranks 0..{read_spec(path).world - 1}")
    watch = watch_run(path)
    records = RankLines(path, rank) if rank is not None else None
    state: dict[str, str | None] = {"now": None}  # as last asked: "starting ranks" and "ended" agree with it

    def read() -> str | tuple[str, str]:
        if records is None:
            return backend.logs(path)
        return backend.rank_logs(path, rank), records.read()

    def active() -> bool:
        now = backend.status(path)
        state["now"] = now.state
        watch.queued = now.detail if now.state == PENDING else None  # "queued: Slurm job 7 PENDING (BeginTime)"
        return state["now"] in ACTIVE

    def progress() -> str | None:
        if state["now"] is None:
            active()
        snap = watch.poll().as_of(state["now"])
        if snap.step or snap.ended:
            return snap.line()
        return watch.starting() if state["now"] in ACTIVE else None  # before the first step (a bare header for ~45 s)

    if not follow:
        texts = read()
        text = "\n".join(t.rstrip("\n") + "\n" for t in ([texts] if isinstance(texts, str) else texts) if t.strip())
        try:
            line = progress()
        except ScalelabError as exc:  # AWS out of reach: the logs are its local copy (the backend said so); show them
            line = f"the run's state is unknown: {exc}"
        click.echo(visible_text(text) + (f"{'' if not text or text.endswith(chr(10)) else chr(10)}[progress] {line}"
                                         if line else ""))
        return
    follow_logs(read, active, lambda s: click.echo(visible_text(s), nl=False), progress=progress)
    st = settle(backend, path)  # a detached run's end is recorded here, as `launch status` would
    if st.state not in ACTIVE:  # not after Ctrl-C, which stops following only
        click.echo(f"[end] {path}: {st.state} {st.detail}".rstrip())


@main.command("cancel")
@click.argument("run_dir", type=RunDir())
@runs_dir_lookup_option()
def cancel_cmd(run_dir: str, runs_dir: str) -> None:
    """Stop a run: ranks get SIGTERM (they checkpoint and exit), then SIGKILL after a grace period; then
    check that none of its processes is left. A sweep directory: every layout launched and not ended.
    RUN_DIR may be a short id (a unique prefix or suffix of its name under the runs directory)."""
    from scalelab.launcher.runner import cancel

    paths = [Path(run_dir)]
    refuse_not_a_run(paths[0], "launch cancel", takes_sweeps=True)  # a study, a prep: not "spec.json is missing"
    if is_sweep(Path(run_dir)):
        paths = _live_layouts(Path(run_dir))
        if not paths:
            console.print(f"{run_dir}: no layout is running", highlight=False)
    for path in paths:
        backend, _ = _backend_of(str(path))
        st = cancel(backend, path, "cancelled by `launch cancel`")
        console.print(f"{path}: {st.state} ({escape(st.detail)})", highlight=False, soft_wrap=True)


def _live_layouts(sweep_dir: Path) -> list[Path]:
    """The sweep's layouts to cancel: every one launched (a launch.json) whose end is neither recorded nor, asked
    now, seen by its backend; the last first. Why not by the state recorded: a sweep launcher records RUNNING only
    for the layout it follows, so the others (queued or running on Slurm, no state yet) were left running after
    its launcher was killed. Why the last first: the layout a live sweep launcher follows is the first unfinished
    one, and its cancel stops the sweep, which must find the others cancelled by the user, not stop them itself."""
    from scalelab.core.rundir import TERMINAL, RunPaths, run_state, sweep_runs
    from scalelab.launcher.runner import settle

    live = []
    for path in sweep_runs(sweep_dir):
        if not RunPaths(path).launch.exists() or run_state(path) in TERMINAL:
            continue
        backend, _ = _backend_of(str(path))
        try:
            ended = settle(backend, path).state in TERMINAL  # an end nobody recorded (a killed launcher) is recorded
        except ScalelabError:  # its state could not be asked: cancelled all the same, which asks again
            ended = False
        if not ended:
            live.append(path)
    return live[::-1]


# ---- entry point ---------------------------------------------------------------------------------


def entry() -> None:
    """Console-script entry: user errors as one line, exit 2; a stop signal exit 128 + it; bugs keep tracebacks.
    (`launch` itself enters through scalelab/launcher/entry.py, which imports this module.)"""
    try:
        escape_unencodable()
        main.main(prog_name="launch", standalone_mode=False, default_map=defaults_for(sys.argv[1:]))
    except click.exceptions.Abort as exc:  # click turns KeyboardInterrupt (and so runner.Interrupted) into Abort
        interrupted(exc.__cause__)
    except click.ClickException as exc:
        show_click_error(exc)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except ScalelabError as exc:
        print_error(str(exc))
        sys.exit(exc.exit_code)
    except OSError as exc:  # a write no command wrapped: still the user's to fix (full, read-only, not theirs)
        if not is_write_failure(exc):
            raise
        print_error(unnamed_write_failure(exc))
        sys.exit(2)
    except KeyboardInterrupt as exc:
        interrupted(exc)


def defaults_for(args: list[str]) -> ConfigDefaults | None:
    """The config files' defaults (`config_defaults`). Where help is asked for, a problem with a file is a
    warning line above it rather than the error that replaced the help: the help is how to find the right key."""
    if not asks_help(args):
        return config_defaults()
    try:
        defaults = config_defaults()
    except SpecError as exc:
        _warn(f"{exc}; the help below shows no configured defaults")
        return None
    if defaults is not None:
        defaults.helping = True
        for problem in dict.fromkeys(defaults.problem.values()):
            _warn(f"{problem} (a command with that option refuses it; the help shows its built-in default)")
    return defaults


def asks_help(args: list[str]) -> bool:
    """Whether `launch ARGS` shows help: a -h or --help before any `--` that is not the value of the option before
    it (`launch run --name --help` names a run)."""
    words = args[:args.index("--")] if "--" in args else args
    command = main.commands.get(words[0]) if words else None
    options = {opt: p for p in (command or run_cmd).params if isinstance(p, click.Option) for opt in p.opts}
    for i, word in enumerate(words):
        before = options.get(words[i - 1]) if i else None
        if word in ("-h", "--help") and (before is None or before.is_flag or before.count):
            return True
    return False


def _warn(text: str) -> None:
    err_console.print(f"[bold yellow]launch: warning:[/] {escape(text)}", highlight=False, soft_wrap=True)


def escape_unencodable() -> None:
    """Text that cannot be encoded (a lone surrogate: an argument's undecodable bytes, a JSON spec's
    "\\ud800") is written escaped on stdout too, as Python does on stderr, instead of a UnicodeEncodeError
    traceback from the middle of an answer (issue #37, found by tests/test_properties.py)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):  # not a text stream of its own (a test's, a pipe's wrapper)
            pass


ERROR_LEAD = "launch: error: "


def backticked(text: str) -> tuple[str, ...]:
    """Each `command` in `text`, backticks included: what `prose_lines` keeps whole on one line."""
    return tuple(re.findall(r"`[^`]+`", text))


def print_error(message: str) -> None:
    """`launch: error: MESSAGE` on stderr. At a terminal, wrapped between words to its width with every `command`
    whole (`prose_lines`, as the interrupted line is): the terminal folded a long message mid-word at 80 columns,
    a path or a command cut in two. Off a terminal (a pipe, a log, a test), one line, which grep and the tools
    that read an error's first line take whole."""
    if err_console.is_terminal:
        message = prose_lines(ERROR_LEAD, message, err_console.width, whole=backticked(message))[len(ERROR_LEAD):]
    err_console.print(f"[bold red]{ERROR_LEAD.rstrip()}[/] {escape(message)}", highlight=False, soft_wrap=True)


def show_click_error(exc: click.ClickException) -> None:
    """A flag click could not read, in the one style of every error (`launch: error: ...`, where click
    said `Error: ...`), after the usage line and before where the help is."""
    ctx = getattr(exc, "ctx", None)
    # `launch` (or `launch aws`) alone: its help, once (it starts with Usage); click < 8.2 prints it itself
    if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):
        exc.show()
        return
    blamed = config_blame(exc)
    if blamed is not None:  # a config file's value: no usage line, as the flag was not typed
        print_error(blamed)
        return
    if isinstance(exc, click.UsageError) and ctx is not None:
        click.echo(ctx.get_usage(), err=True)
    message = exc.format_message()
    if isinstance(exc, click.NoSuchOption) and ctx is not None:
        message = unknown_option_message(exc, ctx.info_name or "run", sys.argv[1:]) or message
    print_error(message)
    if isinstance(exc, click.UsageError) and ctx is not None:
        click.echo(f"(`{ctx.command_path} --help` lists every option)", err=True)


#: Options typed from the habits of other launchers (torchrun, horovodrun, a cluster's `--gpus`), with what `launch
#: run` and `launch sweep` take instead. Why: click's nearest names were wrong ones: `--workers` -> '--nodes', `--gpus`
#: -> '--gpu-type' (a Slurm-only option), where the ranks per node are --gpus-per-node.
_PER_NODE = "--gpus-per-node N (the ranks on each node; --nodes M for more nodes)"
_SWEEP_WORKERS = "give --workers 1,2,4 (the worker counts, on one node) or --layouts 1x1,1x2,2x1"
HABIT_HINTS: dict[str, dict[str, str]] = {
    "run": {
        "--workers": "a run's workers are --nodes x --gpus-per-node: give --gpus-per-node N (and --nodes M); "
                     "`launch sweep --workers 1,2` runs one layout per worker count",
        "--gpus": f"give {_PER_NODE}",
        "--num-gpus": f"give {_PER_NODE}",
        "--ngpus": f"give {_PER_NODE}",
        "--nproc-per-node": f"torchrun's --nproc-per-node is {_PER_NODE}",
        "--nproc_per_node": f"torchrun's --nproc_per_node is {_PER_NODE}",
        "--nnodes": "torchrun's --nnodes is --nodes M",
        "--np": "horovodrun's -np (all ranks) is --nodes M x --gpus-per-node N",
    },
    "sweep": {
        "--gpus": _SWEEP_WORKERS,
        "--num-gpus": _SWEEP_WORKERS,
        "--ngpus": _SWEEP_WORKERS,
        "--nproc-per-node": _SWEEP_WORKERS,
        "--nproc_per_node": _SWEEP_WORKERS,
        "--nnodes": "give --layouts NODESxGPUS, e.g. 1x2,2x2",
        "--detach": "a sweep is not detached: its launcher follows its layouts to their ends and then writes its "
                    "report; run it in the background (`nohup launch sweep ... &`) or in tmux/screen, and `launch "
                    "status SWEEP` shows it from any terminal",
    },
}


def unknown_option_message(exc: click.NoSuchOption, command: str, argv: list[str]) -> str | None:
    """What to say of an option `launch run|sweep` does not have, where click's nearest names mislead: an option
    from another launcher's habits (`HABIT_HINTS`), and with --script/--module, that the script's own arguments go
    after `--` (`launch --script train.py --out x` was "Did you mean one of: '--account', '--spot', '--subnet'?",
    and `--steps 10`, which launch has, was taken by launch). None: click's message stands."""
    name = exc.option_name
    words = argv[:argv.index("--")] if "--" in argv else argv
    hint = HABIT_HINTS.get(command, {}).get(name.split("=")[0])
    script = next((f"{flag} {words[i + 1]}" for i, flag in enumerate(words[:-1]) if flag in ("--script", "--module")),
                  None)
    if hint is None and script is None:
        return None
    parts = [f"No such option {name!r}"] + ([hint] if hint else [])
    if script is not None and name in words:
        at = words.index(name)
        theirs = [name] + list(itertools.takewhile(lambda w: not w.startswith("-"), words[at + 1:]))
        rest = " ".join(shell_word(w) for w in theirs)
        parts.append(("if it is your script's own, " if hint else "") + "your script's arguments go after `--`: "
                     f"`launch {command} {script} [OPTIONS] -- {rest}`")
    return ": ".join(parts[:2]) + "".join(f"; {p}" for p in parts[2:])


def interrupted_text(resume: Path | None) -> str:
    """What an interrupted launch says of what it held: that it stopped, and what continues it. A single run
    with nothing saved gets the no-checkpoint advice (`backend.no_checkpoint_advice`), as `launch status`
    and a cancel (`runner.cancelled_line`) give it. Why: a script that never checkpointed was told
    "`launch resume RUN` continues it" with its checkpoint/ folder empty."""
    if resume is None:
        return INTERRUPTED
    single_run = RunPaths(resume).spec.is_file() and not is_sweep(resume) and not (resume / STUDY_FILE).exists()
    if single_run and not has_checkpoint(resume):
        return f"{INTERRUPTED}; {no_checkpoint_advice(resume)}"
    return f"{INTERRUPTED}; `launch resume {shell_word(resume)}` continues it"


def interrupted(exc: BaseException | None) -> None:
    """Exit after a stop signal: SIGINT 130, SIGTERM 143, SIGHUP 129 (the runner has cancelled the run)."""
    resume = getattr(exc, "resume", None)
    try:
        text = interrupted_text(Path(resume) if resume else None)
        err_console.print(escape(prose_lines("launch: ", text, err_console.width, whole=backticked(text))),
                          highlight=False, soft_wrap=True)  # wrapped between words, each command whole
    except OSError:  # SIGHUP: the terminal may be gone
        pass
    sys.exit(getattr(exc, "exit_code", 128 + signal.SIGINT))


if __name__ == "__main__":
    entry()
