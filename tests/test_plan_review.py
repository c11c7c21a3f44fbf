"""`launch plan` as a reviewer found it (2026-12 review of /tmp/review-plan): tables at 80 columns cut
inside words and numbers, an error that led with an unrelated note, rows and values that cannot be
measurements, a layout listed twice, JSON without the work it priced, and a two-count series told to
measure a count between its two."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from conftest import launch
from scalelab.core.terminal import cell_pieces, fold_cell, unbreakable_width
from scalelab.costs.cli import _rich_table
from scalelab.costs.tables import CsvError, read_scaling_csv

SEED004 = str(Path(__file__).resolve().parents[1] / "scalelab/costs/data/seed004_money_speed.csv")

K80 = ("label,workers,nodes,instance_type,throughput,precision\n"
       "inception3_k80,1,1,p2.8xlarge,30.5,fp32\ninception3_k80,2,1,p2.8xlarge,57.8,fp32\n"
       "inception3_k80,4,1,p2.8xlarge,116,fp32\ninception3_k80,8,1,p2.8xlarge,227,fp32\n")
MULTINODE = ("label,workers,nodes,instance_type,throughput\nresnet101_horovod,1,1,p3.16xlarge,380\n"
             "resnet101_horovod,8,1,p3.16xlarge,2900\nresnet101_horovod,16,2,p3.16xlarge,5500\n"
             "resnet101_horovod,32,4,p3.16xlarge,10600\n")
NEGATIVE = "label,workers,throughput\nps_bottleneck,1,100\nps_bottleneck,2,180\nps_bottleneck,4,260\nps_bottleneck,8,240\n"
TWO_COUNTS = "label,workers,nodes,throughput\ntwo_pts,1,1,1000\ntwo_pts,4,1,3600\n"


def _csv(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _no_prices(tmp_path: Path) -> dict[str, str]:
    """The built-in catalog only: a prices file on the machine would price what the test needs unpriced."""
    return {"SCALELAB_PRICES": str(tmp_path / "none.json"), "COLUMNS": "80"}


def _tables(stdout: str) -> str:
    """The plan's tables: from the first table title on (the prose above wraps at spaces, as prose does)."""
    return stdout[stdout.index("Predicted"):]


# ---- 1. 80 columns ------------------------------------------------------------------------------------


def test_the_k80_spot_plan_fits_80_columns_with_every_cell_whole(tmp_path):
    """Before: `on-dema / nd`, `measure / d`, `fastes / t`, `2*p2.8xla / rge`, `104.74 / h`. Now the box goes,
    then the speed column (named under the table), and every cell stays on one line."""
    r = launch("plan", "--from-csv", str(_csv(tmp_path, K80)), "--instance-types", "p2.xlarge,p2.8xlarge",
               "--market", "both", "--interruptions-per-hour", "0.05", "--work", "1.15e7", "--budget", "150",
               "--deadline-h", "24", "--predict-workers", "1,8,16", cwd=tmp_path, env=_no_prices(tmp_path))
    assert r.returncode == 0, r.stderr
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    table = r.stdout[r.stdout.index("Candidates"):r.stdout.index("pick: cheapest")]
    rows = [line for line in table.splitlines() if re.match(r"\s+\d+\s", line)]
    assert len(rows) == 15  # one line per candidate: no cell went on in a second line
    for line in rows:
        assert re.match(r"\s+\d+\s+\d+\*p2\.(8x|x)large\s+(on-demand|spot)\s+[\d.]+ h\s+[\d.]+ h\s+[\d,.]+\s+[\d,.]+"
                        r"(\s+(fastest|cheapest|both|frontier))?\s*$", line), line
    assert "left out to fit 80 columns: speed" in table


def test_a_multinode_plan_keeps_instance_types_whole_at_80_columns(tmp_path):
    r = launch("plan", "--from-csv", str(_csv(tmp_path, MULTINODE)), "--instance-types", "p4d.24xlarge,p3.16xlarge",
               "--market", "both", "--work", "1e9", cwd=tmp_path, env=_no_prices(tmp_path))
    assert r.returncode == 0, r.stderr
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    tables = _tables(r.stdout)
    for whole in ("8*p4d.24xlarge", "4*p4d.24xlarge", "8*p3.16xlarge", "17,894.74", "730.99 h"):
        assert whole in tables, whole
    assert "arge\n" not in tables.replace("xlarge\n", "")  # `4*p4d.24xl / arge` was split


