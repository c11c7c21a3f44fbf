"""Typed configuration declared once: coercion from the real types, and the base of every backend's options.

Three kinds of configuration are dataclasses whose type hints are their schema: the experiment spec
(`core.spec`), the model presets (`core.presets.ModelConfig`) and each backend's options
(`scalelab/launcher/options.py`, `scalelab/slurm/options.py`, `scalelab/k8s/options.py`, `scalelab/aws/options.py`). One implementation
turns what YAML, JSON or a command line gave into the declared types, so `nodes: true`, `lr: .nan`
and `cpus_per_task: null` fail the same way everywhere, with the field's dotted name and where the
value came from (`in spec file exp.yaml`, `from --backend-opt`) in the message.

A backend's options are a frozen dataclass deriving from `BackendOptions`, as TorchX's `runopts` or
submitit's executor parameters: each field, declared with `option()`, carries its default (the unit
in the name: `mem_gb`, `poll_s`), its help text, its command-line flag if it has one, and its checks.
From that one declaration come the CLI flags (scalelab/launcher/cli.py), the parsing of `--backend-opt
KEY=VALUE` and of `backend_options:` in a spec file, the checks and the messages. This module imports
nothing heavy, so the CLI reads every backend's options without importing the backend.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from typing import Any, ClassVar, TypeVar

from scalelab.core.errors import SpecError

# A check gets a value of the declared type and returns what is wrong with it ("must be >= 1"), or None.
Check = Callable[[Any], "str | None"]
T = TypeVar("T")

# a bool option's words on the command line, in any case: YAML 1.1's booleans and 1 / 0 (yamltext.yaml_11_bool)
TRUE_WORDS = ("true", "yes", "y", "on", "1")
FALSE_WORDS = ("false", "no", "n", "off", "0")
NULL_WORDS = ("null", "none", "~")
# The longest time limit a backend takes (AWS's --time-limit-min, Slurm's --time, Kubernetes' timeout_min): a limit is
# what stops a run that hangs, so one past a year is a typo, not a plan (`--time-limit-min 1e9` was 1,900 years)
MAX_LIMIT_MINUTES = 525_600


# ---- declaring fields --------------------------------------------------------------------------------


def checked(default: Any, *checks: Check, **metadata: Any) -> Any:
    """A dataclass field with checks that run wherever its value is coerced (mutable defaults copied)."""
    meta = {"checks": checks, **metadata}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def option(default: Any, help: str, *checks: Check, flag: str | None = None, metavar: str | None = None,
           parse: Callable[[Any], Any] | None = None, separator: str | None = None) -> Any:
    """A spec field or backend option: default, help text, checks, and optionally its command-line flag.

    `flag` is the flag's name (`--partition`; a bool gets `--x/--no-x` unless the pair is given, as in
    `--spot/--on-demand`); a list option's flag is repeatable, unless `separator` is given: then the
    flag is given once, its items separated by it (`--emulate-slowdown 1,2`). `parse` turns another
    accepted form into the declared type before the type is checked (`"gpu:NoSchedule"` into a
    toleration mapping); it raises ValueError with what is wrong, and must accept its own output. A
    `one_of` check makes the flag a choice of those values. The help says the default unless it says
    one itself (`with_default`).
    """
    return checked(default, *checks, help=help, flag=flag, metavar=metavar, parse=parse, separator=separator)


def at_least(low: float, problem: str | None = None) -> Check:
    return lambda v: None if v >= low else problem or f"must be >= {low}"


def above(low: float, problem: str | None = None) -> Check:
    return lambda v: None if v > low else problem or f"must be > {low}"


def at_most(high: float, problem: str | None = None) -> Check:
    return lambda v: None if v <= high else problem or f"must be <= {high}"


def one_of(*choices: Any) -> Check:
    """A check that the value is one of `choices`; a flag made from the field offers exactly these."""

    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {', '.join(map(str, choices))}"

    check.choices = tuple(choices)  # type: ignore[attr-defined]  # read by `option_flags`
    return check


def one_word(value: str) -> str | None:
    return "must be one word without spaces" if re.search(r"\s", value) else None


def executable(value: str) -> str | None:
    """'' (the default) or a program this machine can run: a path, or a name on PATH. Why here: a missing
    interpreter (`--backend-opt python=/missing`) was accepted and every rank failed to start."""
    import os
    import shutil

    if not value:
        return None
    found = shutil.which(value)
    if found:
        return None
    if os.path.exists(value):
        return "is not an executable file: give an interpreter's path (chmod +x, or another path)"
    return "was not found: give the path of a Python interpreter on this machine (or leave it out for this one)"


def one_line(value: str) -> str | None:
    return "must be one line" if "\n" in value else None


def each(check: Check) -> Check:
    """A check of every item of a list; the problem names the first bad item."""

    def check_items(items: list[Any]) -> str | None:
        for item in items:
            problem = check(item)
            if problem:
                return f"{problem} ({item!r})"
        return None

    return check_items


POSITIVE = at_least(1, "must be a positive whole number")


# ---- coercion ------------------------------------------------------------------------------------------


class _Mismatch(Exception):
    """A value without the declared type; `coerce` names the field and the type."""


@cache
def type_hints(cls: type) -> dict[str, Any]:
    """The real types of a dataclass's fields (annotations are strings under `from __future__ import annotations`)."""
    return typing.get_type_hints(cls)


