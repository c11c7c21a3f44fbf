"""`--rate` and `--prices`: declared once, for `launch cost`, `plan`, `report`, `probe` and the launches.

Why one declaration: the same flag in five commands had two spellings, two help texts and no check at
parse time (`--rate x=0...` was a traceback). Here it is read by one click type (costs.catalog.parse_rate:
a finite price >= 0, per GPU-hour unless `/node-hour@GPUS`), so a bad value is one `launch: error:` line.
A rate without `NAME=` prices the run's (or the launch's) own backend: `named_rates`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import click

from scalelab.costs.catalog import CatalogError, parse_rate

__all__ = ["RateText", "rate_options", "named_rates"]

BARE = "_"  # the name a bare rate is checked under


class RateText(click.ParamType):
    """`[NAME=]USD[/gpu-hour]` or `[NAME=]USD/node-hour@GPUS`, checked and kept as written."""

    name = "rate"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        try:
            parse_rate(text if "=" in text else f"{BARE}={text}")
        except CatalogError as exc:
            self.fail(str(exc).replace(f"'{BARE}=", "'").replace(f" {BARE}=", " "), param, ctx)
        return text


def rate_options(func: Callable) -> Callable:
    """--rate (repeatable) and --prices, the one declaration every command that prices shares."""
    func = click.option("--prices", "prices_file", type=click.Path(dir_okay=False),
                        help="Prices file (JSON/YAML) [default: $SCALELAB_PRICES or ~/.config/scalelab/prices.json]; "
                             "given, it must exist.")(func)
    return click.option("--rate", "rates", multiple=True, type=RateText(), metavar="[NAME=]USD/gpu-hour",
                        help="On-premise price, e.g. 0.45/gpu-hour (the run's backend), slurm=0.45/gpu-hour or "
                             "k8s=3.2/node-hour@4 (repeatable); NAME can then be used as an instance type.")(func)


def named_rates(rates: Iterable[str], backends: Iterable[str]) -> list[str]:
    """--rate values with every bare one (`0.45/gpu-hour`) named after each of `backends`; a bare one where
    no backend is known (a CSV, a plan) is refused, saying to name it."""
    backends = list(dict.fromkeys(backends))
    out = []
    for rate in rates:
        if "=" in rate:
            out.append(rate)
        elif not backends:
            raise CatalogError(f"--rate {rate}: name what it prices here, e.g. --rate slurm={rate}")
        else:
            out += [f"{b}={rate}" for b in backends]
    return out
