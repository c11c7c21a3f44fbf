"""What a run costs: the fleet's price per hour and the expected dollars, before and after it runs.

Why here: the prices live in costs/ (catalog, billing); the launcher asks before it pays and the HTML
report shows what the measured runs cost. Every number carries its basis (which rate, which step
time) because an estimate whose assumption is hidden cannot be checked.

Rates: the backend says how its nodes are paid for (a `Fleet`, scalelab/costs/fleet.py, passed in: this
layer does not import the backends). A cloud fleet (AWS) is priced from its `--instance-type` mix (one
instance per node, on-demand or spot) in the catalog; an on-premise one from the rate named by its
`instance_type` option (what `launch probe` sets: a local variant, a Slurm partition or GPU type), else
the rate named after the backend (`slurm`, `k8s`, `local`) in the user's prices file, else
ASSUMED_GPU_HOUR_USD per GPU-hour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from scalelab.core.spec import Spec
from scalelab.core.terminal import dollars_text, duration_text
from scalelab.costs.billing import Mix, RunCost, instances_for, run_cost
from scalelab.costs.catalog import DEFAULT_REGION, Catalog, CatalogError, Price, load_catalog
from scalelab.costs.fleet import MARKET_ON_DEMAND, MARKET_SPOT, Fleet

__all__ = ["ASSUMED_GPU_HOUR_USD", "ASSUMED_STEP_S", "Estimate", "FleetPrice", "fleet_price", "fleet_pricing",
           "expected_cost", "is_priced", "no_price_note", "planned_steps", "recorded_cost", "run_seconds"]

#: On-premise price of one GPU-hour when the prices file names no rate for the backend.
ASSUMED_GPU_HOUR_USD = 0.50
#: Step time assumed when nothing was measured (seconds per step of the slowest rank).
ASSUMED_STEP_S = 0.5


@dataclass(frozen=True)
class Estimate:
    usd_per_hour: float
    rate_basis: str
    steps: int | None
    step_s: float
    step_basis: str
    hours: float
    dollars: float
    startup_s: float = 0.0
    own_code: bool = False  # a --script/--module spec: unknown steps are the script's own, not --epochs'
    length_basis: str = ""  # which bound gave `steps` (`planned_steps`); "" for --steps alone

    def line(self) -> str:
        """One line for the terminal: price per hour, expected dollars and both assumptions; a script whose
        length is unknown gets the hourly price alone (a sum of unknowns said nothing)."""
        hourly = f"fleet ${self.usd_per_hour:,.2f}/hour ({self.rate_basis})"
        if self.own_code and self.steps is None:
            return f"{hourly}; a script's length is not known before it runs, so no total"
        steps = f"unknown steps ({self.length_basis})" if self.steps is None else f"{self.steps:,} steps" + (
            f" ({self.length_basis})" if self.length_basis else "")
        dollars = "unknown" if math.isnan(self.dollars) else f"${dollars_text(self.dollars)}"
        startup = f" + {self.startup_s:.3g} s start-up" if self.startup_s else ""
        took = "an unknown time" if math.isnan(self.hours) else duration_text(self.hours * 3600)
        return (f"{hourly}; expected {dollars} "
                f"for {steps} x {self.step_s:.3g} s/step ({self.step_basis}){startup} = {took}")

    def with_step_basis(self, basis: str) -> "Estimate":
        """The same estimate, saying where its measured step time came from."""
        return replace(self, step_basis=basis)


@dataclass(frozen=True)
class FleetPrice:
    """How a fleet is priced: its instances (`billing.instances_for`, the one count), the market and region
    of the price found, where it comes from, and the catalog that holds it. `assumed`: no rate was set (an
    on-premise machine at ASSUMED_GPU_HOUR_USD): an estimate before a launch may use it, a recorded run's
    dollars (`launch cost`, `launch report`) never do."""

    mix: Mix
    market: str
    region: str
    basis: str
    catalog: Catalog
    assumed: bool = False

    @property
    def usd_per_hour(self) -> float:
        return self.mix.usd_per_hour(self.catalog, self.market, self.region)

    def cost(self, seconds: float, label: str = "", measured: bool = False, **spot: float) -> RunCost:
        """Dollars of keeping the fleet `seconds`: `billing.run_cost`, the one pricing function (`measured`:
        a recorded wall time, whose interruptions are in it)."""
        return run_cost(seconds, self.mix, self.catalog, self.market, self.region, label, measured=measured, **spot)


def fleet_pricing(spec: Spec, fleet: Fleet, catalog: Catalog | None = None) -> FleetPrice:
    """The fleet of `spec` as its backend pays for it (`fleet`: `launcher.backend.fleet_of`): a cloud's
    instance mix in the catalog; on premise the rate named by its instance_type, else by its backend; an
    on-premise run that names a catalog instance type (measured "as" it) at that type's on-demand price;
    else the assumed GPU-hour price. Instances counted by `instances_for` in every case."""
    catalog = catalog or load_catalog()
    if fleet.cloud:
        return _cloud_price(spec, fleet, catalog)
    for name in dict.fromkeys([fleet.instance_type or fleet.rate_name, fleet.rate_name]):
        inst = catalog.instances.get(name)
        if inst is not None and inst.provider == "rate":
            mix = instances_for(spec.nodes, spec.gpus_per_node, name, catalog)
            units = mix.count()
            basis = f"rate '{name}' from {catalog.price(name).source}, {units} unit{'s' if units != 1 else ''}"
            return FleetPrice(mix, MARKET_ON_DEMAND, catalog.region, basis, catalog)
    if fleet.instance_type in catalog.instances:
        mix = instances_for(spec.nodes, spec.gpus_per_node, fleet.instance_type, catalog)
        return FleetPrice(mix, MARKET_ON_DEMAND, catalog.region, f"{mix} on-demand (the run's instance_type)", catalog)
    name = fleet.instance_type or fleet.rate_name
    assumed = replace(catalog, instances=dict(catalog.instances), on_demand=dict(catalog.on_demand))
    assumed.add_rate(name, ASSUMED_GPU_HOUR_USD, source="assumed")
    mix = instances_for(spec.nodes, spec.gpus_per_node, name, assumed)
    gpus = f"{mix.count()} GPU" + ("s" if mix.count() != 1 else "")
    return FleetPrice(mix, MARKET_ON_DEMAND, catalog.region, f"assumed on-premise ${ASSUMED_GPU_HOUR_USD:.2f}/GPU-hour "
                      f"x {gpus}; set a '{name}' rate in the prices file", assumed, assumed=True)


def fleet_price(spec: Spec, catalog: Catalog | None = None, *, fleet: Fleet) -> tuple[float, str]:
    """USD per hour of every node of `spec` together, and where the price comes from (`fleet_pricing`)."""
    price = fleet_pricing(spec, fleet, catalog)
    return price.usd_per_hour, price.basis


def is_priced(fleet: Fleet, catalog: Catalog) -> bool:
    """Whether the launch is priced at all: a cloud always is; on-premise machines (the local backend
    costs nothing) only when the prices name a rate after the backend."""
    inst = catalog.instances.get(fleet.rate_name)
    return fleet.cloud or (inst is not None and inst.provider == "rate")


def _cloud_price(spec: Spec, fleet: Fleet, catalog: Catalog) -> FleetPrice:
    """The instance mix's price in the run's market and region; where the catalog lacks it, an upper bound
    (spot: --max-price, else on-demand) or the us-east-1 price (built in) as an estimate, said as such."""
    Mix.for_nodes(fleet.instance_type, spec.nodes, catalog, provider=fleet.provider)  # an explicit mix: one per node
    mix = instances_for(spec.nodes, spec.gpus_per_node, fleet.instance_type, catalog, provider=fleet.provider)
    error: CatalogError | None = None
    for market, region, basis, priced in _cloud_tries(mix, fleet, fleet.region or catalog.region, catalog):
        try:
            mix.usd_per_hour(priced, market, region)
            return FleetPrice(mix, market, region, basis, priced)
        except CatalogError as exc:
            error = error or exc  # the first: it names the price that was asked for
    raise error


def _cloud_tries(mix: Mix, fleet: Fleet, region: str, catalog: Catalog) -> list[tuple[str, str, str, Catalog]]:
    """(market, region, basis, catalog) to price `mix` with, best first. A spot bid's --max-price bounds what an
    instance-hour costs in any region, the on-demand price (EC2's default bid) only in its own; another region's
    price bounds nothing (other regions often cost more), so it is only an estimate."""
    market = fleet.market
    tries = [(market, region, f"{mix} {market}", catalog)]
    refresh_spot = f"no spot price known: `launch cost --refresh spot --region {region}`"
    if market == MARKET_SPOT and fleet.max_price:
        capped, lower = _capped_spot(catalog, mix, region, fleet.max_price)
        where_lower = " or the on-demand price where that is lower" if lower else ""
        bid = f"{fleet.max_price:.2f}" if round(fleet.max_price, 2) == fleet.max_price else f"{fleet.max_price:g}"
        above = _spot_above_bid(catalog, mix, region, fleet.max_price)
        if above:  # the known price is one the instances never pay: they pay at most the bid, or do not start
            return [(MARKET_SPOT, region, f"{mix} spot at most --max-price ${bid}/instance-hour{where_lower}; but the "
                                          f"last known spot price of {above} is above the bid, and EC2 starts no spot "
                                          "instance while the price is above its bid (SpotMaxPriceTooLow): raise "
                                          "--max-price, or leave it out to bid the on-demand price", capped)]
        tries.append((MARKET_SPOT, region, f"{mix} spot at most --max-price ${bid}/instance-hour"
                                           f"{where_lower} ({refresh_spot})", capped))
    elif market == MARKET_SPOT:  # a spot price never exceeds on-demand (the default maximum bid)
        tries.append((MARKET_ON_DEMAND, region, f"{mix} spot at most the on-demand price ({refresh_spot})", catalog))
    if region != DEFAULT_REGION:
        tries.append((MARKET_ON_DEMAND, DEFAULT_REGION, f"{mix} {market} estimated at the {DEFAULT_REGION} on-demand "
                                                        f"price (none known in {region}, whose prices may be higher: "
                                                        f"`launch cost --refresh all --region {region}`)", catalog))
    return tries


def _spot_above_bid(catalog: Catalog, mix: Mix, region: str, bid: float) -> str:
    """The types of `mix` whose known spot price in `region` is above `bid`, with that price
    ("p2.xlarge $0.1288/hour (as of 2017)"); '' when none is. Why: the preview priced a fleet at a spot price
    its --max-price does not reach, a cost the run can never have (EC2 starts no instance below the current
    spot price)."""
    said = []
    for name in dict.fromkeys(name for _, name in mix.items):
        known = catalog.spot.get((name, region))
        if known is not None and known.usd_per_hour > bid:
            when = f" (as of {known.observed})" if known.observed else ""
            said.append(f"{name} ${known.usd_per_hour:g}/hour{when}")
    return ", ".join(said)


def _capped_spot(catalog: Catalog, mix: Mix, region: str, cap: float) -> tuple[Catalog, bool]:
    """A copy of `catalog` whose spot price of each type of `mix` in `region` is its bound: the bid `cap`, or the
    on-demand price there where known and lower (a spot price never exceeds it); and whether that was lower."""
    capped = replace(catalog, spot=dict(catalog.spot))
    lower = False
    for _, name in mix.items:
        on_demand = catalog.on_demand.get((name, region))
        bound = cap if on_demand is None or on_demand.usd_per_hour >= cap else on_demand.usd_per_hour
        lower = lower or bound < cap
        capped.set_price(name, region, MARKET_SPOT, Price(bound, "bound: --max-price or on-demand"))
    return capped, lower


def planned_steps(spec: Spec) -> tuple[int | None, str]:
    """(the steps the run will take, which bound gave them: "" for --steps alone). With --epochs, the fewer of
    --steps and the epochs' steps where the spec says the steps of an epoch (task, synthetic data); where the data
    must be read first (text, shards), --steps as an upper bound, else None. Why: an --epochs run was priced at
    its --steps (100,000 steps: $15.83, refused by --max-usd 1) though its 3 epochs of 16 steps ended it first."""
    if spec.epochs is None or spec.own_code:
        return spec.steps, ""
    per_epoch = spec.known_steps_per_epoch()
    if per_epoch is None:
        why = (f"{spec.data.kind} data's steps per epoch are known once it is read" if spec.data.kind in ("text", "shards")
               else "its training samples are fewer than one global batch, which the run refuses")
        if spec.steps is None:
            return None, f"--epochs {spec.epochs}: {why}; give --steps too to bound the price"
        return spec.steps, f"at most: --steps {spec.steps:,}; --epochs {spec.epochs} may end it sooner, {why}"
    by_epochs = spec.epochs * per_epoch
    epochs = f"--epochs {spec.epochs} x {per_epoch:,} steps an epoch"
    if spec.steps is not None and spec.steps < by_epochs:
        return spec.steps, f"--steps {spec.steps:,}, fewer than {epochs}"
    return by_epochs, epochs + (f", fewer than --steps {spec.steps:,}" if spec.steps is not None else "")


def expected_cost(spec: Spec, step_s: float | None = None, catalog: Catalog | None = None,
                  startup_s: float = 0.0, *, fleet: Fleet) -> Estimate:
    """Price per hour and expected dollars of `spec`: its steps (`planned_steps`) x `step_s` (measured) or ASSUMED_STEP_S,
    plus a start-up (launch to the first step: it is paid too), billed as every run is (`billing.run_cost`:
    per second, 60 s minimum per instance); `fleet` as for `fleet_pricing`."""
    price = fleet_pricing(spec, fleet, catalog)
    measured = step_s is not None
    step_s = float(step_s) if measured else ASSUMED_STEP_S
    basis = "measured" if measured else "assumed: nothing measured; --expect-from RUN uses a run's"
    steps, length = planned_steps(spec)
    seconds = steps * step_s + startup_s if steps is not None else math.nan
    dollars = price.cost(seconds).dollars if steps is not None else math.nan
    return Estimate(price.usd_per_hour, price.basis, steps, step_s, basis, seconds / 3600.0, dollars, startup_s,
                    spec.own_code, length)


def no_price_note(spec: Spec) -> str:
    """What prices an on-premise backend's runs when no rate is set, said the same in `launch report`, `launch cost`
    and a --dry-run's preview (which otherwise said nothing, though --help promises a cost)."""
    named = (spec.backend_options or {}).get("instance_type") or spec.backend
    return (f"the {spec.backend} backend's runs have no price: give --rate USD_PER_GPU_HOUR (the backend's rate), "
            f"--rate {named}=USD/gpu-hour, or a '{named}' rate in the prices file")


def run_seconds(run: Any) -> float:
    """Wall time of a recorded run: from its launch (launch.json, else the first start record: the
    start-up is paid too) to the last record of any rank. The one run time every price of a finished run
    uses (`launch cost`, the report's cost chart): billing counts the wall clock, not training seconds."""
    import pandas as pd  # here, not at the top: `launch`'s price quote before every run needs no pandas (1 s)

    from scalelab.analysis.results import launched_at
    from scalelab.core.errors import DataError

    times = [pd.to_numeric(f["time"], errors="coerce") for f in (run.start, run.steps, run.val, run.events)
             if len(f) and "time" in f.columns]
    if not times:
        raise DataError(f"{run.run_dir}: no timed records; cannot tell how long it ran")
    first = launched_at(run)
    first = min(float(t.min()) for t in times) if first is None else first
    return max(float(t.max()) for t in times) - first


def recorded_cost(run: Any, price: FleetPrice | None, wall_to_threshold_s: float | None = None,
                  label: str = "") -> dict[str, Any]:
    """What a recorded run cost, the one row `launch cost RUN` and `launch report` show: its wall time
    (`run_seconds`) and its wall time to the loss threshold, each priced at `price` (`fleet_pricing`, or
    `launch cost --instances`) by `billing.run_cost` (measured times hold their interruptions: none added).
    No price, or only the assumed one (no rate set for an on-premise machine): no dollars; `price_note`
    says what to give."""
    if price is None or price.assumed:
        return {"instances": None, "market": None, "usd_per_hour": None, "billed_seconds": None, "dollars": None,
                "dollars_to_threshold": None, "price_basis": None, "price_note": no_price_note(run.spec)}
    cost = price.cost(run_seconds(run), label, measured=True)
    wall = wall_to_threshold_s
    to_threshold = None if wall is None or wall != wall else price.cost(float(wall), measured=True).dollars
    return {**cost.to_dict(), "dollars_to_threshold": to_threshold, "price_basis": price.basis, "price_note": None}
