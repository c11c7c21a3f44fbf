"""What `launch plan` says, as a user planning from a CSV reads it (a review of 2026-12-06): no
measurement suggested where the models agree, no orphan commas for an unlabelled series, and errors
that say what to do for a CSV rather than for runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from conftest import launch
from scalelab.costs.planner import next_measurement

SCALING = ("workers,nodes,throughput,instance_type\n1,1,1000,g3.16xlarge\n2,1,1900,g3.16xlarge\n"
           "4,1,3600,g3.16xlarge\n8,2,6400,g3.16xlarge\n")


def _csv(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_no_next_measurement_where_the_models_agree():
    """Every untried count's models within 1 %: nothing to settle, so nothing suggested (it said
    "the models disagree most there (0% apart)"); a real disagreement is still named."""
    rows = pd.DataFrame({"label": "", "workers": [16, 32], "measured_throughput": [None, None],
                         "disagreement": [0.0, 0.004]})
    assert next_measurement(rows) is None
    rows["disagreement"] = [0.0, 0.3]
    assert next_measurement(rows)["workers"] == 32


def test_an_unlabelled_table_leaves_no_orphan_commas(tmp_path):
    r = launch("plan", "--from-csv", str(_csv(tmp_path, SCALING)), "--predict-workers", "16", "--work", "1e8",
               "--instance-types", "g3.16xlarge", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert ": ," not in r.stdout and "(, " not in r.stdout and "(series)" not in r.stdout
    # the candidate models split at 16 (node-decay keeps 8's rate past its first crossing, decay does not):
    # named without a series' name, no orphan comma either
    assert "measure next: 16 workers: the models disagree most there" in r.stdout, r.stdout


def test_a_single_count_is_refused_saying_how_to_measure_a_second(tmp_path):
    r = launch("plan", "--from-csv", str(_csv(tmp_path, "workers,throughput\n4,1000\n")), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "at least two different worker counts" in r.stderr and "second GPU count" in r.stderr
    assert "its throughput is not predicted" not in r.stderr


def test_a_deadline_on_a_scaling_csv_names_the_csv_not_runs_to_rerun(tmp_path):
    r = launch("plan", "--from-csv", str(_csv(tmp_path, SCALING, "mine.csv")), "--deadline-h", "1",
               "--instance-types", "g3.16xlarge", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no steps to a loss threshold in mine.csv" in r.stderr and "convergence table" in r.stderr
    assert "run them with" not in r.stderr
    r = launch("plan", "--from-csv", str(_csv(tmp_path, SCALING, "mine.csv")), "--predict-batch", "64",
               cwd=tmp_path)
    assert "no steps to a loss threshold in mine.csv" in r.stderr and "--val-every" not in r.stderr


def test_the_candidates_fit_80_columns_with_whole_words(tmp_path):
    """At 80 columns the candidates' table was cut at the right edge ("fastes", no border) and its cells
    split inside words ("4*g3.16xl / arge"): too wide for a box, it is printed as `squeue` prints."""
    r = launch("plan", "--from-csv", str(_csv(tmp_path, SCALING)), "--predict-workers", "16", "--work", "1e8",
               "--instance-types", "g3.16xlarge,p2.8xlarge", cwd=tmp_path, env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    table = r.stdout[r.stdout.index("Candidates"):]
    for word in ("4*g3.16xlarge", "2*p2.8xlarge", "published", "fastest", "cheapest"):
        assert word in table
    wide = launch("plan", "--from-csv", str(_csv(tmp_path, SCALING)), "--predict-workers", "16", "--work", "1e8",
                  "--instance-types", "g3.16xlarge,p2.8xlarge", cwd=tmp_path, env={"COLUMNS": "200"})
    assert "┃ workers ┃" in wide.stdout  # room enough: boxed as before


def test_a_layout_in_a_market_without_a_price_is_refused_as_a_worker_count_is(tmp_path):
    """`--predict 4x4@4*g3.16xlarge --market spot` with no spot price printed the table and exited 0 with a
    note, where `--predict-workers 16` refused: both paths now refuse, naming the missing price."""
    table = str(_csv(tmp_path, SCALING))
    env = {"SCALELAB_PRICES": str(tmp_path / "none.json")}
    for ask in (["--predict", "4x4@4*g3.16xlarge"], ["--predict-workers", "16", "--instance-types", "g3.16xlarge"]):
        r = launch("plan", "--from-csv", table, *ask, "--work", "1e8", "--market", "spot", cwd=tmp_path, env=env)
        assert r.returncode == 2 and "no spot price for g3.16xlarge" in r.stderr and "Traceback" not in r.stderr
    both = launch("plan", "--from-csv", table, "--predict", "4x4@4*g3.16xlarge", "--work", "1e8", "--market", "both",
                  cwd=tmp_path, env=env)
    assert both.returncode == 0 and "on-demand" in both.stdout  # one market priced: a plan, the other a note
