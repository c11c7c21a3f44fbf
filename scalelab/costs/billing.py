"""Dollars for a run: instance mixes, per-second billing, spot interruptions.

Billing rule (AWS Linux instances, and the default for user rates): every instance is billed per
second, with a 60-second minimum. A run on a mix of instances (e.g. `3*g3.4xlarge+1*p2.xlarge`)
keeps all of them for the whole run, because in synchronous data parallelism the slowest worker
sets every step's time: the fast ones wait and are billed while waiting.

Spot: every instance is interrupted on its own, at λ_t per instance-hour for its type t (the
type's own rate from the catalog, else the global one), so a job is interrupted Σ n_t·λ_t times an
hour, summed over the instances of its mix (8 instances, 8 times as often as one), and one
interruption stops every worker of a synchronous job. An interruption loses the work since the last checkpoint (on
average half of a checkpoint interval and its write, the interruption time being uniform within
it) and costs a restart (new instance, image, data, resume). Checkpoints are written every c
seconds of work and take w seconds each, so a run that needs W seconds of work takes

    T = W·(1 + w/c) / (1 − Λ·((c + w)/2 + r)/3600)        Λ = Σ n_t·λ_t, r = restart time (s)

seconds of expected wall time (each hour of wall time spends Λ·((c+w)/2 + r) seconds redoing
work and restarting). T is infinite when interruptions come faster than progress is made. These
are expectations over the interruption process, not guarantees.

One rule for every dollar (issue 33): `launch cost`, `launch report`, `launch plan`, the launch
previews and `--max-usd`, `launch probe` and the studies price through `run_cost` (a mix and a catalog;
its arithmetic is `cost_at_rate`), and count a layout's instances with `instances_for`.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from scalelab.costs.catalog import MARKETS, Catalog, CatalogError

__all__ = ["MIN_BILLED_S", "Mix", "billed_seconds", "RunCost", "run_cost", "cost_at_rate", "instances_for",
           "spot_expected_seconds", "spot_stall", "threshold_cost"]

MIN_BILLED_S = 60


@dataclass(frozen=True)
class Mix:
    """Instances rented together: ((count, type), ...) in the order written.

    One grammar everywhere an instance mix is written: `COUNT*TYPE` terms joined by `+`, e.g.
    `1*p2.xlarge+3*g3.4xlarge`; TYPE is an instance type or a `--rate` name of the catalog. A bare
    `TYPE` term inside a mix is one instance. A text that is a single bare `TYPE` means:

    - one instance in `Mix.parse(text)` (a cost CSV's `instances` column, a study's `instances`),
      since nothing says how many nodes there were;
    - one instance per node in `Mix.parse(text, nodes=N)` and `Mix.for_nodes(text, N)` (the aws
      backend's `--instance-type`, the run's own spec and `--instances` in `launch cost RUN`),
      as `launch --backend aws --instance-type g3.4xlarge --nodes 4` rents four g3.4xlarge.

    `for_nodes` also requires an explicit mix to hold exactly one instance per node, so the spec
    saved with a run says what ran; `launch cost RUN --instances` does not, because an on-premise
    rate per GPU-hour counts GPUs (`8*slurm`), not nodes.
    """

    items: tuple[tuple[int, str], ...]

    @classmethod
    def parse(cls, text: str, catalog: Catalog | None = None, *, nodes: int | None = None,
              provider: str | None = None) -> Mix:
        """Read `text` (grammar in the class doc). Types are checked against `catalog` when given,
        restricted to `provider` ("aws") when given; an unknown one lists the known ones."""
        items: list[tuple[int, str]] = []
        terms = str(text).split("+")
        for term in terms:
            m = _TERM.fullmatch(term)
            count = int(m.group(1)) if m and m.group(1) is not None else None
            if not m or count == 0:
                why = "a count must be at least 1" if m else "expected COUNT*TYPE or TYPE"
                raise CatalogError(f"cannot read instances {text!r}: term {term.strip()!r}: {why}; write "
                                   "COUNT*TYPE terms joined by '+', e.g. 1*p2.xlarge+3*g3.4xlarge")
            if catalog is not None:
                catalog.instance(m.group(2), provider)
            if count is None:  # a bare type: every node when it stands alone and nodes are known
                count = nodes if len(terms) == 1 and nodes is not None else 1
            items.append((count, m.group(2)))
        return cls(tuple(items))

    @classmethod
    def for_nodes(cls, text: str, nodes: int, catalog: Catalog | None = None, provider: str | None = None) -> Mix:
        """One instance per node: a bare type is every node, an explicit mix must count `nodes`."""
        mix = cls.parse(text, catalog, nodes=nodes, provider=provider)
        if mix.count() != nodes:
            raise CatalogError(f"the instance mix {text!r} has {mix.count()} instances but there are {nodes} "
                               f"nodes (--nodes); pass --nodes {mix.count()}, or one type alone for every node")
        return mix

    def __str__(self) -> str:
        return "+".join(f"{n}*{t}" for n, t in self.items)

    def count(self) -> int:
        return sum(n for n, _ in self.items)

    def node_types(self) -> list[str]:
        """One type per instance, in the order written (for a run: node order, which is rank order)."""
        return [t for n, t in self.items for _ in range(n)]

    def gpus(self, catalog: Catalog) -> int:
        return sum(n * catalog.instance(t).gpus for n, t in self.items)

    def interruptions_per_hour(self, catalog: Catalog, default: float = 0.0) -> float:
        """Spot interruptions per hour of the whole mix: the sum over its instances of each type's
        rate (catalog.interruption_rate, `default` for a type without its own)."""
        return sum(n * catalog.interruption_rate(t, default) for n, t in self.items)

    def usd_per_hour(self, catalog: Catalog, market: str = "on-demand", region: str | None = None) -> float:
        """Hourly price of the whole mix (sum of count x price)."""
        return sum(n * catalog.price(t, market, region).usd_per_hour for n, t in self.items)


_TERM = re.compile(r"\s*(?:(\d+)\s*\*\s*)?([A-Za-z][\w.\-]*)\s*")


def instances_for(nodes: int, gpus_per_node: int, instances: str | Mix, catalog: Catalog,
                  provider: str | None = None) -> Mix:
    """The instances that hold a layout of `nodes` x `gpus_per_node` GPUs: the one count every price uses.

    A bare type T with g GPUs is `nodes * ceil(gpus_per_node / g)` instances (a 1x2 run on 1-GPU
    g5.xlarge is two; a 2x4 run on 4-GPU g3.16xlarge is two; 8 GPUs at a gpu-hour rate are 8 units; a
    1x2 run at a node-hour@4 rate is one node). The planner's N workers on T are the layout 1 x N:
    ceil(N / g). An explicit mix (`1*p2.xlarge+3*g3.4xlarge`, `8*slurm`) is taken as written."""
    if isinstance(instances, Mix):
        return instances
    mix = Mix.parse(instances, catalog, provider=provider)
    if len(mix.items) > 1 or "*" in instances:
        return mix
    name = mix.items[0][1]
    per_node = math.ceil(max(1, int(gpus_per_node)) / max(1, catalog.instance(name).gpus))
    return Mix(((max(1, int(nodes)) * per_node, name),))


def billed_seconds(seconds: float) -> int:
    """Seconds billed for one instance kept `seconds`: whole seconds, at least 60."""
    if seconds < 0 or math.isnan(seconds):
        raise CatalogError(f"run time must be a non-negative number of seconds, got {seconds}")
    return max(MIN_BILLED_S, math.ceil(seconds - 1e-9))


def spot_expected_seconds(seconds: float, interruptions_per_hour: float, checkpoint_interval_s: float = 600.0,
                          restart_s: float = 180.0, checkpoint_write_s: float = 0.0) -> float:
    """Expected wall time of `seconds` of work on spot capacity interrupted `interruptions_per_hour`
    times an hour (the whole job's rate; formula in the module doc)."""
    if interruptions_per_hour < 0 or checkpoint_write_s < 0:
        raise CatalogError("interruptions per hour and checkpoint write seconds must be >= 0")
    lost_per_hour = interruptions_per_hour * _lost_per_interruption(checkpoint_interval_s, restart_s, checkpoint_write_s)
    if lost_per_hour >= 3600.0:
        return math.inf
    return seconds * (1.0 + checkpoint_write_s / checkpoint_interval_s) / (1.0 - lost_per_hour / 3600.0)


def _lost_per_interruption(checkpoint_interval_s: float, restart_s: float, checkpoint_write_s: float) -> float:
    """Seconds one interruption costs on average: half a checkpoint interval and its write, and the restart."""
    return (checkpoint_interval_s + checkpoint_write_s) / 2.0 + restart_s


def spot_stall(interruptions_per_hour: float, checkpoint_interval_s: float = 600.0, restart_s: float = 180.0,
               checkpoint_write_s: float = 0.0, instances: int = 1) -> str | None:
    """Why a spot job interrupted `interruptions_per_hour` times an hour (its `instances` together) never
    finishes, and what would let it, in the flags of `launch cost` and `launch plan`; None when it finishes.

    Why: `spot_expected_seconds` is infinite when the interruptions lose the whole hour, and that was shown as
    dollars `inf` (`launch cost`), null dollars with 0.0 expected interruptions (its JSON), or recommended as
    the cheapest layout and crashed the plan's answer: nothing said that the rate is the cause or what to change.
    """
    lost = _lost_per_interruption(checkpoint_interval_s, restart_s, checkpoint_write_s)
    if interruptions_per_hour * lost < 3600.0:
        return None
    n = max(1, int(instances))
    job = f"{interruptions_per_hour:.3g} interruptions an hour" + (
        f" ({n} instances, {interruptions_per_hour / n:.3g} each)" if n > 1 else "")
    write = f" and its {checkpoint_write_s:g} s write" if checkpoint_write_s else ""
    most = 3600.0 / lost  # the job's rate must stay under this
    ways = [f"lower --interruptions-per-hour below {most / n:.3g} per instance (or the type's rate in the prices file)"]
    room = 3600.0 / interruptions_per_hour  # seconds between interruptions
    interval = 2.0 * (room - restart_s) - checkpoint_write_s  # the checkpoint interval that loses exactly that
    if interval > 0:
        ways.append(f"checkpoint more often (--checkpoint-interval-s below {interval:.3g}, now {checkpoint_interval_s:g})")
    else:  # a restart (and half a write) alone takes the time between interruptions
        ways.append(f"restart faster (--restart-s below {max(room - checkpoint_write_s / 2.0, 0.0):.3g}, now "
                    f"{restart_s:g}) and checkpoint more often (--checkpoint-interval-s)")
    ways.append("use on-demand (--market on-demand)")
    return (f"never finishes on spot: at {job}, each losing {lost:.3g} s on average (half the "
            f"{checkpoint_interval_s:g} s checkpoint interval{write}, and the {restart_s:g} s restart), "
            f"{interruptions_per_hour * lost:,.0f} s of every hour are lost, more than the hour; to finish, "
            f"{', '.join(ways[:-1])}, or {ways[-1]}")


@dataclass
class RunCost:
    """What a run costs. `hours` is the (expected) wall time; `dollars` follows the billing rule."""

    label: str
    instances: str
    market: str
    region: str
    seconds: float
    hours: float
    billed_seconds: int
    gpus: int
    usd_per_hour: float
    dollars: float
    work_seconds: float
    expected_interruptions: float
    #: on spot, why the run never finishes at its interruption rate and what would let it (`spot_stall`);
    #: None when it finishes (then `seconds`, `dollars` are finite)
    never_finishes: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_cost(
    seconds: float,
    mix: Mix | str,
    catalog: Catalog,
    market: str = "on-demand",
    region: str | None = None,
    label: str = "",
    interruptions_per_hour: float = 0.0,
    checkpoint_interval_s: float = 600.0,
    restart_s: float = 180.0,
    checkpoint_write_s: float = 0.0,
    *,
    measured: bool = False,
) -> RunCost:
    """Dollars for keeping `mix` for `seconds` of work (per-second billing, 60 s minimum each): the one
    pricing function (a layout's `mix` from `instances_for`; `mix` may be text, a `Mix`, or one type as
    `Mix(((count, type),))`). `market` "on-demand" or "spot", `region` default the catalog's.

    On spot the wall time is the expected one (checkpoint writes, lost work and restarts included,
    see the module doc) at the mix's summed rate: each type's own rate from the catalog, else
    `interruptions_per_hour` (per instance); and that is what is billed. A `measured` wall time (a
    recorded run's) already holds the interruptions it suffered: none are added, whatever the rates.
    """
    if market not in MARKETS:
        raise CatalogError(f"unknown market {market!r}; use one of {', '.join(MARKETS)}")
    mix = Mix.parse(mix, catalog) if isinstance(mix, str) else mix
    per_hour = 0.0 if measured else mix.interruptions_per_hour(catalog, interruptions_per_hour)
    return cost_at_rate(seconds, str(mix), mix.gpus(catalog), mix.usd_per_hour(catalog, market, region), market,
                        region or catalog.region, label, per_hour, checkpoint_interval_s, restart_s, checkpoint_write_s)


def cost_at_rate(seconds: float, instances: str, gpus: int, usd_per_hour: float, market: str, region: str,
                 label: str = "", interruptions_per_hour: float = 0.0, checkpoint_interval_s: float = 600.0,
                 restart_s: float = 180.0, checkpoint_write_s: float = 0.0) -> RunCost:
    """`run_cost`'s arithmetic for a fleet whose price and spot interruption rate are already known
    (`usd_per_hour` and `interruptions_per_hour` of the whole fleet): per-second billing of the (expected)
    wall time with a 60 s minimum, the spot wall time of the module doc. Call `run_cost`; this is for a
    price resolved once per type (`costs.planner.Candidate` prices every row of it without the catalog)."""
    wall = seconds if market == "on-demand" else spot_expected_seconds(
        seconds, interruptions_per_hour, checkpoint_interval_s, restart_s, checkpoint_write_s)
    stall = spot_stall(interruptions_per_hour, checkpoint_interval_s, restart_s, checkpoint_write_s,
                       Mix.parse(instances).count() if instances else 1) \
        if market != "on-demand" and math.isinf(wall) else None
    if math.isinf(wall):
        billed, dollars = 0, math.inf
    else:
        billed = billed_seconds(wall)
        dollars = usd_per_hour * billed / 3600.0
    return RunCost(
        label=label, instances=instances, market=market, region=region,
        seconds=wall, hours=wall / 3600.0, billed_seconds=billed, gpus=gpus,
        usd_per_hour=usd_per_hour, dollars=dollars, work_seconds=float(seconds),
        # never finishing: interrupted without end (inf, null in JSON), not 0.0 as if never interrupted
        expected_interruptions=0.0 if market == "on-demand" or not interruptions_per_hour
        else interruptions_per_hour * wall / 3600.0,
        never_finishes=stall,
    )


def threshold_cost(time_to_threshold_s: float | None, mix: Mix | str, catalog: Catalog,
                   market: str = "on-demand", region: str | None = None, **spot: float) -> float | None:
    """Dollars until the loss threshold was (or will be) reached; None when it never was."""
    if time_to_threshold_s is None or (isinstance(time_to_threshold_s, float) and math.isnan(time_to_threshold_s)):
        return None
    return run_cost(time_to_threshold_s, mix, catalog, market, region, **spot).dollars
