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
from typing import Any, Callable, Sequence

import pandas as pd

from scalelab.core.spec import Spec
from scalelab.costs.billing import Mix
from scalelab.costs.catalog import DEFAULT_REGION, Catalog, CatalogError, load_catalog
from scalelab.costs.fleet import MARKET_ON_DEMAND, MARKET_SPOT, Fleet

__all__ = ["ASSUMED_GPU_HOUR_USD", "ASSUMED_STEP_S", "Estimate", "fleet_price", "expected_cost",
           "measured_cost_points", "is_priced", "run_mix", "run_price", "run_seconds"]

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

    def line(self) -> str:
        """One line for the terminal: price per hour, expected dollars and both assumptions."""
        steps = "unknown steps (--epochs)" if self.steps is None else f"{self.steps} steps"
        dollars = "unknown" if math.isnan(self.dollars) else f"${self.dollars:,.2f}"
        startup = f" + {self.startup_s:.3g} s start-up" if self.startup_s else ""
        from scalelab.analysis.html import duration_text

        took = "an unknown time" if math.isnan(self.hours) else duration_text(self.hours * 3600)
        return (f"fleet ${self.usd_per_hour:,.2f}/hour ({self.rate_basis}); expected {dollars} "
                f"for {steps} x {self.step_s:.3g} s/step ({self.step_basis}){startup} = {took}")

    def with_step_basis(self, basis: str) -> "Estimate":
        """The same estimate, saying where its measured step time came from."""
        return replace(self, step_basis=basis)


def fleet_price(spec: Spec, catalog: Catalog | None = None, *, fleet: Fleet) -> tuple[float, str]:
    """USD per hour of every node of `spec` together, and where the price comes from. `fleet`: how its
    backend pays for nodes (`launcher.backend.fleet_of`: the backend says it, not this module)."""
    catalog = catalog or load_catalog()
    if fleet.cloud:
        return _cloud_price(spec, fleet, catalog)
    for name in dict.fromkeys([fleet.instance_type or fleet.rate_name, fleet.rate_name]):
        inst = catalog.instances.get(name)
        if inst is not None and inst.provider == "rate":
            price = catalog.price(name)
            units = spec.workers / inst.gpus
            return price.usd_per_hour * units, f"rate '{name}' from {price.source}, {units:g} units"
    name = fleet.instance_type or fleet.rate_name
    gpus = f"{spec.workers} GPU" + ("s" if spec.workers != 1 else "")
    return ASSUMED_GPU_HOUR_USD * spec.workers, (f"assumed on-premise ${ASSUMED_GPU_HOUR_USD:.2f}/GPU-hour x "
                                                 f"{gpus}; set a '{name}' rate in the prices file")


def is_priced(fleet: Fleet, catalog: Catalog) -> bool:
    """Whether the launch is priced at all: a cloud always is; on-premise machines (the local backend
    costs nothing) only when the prices name a rate after the backend."""
    inst = catalog.instances.get(fleet.rate_name)
    return fleet.cloud or (inst is not None and inst.provider == "rate")


def _cloud_price(spec: Spec, fleet: Fleet, catalog: Catalog) -> tuple[float, str]:
    """The instance mix's price in the run's market and region; where the catalog lacks it, an
    upper bound (spot: on-demand) or another region's price (us-east-1, built in), said as such."""
    mix = Mix.for_nodes(fleet.instance_type, spec.nodes, catalog, provider=fleet.provider)
    market = fleet.market
    region = fleet.region or catalog.region
    tries = [(market, region, f"{mix} {market}")]
    if market == MARKET_SPOT:  # a spot price never exceeds on-demand (the default maximum bid)
        tries.append((MARKET_ON_DEMAND, region, f"{mix} spot at most the on-demand price (no spot price known: "
                                                f"`launch cost --refresh spot --region {region}`)"))
    if region != DEFAULT_REGION:
        tries.append((MARKET_ON_DEMAND, DEFAULT_REGION, f"{mix} {market} assumed at most the {DEFAULT_REGION} "
                                                        f"on-demand price (none known in {region}: `launch cost "
                                                        f"--refresh all --region {region}`)"))
    error: CatalogError | None = None
    for market_, region_, basis in tries:
        try:
            return mix.usd_per_hour(catalog, market_, region_), basis
        except CatalogError as exc:
            error = error or exc  # the first: it names the price that was asked for
    raise error


def expected_cost(spec: Spec, step_s: float | None = None, catalog: Catalog | None = None,
                  startup_s: float = 0.0, *, fleet: Fleet) -> Estimate:
    """Price per hour and expected dollars of `spec`: its steps x `step_s` (measured) or ASSUMED_STEP_S,
    plus a measured start-up (launch to the first step: it is paid too); `fleet` as for `fleet_price`."""
    rate, rate_basis = fleet_price(spec, catalog, fleet=fleet)
    measured = step_s is not None
    step_s = float(step_s) if measured else ASSUMED_STEP_S
    basis = "measured" if measured else "assumed: nothing measured; --expect-from RUN uses a run's"
    hours = (spec.steps * step_s + startup_s) / 3600.0 if spec.steps is not None else math.nan
    return Estimate(rate, rate_basis, spec.steps, step_s, basis, hours, rate * hours, startup_s)


