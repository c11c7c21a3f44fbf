"""The instance catalog: shapes, on-demand and spot prices per region, and user-supplied rates.

Why one catalog: a cloud instance, a Slurm partition and a Kubernetes node pool only compare once
they are priced on one scale (US dollars per hour of the thing you rent), and what the aws backend
launches must be what `launch cost` prices. So one table (as SkyPilot's catalog) answers both what
an instance is and what it costs, and the aws backend reads its shapes here (aws imports costs,
never the reverse). The catalog holds:

- AWS GPU instance shapes (GPUs, GPU model and memory, vCPUs, memory, network) and us-east-1
  on-demand prices, built in (`scalelab/costs/data/aws_gpu_instances.csv`, packaged data copied from the
  project's reference table, so shapes work offline; every price keeps its source);
- spot prices per (type, region), refreshable from EC2 `describe_spot_price_history`;
- on-demand prices per (type, region), refreshable from the AWS Pricing API (`get_products`);
- user rates for on-premise clusters: per GPU-hour (the "instance" is one GPU) or per node-hour
  (the "instance" is one node with G GPUs), so `8*slurm-v100` prices eight GPUs of a cluster.

User prices live in one JSON file (`$SCALELAB_PRICES`, else ~/.config/scalelab/prices.json) that
refreshes write to and that overrides the built-in table; its `instances` add or replace shapes,
which the aws backend then launches as well. Instance mixes (`1*p2.xlarge+3*g3.4xlarge`) are read
by `costs.billing.Mix`, the one grammar. Billing rule (see scalelab/costs/billing.py):
per second with a 60-second minimum per instance.

The AWS clients are injected (tests pass botocore-stubbed clients fed with recorded responses);
boto3 is imported only by `default_clients`, when a refresh actually talks to AWS.
"""

from __future__ import annotations

import csv
import datetime as _dt
import difflib
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

from scalelab.core.errors import ScalelabError, SpecError
from scalelab.core.writes import check_input_file
from scalelab.costs.prices_file import FIX, MAX_USD_PER_HOUR, ROWS, prices_problem, read_flags

__all__ = [
    "MARKETS",
    "DEFAULT_REGION",
    "CatalogError",
    "UnknownInstanceError",
    "InstanceType",
    "GpuModel",
    "Price",
    "Catalog",
    "builtin_catalog",
    "load_catalog",
    "user_prices_path",
    "parse_rate",
    "parse_interruptions",
    "fetch_spot_prices",
    "fetch_on_demand_prices",
    "parse_price_list_item",
    "refresh",
]

MARKETS: tuple[str, ...] = ("on-demand", "spot")
DEFAULT_REGION = "us-east-1"
DATA_DIR = Path(__file__).resolve().parent / "data"


class CatalogError(SpecError):
    """A price or instance type the catalog cannot supply (the message says how to supply it)."""


class UnknownInstanceError(CatalogError):
    """An instance type (or rate name) that is neither built in nor user-defined."""


def unknown_type_message(name: str, known: list[str], hint: str) -> str:
    """An unknown type's error: the nearest known name first where one is close (a typo, another case), with a
    pointer to the list; else every known name. Why: `--instance-types g5.xlarg` listed all 26 types and left
    the reader to spot g5.xlarge among them (the prices file's keys are checked the same way)."""
    lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(lower), n=1)
    if close:
        return (f"unknown instance type {name!r}; did you mean {lower[close[0]]!r}? (`launch cost --list` lists "
                f"them; {hint})")
    return f"unknown instance type {name!r}; known: {', '.join(known)} ({hint})"


