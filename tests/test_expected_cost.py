"""scalelab.costs.expected: the fleet's price per hour and the expected dollars, each with its basis."""

import pytest

from scalelab.core.spec import Spec
from scalelab.costs.catalog import builtin_catalog
from scalelab.costs.expected import (
    ASSUMED_GPU_HOUR_USD,
    ASSUMED_STEP_S,
    expected_cost,
    fleet_price,
    is_priced,
)
from scalelab.costs.fleet import Fleet
from scalelab.launcher.backend import assumed_startup_s, fleet_of


def test_aws_fleet_is_priced_from_the_instance_mix():
    cat = builtin_catalog()
    spec = Spec(backend="aws", nodes=2, gpus_per_node=1, steps=3600,
                backend_options={"instance_type": "g3.4xlarge"})
    rate, basis = fleet_price(spec, cat, fleet=fleet_of(spec))
    assert rate == pytest.approx(2 * cat.price("g3.4xlarge").usd_per_hour)
    assert "2*g3.4xlarge on-demand" in basis
    est = expected_cost(spec, step_s=2.0, catalog=cat, fleet=fleet_of(spec))
    assert est.hours == pytest.approx(2.0) and est.dollars == pytest.approx(2 * rate)
    assert "measured" in est.line() and f"${rate:,.2f}/hour" in est.line()


def test_on_premise_without_a_rate_says_it_assumed_one():
    spec = Spec(backend="slurm", nodes=1, gpus_per_node=4, steps=7200)
    est = expected_cost(spec, catalog=builtin_catalog(), fleet=fleet_of(spec))
    assert est.usd_per_hour == pytest.approx(4 * ASSUMED_GPU_HOUR_USD)
    assert est.step_s == ASSUMED_STEP_S and "assumed" in est.step_basis and "assumed" in est.rate_basis
    assert est.dollars == pytest.approx(4 * ASSUMED_GPU_HOUR_USD * 7200 * ASSUMED_STEP_S / 3600)


def test_an_aws_spec_without_a_type_is_priced_on_the_backends_default():
    """The default type is one fact (the aws options' default): what the backend launches is what is priced."""
    from scalelab.aws.options import AwsOptions

    cat = builtin_catalog()
    default = Spec(backend="aws", nodes=2, gpus_per_node=1, steps=3600)
    named = Spec(backend="aws", nodes=2, gpus_per_node=1, steps=3600,
                 backend_options={"instance_type": AwsOptions().instance_type})
    assert fleet_price(default, cat, fleet=fleet_of(default)) == fleet_price(named, cat, fleet=fleet_of(named))
    assert f"2*{AwsOptions().instance_type} on-demand" in fleet_price(default, cat, fleet=fleet_of(default))[1]


def test_each_backend_states_how_its_nodes_are_paid_for_and_how_long_they_take_to_start():
    """The facts live on the backends' options types (read through the registry), not in costs/."""
    spot = Spec(backend="aws", nodes=1, steps=10, backend_options={"spot": True, "region": "eu-west-1"})
    assert fleet_of(spot) == Fleet(provider="aws", instance_type="g4dn.xlarge", market="spot", region="eu-west-1",
                                   rate_name="aws")
    variant = Spec(backend="local", steps=10, backend_options={"instance_type": "local-2t"})
    assert fleet_of(variant) == Fleet(instance_type="local-2t", rate_name="local") and not fleet_of(variant).cloud
    assert fleet_of(Spec(backend="k8s", steps=10)).rate_name == "k8s"
    assert [assumed_startup_s(b) for b in ("local", "slurm", "k8s", "aws")] == [15.0, 30.0, 120.0, 300.0]
    cat = builtin_catalog()
    assert is_priced(fleet_of(spot), cat) and not is_priced(fleet_of(variant), cat)  # no 'local' rate built in
    # a fleet the cost model has never heard of is priced by what it says, not by a backend's name
    rented = Spec(backend="slurm", nodes=2, steps=10)
    assert fleet_price(rented, cat, fleet=Fleet(provider="aws", instance_type="g3.4xlarge"))[0] == pytest.approx(
        2 * cat.price("g3.4xlarge").usd_per_hour)


# ---- the price before paying, at the command line (scalelab/launcher/pricing.py) ------------------------------

import json  # noqa: E402

from conftest import launch, only_run_dir  # noqa: E402

from scalelab.launcher.pricing import guard, step_time  # noqa: E402

NO_PRICES = {"SCALELAB_PRICES": "/nonexistent/scalelab-prices.json"}
AWS = ["--backend", "aws", "--bucket", "bkt", "--region", "us-east-1", "--instance-type", "g3.4xlarge"]
TINY = ["--model", "nmt-tiny", "--data", "task", "--steps", "4", "--warmup-steps", "1", "--prefetch", "1",
        "--engine", "single"]


def test_aws_dry_run_prints_the_price_on_stderr_and_the_requests_exactly(tmp_path):
    out = launch(*AWS, "--nodes", "2", "--steps", "7200", "--dry-run", cwd=tmp_path, env=NO_PRICES)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["layout"]["instances"] == {"g3.4xlarge": 2}  # stdout: the requests only
    per_hour = 2 * builtin_catalog().price("g3.4xlarge").usd_per_hour
    assert f"fleet ${per_hour:,.2f}/hour (2*g3.4xlarge on-demand)" in out.stderr
    expected = per_hour * 7200 * ASSUMED_STEP_S / 3600
    assert f"expected cost of the launch: ${expected:,.2f}" in out.stderr and "assumed" in out.stderr


