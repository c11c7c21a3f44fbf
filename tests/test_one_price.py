"""One pricing rule (issue #28): `launch cost`, the report's cost chart and `launch plan` give the same
dollars for the same run at the same rate; a 2-GPU run is not priced as one 1-GPU instance. Also the
planning path's presentation, the previews' warnings and a report of merged sweeps, on the same runs."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from test_costs_cli import _fake_run

from scalelab.core.errors import SpecError
from scalelab.core.records import load_run
from scalelab.costs.billing import billed_seconds
from scalelab.costs.expected import run_seconds
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

    report = _json("report", str(two), "--out", str(two.parent / "rep"))[0]
    assert report["usd_per_hour"] == pytest.approx(cost["usd_per_hour"])
    assert report["dollars"] == pytest.approx(cost["dollars"])  # the report: the same dollars
    assert report["price_basis"] == cost["price_basis"]

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
    assert "step time from runs on local (CPU), not on aws g4dn.xlarge: its speed is not applied" in out.stderr


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


# ---- issue 33: one dollar rule ---------------------------------------------------------------------------


def _invoke(*args: str):
    out = CliRunner().invoke(main, list(args))
    assert out.exit_code == 0, out.output
    return out


def test_a_10_s_run_bills_60_s_per_instance_in_cost_report_and_preview(tmp_path, monkeypatch):
    """The same 2-GPU run at $36 a GPU-hour: `launch cost`, `launch report --format json` and the launch
    preview (and so --max-usd) all bill its 10 s as 60 s on each of 2 units: $1.20 (10 s alone: $0.20)."""
    from scalelab.launcher.runner import write_summary

    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "no-prices.json"))
    monkeypatch.chdir(tmp_path)
    run = _fake_run(tmp_path, "ten", 2, 1 / 3, 6400, None)  # 30 steps of 1/3 s: 10 s from the first record
    write_summary(run)
    assert run_seconds(load_run(run)) == pytest.approx(10.0)
    want = 2 * 36.0 * 60 / 3600
    cost = json.loads(_invoke("cost", str(run), "--rate", "36/gpu-hour", "--format", "json").stdout)[0]
    assert (cost["instances"], cost["billed_seconds"]) == ("2*local", 60)
    assert cost["dollars"] == pytest.approx(want)
    report = json.loads(_invoke("report", str(run), "--rate", "36/gpu-hour", "--out", str(tmp_path / "r"),
                                "--format", "json").stdout)[0]
    assert report["dollars"] == pytest.approx(want) and report["instances"] == "2*local"
    preview = _invoke("--model", "nmt-tiny", "--gpus-per-node", "2", "--steps", "20", "--rate", "36/gpu-hour",
                      "--expect-from", str(run), "--max-usd", "1", "--dry-run", "--runs-dir", str(tmp_path / "runs"))
    assert f"expected cost of the launch: ${want:,.2f}" in preview.stderr  # 20 steps x 1/3 s: billed as 60 s
    assert "a launch would be refused: over --max-usd 1" in preview.stderr  # $1.20, not the $0.13 of 7 s


def test_a_multi_instance_layout_counts_its_instances_once_everywhere(tmp_path, monkeypatch):
    """A 2x2 Slurm layout at a node-hour rate of 4-GPU nodes holds two nodes (`instances_for`: nodes x
    ceil(GPUs per node / 4)), not the one that 4 GPUs / 4 gave: $8/hour in the preview, `launch cost` and
    `launch report`; the planner's 4 workers on it are one node (1x4), as instances_for counts them."""
    from scalelab.costs.billing import instances_for
    from scalelab.costs.catalog import load_catalog

    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "no-prices.json"))
    monkeypatch.chdir(tmp_path)
    rate = "slurm=4/node-hour@4"
    cat = load_catalog(rates=[rate])
    assert str(instances_for(2, 2, "slurm", cat)) == "2*slurm" and instances_for(1, 4, "slurm", cat).count() == 1
    preview = _invoke("--backend", "slurm", "--nodes", "2", "--gpus-per-node", "2", "--steps", "7200", "--rate", rate,
                      "--dry-run", "--runs-dir", str(tmp_path / "runs"))
    assert "fleet $8.00/hour (rate 'slurm' from --rate (node-hour), 2 units)" in preview.stderr
    run = _fake_run(tmp_path, "two-nodes", 4, 4.0, 6400, None, nodes=2, backend="slurm")  # 120 s
    cost = json.loads(_invoke("cost", str(run), "--rate", rate, "--format", "json").stdout)[0]
    report = json.loads(_invoke("report", str(run), "--rate", rate, "--out", str(tmp_path / "r"),
                                "--format", "json").stdout)[0]
    for row in (cost, report):
        assert row["instances"] == "2*slurm" and row["usd_per_hour"] == pytest.approx(8.0)
        assert row["dollars"] == pytest.approx(8.0 * 120 / 3600)
    one = _fake_run(tmp_path, "one-node", 1, 4.0, 6400, None, backend="slurm")
    plan = json.loads(_invoke("plan", str(one), str(run), "--rate", rate, "--instance-types", "slurm", "--work", "1e6",
                              "--format", "json").stdout)
    row = next(r for r in plan if r.get("instance_type") == "slurm" and r["workers"] == 4)
    assert row["instances"] == instances_for(1, 4, "slurm", cat).count() and row["usd_per_hour"] == pytest.approx(4.0)


