"""How a backend's nodes are paid for, stated by the backend and handed to the cost model as data.

Why: the price and the start-up of a run belong to the backend that runs it (an EC2 instance per node,
billed from the catalog; a Slurm partition or a workstation, billed at an on-premise rate), but the
cost model (scalelab/costs/expected.py) may not import the backends - they sit above it. So each
backend's options type (its `options.py`, light: the CLI reads it at start) says it with one of the two
mixins below, and the launcher reads it through the backend registry (`launcher.backend.fleet_of`,
`assumed_startup_s`) and passes the `Fleet` down. No module under costs/ names a backend.

No heavy imports: the backends' options modules import this.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

MARKET_ON_DEMAND, MARKET_SPOT = "on-demand", "spot"


@dataclass(frozen=True)
class Fleet:
    """What prices a run's nodes. `provider`: a cloud of the catalog, each node one instance of
    `instance_type` (a type or a mix) in `market` and `region`, always priced; None: on-premise, priced
    by the rate named `instance_type` (a probe's variant, a GPU type) else `rate_name` (the backend's),
    when the prices file sets one."""

    provider: str | None = None
    instance_type: str = ""
    market: str = MARKET_ON_DEMAND
    region: str | None = None
    rate_name: str = ""
    max_price: float | None = None  # spot: the highest USD per instance-hour bid (--max-price), None: on-demand

    @property
    def cloud(self) -> bool:
        return self.provider is not None


class OnPremiseFleet:
    """Options mixin of a backend whose machines are not rented per instance (local, Slurm, Kubernetes):
    priced by an on-premise rate named after its `instance_type` option or after the backend."""

    #: Seconds from submission to the first step, assumed in a cost estimate before one was measured.
    assumed_startup_s: ClassVar[float] = 60.0
    backend: ClassVar[str]

    def fleet(self: Any) -> Fleet:
        """The rates that price these nodes (only the backend's own when no `instance_type` is set)."""
        options: Mapping[str, Any] = self
        return Fleet(instance_type=str(options.get("instance_type") or ""), rate_name=self.backend)


class CloudFleet:
    """Options mixin of a backend that rents one instance per node from `provider` (AWS): priced from the
    catalog by its `instance_type`, `spot` and `region` options."""

    assumed_startup_s: ClassVar[float] = 300.0
    provider: ClassVar[str]
    backend: ClassVar[str]

    def fleet(self: Any) -> Fleet:
        """The instances of the run, their market and region (None: the catalog's), and a spot bid's cap: a spot
        price is unknown until it runs, and the cap is then what bounds it."""
        options: Mapping[str, Any] = self
        spot = bool(options.get("spot"))
        max_price = options.get("spot_max_price") if spot else None
        return Fleet(provider=self.provider, instance_type=str(options["instance_type"]),
                     market=MARKET_SPOT if spot else MARKET_ON_DEMAND, region=options.get("region") or None,
                     rate_name=self.backend, max_price=float(max_price) if max_price else None)
