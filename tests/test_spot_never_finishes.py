"""Spot at an interruption rate that loses every hour: the job never finishes. `launch plan` recommended such a
layout and crashed printing it (TypeError on hours None), `launch cost` printed dollars `inf` and its JSON null
dollars with 0.0 expected interruptions. Each now says it never finishes, why, and what would let it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from scalelab.costs import billing
from scalelab.costs.billing import spot_expected_seconds
from tests.conftest import run_entry

TABLE = "label,workers,nodes,instance_type,throughput\na,1,1,g4dn.xlarge,100\na,2,2,g4dn.xlarge,180\na,4,4,g4dn.xlarge,300\n"
SEED004 = Path(__file__).resolve().parents[1] / "scalelab" / "costs" / "data" / "seed004_money_speed.csv"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "it.csv").write_text(TABLE)
    (tmp_path / "p.json").write_text(json.dumps({"spot": [
        {"instance_type": "g4dn.xlarge", "region": "us-east-1", "usd_per_hour": 0.2},
        {"instance_type": "g3.4xlarge", "region": "us-east-1", "usd_per_hour": 0.3}]}))
    (tmp_path / "runs.csv").write_text("label,seconds,instances,market\nr1,3600,2*g4dn.xlarge,spot\n"
                                       "r2,600,1*g4dn.xlarge,spot\n")
    return {k: str(tmp_path / f) for k, f in (("table", "it.csv"), ("prices", "p.json"), ("runs", "runs.csv"))}


def _plan(monkeypatch, capsys, files, rate: str, *flags: str) -> tuple[int, str, str]:
    return run_entry(["plan", "--from-csv", files["table"], "--work", "1e9", "--market", "spot", "--prices",
                      files["prices"], "--interruptions-per-hour", rate, *flags], monkeypatch, capsys)


def test_the_stall_reason_names_bounds_that_let_the_job_finish() -> None:
    assert billing.spot_stall(5.0) is None and billing.spot_stall(0.0) is None  # 5 x 480 s < 3600 s: it finishes
    why = billing.spot_stall(10.0, 600.0, 180.0, 0.0)
    assert why and "--interruptions-per-hour below 7.5 per instance" in why, why
    assert "--checkpoint-interval-s below 360" in why and "--market on-demand" in why, why
    # the bounds it names are the real ones: just under them the job finishes, at them it does not
    assert math.isfinite(spot_expected_seconds(3600, 7.49)) and math.isinf(spot_expected_seconds(3600, 7.5))
    assert math.isfinite(spot_expected_seconds(3600, 10.0, 359.0)) and math.isinf(spot_expected_seconds(3600, 10.0, 360.0))
    two = billing.spot_stall(20.0, instances=2)  # the job's rate over two instances: the bound is per instance
    assert two and "(2 instances, 10 each)" in two and "below 3.75 per instance" in two, two
    # a restart as long as the time between interruptions: checkpointing alone cannot help, the restart is named
    assert "--restart-s below 180" in two, two


def test_plan_on_spot_where_nothing_finishes_answers_none_and_why(monkeypatch, capsys, files) -> None:
    code, err, out = _plan(monkeypatch, capsys, files, "10")
    assert code == 0 and "Traceback" not in err, err  # as other unmet answers: exit 0
    said = " ".join(out.split())
    assert "cheapest: none: no priced layout finishes; the one with the fewest instances, 1 worker on " \
           "1*g4dn.xlarge spot, never finishes on spot" in said, said
    assert "--interruptions-per-hour below 7.5" in said and "--checkpoint-interval-s below 360" in said, said
    assert "--market on-demand" in said and "fastest: none" in said, said
    assert "inf" not in said.split() and "never = never finishes on spot" in said, said
    code, err, out = _plan(monkeypatch, capsys, files, "10", "--format", "json")
    rows = json.loads(out)
    assert code == 0 and rows and all(r["recommendation"] is None for r in rows), rows  # nothing impossible
    assert all(r["never_finishes"].startswith("never finishes on spot") for r in rows), rows
    for fmt in ("markdown", "html"):
        code, err, out = _plan(monkeypatch, capsys, files, "10", "--format", fmt)
        assert code == 0 and "Traceback" not in err, err
    assert "cheapest: none: no priced layout finishes" in " ".join(
        _plan(monkeypatch, capsys, files, "10", "--format", "markdown")[2].split())


def test_plan_recommends_only_the_layouts_that_finish(monkeypatch, capsys, files) -> None:
    """At 5 an hour per instance one instance finishes, two or more do not (10 an hour for the job)."""
    code, err, out = _plan(monkeypatch, capsys, files, "5", "--format", "json")
    assert code == 0, err
    rows = {r["workers"]: r for r in json.loads(out)}
    assert rows[1]["recommendation"] and rows[1]["never_finishes"] is None, rows[1]
    assert all(rows[w]["recommendation"] is None and rows[w]["never_finishes"] for w in (2, 4, 8)), rows
    assert "3 of 4 priced layouts never finish" in " ".join(err.split()), err
    code, err, out = _plan(monkeypatch, capsys, files, "10", "--deadline-h", "5")
    said = " ".join(out.split())
    assert code == 0 and "cheapest within deadline: none: no priced layout finishes" in said, said
    assert "inf h" not in said and "inf" not in " ".join(err.split()).split(), (said, err)


def test_plan_predict_layouts_on_spot_where_nothing_finishes(monkeypatch, capsys, files) -> None:
    code, err, out = run_entry(["plan", "--from-csv", str(SEED004), "--prices", files["prices"], "--predict",
                                "4x1@4*g3.4xlarge,1x1@1*g3.4xlarge", "--market", "spot", "--interruptions-per-hour",
                                "10"], monkeypatch, capsys)
    said = " ".join(out.split())
    assert code == 0 and "Traceback" not in err, err
    assert "cheapest: none: no priced layout finishes; the one with the fewest instances, 1x1@1*g3.4xlarge" in said, said


def test_cost_says_never_and_why_in_table_and_json(monkeypatch, capsys, files) -> None:
    argv = ["cost", "--from-csv", files["runs"], "--prices", files["prices"], "--interruptions-per-hour", "5"]
    code, err, out = run_entry(argv, monkeypatch, capsys)
    assert code == 0, err
    r1 = next(line for line in out.splitlines() if "r1" in line and "g4dn" in line)
    assert r1.count("never") == 2 and "inf" not in out.split(), out  # wall and dollars
    said = " ".join(out.split())
    assert "r1: never finishes on spot: at 10 interruptions an hour (2 instances, 5 each)" in said, said
    assert "r2:" not in said  # one instance at 5 an hour finishes
    code, err, out = run_entry([*argv, "--format", "json"], monkeypatch, capsys)
    rows = {r["label"]: r for r in json.loads(out)}
    assert rows["r1"]["dollars"] is None and rows["r1"]["expected_interruptions"] is None, rows["r1"]
    assert rows["r1"]["never_finishes"].startswith("never finishes on spot: at 10 interruptions"), rows["r1"]
    assert rows["r2"]["never_finishes"] is None and rows["r2"]["dollars"] > 0, rows["r2"]
    code, err, out = run_entry([*argv, "--format", "markdown"], monkeypatch, capsys)
    assert code == 0 and "| never |" in out and "r1: never finishes on spot" in out, out


def test_the_plan_page_says_never_where_the_candidates_never_finish(monkeypatch, capsys, files, tmp_path) -> None:
    """plan.html's Candidates table printed "inf" in the time and dollars cells of a spot layout that never
    finishes; it says never, as the terminal's table does."""
    code, err, _ = _plan(monkeypatch, capsys, files, "5", "--out", str(tmp_path / "plan"))
    assert code == 0, err
    page = (tmp_path / "plan" / "plan.html").read_text()
    table = page[page.index("Candidates"):]
    assert "inf" not in table.replace("info", ""), table[:3000]
    assert table.count("<td>never</td>") >= 6, table[:3000]  # 3 layouts never finish: time and dollars each
