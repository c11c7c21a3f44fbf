"""The one YAML reader for files users write (specs, studies, prices) and flag values.

Why not `yaml.safe_load`: PyYAML implements YAML 1.1, which reads `6:8` as the base-60 integer 368 and
`1:30:00` as 5400, so a valid `profile_steps: 6:8` was refused as "got 368". YAML 1.2 (what every
other tool and the docs assume) has no sexagesimal numbers, so `SpecLoader` drops those resolvers and
such a value stays text for the spec's own parser. And `safe_load` lets a duplicate key silently win
over the first (`nodes: 2` ... `nodes: 4` is 4): a mapping with a key given twice is refused, naming
the key and both lines.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import yaml

# YAML 1.1's base-60 forms, as PyYAML spells them in its implicit resolvers (int and float).
_SEXAGESIMAL = ("[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+", "[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\\.[0-9_]*")


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
        """An integer; one of more digits than Python converts is refused with its line and the limit."""
        try:
            return super().construct_yaml_int(node)
        except ValueError as exc:
            if "digits" not in str(exc):
                raise
            digits = sum(c.isdigit() for c in str(node.value))
            raise BeyondLimitsError(f"line {node.start_mark.line + 1}: a whole number of {digits:,} digits, more than "
                                    f"the {sys.get_int_max_str_digits():,} digits a number may have; give a smaller "
                                    "number") from None


SpecLoader.add_constructor("tag:yaml.org,2002:int", SpecLoader.construct_yaml_int)


def _drop_sexagesimal() -> None:
    """Give SpecLoader its own resolvers (SafeLoader's stay as they are) whose int and float patterns
    lack the base-60 alternatives; a value such as `6:8` then resolves to a string."""
    resolvers: dict[Any, list[tuple[str, re.Pattern[str]]]] = {}
    for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items():
        resolvers[first] = [(tag, _without_base60(regexp) if tag.endswith((":int", ":float")) else regexp)
                            for tag, regexp in entries]
    SpecLoader.yaml_implicit_resolvers = resolvers


def _without_base60(regexp: re.Pattern[str]) -> re.Pattern[str]:
    """`regexp` (an `^(?:a|b|...)$` of PyYAML's) less its alternatives that are base-60 forms."""
    body = regexp.pattern.strip()[len("^(?:"):-len(")$")]
    kept = [alt.strip() for alt in body.split("|") if alt.strip() not in _SEXAGESIMAL]
    return re.compile("^(?:" + "|".join(kept) + ")$")


_drop_sexagesimal()


def load_yaml(text: str) -> Any:
    """`text` read as YAML with 1.2's numbers and unique keys; errors are `yaml.YAMLError` (the caller
    names the file)."""
    try:
        return yaml.load(text, Loader=SpecLoader)  # noqa: S506 - SpecLoader is a SafeLoader
    except RecursionError:  # the composer recurses once per level of nesting
        raise BeyondLimitsError("lists or mappings nested deeper than can be read (a few hundred levels, with "
                                "Python's recursion limit; a spec needs a few); flatten it") from None


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