def coerce(value: Any, hint: Any, name: str, where: str = "", *, text: bool = False) -> Any:
    """`value` as type `hint`, or SpecError "NAME: expected KIND, got VALUE (WHERE)".

    Accepted beyond the exact type: an int where a float is declared; one item where a list is
    (`setup: module load cuda`). With `text=True` (command-line values) text is read as any type:
    "8", "false", "null" for an optional value, "[a, b]" for a list, "{k: v}" for a mapping.
    A bool takes YAML 1.1's boolean words (`yes`, `off`), which YAML 1.2 reads as text (core/yamltext.py).
    Refused: a bool where a number or text is declared (YAML's `true`), NaN and infinity, null where
    the field is not optional.
    """
    try:
        return _convert(_text_container(value, hint) if text else value, hint, text)
    except _Mismatch:
        raise SpecError(f"{name}: expected {describe(hint)}, got {show(value)}{_src(where)}") from None


def _convert(value: Any, hint: Any, text: bool) -> Any:
    if hint is Any:
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _convert_union(value, args, text)
    if value is None:
        raise _Mismatch
    if origin is list:
        items = value if isinstance(value, (list, tuple)) else [value]
        return [_convert(v, args[0] if args else Any, text) for v in items]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise _Mismatch
        key, val = args or (Any, Any)
        return {_convert(k, key, text): _convert(v, val, text) for k, v in value.items()}
    if text and isinstance(value, str) and hint in (bool, int, float):
        value = _parse_text(value.strip(), hint)
    elif hint is bool and isinstance(value, str):
        value = _yaml_11_word(value)
    return _scalar(value, hint)


def _yaml_11_word(value: str) -> Any:
    """YAML 1.1's `yes`, `off` as the boolean it meant, for a bool field: YAML 1.2 reads them as text (core/yamltext.py
    says why they are taken); other text is left for the type check to refuse."""
    from scalelab.core.yamltext import yaml_11_bool  # PyYAML only where a bool is given as text

    word = yaml_11_bool(value)
    return value if word is None else word


def _convert_union(value: Any, args: tuple[Any, ...], text: bool) -> Any:
    optional = type(None) in args
    if optional and (value is None or text and isinstance(value, str) and value.strip().lower() in NULL_WORDS):
        return None
    for arg in args:
        if arg is not type(None):
            try:
                return _convert(value, arg, text)
            except _Mismatch:
                pass
    raise _Mismatch


def _scalar(value: Any, hint: type) -> Any:
    if isinstance(value, bool):
        if hint is bool:
            return value
        raise _Mismatch  # YAML's true/false where a number or a name is meant
    if hint is int and isinstance(value, int) or hint is str and isinstance(value, str):
        return value
    if hint is float and isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:
            raise _Mismatch from None
        if math.isfinite(number):
            return number
    raise _Mismatch


def _parse_text(text: str, hint: type) -> Any:
    if hint is bool:
        if text.lower() in TRUE_WORDS + FALSE_WORDS:
            return text.lower() in TRUE_WORDS
        raise _Mismatch
    try:
        return int(text, 10) if hint is int else float(text)
    except ValueError:
        raise _Mismatch from None


def _text_container(value: Any, hint: Any) -> Any:
    """Command-line text for a list or mapping: `[a, b]` and `{k: v}` are read as YAML flow collections."""
    kinds = {typing.get_origin(a) for a in (hint, *typing.get_args(hint))}
    if not (isinstance(value, str) and kinds & {list, dict} and value.lstrip()[:1] in ("[", "{")):
        return value
    import yaml

    from scalelab.core.yamltext import load_yaml  # the one YAML reading of user text (docstring there)

    try:
        return load_yaml(value)
    except yaml.YAMLError:
        return value  # the type check names it


