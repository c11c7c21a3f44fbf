"""Price catalog and billing: built-in prices with sources, user rates, seed 004's dollars to the cent,
spot interruptions, and price refresh from AWS.

The refresh code is tested with botocore's Stubber fed with the responses in tests/data/: the
Pricing API is not served by moto (HTTP 500) and moto's describe_spot_price_history answers with an
empty list, so no local AWS stand-in can produce these answers. The files are written in the
documented response shapes (see their "note"); Stubber validates every request's parameters and
every response against botocore's own service model, so a wrong field name fails the test.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

import pytest

from scalelab.costs.billing import Mix, billed_seconds, run_cost, spot_expected_seconds
from scalelab.costs.catalog import (
    CatalogError,
    UnknownInstanceError,
    builtin_catalog,
    fetch_on_demand_prices,
    fetch_spot_prices,
    load_catalog,
    parse_interruptions,
    parse_price_list_item,
    parse_rate,
    refresh,
)
from tests.conftest import run_entry

DATA = Path(__file__).parent / "data"
SEED004_SCALING = Path(__file__).resolve().parents[1] / "scalelab" / "costs" / "data" / "seed004_sentiment_scaling.csv"

# Seed 004 (shared/seeds/004), "Table of Total Costs for 10 epochs":
# (experiment, #p2.xlarge, #g3.4xlarge, #g3.16xlarge, seconds, hours, total price)
SEED_004 = [
    ("Single g3.4xlarge", 0, 1, 0, 35920, 9.98, 11.38),
    ("Single p2.xlarge", 1, 0, 0, 63923, 17.76, 15.98),
    ("Single g3.16xlarge", 0, 0, 1, 13156, 3.65, 16.64),
    ("Two g3.4xlarge", 0, 2, 0, 24316, 6.75, 15.39),
    ("Two g3.16xlarge with 2 GPU only", 0, 0, 1, 15820, 4.39, 20.02),
    ("Four g3.4xlarge", 0, 4, 0, 13973, 3.88, 17.69),
    ("Two g3.16xlarge", 0, 0, 2, 9531, 2.65, 24.17),
    ("Three g3.4xlarge + one p2.xlarge", 1, 3, 0, 24256, 6.74, 29.12),
    ("Three g3.4xlarge + one p2.xlarge + dynamic", 1, 3, 0, 23007, 6.39, 27.6),
    ("One g3.4xlarge + one p2.xlarge", 1, 1, 0, 39382, 10.94, 22.32),
    ("One g3.4xlarge + one p2.xlarge + dynamic", 1, 1, 0, 37503, 10.42, 21.26),
]


def seed_mix(p2: int, g3: int, g316: int) -> str:
    terms = [f"{n}*{t}" for n, t in ((p2, "p2.xlarge"), (g3, "g3.4xlarge"), (g316, "g3.16xlarge")) if n]
    return "+".join(terms)


@pytest.fixture(autouse=True)
def _no_user_prices(tmp_path, monkeypatch):
    """Never read or write the real ~/.config/scalelab/prices.json."""
    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "prices.json"))


# ---- built-in catalog -------------------------------------------------------------------------


def test_builtin_catalog_matches_seed_004_price_table_and_keeps_sources():
    cat = builtin_catalog()
    # seed 004, "AWS Cost Table"
    for name, usd in (("p2.xlarge", 0.9), ("g3.4xlarge", 1.14), ("g3.16xlarge", 4.56)):
        p = cat.price(name)
        assert p.usd_per_hour == pytest.approx(usd)
        assert "seed 004" in p.source
    assert cat.instance("g3.16xlarge").gpus == 4
    assert all(cat.price(n).source for n in cat.names())


def test_unknown_instance_type_names_the_known_ones():
    with pytest.raises(UnknownInstanceError) as err:
        builtin_catalog().instance("g9.huge")
    msg = str(err.value)
    assert msg.startswith("unknown instance type 'g9.huge'; known: ")
    assert "g3.4xlarge" in msg and "p2.xlarge" in msg


def test_a_near_miss_instance_type_suggests_the_nearest_first():
    """`--instance-types g5.xlarg` listed all 26 types; the nearest now comes first, the list by pointer."""
    for typo, meant in (("g5.xlarg", "g5.xlarge"), ("G5.XLARGE", "g5.xlarge"), ("p3.2xl", "p3.2xlarge")):
        with pytest.raises(UnknownInstanceError) as err:
            builtin_catalog().instance(typo)
        assert str(err.value).startswith(f"unknown instance type {typo!r}; did you mean {meant!r}? "), err.value
        assert "`launch cost --list`" in str(err.value) and "g3.4xlarge" not in str(err.value)


@pytest.mark.parametrize("command", [["plan", "--from-csv", str(SEED004_SCALING), "--instance-types", "g5.xlarg"],
                                     ["memory", "--instance-types", "g5.xlarg"]])
def test_plan_and_memory_suggest_the_nearest_type(command, monkeypatch, capsys):
    code, err, _ = run_entry(command, monkeypatch, capsys)
    assert code == 2 and "did you mean 'g5.xlarge'?" in err and "Traceback" not in err, err


def test_cost_from_csv_suggests_the_nearest_type(tmp_path, monkeypatch, capsys):
    table = tmp_path / "c.csv"
    table.write_text("label,seconds,instances\na,10,2*g5.xlarg\n")
    code, err, _ = run_entry(["cost", "--from-csv", str(table)], monkeypatch, capsys)
    assert code == 2 and "c.csv:2: unknown instance type 'g5.xlarg'; did you mean 'g5.xlarge'?" in err, err


def test_missing_spot_price_says_how_to_get_one():
    with pytest.raises(CatalogError, match=r"no spot price for g3\.4xlarge in us-east-1.*--refresh spot"):
        builtin_catalog().price("g3.4xlarge", "spot")
    assert builtin_catalog().price("p2.xlarge", "spot").usd_per_hour == pytest.approx(0.1288)


def test_network_bandwidth_is_parsed():
    cat = builtin_catalog()
    assert cat.instance("g3.16xlarge").network_gbps == 25
    assert cat.instance("g3.4xlarge").network_gbps == 10  # "up to 10 Gbps"
    assert cat.instance("p2.xlarge").network_gbps is None  # "High"


# ---- on-premise rates -----------------------------------------------------------------------------


def test_rates_put_clusters_and_clouds_on_one_scale(tmp_path):
    cat = load_catalog(rates=["slurm=0.45/gpu-hour", "k8s=3.2/node-hour@4"])
    assert cat.instance("slurm").gpus == 1 and cat.instance("k8s").gpus == 4
    # 8 GPUs for 2 h: on Slurm 8 x 0.45 x 2; on 2 Kubernetes nodes 2 x 3.2 x 2
    assert run_cost(7200, "8*slurm", cat).dollars == pytest.approx(7.2)
    assert run_cost(7200, "2*k8s", cat).dollars == pytest.approx(12.8)
    # a rate has no spot market and no region: the same price everywhere
    assert run_cost(7200, "8*slurm", cat, "spot", "eu-west-1").dollars == pytest.approx(7.2)


@pytest.mark.parametrize("bad", ["slurm", "slurm=abc/gpu-hour", "k8s=3/node-hour", "x=1/day"])
def test_bad_rate_is_one_clear_error(bad):
    with pytest.raises(CatalogError, match="--rate"):
        parse_rate(bad)


def test_prices_file_overrides_builtin_and_adds_rates(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps({
        "on_demand": [{"instance_type": "g3.4xlarge", "region": "us-east-1", "usd_per_hour": 0.75, "source": "EDP discount"}],
        "spot": [{"instance_type": "g3.4xlarge", "region": "us-east-1", "usd_per_hour": 0.34}],
        "rates": [{"name": "onprem", "usd_per_node_hour": 2.0, "gpus": 8}],
    }))
    cat = load_catalog(f)
    assert cat.price("g3.4xlarge").usd_per_hour == 0.75 and cat.price("g3.4xlarge").source == "EDP discount"
    assert cat.price("g3.4xlarge", "spot").usd_per_hour == 0.34
    assert cat.instance("onprem").gpus == 8
    f.write_text(json.dumps({"spot": [{"instance_type": "g3.4xlarge"}]}))
    with pytest.raises(CatalogError, match=r"spot\[0\] has no 'region'"):
        load_catalog(f)


# ---- billing ----------------------------------------------------------------------------------------


def test_billing_is_per_second_with_a_60_second_minimum():
    assert billed_seconds(0) == 60
    assert billed_seconds(59.2) == 60
    assert billed_seconds(60.2) == 61
    cat = builtin_catalog()
    assert run_cost(30, "p2.xlarge", cat).dollars == pytest.approx(0.9 * 60 / 3600)
    # the minimum applies per instance: two instances for 10 s bill 2 x 60 s
    assert run_cost(10, "2*p2.xlarge", cat).dollars == pytest.approx(2 * 0.9 * 60 / 3600)
    assert run_cost(3601, "g3.4xlarge", cat).dollars == pytest.approx(1.14 * 3601 / 3600)


# ---- the one instance-mix grammar ---------------------------------------------------------------


@pytest.mark.parametrize("text,nodes,items", [
    ("3*g3.4xlarge+1*p2.xlarge", None, ((3, "g3.4xlarge"), (1, "p2.xlarge"))),
    ("g3.16xlarge", None, ((1, "g3.16xlarge"),)),  # a lone bare type, no node count: one instance
    ("g3.16xlarge", 3, ((3, "g3.16xlarge"),)),  # a lone bare type with a node count: every node
    (" 2 * p2.xlarge + g3.4xlarge ", None, ((2, "p2.xlarge"), (1, "g3.4xlarge"))),
    ("2*p2.xlarge+g3.4xlarge", 5, ((2, "p2.xlarge"), (1, "g3.4xlarge"))),  # bare inside a mix: one
    ("1*g3.4xlarge", 4, ((1, "g3.4xlarge"),)),  # an explicit count is taken as written
])
def test_mix_parse(text, nodes, items):
    assert Mix.parse(text, builtin_catalog(), nodes=nodes).items == items


@pytest.mark.parametrize("bad,term,why", [
    ("", "", "expected COUNT*TYPE"),
    ("3*", "3*", "expected COUNT*TYPE"),
    ("0*p2.xlarge", "0*p2.xlarge", "a count must be at least 1"),
    ("p2.xlarge++g3.4xlarge", "", "expected COUNT*TYPE"),
    ("*p2.xlarge", "*p2.xlarge", "expected COUNT*TYPE"),
    ("2x*g3.4xlarge", "2x*g3.4xlarge", "expected COUNT*TYPE"),
    ("1*p2.xlarge+3x g3.4xlarge", "3x g3.4xlarge", "expected COUNT*TYPE"),
])
def test_bad_mix_names_the_term_and_shows_an_example(bad, term, why):
    with pytest.raises(CatalogError) as err:
        Mix.parse(bad)
    msg = str(err.value)
    assert msg.startswith(f"cannot read instances {bad!r}: term {term!r}: {why}")
    assert msg.endswith("e.g. 1*p2.xlarge+3*g3.4xlarge")


@pytest.mark.parametrize("text,nodes,types", [
    ("g3.4xlarge", 3, ["g3.4xlarge"] * 3),
    ("1*p2.xlarge+3*g3.4xlarge", 4, ["p2.xlarge"] + ["g3.4xlarge"] * 3),
    ("g3.16xlarge+p3.8xlarge", 2, ["g3.16xlarge", "p3.8xlarge"]),
    ("1*p2.xlarge+1*g3.4xlarge", 2, ["p2.xlarge", "g3.4xlarge"]),
])
def test_mix_for_nodes_is_one_type_per_node(text, nodes, types):
    mix = Mix.for_nodes(text, nodes, builtin_catalog())
    assert mix.node_types() == types and mix.count() == nodes


def test_mix_for_nodes_must_count_the_nodes():
    with pytest.raises(CatalogError, match=r"'1\*p2\.xlarge\+3\*g3\.4xlarge' has 4 instances but there are 2 "
                                           r"nodes \(--nodes\); pass --nodes 4"):
        Mix.for_nodes("1*p2.xlarge+3*g3.4xlarge", 2)
    with pytest.raises(CatalogError, match="has 1 instances but there are 3 nodes"):
        Mix.for_nodes("1*g3.4xlarge", 3)


def test_mix_for_nodes_checks_types_against_one_provider():
    cat = load_catalog(rates=["slurm=0.45/gpu-hour"])
    with pytest.raises(UnknownInstanceError, match="unknown instance type 'g9.huge'; known: g3.16xlarge"):
        Mix.for_nodes("g9.huge", 1, cat, provider="aws")
    # a --rate name is an instance type for pricing, but not one the aws backend can launch
    assert Mix.for_nodes("slurm", 2, cat).node_types() == ["slurm", "slurm"]
    with pytest.raises(UnknownInstanceError) as err:
        Mix.for_nodes("slurm", 2, cat, provider="aws")
    assert "slurm" not in str(err.value).split("known: ")[1].split(" (")[0]


# ---- the one instance table -----------------------------------------------------------------------

# Every type the aws backend's own table (scalelab/aws/instances.py) and the price table had before they were
# merged into scalelab/costs/data/aws_gpu_instances.csv: none may be lost.
MERGED_TYPES = {"p2.xlarge", "p2.8xlarge", "p2.16xlarge", "g3s.xlarge", "g3.4xlarge", "g3.8xlarge", "g3.16xlarge",
                "p3.2xlarge", "p3.8xlarge", "p3.16xlarge", "g4dn.xlarge", "g4dn.12xlarge", "g5.xlarge",
                "g5.12xlarge", "p4d.24xlarge"}


# The families of issue 15 (p2 and g3 kept for the seeds).
FAMILIES = {"p2", "g3", "g3s", "p3", "p3dn", "p4d", "p4de", "p5", "g4dn", "g5", "g6", "g6e"}


def test_every_aws_type_has_a_shape_specs_and_a_dated_price():
    cat = builtin_catalog()
    aws = {n for n, i in cat.instances.items() if i.provider == "aws"}
    assert aws >= MERGED_TYPES
    assert {n.split(".")[0] for n in aws} == FAMILIES
    for name in aws:
        inst = cat.instance(name, "aws")
        assert inst.gpus >= 1 and inst.gpu_model and inst.gpu_mem_gib and inst.vcpus and inst.mem_gib and inst.network
        assert inst.interconnect in ("NVLink", "PCIe") and inst.efa in (True, False)
        assert inst.source and inst.source_date
        assert inst.network_gbps or name == "p2.xlarge"  # "High": AWS states no number
        gpu = cat.gpu(inst)
        assert gpu is not None and gpu.fp32_tflops > 0 and gpu.mem_bandwidth_gbs > 0 and gpu.source and gpu.date
        price = cat.price(name)
        assert price.usd_per_hour > 0 and price.source and price.observed


def test_gpu_table_has_no_arithmetic_a_gpu_lacks():
    cat = builtin_catalog()
    assert cat.gpu_models["K80"].fp16_tflops is None and cat.gpu_models["V100"].bf16_tflops is None
    assert cat.gpu_models["V100"].peak_tflops("fp16") == (125.0, None)
    peak, note = cat.gpu_models["V100"].peak_tflops("bf16")
    assert peak == 15.7 and "no bf16 arithmetic" in note
    # dense tensor-core rates, newer GPUs faster in every column
    a100, h100 = cat.gpu_models["A100"], cat.gpu_models["H100"]
    assert all(getattr(h100, k) > getattr(a100, k) for k in ("fp32_tflops", "tf32_tflops", "bf16_tflops", "mem_bandwidth_gbs"))
    assert cat.gpu_models["A100-80GB"].mem_bandwidth_gbs > a100.mem_bandwidth_gbs


def test_june_2025_price_cut_is_noted_and_prices_marked_unverified():
    cat = builtin_catalog()
    for name in ("p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge"):
        src = cat.price(name).source
        assert "June 2025" in src and "unverified: refresh with launch cost --refresh on-demand" in src
    assert cat.price("p4d.24xlarge").usd_per_hour < 32.7726  # below the price before the cut


def test_user_instance_needs_only_name_and_gpus_and_gets_gpu_specs_from_the_file(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps({
        "instances": [{"name": "g9.big", "gpus": 2, "gpu_model": "X1", "network": "up to 50 Gbps"},
                      {"name": "tiny", "gpus": 1}],
        "gpu_models": [{"name": "X1", "fp32_tflops": 10, "mem_bandwidth_gbs": 500, "bf16_tflops": 80}],
        "on_demand": [{"instance_type": "g9.big", "region": "us-east-1", "usd_per_hour": 2.0}],
        "rates": [{"name": "lab", "usd_per_gpu_hour": 0.3, "gpu_model": "V100"}],
    }))
    cat = load_catalog(f)
    big = cat.instance("g9.big")
    assert big.network_gbps == 50 and big.efa is None and big.interconnect is None
    assert cat.gpu(big).peak_tflops("bf16") == (80.0, None)
    assert cat.gpu(cat.instance("tiny")) is None
    assert cat.gpu(cat.instance("lab")).name == "V100"


def test_interruption_rates_per_type_sum_over_the_mix(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"interruptions": [{"instance_type": "p2.xlarge", "per_hour": 0.2}],
                             "spot": [{"instance_type": "g3.4xlarge", "region": "us-east-1", "usd_per_hour": 0.4}]}))
    cat = load_catalog(f, interruptions={"g3.4xlarge": 0.05})
    assert cat.interruption_rate("p2.xlarge") == 0.2 and cat.interruption_rate("g3.4xlarge", 9.0) == 0.05
    assert cat.interruption_rate("g5.xlarge", 0.01) == 0.01  # no rate of its own: the global one
    # 1 p2 at 0.2 + 3 g3 at 0.05 = 0.35 interruptions an hour for the job; 300 s lost each (c=600, r=0)
    c = run_cost(3600, "1*p2.xlarge+3*g3.4xlarge", cat, "spot", interruptions_per_hour=7.0,
                 checkpoint_interval_s=600, restart_s=0)
    assert c.seconds == pytest.approx(3600 / (1 - 0.35 * 300 / 3600))
    assert c.expected_interruptions == pytest.approx(0.35 * c.hours)
    with pytest.raises(UnknownInstanceError):
        load_catalog(interruptions={"g9.huge": 0.1})


@pytest.mark.parametrize("texts,want", [
    ([], (0.0, {})), (["0.05"], (0.05, {})), (["0.1", "g5.xlarge=0.3", "p2.xlarge=0"], (0.1, {"g5.xlarge": 0.3, "p2.xlarge": 0.0})),
])
def test_parse_interruptions(texts, want):
    assert parse_interruptions(texts) == want


@pytest.mark.parametrize("bad", ["-1", "abc", "g5.xlarge=", "=0.1", "x=nan", "inf"])
def test_bad_interruptions_is_one_clear_error(bad):
    with pytest.raises(CatalogError, match=r"--interruptions-per-hour takes RATE or TYPE=RATE"):
        parse_interruptions([bad])


def test_shapes_match_the_reference_figures():
    """A few rows checked by hand against the reference table (shared/reference/aws_gpu_instances.csv)."""
    cat = builtin_catalog()
    want = {"p2.xlarge": (1, "K80", 12, 4, 61), "g3s.xlarge": (1, "M60", 8, 4, 30.5),
            "g3.16xlarge": (4, "M60", 8, 64, 488), "p3.8xlarge": (4, "V100", 16, 32, 244),
            "p4d.24xlarge": (8, "A100", 40, 96, 1152)}
    for name, shape in want.items():
        i = cat.instance(name)
        assert (i.gpus, i.gpu_model, i.gpu_mem_gib, i.vcpus, i.mem_gib) == shape


@pytest.mark.parametrize("row", SEED_004, ids=[r[0] for r in SEED_004])
def test_seed_004_money_speed_table_to_the_cent(row):
    """Hours and dollars of seed 004 from its seconds and instance mix, with the catalog's prices.

    The seed rounds hours to two decimals and then multiplies by the hourly price, so its totals
    are reproduced exactly that way; our exact per-second dollars differ from them by at most the
    price of the 0.005 h the seed rounded away (plus half a cent of its own rounding).
    """
    name, p2, g3, g316, seconds, hours, dollars = row
    cat = builtin_catalog()
    cost = run_cost(seconds, seed_mix(p2, g3, g316), cat)
    assert round(cost.hours, 2) == pytest.approx(hours, abs=1e-9)
    assert round(round(cost.hours, 2) * cost.usd_per_hour + 1e-9, 2) == pytest.approx(dollars, abs=1e-9)
    assert abs(cost.dollars - dollars) <= 0.005 * cost.usd_per_hour + 0.005 + 1e-9


def test_spot_interruptions_add_lost_work_and_restarts():
    # 1 interruption/h, checkpoint every 20 min (10 min lost on average) + 5 min restart:
    # each wall hour loses 15 min, so 3 h of work take 4 h.
    assert spot_expected_seconds(3 * 3600, 1.0, 1200, 300) == pytest.approx(4 * 3600)
    assert spot_expected_seconds(3600, 0.0) == 3600
    assert math.isinf(spot_expected_seconds(3600, 4.0, 1200, 600))  # never finishes
    cat = builtin_catalog()
    c = run_cost(3 * 3600, "p2.xlarge", cat, "spot", interruptions_per_hour=1.0,
                 checkpoint_interval_s=1200, restart_s=300)
    assert c.hours == pytest.approx(4.0)
    assert c.dollars == pytest.approx(4 * 0.1288)
    assert c.expected_interruptions == pytest.approx(4.0)
    on_demand = run_cost(3 * 3600, "p2.xlarge", cat)
    assert on_demand.dollars == pytest.approx(3 * 0.9) and on_demand.hours == 3.0


# ---- refresh from AWS (recorded responses) ----------------------------------------------------------


def _stubbed(service: str, region: str):
    botocore = pytest.importorskip("botocore", reason="botocore (boto3) is needed to stub AWS clients")
    import botocore.session
    from botocore.stub import Stubber

    client = botocore.session.get_session().create_client(
        service, region_name=region, aws_access_key_id="x", aws_secret_access_key="x")
    return client, Stubber(client)


class _AnyTime:
    def __eq__(self, other):
        return isinstance(other, dt.datetime)


ANY_TIME = _AnyTime()


def _spot_client(start_time=None):
    client, stub = _stubbed("ec2", "us-west-2")
    calls = json.loads((DATA / "ec2_describe_spot_price_history.json").read_text())["calls"]
    for i, call in enumerate(calls):
        resp = call["response"]
        for item in resp["SpotPriceHistory"]:
            item["Timestamp"] = dt.datetime.fromisoformat(item["Timestamp"])
        expected = {"InstanceTypes": ["g3.4xlarge", "p2.xlarge"], "ProductDescriptions": ["Linux/UNIX"],
                    "StartTime": start_time or NOW}
        if i:
            expected["NextToken"] = calls[i - 1]["response"]["NextToken"]
        stub.add_response("describe_spot_price_history", resp, expected)
    return client, stub


def _pricing_client():
    from botocore.stub import ANY

    client, stub = _stubbed("pricing", "us-east-1")
    calls = json.loads((DATA / "pricing_get_products.json").read_text())["calls"]
    for i, call in enumerate(calls):
        expected = {"ServiceCode": "AmazonEC2", "Filters": ANY, "FormatVersion": "aws_v1"}
        if i and calls[i - 1]["expected_params_instance"] == call["expected_params_instance"]:
            expected["NextToken"] = calls[i - 1]["response"]["NextToken"]
        stub.add_response("get_products", call["response"], expected)
    return client, stub


NOW = dt.datetime(2025, 6, 1, 12, 30, tzinfo=dt.timezone.utc)


def test_spot_refresh_takes_latest_price_per_zone_then_cheapest_zone():
    client, stub = _spot_client()
    with stub:
        rows = fetch_spot_prices(client, ["g3.4xlarge", "p2.xlarge"], "us-west-2", now=NOW)
        stub.assert_no_pending_responses()
    by = {r["instance_type"]: r for r in rows}
    # zone a: latest is 0.45 (not the older 0.40); zone b: 0.342 -> cheapest zone b
    assert by["g3.4xlarge"]["usd_per_hour"] == pytest.approx(0.342)
    assert "us-west-2b" in by["g3.4xlarge"]["source"]
    assert by["p2.xlarge"]["usd_per_hour"] == pytest.approx(0.27)


def test_price_list_item_parser():
    doc = json.loads(json.loads((DATA / "pricing_get_products.json").read_text())["calls"][2]["response"]["PriceList"][0])
    p = parse_price_list_item(doc)
    assert p["instance_type"] == "g6.xlarge" and p["usd_per_hour"] == pytest.approx(0.8048)
    assert p["gpus"] == 1 and p["vcpus"] == 4 and p["mem_gib"] == 16 and p["region"] == "us-west-2"
    doc["terms"] = {"OnDemand": {}}
    assert parse_price_list_item(doc) is None


def test_on_demand_refresh_follows_pages_and_filters_linux_shared():
    client, stub = _pricing_client()
    with stub:
        rows = fetch_on_demand_prices(client, ["p3.2xlarge", "g6.xlarge"], "us-west-2")
        stub.assert_no_pending_responses()
    by = {r["instance_type"]: r for r in rows}
    assert by["p3.2xlarge"]["usd_per_hour"] == pytest.approx(3.06)  # the lower of the two pages
    assert by["g6.xlarge"]["gpus"] == 1


def test_refresh_updates_catalog_and_prices_file(tmp_path):
    ec2, s1 = _spot_client(start_time=ANY_TIME)
    pricing, s2 = _pricing_client()
    cat = builtin_catalog()
    path = tmp_path / "prices.json"
    with s1, s2:
        rows = refresh(cat, "spot", "us-west-2", ec2=ec2, types=["g3.4xlarge", "p2.xlarge"], path=path)
        rows += refresh(cat, "on-demand", "us-west-2", pricing=pricing, types=["p3.2xlarge", "g6.xlarge"], path=path)
    assert len(rows) == 4
    assert cat.price("g3.4xlarge", "spot", "us-west-2").usd_per_hour == pytest.approx(0.342)
    assert cat.price("g6.xlarge", "on-demand", "us-west-2").usd_per_hour == pytest.approx(0.8048)
    # a fresh catalog reads the refreshed prices (and the new type) back from the file
    again = load_catalog(path, region="us-west-2")
    assert again.price("p3.2xlarge").usd_per_hour == pytest.approx(3.06)
    assert again.price("g3.4xlarge", "spot").usd_per_hour == pytest.approx(0.342)  # first refresh kept
    assert again.instance("g6.xlarge").gpus == 1
    assert again.price("g3.4xlarge", region="us-east-1").usd_per_hour == 1.14  # built-in kept


def test_refresh_error_from_aws_is_one_line():
    client, stub = _stubbed("ec2", "us-west-2")
    stub.add_client_error("describe_spot_price_history", "UnauthorizedOperation", "You are not authorized")
    with stub, pytest.raises(CatalogError, match="price refresh from AWS failed.*not authorized"):
        refresh(builtin_catalog(), "spot", "us-west-2", ec2=client, types=["g3.4xlarge"])


# ---- the prices file's schema (issue #27 item 4) ------------------------------------------------


def test_prices_schema_names_every_field_of_the_shapes_it_builds():
    """A field added to InstanceType or GpuModel must be allowed in the file (refresh writes them all)."""
    from dataclasses import fields

    from scalelab.costs.catalog import GpuModel, InstanceType
    from scalelab.costs.prices_file import ROWS

    assert set(ROWS["instances"]) == {f.name for f in fields(InstanceType)}
    assert set(ROWS["gpu_models"]) == {f.name for f in fields(GpuModel)}


@pytest.mark.parametrize("data, words", [
    ({"on-demand": []}, ["unknown key 'on-demand'", "did you mean 'on_demand'"]),
    ({"on_demand": [{"instance_type": "p2.xlarge", "region": "us-east-1", "usd_per_hour": -0.9}]},
     ["on_demand[0].usd_per_hour", "-0.9"]),
    ({"spot": [{"instance_type": "p2.xlarge", "region": "us-east-1", "usd_per_hour": float("nan")}]},
     ["spot[0].usd_per_hour", "nan"]),
    ({"spot": [{"instance_type": "p2.xlarge", "region": "us-east-1", "usd_per_hour": 1e308}]}, ["<= 10,000"]),
    ({"instances": [{"name": "x9", "gpus": 0}]}, ["instances[0].gpus", "whole number >= 1"]),
    ({"instances": [{"name": "x9", "gpus": 1.5}]}, ["instances[0].gpus"]),
    ({"rates": [{"name": "r", "usd_per_gpu_hour": 1, "usd_per_node_hour": 2, "gpus": 2}]}, ["not both"]),
    ({"interruptions": [{"instance_type": "p2.xlarge", "per_hour": -1}]}, ["interruptions[0].per_hour"]),
    ({"on_demand": {"p2.xlarge": 1}}, ["on_demand must be a list"]),
])
def test_a_bad_prices_file_is_one_line_naming_the_entry(tmp_path, data, words):
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CatalogError) as exc:
        load_catalog(path)
    msg = str(exc.value)
    assert str(path) in msg and "docs/costs.md" in msg and "\n" not in msg
    for word in words:
        assert word in msg


def test_a_valid_prices_file_with_every_list_is_taken(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text(
        "on_demand: [{instance_type: g3.4xlarge, region: us-east-1, usd_per_hour: 0.75, source: ours}]\n"
        "rates: [{name: slurm, usd_per_gpu_hour: 0.45, gpu_model: V100}, {name: k8s, usd_per_node_hour: 3.2, gpus: 4}]\n"
        "instances: [{name: g4dn.2xlarge, gpus: 1, gpu_model: T4, efa: false, vcpus: 8, network_gbps: 25}]\n"
        "gpu_models: [{name: X1, fp32_tflops: 10, mem_bandwidth_gbs: 500}]\n"
        "interruptions: [{instance_type: g3.4xlarge, per_hour: 0.05}]\n")
    cat = load_catalog(path)
    assert cat.instance("k8s").gpus == 4 and "g4dn.2xlarge" in cat.instances
