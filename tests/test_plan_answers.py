"""`launch plan`'s answer block where no layout meets --deadline-h or --budget: it says none does, which layout
comes nearest, and what to change. It was a stderr note only, the stdout answer silent."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from scalelab.analysis.report import dollars_text
from tests.conftest import run_entry

SEED004 = Path(__file__).resolve().parents[1] / "scalelab" / "costs" / "data" / "seed004_sentiment_scaling.csv"


def _answer(monkeypatch, capsys, *flags: str) -> str:
    code, err, out = run_entry(["plan", "--from-csv", str(SEED004), "--instance-types", "g3.4xlarge", *flags],
                               monkeypatch, capsys)
    assert code == 0, err
    return " ".join(out[:out.index("Predicted throughput")].split())  # the words above the tables, unwrapped


def test_an_unmet_deadline_and_budget_are_answered_with_what_to_change(monkeypatch, capsys) -> None:
    said = _answer(monkeypatch, capsys, "--deadline-h", "0.5", "--budget", "1")
    hours = re.search(r"cheapest within deadline: none: no layout finishes within --deadline-h with 90% confidence; "
                      r"the surest, 16 workers on 16\*g3\.4xlarge on-demand, takes up to ([0-9.]+) h\.", said)
    assert hours and float(hours[1]) > 0.5, said  # the surest layout's bad end, over the deadline
    assert f"raise --deadline-h to at least {hours[1]}" in said and "--predict-workers" in said, said
    assert "--instance-types" in said and "lower --confidence (now 90%)" in said, said
    dollars = re.search(r"fastest within budget: none: no layout costs at most --budget with 90% confidence; the "
                        r"surest, [^$]+ costs up to \$([0-9.,]+)\.", said)
    assert dollars and float(dollars[1].replace(",", "")) > 1, said  # over the budget
    raise_to = re.search(r"raise --budget to at least ([0-9.]+)", said)
    assert raise_to and float(raise_to[1]) >= float(dollars[1].replace(",", "")), said
    code, err, out = run_entry(["plan", "--from-csv", str(SEED004), "--instance-types", "g3.4xlarge", "--deadline-h",
                                "0.5", "--budget", "1", "--format", "json"], monkeypatch, capsys)
    rows = json.loads(out)  # the surest layout's bad ends, as the candidates' rows have them
    up = lambda x: math.ceil(x * 100 - 1e-9) / 100  # noqa: E731 - rounded up: "at least" that much suffices
    assert float(hours[1]) == up(min(r["hours_high"] for r in rows)), (hours[1], rows)
    # the price as the candidates table reads it (`dollars_text`); the flag's value rounded up to a cent
    assert dollars[1] == dollars_text(min(r["dollars_high"] for r in rows)), (dollars[1], rows)
    assert float(raise_to[1]) == up(min(r["dollars_high"] for r in rows)), (raise_to[1], rows)
    assert "--market spot" in said, said


def test_the_plan_page_answers_an_unmet_deadline_as_the_terminal_does(monkeypatch, capsys, tmp_path) -> None:
    """plan.html listed the met recommendations only: with no layout within --deadline-h its Recommendation
    section was gone, without the surest layout or what to change."""
    code, err, out = run_entry(["plan", "--from-csv", str(SEED004), "--instance-types", "g3.4xlarge", "--deadline-h",
                                "0.5", "--budget", "1000", "--out", str(tmp_path / "plan")], monkeypatch, capsys)
    assert code == 0, err
    page = (tmp_path / "plan" / "plan.html").read_text()
    section = page[page.index("Recommendation"):page.index("Scaling models")]
    assert "<b>cheapest within deadline</b>: none: no layout finishes within --deadline-h" in section, section
    assert "raise --deadline-h to at least" in section and "<b>fastest within budget</b>: " in section, section
    assert "fastest within budget</b>: none" not in section  # met: its layout, as before


def test_a_met_limit_keeps_its_recommendation_and_no_none(monkeypatch, capsys) -> None:
    said = _answer(monkeypatch, capsys, "--deadline-h", "5", "--budget", "1", "--market", "both")
    assert "cheapest within deadline: 4 workers on" in said and "deadline: none" not in said, said
    assert "fastest within budget: none" in said and "--market spot" not in said, said  # spot is priced already


TWO_SWEEPS = ("label,workers,throughput\n"
              "nmt-tiny fused fp32 ddp strong global-batch=64 steps=300,1,1000\n"
              "nmt-tiny fused fp32 ddp strong global-batch=64 steps=300,2,1800\n"
              "nmt-tiny fused fp32 ddp strong global-batch=128 steps=400,1,1100\n"
              "nmt-tiny fused fp32 ddp strong global-batch=128 steps=400,2,2000\n")


def test_long_series_labels_fold_no_row_at_80_columns(tmp_path) -> None:
    """Two sweeps of one model: each row's label folded into five or six lines at 80 columns. Their common words
    go into the title, and where the rest is still too wide each series is a letter named above the table."""
    from tests.conftest import launch

    (tmp_path / "two.csv").write_text(TWO_SWEEPS)
    proc = launch("plan", "--from-csv", "two.csv", "--measured-on", "g3.4xlarge", "--instance-types", "g3.4xlarge",
                  "--work", "1e9", cwd=tmp_path, env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert "every series nmt-tiny fused fp32 ddp strong" in " ".join(out.split()), out
    assert "series: A = global-batch=64 steps=300; B = global-batch=128 steps=400" in out, out
    candidates = out[out.index("Candidates"):]
    lines = candidates.splitlines()
    body = lines[next(i for i, line in enumerate(lines) if line.startswith("───")) + 1:]
    body = body[:next(i for i, line in enumerate(body) if line.startswith("pick:"))]
    assert len(body) == 6 and all(line[:2] in ("A ", "B ") for line in body), candidates  # one line a row
    wide = launch("plan", "--from-csv", "two.csv", "--measured-on", "g3.4xlarge", "--instance-types", "g3.4xlarge",
                  "--work", "1e9", cwd=tmp_path, env={"COLUMNS": "160"})
    assert "global-batch=64 steps=300 " in wide.stdout and "series: A =" not in wide.stdout, wide.stdout