def test_predicted_layouts_fold_between_their_parts_at_80_columns(tmp_path):
    """`8x1@1*p2.xlarge+7*g3.4xlarge:dynamic` went on as `...:d / ynamic` (layouts) and `...:dy / namic`
    (candidates): now a layout folds after `@` or `+` and before `:dynamic`, never inside a type."""
    r = launch("plan", "--from-csv", SEED004, "--predict",
               "8x1@1*p2.xlarge+7*g3.4xlarge:dynamic,4x1@1*p2.xlarge+3*g3.4xlarge:dynamic,2x2@2*g3.16xlarge",
               cwd=tmp_path, env=_no_prices(tmp_path))
    assert r.returncode == 0, r.stderr
    tables = _tables(r.stdout)
    assert max(len(line) for line in tables.splitlines()) <= 80
    assert tables.count(":dynamic") == 4 and "2*g3.16xlarge" in tables
    for part, times in (("1*p2.xlarge+", 4), ("7*g3.4xlarge", 2), ("3*g3.4xlarge", 2)):
        assert tables.count(part) == times, part


def _rendered(table, width: int) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(table)
    return console.export_text()


@pytest.mark.parametrize("width", [80, 100, 200])
def test_no_cell_is_cut_inside_a_word_or_a_number(width):
    """Any table `_rich_table` draws: each number whole on one line, each text cell whole or folded only
    between its parts (`cell_pieces`)."""
    df = pd.DataFrame({"series": ["resnet101-horovod-ethernet-p3dn", "a"], "workers": [64, 1],
                       "instances": ["8x1@1*p2.xlarge+7*g3.4xlarge:dynamic", "16*p2.xlarge"],
                       "market": ["on-demand", "spot"], "speed": ["published", "measured"],
                       "time": [104.74, 7.19], "dollars": [17894.74, 103.56], "up to $": [18383.03, 116.44]})
    fmt = {"workers": ".0f", "time": lambda h: f"{h:.2f} h", "dollars": ",.2f", "up to $": ",.2f"}
    text = _rendered(_rich_table("", df, fmt, width=width, droppable=("speed",)), width)
    assert max(len(line) for line in text.splitlines()) <= width
    for number in ("104.74 h", "17,894.74", "18,383.03", "116.44"):
        assert number in text
    for i, col in enumerate(["series", "instances", "market"]):
        for cell in df[col]:
            assert all(p.strip() in text for p in cell_pieces(cell, hyphens=i == 0)), cell
    assert "on-demand" in text  # a hyphen inside a value is no place to break


def test_fold_cell_breaks_only_between_parts():
    layout = "8x1@1*p2.xlarge+7*g3.4xlarge:dynamic"
    assert unbreakable_width(layout) == len("1*p2.xlarge+")
    assert fold_cell(layout, 16).split("\n") == ["8x1@1*p2.xlarge+", "7*g3.4xlarge", ":dynamic"]
    assert fold_cell("on-demand", 3) == "on-demand"
    assert fold_cell("run-2026-x", 4, hyphens=True).split("\n") == ["run-", "2026-", "x"]


# ---- 2. the error when nothing is priced ----------------------------------------------------------


