"""One pricing rule (issue #28): `launch cost`, the report's cost chart and `launch plan` give the same
dollars for the same run at the same rate; a 2-GPU run is not priced as one 1-GPU instance. Also the
planning path's presentation, the previews' warnings and a report of merged sweeps, on the same runs."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from test_costs_cli import _fake_run

from scalelab.core.records import load_run
from scalelab.costs.billing import billed_seconds
from scalelab.costs.expected import measured_cost_points, run_seconds
from scalelab.launcher.backend import fleet_of
from scalelab.launcher.cli import main


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """A local 1-GPU and 2-GPU run (one node), priced by a 'local' rate of $0.50 a GPU-hour."""
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"rates": [{"name": "local", "usd_per_gpu_hour": 0.5}]}))
    monkeypatch.setenv("SCALELAB_PRICES", str(prices))
    return [_fake_run(tmp_path, f"r{g}", g, 0.1 * (1 + 0.1 * g) / g, 6400, None) for g in (1, 2)]


def _json(*args: str):
    out = CliRunner().invoke(main, [*args, "--format", "json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)  # notes go to stderr


def test_cost_report_and_plan_agree_on_one_run(runs):
    two = runs[1]
    cost = _json("cost", str(two))[0]
    assert cost["usd_per_hour"] == pytest.approx(2 * 0.5)  # 2 GPUs at $0.50 (it was one unit: $0.50)
    seconds = run_seconds(load_run(two))
    assert cost["dollars"] == pytest.approx(1.0 * billed_seconds(seconds) / 3600)

    points, basis = measured_cost_points(None, [load_run(two)], fleet_of)
    assert points["usd_per_hour"].iloc[0] == pytest.approx(cost["usd_per_hour"])
    assert points["dollars"].iloc[0] == pytest.approx(cost["dollars"])  # the report: the same dollars
    assert "as `launch cost`" in basis

    plan = _json("plan", *map(str, runs), "--instance-types", "local", "--work", "1e6")
    row = next(r for r in plan if r.get("instance_type") == "local" and r["workers"] == 2)
    assert row["usd_per_hour"] == pytest.approx(cost["usd_per_hour"])  # the plan: the same price of the layout
    assert row["dollars"] == pytest.approx(row["usd_per_hour"] * billed_seconds(row["hours"] * 3600) / 3600)


def test_a_bare_instance_type_holds_every_gpu_of_the_run(runs):
    """`launch cost RUN --instances g5.xlarge` of a 1x2 run: two 1-GPU g5.xlarge, as the planner counts
    ceil(workers / GPUs) instances of a type."""
    cost = _json("cost", str(runs[1]), "--instances", "g5.xlarge")[0]
    assert cost["instances"] == "2*g5.xlarge" and cost["gpus"] == 2
    plan = _json("plan", *map(str, runs), "--instance-types", "g5.xlarge", "--measured-on", "g5.xlarge",
                 "--work", "1e6")
    row = next(r for r in plan if r.get("instance_type") == "g5.xlarge" and r["workers"] == 2)
    assert row["instances"] == 2 and row["usd_per_hour"] == pytest.approx(cost["usd_per_hour"])


def test_the_plan_answers_first_with_its_bounds_at_100_columns(runs, tmp_path, monkeypatch):
    from rich.console import Console

    import scalelab.costs.cli as costs_cli

    monkeypatch.setattr(costs_cli, "console", Console(width=100, force_terminal=False))
    out = CliRunner().invoke(main, ["plan", *map(str, runs), "--instance-types", "local", "--work", "1e6",
                                    "--deadline-h", "6", "--budget", "50"])
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    answer = next(i for i, line in enumerate(lines) if line.startswith("cheapest within deadline: "))
    assert "(up to " in lines[answer] and "$" in lines[answer]
    assert answer < next(i for i, line in enumerate(lines) if line.startswith("Candidates"))  # the answer first
    assert "0.00 h" not in out.stdout and re.search(r"\d s\b|\d min\b", out.stdout)  # short jobs in s / min
    assert "1 workers" not in out.stdout
    # markdown and html carry the bounds too
    md = CliRunner().invoke(main, ["plan", *map(str, runs), "--instance-types", "local", "--work", "1e6",
                                   "--deadline-h", "6", "--out", str(tmp_path / "p"), "--format", "markdown"])
    assert md.exit_code == 0 and "(up to " in md.stdout
    assert "(up to " in (tmp_path / "p" / "plan.html").read_text()


def test_a_deadline_nothing_can_answer_is_refused_saying_what_to_give(runs):
    """The README's `launch plan runs/sweep-* --deadline-h 6 --budget 50` silently ignored both flags."""
    out = CliRunner().invoke(main, ["plan", *map(str, runs), "--deadline-h", "6", "--budget", "50"])
    assert out.exit_code != 0
    assert "--deadline-h and --budget cannot be answered" in str(out.exception) and "--instance-types" in str(out.exception)


AWS = ["--backend", "aws", "--bucket", "bkt", "--region", "us-east-1", "--model", "nmt-tiny", "--data", "task",
       "--steps", "20000", "--dry-run"]


def test_the_preview_warns_past_the_time_limit_and_names_where_its_step_time_was_measured(runs, tmp_path,
                                                                                         monkeypatch):
    from scalelab.launcher.runner import write_summary

    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(main, AWS)  # 20000 x the assumed 0.5 s: 2.78 h, past the default 120 min
    assert out.exit_code == 0, out.output
    assert "longer than --time-limit-min 120" in out.stderr and "= 2.78 h" in out.stderr
    assert "warning" not in CliRunner().invoke(main, [*AWS, "--time-limit-min", "200"]).stderr
    write_summary(runs[0])  # a 1x1 run of the local backend, on a CPU
    out = CliRunner().invoke(main, [*AWS, "--expect-from", str(runs[0])])
    assert out.exit_code == 0, out.output
    assert "step time from runs on local (CPU), not on aws g3.4xlarge: its speed is not applied" in out.stderr


def test_a_report_of_two_sweeps_with_the_same_layouts_says_it_merged_them(tmp_path):
    """`launch report runs/sweep-nmt-small-strong-*` merged two sweeps into one series without a word."""
    from scalelab.analysis.results import build_report
    from scalelab.core.rundir import write_json

    sweeps = []
    for name in ("sweep-a", "sweep-b"):
        sweep = tmp_path / name
        sweep.mkdir()
        run = _fake_run(sweep, "1x1", 1, 0.1, 6400, None)
        write_json(run / "launch.json", {"backend": "local", "state": "COMPLETED", "run_dir": str(run)})
        write_json(sweep / "sweep.json", {"runs": ["1x1"], "layouts": [[1, 1]]})
        sweeps.append(sweep)
    both = build_report(sweeps, tmp_path / "out")
    assert any("2 sweeps given together measured the same layouts" in w for w in both.warnings), both.warnings
    one = build_report(sweeps[:1], tmp_path / "out1")
    assert not any("sweeps given together" in w for w in one.warnings)