def describe(hint: Any) -> str:
    """What a type hint accepts, in words for messages."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        kinds = " or ".join(describe(a) for a in args if a is not type(None))
        return kinds + (" or null" if type(None) in args else "")
    if typing.get_origin(hint) is list:
        return f"a list of {describe(args[0]) if args else 'values'}"
    if typing.get_origin(hint) is dict:
        return "a mapping of key: value"
    kinds = {int: "int (a whole number)", float: "float (a finite number)", bool: "bool (true or false)",
             str: "str (text)", Any: "a value"}
    return kinds.get(hint, getattr(hint, "__name__", str(hint)))


def show(value: Any) -> str:
    """A value as the user wrote it in YAML or on a command line: null, true, 'text', 1.5."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value)


def _src(where: str) -> str:
    return f" ({where})" if where else ""


# ---- dataclasses: one field, a mapping of fields, an instance ------------------------------------------


def coerce_field(f: dataclasses.Field, hint: Any, value: Any, where: str = "", *, label: str = "",
                 prefix: str = "", text: bool = False) -> Any:
    """One field's value: its `parse` hook, its type, then its checks; errors name the field and `where`.

    A backend option (given a `label`) is named with its flag, `cpus_per_task (--cpus-per-task)`, since
    its key is what a spec file and --backend-opt use; a spec field's messages keep the key alone (a
    flag's value already says `from --nodes`)."""
    flag = f.metadata.get("flag") if label else None
    name = f"{label}{prefix}{f.name}" + (f" ({flag})" if flag else "")
    separator = f.metadata.get("separator")
    if text and separator and isinstance(value, str):  # `--emulate-slowdown 1,2`: each item read below
        value = value.split(separator)
    parse = f.metadata.get("parse")
    if parse is not None and value is not None:
        try:
            value = parse(_text_container(value, hint) if text else value)
        except ValueError as exc:
            raise SpecError(f"{name}: {exc}{_src(where)}") from None
    value = coerce(value, hint, name, where, text=text)
    for check in f.metadata.get("checks", ()):
        problem = None if value is None else check(value)
        if problem:
            raise SpecError(f"{name} {problem}, got {show(value)}{_src(where)}")
    return value