def run_seconds(run: Any) -> float:
    """Wall time of a recorded run: from its launch (launch.json, else the first start record: the
    start-up is paid too) to the last record of any rank. The one run time every price of a finished run
    uses (`launch cost`, the report's cost chart): billing counts the wall clock, not training seconds."""
    from scalelab.analysis.results import launched_at
    from scalelab.core.errors import DataError

    times = [pd.to_numeric(f["time"], errors="coerce") for f in (run.start, run.steps, run.val, run.events)
             if len(f) and "time" in f.columns]
    if not times:
        raise DataError(f"{run.run_dir}: no timed records; cannot tell how long it ran")
    first = launched_at(run)
    first = min(float(t.min()) for t in times) if first is None else first
    return max(float(t.max()) for t in times) - first


def run_mix(spec: Spec, text: str, catalog: Catalog) -> Mix:
    """The instances that hold a run's layout, as `launch cost RUN --instances TEXT` prices it: a bare type
    is `nodes x ceil(gpus_per_node / its GPUs)` instances (a 1x2 run on 1-GPU g5.xlarge is two, not one, as
    the planner counts ceil(workers / GPUs)); an explicit mix (`2*g5.xlarge`, `8*slurm`) is taken as written."""
    mix = Mix.parse(text, catalog, nodes=spec.nodes)
    if len(mix.items) == 1 and "*" not in text:
        gpus = max(1, catalog.instance(mix.items[0][1]).gpus)
        mix = Mix(((spec.nodes * math.ceil(spec.gpus_per_node / gpus), mix.items[0][1]),))
    return mix


def run_price(spec: Spec, fleet: Fleet, catalog: Catalog | None = None) -> tuple[float, str, str]:
    """(USD per hour, basis, instances) of a recorded run: the one rule `launch cost RUN`, the report's cost
    chart, the previews (`fleet_price`) and the planner (ceil(GPUs / GPUs per instance) instances of a type)
    share. Its fleet's price; an on-premise run that names a catalog instance type but has no rate (hand-
    made, or measured "as" a type) at that type's on-demand price for instances holding its GPUs
    (`run_mix`), rather than at the assumed GPU-hour price."""
    catalog = catalog or load_catalog()
    name = fleet.instance_type or fleet.rate_name
    inst = catalog.instances.get(fleet.instance_type) if fleet.instance_type else None
    if not fleet.cloud and not is_priced(fleet, catalog) and inst is not None and inst.provider != "rate":
        mix = run_mix(spec, fleet.instance_type, catalog)
        return mix.usd_per_hour(catalog, MARKET_ON_DEMAND), f"{mix} on-demand (the run's instance_type)", str(mix)
    rate, basis = fleet_price(spec, catalog, fleet=fleet)
    if fleet.cloud:
        return rate, basis, str(Mix.for_nodes(fleet.instance_type, spec.nodes, catalog, provider=fleet.provider))
    inst = catalog.instances.get(name) or catalog.instances.get(fleet.rate_name)
    units = spec.workers / inst.gpus if inst is not None and inst.provider == "rate" else spec.workers
    return rate, basis, f"{units:g}*{name}"


def measured_cost_points(table: pd.DataFrame, runs: Sequence[Any],
                         fleet_of: Callable[[Spec], Fleet]) -> tuple[pd.DataFrame | None, str]:
    """Per run: its billed hours and dollars at its fleet's price (the HTML report), by the rule `launch
    cost` uses (`fleet_price` for the whole fleet, `run_seconds` of wall time, per-second billing with a
    60 s minimum), so the two give the same dollars for the same run; `fleet_of` says how each run's
    backend pays for its nodes."""
    from scalelab.costs.billing import cost_at_rate

    rows, bases = [], set()
    for run in runs:
        try:
            fleet = fleet_of(run.spec)
            rate, basis, instances = run_price(run.spec, fleet)
            seconds = run_seconds(run)
        except Exception as exc:  # a price missing must not lose the whole report
            bases.add(f"{run.run_dir.name}: no price ({exc})")
            continue
        if seconds > 0:
            cost = cost_at_rate(seconds, instances, run.spec.workers, rate, fleet.market, fleet.region or "")
            rows.append({"layout": f"{run.spec.nodes}x{run.spec.gpus_per_node}", "hours": cost.billed_seconds / 3600.0,
                         "dollars": cost.dollars, "usd_per_hour": rate})
            bases.add(basis)
    text = ("Billed wall time (launch to last record, per second, 60 s minimum; as `launch cost`) at: "
            + "; ".join(sorted(bases)) + ".")
    return (pd.DataFrame(rows) if rows else None), text