@dataclass(frozen=True)
class InstanceType:
    """What one rented unit is: an AWS instance, or a GPU / node of an on-premise cluster.

    Everything but `name` and `gpus` is optional, so a user-defined shape (prices file) needs no
    more than what it knows. `network` is the provider's wording ("up to 10 Gbps", "High");
    `network_gbps` the number (read from `network` when not given; None when the wording has none);
    `interconnect` how the GPUs of one instance talk (NVLink or PCIe); `efa` whether the instance
    has an Elastic Fabric Adapter; `source` and `source_date` where and when the shape was read.
    """

    name: str
    gpus: int
    gpu_model: str | None = None
    gpu_mem_gib: float | None = None
    vcpus: int | None = None
    mem_gib: float | None = None
    network: str | None = None
    source: str = ""
    provider: str = "aws"  # "aws" or "rate" (user-supplied on-premise rate)
    network_gbps: float | None = None
    efa: bool | None = None
    interconnect: str | None = None
    source_date: str | None = None
    per_gpu: bool = False  # a rate per GPU-hour: no shape, any layout of its GPUs (`Catalog.add_rate`)

    def holds(self, workers: int, nodes: int) -> bool:
        """Whether `nodes` of this type can run `workers` workers, one per GPU, as a layout spread evenly; a
        rate per GPU-hour has no shape and holds any layout."""
        return self.per_gpu or math.ceil(workers / nodes) <= self.gpus

    def __post_init__(self) -> None:
        if self.network_gbps is None:
            m = re.search(r"([\d.]+)\s*(?:gbps|gigabit)", (self.network or "").lower())
            object.__setattr__(self, "network_gbps", float(m.group(1)) if m else None)


@dataclass(frozen=True)
class GpuModel:
    """Peak arithmetic and memory bandwidth of one GPU, the specs a speed estimate scales by.

    TFLOP/s are dense (no sparsity); tf32, fp16 and bf16 are tensor-core rates where the GPU has
    tensor cores; None where the GPU has no such arithmetic (K80, M60: no fast fp16; V100, T4: no
    bf16 or tf32)."""

    name: str
    mem_bandwidth_gbs: float
    fp32_tflops: float
    tf32_tflops: float | None = None
    fp16_tflops: float | None = None
    bf16_tflops: float | None = None
    mem_gib: float | None = None
    source: str = ""
    date: str | None = None

    def peak_tflops(self, precision: str) -> tuple[float, str | None]:
        """(peak TFLOP/s for a run at `precision`, a note when it falls back to fp32): a GPU
        without fp16/bf16 arithmetic runs such a run no faster than fp32 (emulated or refused)."""
        value = getattr(self, f"{precision}_tflops", None)
        if value is not None:
            return float(value), None
        return float(self.fp32_tflops), f"{self.name} has no {precision} arithmetic: its fp32 rate is used"


@dataclass(frozen=True)
class Price:
    """US dollars per hour of one instance, with where the number came from."""

    usd_per_hour: float
    source: str
    observed: str | None = None


def user_prices_path() -> Path:
    """Where refreshed prices and user rates are kept: $SCALELAB_PRICES or ~/.config/scalelab/prices.json."""
    env = os.environ.get("SCALELAB_PRICES")
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "scalelab" / "prices.json"


