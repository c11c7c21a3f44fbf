"""The one YAML reader for files users write (specs, studies, prices) and flag values.

Why not `yaml.safe_load`: PyYAML implements YAML 1.1's numbers, and YAML 1.2 (what every other tool and
the docs assume, and what a config file read through the flags' own parsing accepted) reads them otherwise:
- 1.1 reads `6:8` as the base-60 integer 368 and `1:30:00` as 5400, so a valid `profile_steps: 6:8` was
  refused as "got 368"; 1.2 has no sexagesimal numbers: such a value stays text for the spec's own parser;
- 1.1's floats need a dot and a signed exponent, so `lr: 1e-3`, `1E5` and `-.5` were text and refused in a
  spec file ("expected float, got '1e-3'") while a config file took them; 1.2 reads them as numbers;
- 1.1 reads `017` as octal 15; 1.2 as 17 (its octal is `0o17`, which 1.1 left as text).
`SpecLoader` resolves and builds numbers by 1.2's core schema. It still takes PyYAML's `_` digit separators
(`1_000`) and `0b` binary, which 1.2 would leave as text that no number field accepts. And `safe_load` lets a
duplicate key silently win over the first (`nodes: 2` ... `nodes: 4` is 4): a mapping with a key given twice
is refused, naming the key and both lines.

Booleans are 1.2's too: only true and false (True, TRUE, False, FALSE). 1.1 also read yes/no/on/off (and, by
its spec though not PyYAML, y/n) as booleans, so a text option given one of those words got a boolean: a run
named `no` was refused in a spec file ("expected str, got false") and became a run named "False" from a config
file, `bucket: on` an S3 bucket "True", `rank-output: off` the ranks 'False'. Read by 1.2 they stay text, and
an option declared bool takes 1.1's words as the boolean 1.1 meant (`yaml_11_bool`, applied by the typed
fields in core/options.py and the prices file's checks): as with the numbers, the field's own parser judges
the text, and a bool option took yes/no/on/off on the command line (`--backend-opt spot=yes`), from a config
file (click's bool type) and, through 1.1, from a spec file already; refusing them now would break files that
worked, with nothing left to disambiguate (the option is a bool either way).
"""

from __future__ import annotations

import re
import sys
from typing import Any

import yaml

# YAML 1.1's base-60 forms, as PyYAML spells them in its implicit resolvers (int and float).
_SEXAGESIMAL = ("[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+", "[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\\.[0-9_]*")
# YAML 1.2's booleans (core schema); YAML 1.1's other boolean words, which 1.2 reads as text (yaml.org/type/bool.html).
_BOOL_12 = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
YAML_11_BOOLS = {**dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "on", "On", "ON"), True),
                 **dict.fromkeys(("n", "N", "no", "No", "NO", "off", "Off", "OFF"), False)}
