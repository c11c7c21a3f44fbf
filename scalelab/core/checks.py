"""Shared validators for numbers that enter from flags, spec files and CSV cells.

One rule everywhere: a number must be finite (no NaN, no infinity) and inside its range, and the
message names the input and what it expects. Python's comparisons are False for NaN, so a plain
`value < 0` check lets NaN through; these helpers do not.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Iterable

import click


def describe(minimum: float | None = None, above: float | None = None, maximum: float | None = None,
             integer: bool = False) -> str:
    """'a finite number > 0', 'a whole number >= 1', ... for messages."""
    kind = "a whole number" if integer else "a finite number"
    bounds = []
    if above is not None:
        bounds.append(f"> {above:g}")
    if minimum is not None:
        bounds.append(f">= {minimum:g}")
    if maximum is not None:
        bounds.append(f"<= {maximum:g}")
    return kind + (" " + " and ".join(bounds) if bounds else "")


def in_range(value: Any, minimum: float | None = None, above: float | None = None,
             maximum: float | None = None, integer: bool = False) -> bool:
    """True when `value` is a (whole, if asked) finite number inside the bounds; bools are not numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if integer and (isinstance(value, float) and not value.is_integer()):
        return False
    if not math.isfinite(value):
        return False
    if above is not None and not value > above:
        return False
    if minimum is not None and not value >= minimum:
        return False
    return maximum is None or value <= maximum



class Number(click.ParamType):
    """A click type for a bounded finite number: `--deadline-h nan` is refused like `--deadline-h x`."""

    def __init__(self, minimum: float | None = None, above: float | None = None, maximum: float | None = None,
                 integer: bool = False, why: str = "") -> None:
        self.bounds = dict(minimum=minimum, above=above, maximum=maximum, integer=integer)
        self.name = "integer" if integer else "float"
        self.why = f" ({why})" if why else ""  # why the limit: said with every refusal

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number: float = value
        else:
            try:
                number = float(str(value).strip())
            except ValueError:
                self.fail(f"expected {describe(**self.bounds)}, got {value!r}", param, ctx)
        if not in_range(number, **self.bounds):
            self.fail(f"expected {describe(**self.bounds)}{self.why}, got {value!r}", param, ctx)
        return int(number) if self.bounds["integer"] else float(number)


POSITIVE = Number(above=0)
NON_NEGATIVE = Number(minimum=0)


class OutputDir(click.ParamType):
    """A directory flag a command creates and writes (--runs-dir, --out): checked by
    `writes.check_output_dir` when the flag is read, so every command refuses an empty path, a file,
    /dev/null, FILE/x or /proc/x with the same one line before it makes anything. `remote_ok` lets
    s3:// URLs through (prep --out), which are checked where they are written."""

    name = "directory"

    def __init__(self, flag: str, remote_ok: bool = False) -> None:
        self.flag, self.remote_ok = flag, remote_ok

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from scalelab.core.writes import check_output_dir

        text = str(value)
        if self.remote_ok and "://" in text:
            return text
        check_output_dir(text, self.flag)  # a WriteError: one line, through the CLI's ScalelabError path
        return text


class InputFile(click.ParamType):
    """A file flag a command reads (--spec, --from-csv): checked by `writes.check_input_file` when the flag
    is read, so a directory, FIFO or device is one line saying what it is (click's own check said "is
    a directory" under a usage block, and let a FIFO through to a read that never returns)."""

    name = "file"

    def __init__(self, what: str) -> None:
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from scalelab.core.writes import check_input_file

        check_input_file(str(value), self.what)
        return str(value)


@functools.lru_cache(maxsize=1)
def aws_ec2_regions() -> tuple[str, ...]:
    """Every region with EC2 in botocore's own data (no network). Read once a process: it loads the EC2
    service model, about 0.2 s, and a sweep or a probe checks the region of every run it plans."""
    import botocore.session

    session = botocore.session.get_session()
    return tuple(r for p in session.get_available_partitions() for r in session.get_available_regions("ec2", partition_name=p))


def aws_region_problem(region: str, also: Iterable[str] = ()) -> str | None:
    """An AWS region botocore does not know (every partition's, from its own data: no network), named with
    the known ones; None when it knows it, or it is one of `also` (the regions a prices file prices).
    Why: `--region mars-1` was taken by a dry run and priced, and failed only at the first API call.
    A region of `also` is answered before botocore is read (`launch cost` and `launch plan` in the default
    region, which the catalog prices, need none of it); botocore's regions are read once a process."""
    also = set(also)
    if region in also:
        return None
    known = aws_ec2_regions()
    if not known or region in known:
        return None
    return f"--region {region!r} is not an AWS region; the regions with EC2: {', '.join(sorted(known))}"
