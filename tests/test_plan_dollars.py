"""A plan's dollars read the same everywhere: the answer line, plan.md and plan.html round as its candidates
table does (`billing.dollars_text`, as `launch cost` and `launch report`). The answer and the page printed
cents ("$0.32 (up to $0.33)") beside the table's 0.3167 / 0.3277."""

from __future__ import annotations

import json
import re
from pathlib import Path

from scalelab.core.terminal import usd_text
from tests.conftest import run_entry

SEED004 = Path(__file__).resolve().parents[1] / "scalelab" / "costs" / "data" / "seed004_sentiment_scaling.csv"
# a small piece of work: every layout costs under a dollar, where cents and the table's four decimals differ
FLAGS = ["plan", "--from-csv", str(SEED004), "--instance-types", "g3.4xlarge", "--work", "0.01"]


def _cheapest_row(monkeypatch, capsys) -> dict:
    code, err, out = run_entry([*FLAGS, "--format", "json"], monkeypatch, capsys)
    assert code == 0, err
    rows = [r for r in json.loads(out) if r["table"] == "candidates"]
    row = next(r for r in rows if "cheapest" in (r["recommendation"] or ""))
    assert row["dollars_high"] < 1, row  # below a dollar: four decimals, not cents
    return row


def test_the_answer_line_rounds_dollars_as_the_candidates_table(monkeypatch, capsys, tmp_path) -> None:
    row = _cheapest_row(monkeypatch, capsys)
    cell, high = usd_text(row["dollars"]), usd_text(row["dollars_high"])  # finite: `dollars_text` is `usd_text`
    code, err, out = run_entry([*FLAGS, "--out", str(tmp_path / "plan")], monkeypatch, capsys)
    assert code == 0, err
    said = " ".join(out.split())
    answer = re.search(r"cheapest: [^$]+ \$([0-9.,]+) \(up to \$([0-9.,]+)\)", said)
    assert answer and (answer[1], answer[2]) == (cell, high), said
    table = out[out.index("Candidates"):]
    assert re.search(rf"\b{re.escape(cell)}\b.*\b{re.escape(high)}\b.*cheapest", table), table  # the row's cells
    md = (tmp_path / "plan" / "plan.md").read_text()
    assert f"${cell} (up to ${high})" in md, md
    page = (tmp_path / "plan" / "plan.html").read_text()
    assert f"${cell} (up to ${high})" in page, page  # the recommendation
    assert f"{cell} (up to {high})" in page[page.index("Candidates"):], page  # its candidates row