def test_sweep_dry_run_prices_every_layout_and_repeat(tmp_path):
    out = launch("sweep", *AWS, "--layouts", "1x1,2x1", "--repeats", "2", "--steps", "3600", "--dry-run",
                 cwd=tmp_path, env=NO_PRICES)
    assert out.returncode == 0, out.stderr
    one = builtin_catalog().price("g3.4xlarge").usd_per_hour * 3600 * ASSUMED_STEP_S / 3600
    assert "1x1: 2 x fleet" in out.stderr and "2x1: 2 x fleet" in out.stderr
    assert f"expected cost of the launch: ${2 * one + 2 * 2 * one:,.2f}" in out.stderr


@pytest.mark.slow
def test_on_premise_rate_prices_slurm_and_no_rate_prices_nothing(tmp_path):
    out = launch("--backend", "slurm", "--nodes", "2", "--gpus-per-node", "4", "--steps", "3600",
                 "--rate", "0.45/gpu-hour", "--dry-run", cwd=tmp_path, env=NO_PRICES)
    assert out.returncode == 0, out.stderr
    assert "fleet $3.60/hour (rate 'slurm' from --rate" in out.stderr and "cost of the launch: $1.80" in out.stderr
    out = launch("--backend", "local", "--steps", "3600", "--dry-run", cwd=tmp_path, env=NO_PRICES)
    assert out.returncode == 0 and "/hour" not in out.stderr  # the local backend costs nothing
    out = launch("--backend", "local", "--steps", "30", "--max-usd", "1", cwd=tmp_path, env=NO_PRICES)
    assert out.returncode == 2 and "--rate local=USD/gpu-hour" in out.stderr and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_over_the_threshold_without_a_terminal_needs_yes(tmp_path):
    """A local run with a rate in the prices file: over --confirm-above-usd and no terminal it is
    refused naming --yes; with --yes it runs and records its price per hour (`launch ls` shows its
    cost); then a dry-run of the same spec is priced from that run's measured step time."""
    runs, prices = tmp_path / "runs", tmp_path / "prices.json"
    prices.write_text(json.dumps({"rates": [{"name": "local", "usd_per_gpu_hour": 100}]}))
    env = {"SCALELAB_PRICES": str(prices)}
    args = [*TINY, "--runs-dir", str(runs), "--confirm-above-usd", "0"]
    out = launch(*args, cwd=tmp_path, env=env)
    assert out.returncode == 2 and "pass --yes" in out.stderr and "--confirm-above-usd" in out.stderr
    assert "fleet $100.00/hour (rate 'local' from " in out.stderr and not runs.exists()
    out = launch(*args, "--yes", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    run = only_run_dir(runs)
    assert json.loads((run / "launch.json").read_text())["usd_per_hour"] == 100.0
    listed = json.loads(launch("ls", "--runs-dir", str(runs), "--format", "json", cwd=tmp_path, env=env).stdout)
    assert listed[0]["cost_usd"] > 0
    measured = json.loads((run / "summary.json").read_text())["step_s_median"]
    out = launch(*args, "--dry-run", cwd=tmp_path, env=env)
    assert f"x {measured:.3g} s/step (median measured in {run})" in out.stderr, out.stderr


def test_refused_on_a_terminal_when_the_answer_is_no(monkeypatch):
    spec = Spec(backend="slurm", nodes=1, gpus_per_node=4, steps=7200)
    params = {"rates": ["slurm=100/gpu-hour"], "prices_file": None, "runs_dir": "/nonexistent", "yes": False,
              "max_usd": None, "confirm_above_usd": 20.0}
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    answers = []
    monkeypatch.setattr("click.confirm", lambda text, **kw: answers.append(text) or False)
    with pytest.raises(Exception, match="declined"):
        guard([(spec, 1)], params)
    assert answers and "$400.00" in answers[0]
    assert guard([(spec, 1)], {**params, "yes": True}).total_usd == pytest.approx(400.0)
    with pytest.raises(Exception, match=r"\$400.00 is over --max-usd 399"):
        guard([(spec, 1)], {**params, "yes": True, "max_usd": 399})


def test_an_unmeasured_layout_is_predicted_from_the_measured_ones():
    base = dict(backend="slurm", model="nmt-tiny", global_batch=64, steps=100)
    runs = [(Spec(nodes=1, gpus_per_node=w, **base), {"samples_per_s": rate, "run_dir": f"r{w}"})
            for w, rate in ((1, 100.0), (2, 190.0), (4, 350.0))]
    step_s, _, basis = step_time(Spec(nodes=1, gpus_per_node=2, **base), runs + [
        (Spec(nodes=1, gpus_per_node=2, **base), {"samples_per_s": 190.0, "step_s_median": 0.3, "run_dir": "r"})])
    assert step_s == 0.3 and "measured" in basis
    step_s, _, basis = step_time(Spec(nodes=1, gpus_per_node=8, **base), runs)
    assert "predicted" in basis and 64 / 700 < step_s < 64 / 350  # faster than 4 workers, below linear


def test_a_preview_under_a_dollar_is_rounded_as_every_cost_figure(tmp_path):
    """The dry run's price says what a short launch costs as `launch cost` and `launch report` would (four
    decimals below a dollar: $0.0190), not "$0.02" for the layout and the launch."""
    import re

    out = launch(*AWS, "--steps", "20", "--dry-run", cwd=tmp_path, env=NO_PRICES)
    assert out.returncode == 0, out.stderr
    (layout,) = re.findall(r"expected \$(\S+) for 20 steps", out.stderr)
    (total,) = re.findall(r"expected cost of the launch: \$(\S+)\n", out.stderr)
    assert re.fullmatch(r"0\.\d{4}", layout) and total == layout  # one layout: its price is the launch's
