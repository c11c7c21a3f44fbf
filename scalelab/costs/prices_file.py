"""The schema of the user's prices file (docs/costs.md), checked before any of it is used.

Why a schema: the file overrides the built-in prices, and the planner takes its numbers at face value.
A negative `usd_per_hour` made `launch plan` recommend a negative cost, NaN and 1e308 went through
every sum, `gpus: 0` divided by zero later, and a misspelt top-level key (`on-demand`) made the whole
file silently ignored (the built-in prices were used instead). Each of those is now one line naming
the file, the entry (`on_demand[2].usd_per_hour`) and the fix.
"""

from __future__ import annotations

import difflib
import math
from typing import Any, Callable

MAX_USD_PER_HOUR = 10_000.0  # a p5.48xlarge is about 100 USD/hour; above this a price is a typo
MAX_QUANTITY = 1e6  # GPUs, vCPUs, GiB, Gbit/s, TFLOP/s, GB/s: any real figure is far below

Check = Callable[[Any], str | None]  # a value -> what it must be, or None when it fits


def _price(value: Any) -> str | None:
    ok = _is_number(value) and 0 < value <= MAX_USD_PER_HOUR
    return None if ok else f"a price in USD per hour, a number > 0 and <= {MAX_USD_PER_HOUR:,.0f}"


def _positive(value: Any) -> str | None:
    return None if _is_number(value) and 0 < value <= MAX_QUANTITY else f"a number > 0 and <= {MAX_QUANTITY:g}"


def _rate(value: Any) -> str | None:
    return None if _is_number(value) and 0 <= value <= 1000 else "interruptions per hour, a number >= 0 and <= 1000"


def _count(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_QUANTITY
    return None if ok else "a whole number >= 1"


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) and value.strip() else "a non-empty string"


def _flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else "true or false"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# list key -> {field: (check, required)}; optional fields may also be null.
ROWS: dict[str, dict[str, tuple[Check, bool]]] = {
    "on_demand": {"instance_type": (_text, True), "region": (_text, True), "usd_per_hour": (_price, True),
                  "source": (_text, False), "observed": (_text, False)},
    "rates": {"name": (_text, True), "usd_per_gpu_hour": (_price, False), "usd_per_node_hour": (_price, False),
              "gpus": (_count, False), "gpu_model": (_text, False), "source": (_text, False)},
    "instances": {"name": (_text, True), "gpus": (_count, True), "gpu_model": (_text, False),
                  "gpu_mem_gib": (_positive, False), "vcpus": (_count, False), "mem_gib": (_positive, False),
                  "network": (_text, False), "source": (lambda v: None if isinstance(v, str) else "a string", False),
                  "provider": (_text, False), "network_gbps": (_positive, False), "efa": (_flag, False),
                  "interconnect": (_text, False), "source_date": (_text, False),
                  "per_gpu": (_flag, False)},
    "gpu_models": {"name": (_text, True), "mem_bandwidth_gbs": (_positive, True), "fp32_tflops": (_positive, True),
                   "tf32_tflops": (_positive, False), "fp16_tflops": (_positive, False),
                   "bf16_tflops": (_positive, False), "mem_gib": (_positive, False), "source": (_text, False),
                   "date": (_text, False)},
    "interruptions": {"instance_type": (_text, True), "per_hour": (_rate, True)},
}
ROWS["spot"] = ROWS["on_demand"]
FIX = "fix it in the prices file (format: docs/costs.md)"


def _unknown(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key.replace("-", "_"), valid, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key {key!r} ({hint}valid keys: {', '.join(valid)})"


def read_flags(data: Any) -> Any:
    """`data` with YAML 1.1's boolean words (`efa: yes`) in a true-or-false field read as the boolean they meant:
    YAML 1.2 reads them as text (scalelab/core/yamltext.py says why they are taken). Anything not shaped as a
    prices file is left as it is, for `prices_problem` to name."""
    from scalelab.core.yamltext import yaml_11_bool

    if not isinstance(data, dict):
        return data
    out = dict(data)
    for key, rows in data.items():
        flags = [name for name, (check, _) in ROWS.get(key, {}).items() if check is _flag]
        if flags and isinstance(rows, list):
            out[key] = [{**row, **{f: yaml_11_bool(row[f]) for f in flags if yaml_11_bool(row.get(f)) is not None}}
                        if isinstance(row, dict) else row for row in rows]
    return out


def prices_problem(data: Any) -> str | None:
    """What is wrong with a prices file's content (`where: ` and the fix are the caller's), or None."""
    if not isinstance(data, dict):
        return f"must be a mapping of {', '.join(ROWS)} to lists of entries, got a {type(data).__name__}"
    for key, rows in data.items():
        if key not in ROWS:
            return _unknown(str(key), list(ROWS))
        if not isinstance(rows, list):
            return f"{key} must be a list of entries, got {rows!r:.60}"
        for i, row in enumerate(rows):
            problem = _row_problem(key, row)
            if problem:
                return f"{key}[{i}]{problem}"
        twice = _listed_twice(key, rows)
        if twice:
            return twice
    return None


# list key -> the fields that name one entry: a second entry of the same name silently replaced the first
# (issue #37: a type listed at $0.90/h, then at $0.10/h, was priced $0.10/h without a word)
KEYS = {"on_demand": ("instance_type", "region"), "spot": ("instance_type", "region"), "rates": ("name",),
        "instances": ("name",), "gpu_models": ("name",), "interruptions": ("instance_type",)}


def _listed_twice(key: str, rows: list[dict[str, Any]]) -> str | None:
    seen: dict[tuple, int] = {}
    for i, row in enumerate(rows):
        name = tuple(row.get(f) for f in KEYS[key])
        if name in seen:
            what = " in ".join(str(n) for n in name)
            return (f"{key}[{i}] lists {what} again (first at {key}[{seen[name]}]); the second entry would "
                    "replace the first without a word: keep one of them")
        seen[name] = i
    return None


def _row_problem(key: str, row: Any) -> str | None:
    """`.field must be ...` for one entry of list `key`, or None."""
    fields = ROWS[key]
    if not isinstance(row, dict):
        return f" must be a mapping of {', '.join(f for f, (_, req) in fields.items() if req)} ..., got {row!r:.60}"
    for name, value in row.items():
        if name not in fields:
            return f": {_unknown(str(name), list(fields))}"
    for name, (check, required) in fields.items():
        if name not in row:
            if required:
                return f" has no {name!r}"
            continue
        expected = None if row[name] is None and not required else check(row[name])
        if expected:
            return f".{name} must be {expected}, got {row[name]!r:.60}"
    if key == "rates" and ("usd_per_gpu_hour" in row) == ("usd_per_node_hour" in row):
        return " needs one of usd_per_gpu_hour or usd_per_node_hour (with gpus), not both or neither"
    return None