def test_a_run_with_no_price_shows_no_dollars_and_says_how_to_give_one(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "no-prices.json"))
    run = _fake_run(tmp_path, "free", 1, 0.1, 6400, None)
    row = json.loads(_invoke("report", str(run), "--out", str(tmp_path / "r"), "--format", "json").stdout)[0]
    assert row["dollars"] is None and row["price_basis"] is None and "--rate USD_PER_GPU_HOUR" in row["price_note"]
    md = (tmp_path / "r" / "report.md").read_text()
    assert "no dollars: the local backend's runs have no price: give --rate USD_PER_GPU_HOUR" in md
    assert "| dollars |" not in md  # no column of dashes
    priced = _invoke("report", str(run), "--rate", "0.5", "--out", str(tmp_path / "r2"), "--format", "markdown").stdout
    assert "| dollars |" in priced and "$0.0083" in priced  # 3 s billed as 60 s at $0.50 a GPU-hour


def test_expect_from_takes_only_runs_of_the_launchs_model(runs, tmp_path, monkeypatch):
    """--expect-from /tmp priced nmt-tiny from a hello.py run it found three folders down: other hardware is
    what the flag is for, another model is refused in one line naming both."""
    from scalelab.core.spec import read_spec, save_spec
    from scalelab.launcher.runner import write_summary

    monkeypatch.chdir(tmp_path)
    write_summary(runs[0])
    other = read_spec(runs[0])
    other.model = "rnnlm-tiny"
    save_spec(other, runs[0])
    out = CliRunner().invoke(main, [*AWS, "--expect-from", str(runs[0])])  # a run dir (a folder of runs is refused)
    assert isinstance(out.exception, SpecError), out.output  # the console entry's one line and exit 2
    assert ("none of its 1 completed run(s) is of nmt-tiny (they are of rnnlm-tiny); point it at runs of nmt-tiny"
            in str(out.exception)), out.exception


def test_the_start_up_of_a_resumed_run_is_its_latest_launchs_not_negative():
    """The steps of a resumed run's earlier launch began before its latest launch: start-up came out -14 s."""
    import pandas as pd

    from scalelab.analysis.scaling import RunMeta, summarize_run

    steps = pd.DataFrame([dict(kind="step", rank=0, world=1, step=i, epoch=0, warmup=False, step_s=1.0, samples=8,
                               words=80, loss=1.0, lr=0.01, time=t) for i, t in ((1, 1001.0), (2, 1002.0),
                                                                                 (3, 1031.0), (4, 1032.0))])
    meta = RunMeta(label="x", workers=1, batch_mode="weak", global_batch=8, launched_at=1020.0)
    assert summarize_run(steps, None, None, meta).startup_s == 1030.0 - 1020.0
    meta = RunMeta(label="x", workers=1, batch_mode="weak", global_batch=8, launched_at=1040.0)  # no step after it
    assert summarize_run(steps, None, None, meta).startup_s is None