def test_nothing_priced_is_an_error_with_its_cause_only(tmp_path):
    """It led with the fit's notes ("series ps_bottleneck: throughput drops from 4 to 8 workers ...; at 8
    workers the measurement ... lies outside ...; no spot price for p3.16xlarge ...")."""
    r = launch("plan", "--from-csv", str(_csv(tmp_path, NEGATIVE)), "--measured-on", "p3.16xlarge",
               "--instance-types", "p3.16xlarge", "--market", "spot", "--work", "1e10", "--deadline-h", "12",
               cwd=tmp_path, env=_no_prices(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    error = [line for line in r.stderr.splitlines() if line.startswith("launch: error:")]
    assert len(error) == 1 and error[0].startswith("launch: error: no spot price for p3.16xlarge in us-east-1")
    assert "series" not in r.stderr and "lies outside" not in r.stderr and "drops" not in r.stderr


# ---- 3. and 4. rows that cannot be measurements ----------------------------------------------------


def test_more_nodes_than_workers_is_refused_naming_the_line(tmp_path):
    r = launch("plan", "--from-csv", str(_csv(tmp_path, "label,workers,nodes,throughput\na,1,1,100\na,2,4,180\n"
                                                        "a,4,1,350\n")), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
    assert r.stderr.count("\n") == 1
    assert "t.csv:3: 2 workers on 4 nodes; every node runs at least one worker" in r.stderr


@pytest.mark.parametrize("text, said", [
    ("label,workers,throughput\na,1,1e308\na,2,1.7e308\n", "t.csv:2: throughput 1e+308 per second, above 1e+15"),
    ("label,workers,throughput\na,1,1e-300\na,2,1.7e-300\n", "t.csv:2: throughput 1e-300 per second, below 1e-09"),
    ("workers,time_s\n1,100\n2,1e-16\n", "t.csv:3: time_s 1e-16 gives a throughput of 1e+16 per second"),
])
def test_absurd_throughput_is_refused_in_one_line(tmp_path, text, said):
    """1e308 reached the fit and ended in numpy's LinAlgError (exit 1); 1e-300 priced infinite hours."""
    r = launch("plan", "--from-csv", str(_csv(tmp_path, text)), "--work", "1e15", "--measured-on", "p3.2xlarge",
               "--instance-types", "p3.2xlarge", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    assert said in r.stderr


def test_the_throughput_bounds_themselves_are_read(tmp_path):
    table = read_scaling_csv(_csv(tmp_path, "workers,throughput\n1,1e-9\n2,1e15\n"))
    assert list(table["throughput"]) == [1e-9, 1e15]
    with pytest.raises(CsvError, match="above 1e"):
        read_scaling_csv(_csv(tmp_path, "workers,throughput\n1,1\n2,1.0000001e15\n"))


# ---- 5. --predict: a layout named twice, the work in JSON ----------------------------------------------


def test_a_layout_named_twice_is_planned_once_with_a_note(tmp_path):
    r = launch("plan", "--from-csv", SEED004, "--predict",
               "4x1@4*g3.4xlarge:dynamic,4x1@4*g3.4xlarge,4x1@g3.4xlarge", "--format", "json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    layouts = [row["layout"] for row in json.loads(r.stdout)]
    assert sorted(layouts) == ["4x1@4*g3.4xlarge", "4x1@4*g3.4xlarge:dynamic"]
    assert "--predict names 4x1@4*g3.4xlarge 2 times: planned once" in r.stderr


def test_predicted_layouts_carry_the_work_they_were_priced_for(tmp_path):
    given = launch("plan", "--from-csv", SEED004, "--predict", "4x1@4*g3.4xlarge:dynamic,4x1@4*g3.4xlarge",
                   "--work", "5", "--format", "json", cwd=tmp_path)
    assert given.returncode == 0, given.stderr
    rows = json.loads(given.stdout)
    assert [(r["work"], r["time_basis"]) for r in rows] == [(5.0, "given work")] * 2
    own = launch("plan", "--from-csv", SEED004, "--predict", "4x1@4*g3.4xlarge", "--format", "json", cwd=tmp_path)
    assert [(r["work"], r["time_basis"]) for r in json.loads(own.stdout)] == [(1.0, "the table's job")]


# ---- 7. two counts: which third to measure ------------------------------------------------------------


def test_a_two_count_series_is_told_to_measure_the_doubling(tmp_path):
    """Asked for 2 and 3 of a series measured at 1 and 4, it said "measure next: 2 workers ... (1% apart)":
    docs/costs.md promises the third count that narrows the band, the doubling of the most measured."""
    r = launch("plan", "--from-csv", str(_csv(tmp_path, TWO_COUNTS)), "--predict-workers", "2,3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "measure next: 8 workers (two_pts): the series is measured at two GPU counts only" in r.stdout
    assert "measuring 8 GPUs would narrow it" in " ".join(r.stderr.split())