@dataclass
class Catalog:
    """Instance shapes and prices. Look-ups raise CatalogError with the fix in the message."""

    instances: dict[str, InstanceType] = field(default_factory=dict)
    on_demand: dict[tuple[str, str], Price] = field(default_factory=dict)
    spot: dict[tuple[str, str], Price] = field(default_factory=dict)
    region: str = DEFAULT_REGION
    gpu_models: dict[str, GpuModel] = field(default_factory=dict)
    interruptions: dict[str, float] = field(default_factory=dict)

    # ---- look-ups ----------------------------------------------------------------------------

    def names(self) -> list[str]:
        return sorted(self.instances)

    def instance(self, name: str, provider: str | None = None) -> InstanceType:
        """The shape of `name`; with `provider` ("aws") only that provider's types are accepted, so
        the aws backend refuses an on-premise rate name."""
        inst = self.instances.get(name)
        if inst is not None and provider in (None, inst.provider):
            return inst
        if provider is None:
            known, hint = self.names(), "add on-premise rates with --rate NAME=USD/gpu-hour"
        else:
            known = [n for n in self.names() if self.instances[n].provider == provider]
            hint = f"add others to the 'instances' of {user_prices_path()}, see docs/costs.md"
        raise UnknownInstanceError(unknown_type_message(name, known, hint))

    def price(self, name: str, market: str = "on-demand", region: str | None = None) -> Price:
        """Hourly price of one `name` instance in `market` and `region` (default: the catalog's)."""
        inst = self.instance(name)
        region = region or self.region
        if market not in MARKETS:
            raise CatalogError(f"unknown market {market!r}; use one of {', '.join(MARKETS)}")
        if inst.provider == "rate":  # an on-premise rate: no markets, no regions
            return self.on_demand[(name, "*")]
        table = self.on_demand if market == "on-demand" else self.spot
        if (name, region) in table:
            return table[(name, region)]
        have = sorted(r for (n, r) in table if n == name)
        where = f" (known for: {', '.join(have)})" if have else ""
        flag = "on-demand" if market == "on-demand" else "spot"
        raise CatalogError(
            f"no {market} price for {name} in {region}{where}; run `launch cost --refresh {flag} "
            f"--region {region}` (needs AWS credentials) or add it to {user_prices_path()}"
        )

    def gpu(self, inst: InstanceType) -> GpuModel | None:
        """The specs of `inst`'s GPU model, or None when it has none or the table lacks it."""
        return self.gpu_models.get(inst.gpu_model) if inst.gpu_model else None

    def interruption_rate(self, name: str, default: float = 0.0) -> float:
        """Spot interruptions per hour of one `name` instance: its own rate (prices file or
        --interruptions-per-hour TYPE=RATE), else `default` (the global --interruptions-per-hour)."""
        return self.interruptions.get(name, default)

    # ---- changes -----------------------------------------------------------------------------

    def add_rate(self, name: str, usd_per_hour: float, per: str = "gpu-hour", gpus: int = 1,
                 source: str = "user rate", gpu_model: str | None = None) -> InstanceType:
        """Define an on-premise unit: per "gpu-hour" (one GPU) or per "node-hour" (a node of `gpus`);
        with its `gpu_model` the planner can estimate its speed from the GPU table."""
        if per not in ("gpu-hour", "node-hour"):
            raise CatalogError(f"rate for {name!r}: per must be gpu-hour or node-hour, got {per!r}")
        if not (0 <= usd_per_hour < math.inf) or gpus < 1:
            raise CatalogError(f"rate for {name!r}: price must be >= 0 and gpus >= 1")
        known = self.instances.get(name)
        if known is not None and known.provider != "rate":  # it replaced the type's shape and price, unsaid
            raise CatalogError(f"rate for {name!r}: that is an instance type the catalog knows ({known.gpus} GPU{'' if known.gpus == 1 else 's'}, "
                               f"{known.provider}); name your on-premise rate otherwise (e.g. {name}-onprem), or "
                               "change the type's own price in a prices file's on_demand rows")
        inst = InstanceType(name=name, gpus=1 if per == "gpu-hour" else int(gpus), gpu_model=gpu_model,
                            source=source, provider="rate", per_gpu=per == "gpu-hour")
        self.instances[name] = inst
        self.on_demand[(name, "*")] = Price(float(usd_per_hour), f"{source} ({per})")
        return inst

    def set_price(self, name: str, region: str, market: str, price: Price) -> None:
        (self.on_demand if market == "on-demand" else self.spot)[(name, region)] = price

    def set_interruptions(self, name: str, per_hour: float) -> None:
        """Spot interruptions per hour of one `name` instance (a known type or rate)."""
        self.instance(name)
        if not (per_hour >= 0 and per_hour != float("inf")):
            raise CatalogError(f"interruptions per hour of {name} must be a number >= 0, got {per_hour}")
        self.interruptions[name] = float(per_hour)

    def apply_user_file(self, data: dict[str, Any], where: str = "prices file") -> None:
        """Merge a prices file ({"instances", "gpu_models", "on_demand", "spot", "rates",
        "interruptions"}: lists of rows, docs/costs.md), checked whole against its schema first
        (costs/prices_file.py): a bad price must not reach a plan, nor a misspelt key void the file."""
        data = read_flags(data)  # `efa: yes`: text in YAML 1.2, the boolean it meant here
        problem = prices_problem(data)
        if problem:
            raise CatalogError(f"prices file {where}: {problem}; {FIX}")
        try:
            for row in data.get("instances", []):
                inst = InstanceType(**row)
                self.instances[inst.name] = inst
            for row in data.get("gpu_models", []):
                self.gpu_models[row["name"]] = GpuModel(**row)
            for market, key in (("on-demand", "on_demand"), ("spot", "spot")):
                for row in data.get(key, []):
                    self.set_price(row["instance_type"], row["region"], market,
                                   Price(float(row["usd_per_hour"]), row.get("source", where), row.get("observed")))
            for row in data.get("rates", []):
                per = "gpu-hour" if "usd_per_gpu_hour" in row else "node-hour"
                self.add_rate(row["name"], float(row[f"usd_per_{per.replace('-', '_')}"]), per, int(row.get("gpus", 1)),
                              source=row.get("source", where), gpu_model=row.get("gpu_model"))
            for row in data.get("interruptions", []):
                self.set_interruptions(row["instance_type"], float(row["per_hour"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CatalogError(f"{where}: malformed entry ({exc}); see docs/costs.md for the format") from None


def parse_rate(text: str) -> tuple[str, float, str, int]:
    """`NAME=USD/gpu-hour`, `NAME=USD` (per GPU-hour) or `NAME=USD/node-hour@GPUS` -> (name, usd, per,
    gpus), for --rate. The price is a finite number >= 0; anything else is one CatalogError naming it."""
    m = re.fullmatch(r"\s*([\w.\-]+)\s*=\s*\$?([^/\s]+)\s*(?:/\s*(gpu-hour|node-hour)(?:@(\d+))?)?\s*", str(text))
    usd = _rate_usd(m.group(2)) if m else None
    if not m or usd is None:
        raise CatalogError(
            f"--rate takes [NAME=]USD/gpu-hour or [NAME=]USD/node-hour@GPUS with USD a number from 0 to "
            f"{MAX_USD_PER_HOUR:,.0f} (above that a price is a typo; e.g. "
            f"0.45/gpu-hour, slurm=0.45/gpu-hour, k8s=3.2/node-hour@4), got {text!r}"
        )
    name, _, per, gpus = m.groups()
    per = per or "gpu-hour"
    if per == "node-hour" and gpus is None:
        raise CatalogError(f"--rate {text!r}: a node-hour rate needs the GPUs per node, e.g. {name}={usd:g}/node-hour@4")
    if int(gpus or 1) < 1:
        raise CatalogError(f"--rate {text!r}: a node has at least 1 GPU")
    return name, usd, per, int(gpus or 1)


def _rate_usd(text: str) -> float | None:
    """A price of --rate: a finite number >= 0 and at most the prices file's ceiling, else None."""
    try:
        usd = float(text)
    except ValueError:
        return None
    return usd if math.isfinite(usd) and 0 <= usd <= MAX_USD_PER_HOUR else None


def parse_interruptions(texts: Iterable[str]) -> tuple[float, dict[str, float]]:
    """--interruptions-per-hour values -> (the global rate, {type: its own rate}): `RATE` sets the
    rate of every type without its own (the last one given wins), `TYPE=RATE` one type's."""
    default, per_type = 0.0, {}
    for text in texts:
        name, sep, value = str(text).rpartition("=")
        try:
            rate = float(value)
            if not (0 <= rate < float("inf")) or (sep and not name.strip()):
                raise ValueError
        except ValueError:
            raise CatalogError(f"--interruptions-per-hour takes RATE or TYPE=RATE with RATE a number >= 0 (spot "
                               f"interruptions per instance-hour, e.g. 0.05 or g5.xlarge=0.1), got {text!r}") from None
        if sep:
            per_type[name.strip()] = rate
        else:
            default = rate
    return default, per_type


# ---- loading -----------------------------------------------------------------------------------


def _num(x: str, kind: type = float) -> Any:
    x = (x or "").strip()
    return kind(float(x)) if x else None


def _yes_no(x: str) -> bool | None:
    x = (x or "").strip().lower()
    return {"yes": True, "no": False}.get(x)


def builtin_catalog() -> Catalog:
    """The shapes, GPU specs and prices shipped in scalelab/costs/data/ (us-east-1 on-demand; a few spot
    examples); every figure keeps its source and date (scalelab/costs/data/README.md)."""
    cat = Catalog()
    with open(DATA_DIR / "aws_gpu_instances.csv", newline="") as f:
        for row in csv.DictReader(f):
            name = row["instance_type"].strip()
            cat.instances[name] = InstanceType(
                name=name, gpus=int(row["gpus"]), gpu_model=row["gpu_model"] or None,
                gpu_mem_gib=_num(row["gpu_mem_gib"]), vcpus=_num(row["vcpus"], int),
                mem_gib=_num(row["mem_gib"]), network=row["network"] or None, source=row["shape_source"],
                network_gbps=_num(row["network_gbps"]), efa=_yes_no(row["efa"]),
                interconnect=row["interconnect"] or None, source_date=row["shape_date"] or None,
            )
            src = f"{row['price_note']} [{row['price_source']}, {row['price_date']}]"
            cat.on_demand[(name, DEFAULT_REGION)] = Price(float(row["on_demand_usd_per_hour_us_east_1"]), src,
                                                          row["price_date"] or None)
    with open(DATA_DIR / "gpu_models.csv", newline="") as f:
        for row in csv.DictReader(f):
            cat.gpu_models[row["gpu_model"]] = GpuModel(
                name=row["gpu_model"], mem_bandwidth_gbs=float(row["mem_bandwidth_gbs"]),
                fp32_tflops=float(row["fp32_tflops"]), tf32_tflops=_num(row["tf32_tflops"]),
                fp16_tflops=_num(row["fp16_tflops"]), bf16_tflops=_num(row["bf16_tflops"]),
                mem_gib=_num(row["mem_gib"]), source=row["source"], date=row["date"] or None)
    with open(DATA_DIR / "spot_prices.csv", newline="") as f:
        for row in csv.DictReader(f):
            cat.spot[(row["instance_type"], row["region"])] = Price(
                float(row["spot_usd_per_hour"]), row["source"], row["observed"] or None)
    return cat


def load_catalog(prices_file: str | Path | None = None, rates: Iterable[str] = (),
                 region: str = DEFAULT_REGION, interruptions: dict[str, float] | None = None) -> Catalog:
    """Built-in table, then the user's prices file (if it exists), then --rate strings, then the
    per-type spot interruption rates of --interruptions-per-hour TYPE=RATE."""
    cat = builtin_catalog()
    cat.region = region
    path = Path(prices_file) if prices_file else user_prices_path()
    if prices_file or path.exists():  # a directory or FIFO is said as such; a FIFO is never opened
        try:
            check_input_file(path, "prices file")
        except ScalelabError as exc:
            raise CatalogError(str(exc)) from None
    if path.exists():
        try:
            data = _read_structured(path, empty=None)
        except NotAMapping as exc:  # `null` or a list is valid JSON, but not prices: said as such
            raise CatalogError(f"prices file {path} holds no mapping of prices: {exc}; {FIX}") from None
        except ValueError as exc:
            raise CatalogError(f"prices file {path} is not valid JSON/YAML: {exc}; {FIX}") from None
        if data is None:  # as an empty spec or config file is refused: a file meant to say something says nothing
            raise CatalogError(f"prices file {path} is empty: give it prices ({', '.join(ROWS)}; format: "
                               "docs/costs.md), or remove it")
        cat.apply_user_file(data, str(path))
    for text in rates:
        name, usd, per, gpus = parse_rate(text)
        cat.add_rate(name, usd, per, gpus, source="--rate")
    for name, rate in (interruptions or {}).items():
        cat.set_interruptions(name, rate)
    return cat


class NotAMapping(ValueError):
    """A prices file that parses but holds no mapping at its top (a list, a number): not a syntax error."""


def _read_structured(path: Path, empty: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The mapping a JSON (or .yaml/.yml) file holds; `empty` for a file with nothing in it ({} to start anew)."""
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        from scalelab.core.yamltext import load_yaml

        from scalelab.core.yamltext import BeyondLimitsError, yaml_problem

        try:
            data = load_yaml(text)
            if data is None:  # nothing, or only comments
                return empty
        except BeyondLimitsError as exc:
            raise ValueError(str(exc)) from None
        except yaml.YAMLError as exc:
            raise ValueError(yaml_problem(exc)) from None
    else:
        if not text.strip():
            return empty
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:  # one line: where and what (a trailing comma said as such)
            before = text[:exc.pos].rstrip()
            comma = before.endswith(",") and text[exc.pos:exc.pos + 1] in ("}", "]")
            raise ValueError(f"a trailing comma before the closing {text[exc.pos]} at line {exc.lineno}; remove it"
                             if comma else f"{exc.msg} at line {exc.lineno}, column {exc.colno}") from None
        except RecursionError:  # a RecursionError traceback (issue #37)
            raise ValueError("lists or mappings nested deeper than can be read; flatten it") from None
    if not isinstance(data, dict):
        raise NotAMapping("expected a mapping at the top level")
    return data


# ---- refresh from AWS --------------------------------------------------------------------------


def fetch_spot_prices(ec2: Any, instance_types: Iterable[str], region: str,
                      now: _dt.datetime | None = None) -> list[dict[str, Any]]:
    """Current Linux spot price per type in `region`: the latest price of each availability zone,
    then the lowest zone (you can pick the zone). `ec2` is a boto3 EC2 client for `region`.

    Uses `describe_spot_price_history` with StartTime=now, which AWS answers with the price in
    effect now per zone; pages are followed through NextToken.
    """
    now = now or _dt.datetime.now(_dt.timezone.utc)
    types = list(instance_types)
    latest: dict[tuple[str, str], tuple[Any, float]] = {}
    kwargs: dict[str, Any] = dict(InstanceTypes=types, ProductDescriptions=["Linux/UNIX"], StartTime=now)
    while True:
        page = ec2.describe_spot_price_history(**kwargs)
        for item in page.get("SpotPriceHistory", []):
            key = (item["InstanceType"], item.get("AvailabilityZone", "?"))
            ts = item.get("Timestamp")
            if key not in latest or (ts is not None and ts > latest[key][0]):
                latest[key] = (ts, float(item["SpotPrice"]))
        token = page.get("NextToken")
        if not token:
            break
        kwargs["NextToken"] = token
    out = []
    for t in types:
        zones = {az: p for (it, az), (_, p) in latest.items() if it == t}
        if not zones:
            continue
        az = min(zones, key=zones.get)
        out.append({"instance_type": t, "region": region, "usd_per_hour": zones[az],
                    "source": f"describe_spot_price_history, lowest zone {az} of {len(zones)}",
                    "observed": now.date().isoformat()})
    return out


def parse_price_list_item(item: str | dict[str, Any]) -> dict[str, Any] | None:
    """One `get_products` PriceList entry (a JSON string) -> {instance_type, region, usd_per_hour,
    gpus, vcpus, mem_gib, network}, or None when it holds no hourly on-demand USD price."""
    doc = json.loads(item) if isinstance(item, str) else item
    attrs = doc.get("product", {}).get("attributes", {})
    prices = []
    for term in doc.get("terms", {}).get("OnDemand", {}).values():
        for dim in term.get("priceDimensions", {}).values():
            usd = dim.get("pricePerUnit", {}).get("USD")
            if usd is not None and dim.get("unit", "Hrs").lower().startswith("hr"):
                prices.append(float(usd))
    positive = [p for p in prices if p > 0]
    if not positive or "instanceType" not in attrs:
        return None

    def gib(s: str | None) -> float | None:
        m = re.match(r"\s*([\d.,]+)", s or "")
        return float(m.group(1).replace(",", "")) if m else None

    return {
        "instance_type": attrs["instanceType"], "region": attrs.get("regionCode"),
        "usd_per_hour": min(positive), "gpus": int(gib(attrs.get("gpu")) or 0),
        "vcpus": int(gib(attrs.get("vcpu")) or 0) or None, "mem_gib": gib(attrs.get("memory")),
        "gpu_mem_gib": gib(attrs.get("gpuMemory")), "network": attrs.get("networkPerformance"),
    }


def fetch_on_demand_prices(pricing: Any, instance_types: Iterable[str], region: str,
                           today: _dt.date | None = None) -> list[dict[str, Any]]:
    """Linux, shared-tenancy, no-preinstalled-software on-demand price per type from the Pricing
    API. `pricing` is a boto3 "pricing" client (the API answers in us-east-1 for every region)."""
    today = today or _dt.date.today()
    out = []
    for t in instance_types:
        filters = [
            {"Type": "TERM_MATCH", "Field": k, "Value": v}
            for k, v in (("instanceType", t), ("regionCode", region), ("operatingSystem", "Linux"),
                         ("tenancy", "Shared"), ("preInstalledSw", "NA"), ("capacitystatus", "Used"))
        ]
        kwargs: dict[str, Any] = dict(ServiceCode="AmazonEC2", Filters=filters, FormatVersion="aws_v1")
        found: list[dict[str, Any]] = []
        while True:
            page = pricing.get_products(**kwargs)
            found += [p for p in map(parse_price_list_item, page.get("PriceList", [])) if p]
            token = page.get("NextToken")
            if not token:
                break
            kwargs["NextToken"] = token
        found = [p for p in found if p["instance_type"] == t]
        if found:
            best = min(found, key=lambda p: p["usd_per_hour"])
            out.append({**best, "region": region, "source": "AWS Pricing API get_products",
                        "observed": today.isoformat()})
    return out


def default_clients(region: str) -> tuple[Any, Any]:
    """(ec2 client for `region`, pricing client) from boto3's default credential chain."""
    try:
        import boto3
    except ImportError:
        raise CatalogError("refreshing prices needs boto3: pip install boto3") from None
    return boto3.client("ec2", region_name=region), boto3.client("pricing", region_name="us-east-1")


def refresh(catalog: Catalog, what: str, region: str, ec2: Any = None, pricing: Any = None,
            types: Iterable[str] | None = None, path: Path | None = None) -> list[dict[str, Any]]:
    """Fetch `what` ("spot", "on-demand" or "all") prices for `types` (default: every AWS type in
    the catalog), merge them into `catalog` and into the user's prices file. Returns the new rows.

    Errors from AWS (no credentials, access denied) become one CatalogError line.
    """
    if what not in ("spot", "on-demand", "all"):
        raise CatalogError(f"--refresh takes spot, on-demand or all, got {what!r}")
    types = list(types or [n for n, i in catalog.instances.items() if i.provider == "aws"])
    rows: dict[str, list[dict[str, Any]]] = {"spot": [], "on_demand": []}
    try:
        if (ec2 is None and what != "on-demand") or (pricing is None and what != "spot"):
            d_ec2, d_pricing = default_clients(region)
            ec2 = ec2 or d_ec2
            pricing = pricing or d_pricing
        if what in ("spot", "all"):
            rows["spot"] = fetch_spot_prices(ec2, types, region)
        if what in ("on-demand", "all"):
            rows["on_demand"] = fetch_on_demand_prices(pricing, types, region)
    except CatalogError:
        raise
    except Exception as exc:  # botocore ClientError / NoCredentialsError / EndpointConnectionError
        if type(exc).__module__.split(".")[0] not in ("botocore", "boto3"):
            raise
        raise CatalogError(f"price refresh from AWS failed: {exc}") from None
    for r in rows["spot"]:
        catalog.set_price(r["instance_type"], region, "spot", Price(r["usd_per_hour"], r["source"], r["observed"]))
    new_instances = []
    for r in rows["on_demand"]:
        catalog.set_price(r["instance_type"], region, "on-demand", Price(r["usd_per_hour"], r["source"], r["observed"]))
        if r["instance_type"] not in catalog.instances and r["gpus"]:
            inst = InstanceType(name=r["instance_type"], gpus=r["gpus"], gpu_mem_gib=r["gpu_mem_gib"],
                                vcpus=r["vcpus"], mem_gib=r["mem_gib"], network=r["network"], source=r["source"])
            catalog.instances[inst.name] = inst
            new_instances.append(asdict(inst))
    _save_user_prices(path or user_prices_path(), rows, new_instances)
    return rows["spot"] + rows["on_demand"]


def _save_user_prices(path: Path, rows: dict[str, list[dict[str, Any]]], instances: list[dict[str, Any]]) -> None:
    data = _read_structured(path, empty={}) if path.exists() else {}
    for key in ("spot", "on_demand"):
        fresh = {(r["instance_type"], r["region"]) for r in rows[key]}
        kept = [r for r in data.get(key, []) if (r.get("instance_type"), r.get("region")) not in fresh]
        data[key] = kept + [{k: r[k] for k in ("instance_type", "region", "usd_per_hour", "source", "observed")}
                            for r in rows[key]]
    names = {i["name"] for i in instances}
    data["instances"] = [i for i in data.get("instances", []) if i.get("name") not in names] + instances
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def copy_with_region(catalog: Catalog, region: str) -> Catalog:
    """The same catalog looking up prices in another region by default."""
    return replace(catalog, region=region)
