"""costs.expected: the fleet's price per hour and the expected dollars, each with its basis."""

import pytest

from core.spec import Spec
from costs.catalog import builtin_catalog
from costs.expected import (
    ASSUMED_GPU_HOUR_USD,
    ASSUMED_STEP_S,
    expected_cost,
    fleet_price,
)


def test_aws_fleet_is_priced_from_the_instance_mix():
    cat = builtin_catalog()
    spec = Spec(backend="aws", nodes=2, gpus_per_node=1, steps=3600,
                backend_options={"instance_type": "g3.4xlarge"})
    rate, basis = fleet_price(spec, cat)
    assert rate == pytest.approx(2 * cat.price("g3.4xlarge").usd_per_hour)
    assert "2*g3.4xlarge on-demand" in basis
    est = expected_cost(spec, step_s=2.0, catalog=cat)
    assert est.hours == pytest.approx(2.0) and est.dollars == pytest.approx(2 * rate)
    assert "measured" in est.line() and f"${rate:,.2f}/hour" in est.line()


def test_on_premise_without_a_rate_says_it_assumed_one():
    spec = Spec(backend="slurm", nodes=1, gpus_per_node=4, steps=7200)
    est = expected_cost(spec, catalog=builtin_catalog())
    assert est.usd_per_hour == pytest.approx(4 * ASSUMED_GPU_HOUR_USD)
    assert est.step_s == ASSUMED_STEP_S and "assumed" in est.step_basis and "assumed" in est.rate_basis
    assert est.dollars == pytest.approx(4 * ASSUMED_GPU_HOUR_USD * 7200 * ASSUMED_STEP_S / 3600)


def test_an_aws_spec_without_a_type_is_priced_on_the_backends_default():
    """The default type is one fact (core.spec): what the aws backend launches is what is priced."""
    from aws.options import AwsOptions

    cat = builtin_catalog()
    default = Spec(backend="aws", nodes=2, gpus_per_node=1, steps=3600)
    named = Spec(backend="aws", nodes=2, gpus_per_node=1, steps=3600,
                 backend_options={"instance_type": AwsOptions().instance_type})
    assert fleet_price(default, cat) == fleet_price(named, cat)
    assert f"2*{AwsOptions().instance_type} on-demand" in fleet_price(default, cat)[1]