def coerce_items(cls: type, raw: Any, where: str = "", *, label: str = "", text: bool = False,
                 prefix: str = "", show_defaults: bool = False) -> dict[str, Any]:
    """The entries of `raw` typed and checked as the fields of dataclass `cls` (only the keys given).

    Unknown keys fail listing the valid ones (with their defaults if `show_defaults`). A field whose
    type is itself a dataclass (a spec's `engine:`) is built from its own mapping, names prefixed.
    """
    if not isinstance(raw, Mapping):
        raise SpecError(f"{label}{prefix.rstrip('.') or 'options'}: expected a mapping of option: value, "
                        f"got {show(raw)}{_src(where)}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        noun = label.strip() or "option"
        valid = [prefix + name + (f" (default {show(_default(f))})" if show_defaults else "") for name, f in known.items()]
        raise SpecError(f"unknown {noun}(s): {', '.join(prefix + str(k) for k in unknown)}{_src(where)}; "
                        f"valid {noun.split()[-1]}s: {', '.join(valid) or 'none'}")
    hints = type_hints(cls)
    out = {}
    for key, value in raw.items():
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            out[key] = value if isinstance(value, hint) else build(hint, value, where, label=label, text=text,
                                                                    prefix=f"{prefix}{key}.")
        else:
            out[key] = coerce_field(known[key], hint, value, where, label=label, prefix=prefix, text=text)
    return out


def build(cls: type[T], raw: Any, where: str = "", **kwargs: Any) -> T:
    """An instance of dataclass `cls` from a mapping (YAML, JSON, flags); see `coerce_items`."""
    return cls(**coerce_items(cls, raw, where, **kwargs))


def coerce_path(cls: type, dotted: str, value: Any, where: str = "", *, text: bool = False) -> Any:
    """One value for the dotted field `dotted` of dataclass `cls` (`engine.name` of a Spec), typed and checked."""
    *parents, key = dotted.split(".")
    for part in parents:
        cls = type_hints(cls)[part]
    prefix = "".join(f"{part}." for part in parents)
    return coerce_items(cls, {key: value}, where, text=text, prefix=prefix)[key]


def coerce_fields(obj: Any, label: str = "", prefix: str = "") -> None:
    """Type and check every field of a dataclass instance in place (frozen ones too): `__post_init__`,
    and specs built field by field in code rather than from a mapping."""
    hints = type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(hints[f.name]) and isinstance(value, hints[f.name]):
            coerce_fields(value, label, f"{prefix}{f.name}.")
        else:
            object.__setattr__(obj, f.name, coerce_field(f, hints[f.name], value, label=label, prefix=prefix))


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def with_default(help: str, default: Any, decl: str = "") -> str:
    """Help text ending in `[default: X]` unless it says its default itself or there is none to show."""
    if "[default" in help or default is None or default in ("", [], {}):
        return help
    if isinstance(default, bool):
        if "/" not in decl:
            return help
        default = decl.split("/")[0 if default else 1]  # the flag of the default side
    return f"{help} [default: {default}]".strip()


# ---- flags ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Flag:
    """A command-line flag generated from an option field; the CLI makes a click option of it."""

    decl: str  # "--partition", or an on/off pair "--spot/--on-demand"
    key: str  # the option it sets: a field name, dotted for a nested dataclass's field ("engine.name")
    kind: type  # what one value is: str, int, float or bool (a bool flag is an on/off pair)
    multiple: bool  # repeatable: a list option
    help: str
    metavar: str | None = None
    choices: tuple[Any, ...] | None = None  # from the field's `one_of` check

    @property
    def name(self) -> str:
        return self.decl.split("/")[0]


def option_flags(cls: type, prefix: str = "") -> list[Flag]:
    """The command-line flags of dataclass `cls`'s fields that declare one (`option(..., flag=...)`), in
    declaration order; a field that is itself a dataclass (a spec's `engine`) gives its own flags
    there, keys dotted. The CLI makes its click options of these and of nothing else, so a field's
    flag, type, choices, help and default cannot drift from the field."""
    hints = type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out += option_flags(hints[f.name], f"{prefix}{f.name}.")
            continue
        decl = f.metadata.get("flag")
        if not decl:
            continue
        out.append(_flag(f, hints[f.name], decl, prefix))
    return out


def _flag(f: dataclasses.Field, hint: Any, decl: str, prefix: str) -> Flag:
    """The Flag of one field: its kind from the type hint, choices from a `one_of` check."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # `X | None`: X (not list[X]'s X: a list
        hint = next(a for a in typing.get_args(hint) if a is not type(None))  # is repeatable, one item a flag)
    multiple = typing.get_origin(hint) in (list, dict)  # an item a flag: `--toleration K:E` as `--sbatch-arg X`
    kind = typing.get_args(hint)[0] if multiple else hint
    if f.metadata.get("separator"):  # one flag, its items in one text: `--emulate-slowdown 1,2`
        multiple, kind = False, str
    if kind is bool and "/" not in decl:
        decl = f"{decl}/--no-{decl[2:]}"
    choices = next((c.choices for c in f.metadata.get("checks", ()) if hasattr(c, "choices")), None)
    return Flag(decl, prefix + f.name, kind, multiple, with_default(f.metadata["help"], _default(f), decl),
                f.metadata.get("metavar"), choices)


# ---- backend options ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BackendOptions(Mapping[str, Any]):
    """Base of every backend's options: a frozen dataclass that is also a read-only mapping.

    Subclasses are `@dataclass(frozen=True)`, set `backend`, and declare their fields with `option()`.
    Constructing one types and checks every field, so an instance is always valid. The mapping view
    (`options["partition"]`, `dict(options)`, `{**options}`) is what render functions read.
    """

    backend: ClassVar[str] = ""

    def __post_init__(self) -> None:
        coerce_fields(self, self.label())

    @classmethod
    def label(cls) -> str:
        return f"{cls.backend} backend option "

    @classmethod
    def coerce(cls, raw: Mapping[str, Any], where: str = "", *, text: bool = False) -> dict[str, Any]:
        """The given options typed and checked (only those keys): for merging sources before `parse`."""
        return coerce_items(cls, raw, where, label=cls.label(), text=text, show_defaults=True)

    @classmethod
    def parse(cls: type[T], raw: Mapping[str, Any] | None = None, where: str = "", *, text: bool = False) -> T:
        """The options object for `raw`, defaults for the rest; SpecError names a bad key or value and `where`."""
        return cls(**cls.coerce(raw or {}, where, text=text))

    @classmethod
    def flags(cls) -> list[Flag]:
        """The command-line flags of the fields that declare one, in declaration order."""
        return option_flags(cls)

    @classmethod
    def unread(cls, values: Mapping[str, Any]) -> dict[str, tuple[str, str, str]]:
        """The options of `values` (typed, the given ones only) that the others leave unread, each as (what it
        needs, what that is, what there is instead): `spot_max_price` without `spot` is ("--spot", "spot
        instances", "--on-demand"). Refused when given for this run, dropped when a config file's default
        (scalelab/launcher/cli.py), as a spec's `Unread` settings are. None by default; a backend says its own."""
        return {}

    def __getitem__(self, key: str) -> Any:
        if key not in self._names():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_pairs(pairs: tuple[str, ...], flag: str) -> dict[str, str]:
    """KEY=VALUE pairs as {key: text}; the text is read as the type the key declares (core.options)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"{flag} takes KEY=VALUE, got {pair!r}")
        out[key.strip().replace("-", "_")] = value
    return out