# YAML 1.2's core schema (yaml.org/spec/1.2.2, 10.3.2), with PyYAML's `_` separators and `0b` binary kept:
# an int is decimal (a leading 0 too), 0o octal or 0x hex; a float has a dot or an exponent (its sign optional),
# or is .inf / .nan.
_INT_12 = re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0o[0-7_]+|[-+]?0x[0-9a-fA-F_]+|[-+]?[0-9][0-9_]*)$")
_FLOAT_12 = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?
                          |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
                          |[-+]?\.(?:inf|Inf|INF)
                          |\.(?:nan|NaN|NAN))$""", re.X)


class DuplicateKeyError(yaml.YAMLError):
    """A mapping gives one key twice: YAML says keys are unique, PyYAML would keep the last silently."""


class BeyondLimitsError(yaml.YAMLError):
    """Valid YAML that Python cannot hold: a whole number of more digits than `int()` converts (4,300 by
    default), mappings or lists nested deeper than the interpreter's recursion allows. Both were a
    ValueError or RecursionError traceback (issue #37); now one line naming the line and the limit."""


class SpecLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2's numbers (no base 60) and unique mapping keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """Refuse a key given twice instead of letting the last one win without a word."""
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
                seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: the base constructor says so
                continue
            if first is not None:
                raise DuplicateKeyError(f"duplicate key {key!r} at line {key_node.start_mark.line + 1} "
                                        f"(first at line {first}); keep one of them")
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        """An integer as YAML 1.2 reads it (`017` is 17, `0o17` 15; PyYAML's 1.1 read 017 as octal); one of more
        digits than Python converts is refused with its line and the limit."""
        text = str(self.construct_scalar(node)).replace("_", "")
        sign, digits = (-1, text[1:]) if text[:1] == "-" else (1, text.lstrip("+"))
        base = {"0b": 2, "0o": 8, "0x": 16}.get(digits[:2].lower(), 10)
        try:
            return sign * int(digits[2:] if base != 10 else digits, base)
        except ValueError as exc:
            if "digits" not in str(exc):  # an explicit `!!int` tag on text that is no whole number
                raise yaml.constructor.ConstructorError(None, None, f"{text!r} is not a whole number",
                                                        node.start_mark) from None
            digits = sum(c.isdigit() for c in str(node.value))
            raise BeyondLimitsError(f"line {node.start_mark.line + 1}: a whole number of {digits:,} digits, more than "
                                    f"the {sys.get_int_max_str_digits():,} digits a number may have; give a smaller "
                                    "number") from None

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        """A float; an explicit `!!float` tag on text that is no number is a YAML error, not a ValueError."""
        try:
            return super().construct_yaml_float(node)
        except ValueError:
            raise yaml.constructor.ConstructorError(None, None, f"{node.value!r} is not a number",
                                                    node.start_mark) from None


SpecLoader.add_constructor("tag:yaml.org,2002:int", SpecLoader.construct_yaml_int)
SpecLoader.add_constructor("tag:yaml.org,2002:float", SpecLoader.construct_yaml_float)


def _yaml_12_scalars() -> None:
    """Give SpecLoader its own resolvers (SafeLoader's stay as they are) whose int, float and bool patterns are
    YAML 1.2's: a value such as `6:8` then resolves to a string, `1e-3` to a float, `no` to a string. The first
    characters they are tried for are PyYAML's (digits, signs and, for floats, the dot; for booleans the first
    letters of 1.1's words), which 1.2's forms start with too."""
    patterns = {"tag:yaml.org,2002:int": _INT_12, "tag:yaml.org,2002:float": _FLOAT_12,
                "tag:yaml.org,2002:bool": _BOOL_12}
    resolvers: dict[Any, list[tuple[str, re.Pattern[str]]]] = {}
    for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items():
        resolvers[first] = [(tag, patterns.get(tag, regexp)) for tag, regexp in entries]
    SpecLoader.yaml_implicit_resolvers = resolvers


_yaml_12_scalars()


def load_yaml(text: str) -> Any:
    """`text` read as YAML with 1.2's numbers and unique keys; errors are `yaml.YAMLError` (the caller
    names the file)."""
    try:
        return yaml.load(text, Loader=SpecLoader)  # noqa: S506 - SpecLoader is a SafeLoader
    except RecursionError:  # the composer recurses once per level of nesting
        raise BeyondLimitsError("lists or mappings nested deeper than can be read (a few hundred levels, with "
                                "Python's recursion limit; a spec needs a few); flatten it") from None


def yaml_11_bool(value: Any) -> bool | None:
    """The boolean YAML 1.1 read `value` as (`yes`, `Off`, `n`), for an option declared bool; None for anything
    else (1.2's true and false are booleans already, and `maybe` is no boolean in either)."""
    return YAML_11_BOOLS.get(value) if isinstance(value, str) else None


def is_sexagesimal(text: str) -> bool:
    """Whether YAML 1.1 would have read `text` as a base-60 number (for tests and messages)."""
    return any(re.fullmatch(p, text) for p in _SEXAGESIMAL)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error as one line: where (line, column) and what, without PyYAML's multi-line excerpt of the
    text and its "<unicode string>" (a prices file's error came out as eight lines, issue #37)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or not problem:
        return " ".join(str(exc).split())
    context = getattr(exc, "context", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" + (f" ({context})" if context else "")
