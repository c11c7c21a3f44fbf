"""Which layout a worker-count plan prices on each instance type, and with which measurement.

Seed 004's table measured 4 GPUs three ways: 1x4 on a g3.16xlarge (13,156 s), 2x2 on two g3.16xlarge
(15,820 s) and 4x1 on four g3.4xlarge (13,973 s). The plan used to price every one of those rows on every
type: three rows "4 workers on 4*g3.4xlarge" (3.65, 3.88 and 4.39 h), and it recommended the first, the
g3.16xlarge's 1x4, as a *measured* 4*g3.4xlarge. Each type now gets one row per layout it can run, a
measured layout answered by its own measurement on its own type.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import run_entry

SEED004 = Path(__file__).resolve().parents[1] / "scalelab" / "costs" / "data" / "seed004_sentiment_scaling.csv"
TYPES = "g3.4xlarge,g3.16xlarge,p2.xlarge"


def _plan_json(tmp_path: Path, monkeypatch, capsys, *flags: str) -> tuple[pd.DataFrame, str]:
    out = tmp_path / "plan"
    code, err, _ = run_entry(["plan", "--from-csv", str(SEED004), "--instance-types", TYPES, "--deadline-h", "5",
                              "--out", str(out), *flags], monkeypatch, capsys)
    assert code == 0, err
    rows = [r for r in json.loads((out / "plan.json").read_text()) if r["table"] == "candidates"]
    return pd.DataFrame(rows), err


def test_each_type_prices_each_layout_once_with_its_own_measurement(tmp_path, monkeypatch, capsys) -> None:
    c, _ = _plan_json(tmp_path, monkeypatch, capsys, "--measured-on", "g3.4xlarge", "--work", "1")
    assert not c.duplicated(["instance_type", "workers", "nodes", "market"]).any(), c
    at4 = c[c["workers"] == 4].set_index(["instance_type", "nodes"])
    small = at4.loc[("g3.4xlarge", 4)]
    assert small["instances"] == 4 and small["measured"]
    assert small["hours"] * 3600 == pytest.approx(13973, rel=0.01)  # its own 4x1, not the g3.16xlarge's 1x4
    one = at4.loc[("g3.16xlarge", 1)]
    assert one["instances"] == 1 and one["measured"] and one["speed_widening"] == 1.0
    assert one["hours"] * 3600 == pytest.approx(13156, rel=0.01)
    two = at4.loc[("g3.16xlarge", 2)]  # measured 2x2 on two g3.16xlarge: kept as measured, both billed
    assert two["instances"] == 2 and two["idle_gpus"] == 4 and two["measured"]
    assert two["hours"] * 3600 == pytest.approx(15820, rel=0.01)
    assert set(at4.loc["p2.xlarge"].index) == {4}  # a type measured never: its packed layout only
    assert not at4.loc[("p2.xlarge", 4)]["measured"]


def test_the_cheapest_within_the_deadline_is_the_measured_1x4(tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "plan"
    code, err, _ = run_entry(["plan", "--from-csv", str(SEED004), "--instance-types", TYPES, "--deadline-h", "5",
                              "--out", str(out)], monkeypatch, capsys)
    assert code == 0, err
    picked = [r for r in json.loads((out / "plan.json").read_text()) if "cheapest within" in (r["recommendation"] or "")]
    assert len(picked) == 1, picked
    cheapest = picked[0]
    assert (cheapest["workers"], cheapest["instance_type"], cheapest["instances"]) == (4, "g3.16xlarge", 1)
    assert cheapest["measured"] and cheapest["dollars"] == pytest.approx(13156 / 3600 * 4.56, rel=0.01)


def test_a_tables_types_of_one_gpu_and_its_whole_job_need_no_flags(tmp_path, monkeypatch, capsys) -> None:
    """The table names g3.4xlarge and g3.16xlarge (both M60) and times one whole job (time_s): without
    --measured-on and --work the plan was refused for every type and for --deadline-h."""
    c, err = _plan_json(tmp_path, monkeypatch, capsys)
    assert {"g3.4xlarge", "g3.16xlarge", "p2.xlarge"} <= set(c["instance_type"])
    said = " ".join(err.split())
    assert "measured on g3.4xlarge (the table's fewest workers" in said, err
    assert "work: one job" in said, err


def test_types_of_two_gpu_models_are_not_guessed(tmp_path, monkeypatch, capsys) -> None:
    table = pd.read_csv(SEED004)
    table.loc[table["instance"] == "g3.16xlarge", "instance"] = "p3.8xlarge"  # V100s beside the M60s
    path = tmp_path / "mixed.csv"
    table.to_csv(path, index=False)
    code, err, _ = run_entry(["plan", "--from-csv", str(path), "--instance-types", TYPES, "--deadline-h", "5"],
                             monkeypatch, capsys)
    assert code != 0 and "Traceback" not in err
    assert "measured on g3.4xlarge (the table's" not in err


def test_a_gpu_hour_rate_keeps_a_measured_1x4_on_one_node() -> None:
    """A rate per GPU-hour has no shape: 4 of its GPUs can be the measured 1x4 (billed 4 GPU-hours an hour)."""
    from scalelab.costs.catalog import builtin_catalog
    from scalelab.costs.planner import PlanRequest, plan

    cat = builtin_catalog()
    cat.add_rate("lab", 0.5, "gpu-hour")
    df = pd.DataFrame({"label": "s", "workers": [1, 4, 4], "nodes": [1, 1, 4], "throughput": [100.0, 380.0, 300.0]})
    c = plan(PlanRequest(df, [1, 4, 8], cat, ["lab"], work=1e6, measured_on="lab")).candidates
    at4 = c[c["workers"] == 4].set_index("nodes")
    assert set(at4.index) == {1, 4} and at4["measured"].all() and (at4["instances"] == 4).all()
    assert at4.loc[1, "predicted_throughput"] == pytest.approx(380.0, rel=1e-6)
    assert at4.loc[4, "predicted_throughput"] == pytest.approx(300.0, rel=1e-6)
    assert (c["idle_gpus"] == 0).all()


def test_a_table_of_named_layouts_is_pointed_at_predict(monkeypatch, capsys) -> None:
    """Seed 004's money-speed table has a series per row: no worker-count fit, and the error says what plans it."""
    table = SEED004.with_name("seed004_money_speed.csv")
    code, err, _ = run_entry(["plan", "--from-csv", str(table)], monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err and err.count("launch: error:") == 1, err
    assert "plan them with --predict LAYOUTS" in err and "--predict 1x1@1*g3.4xlarge" in err, err


def test_a_tables_precision_column_sets_the_speed_conversion(tmp_path, monkeypatch, capsys) -> None:
    """NVIDIA's TF BERT on DGX A100 in mixed precision (DeepLearningExamples): converted to a V100 with the
    fp32 ratio (0.26x) its hours were 2x too many; the published mixed-precision ratio is 0.54x."""
    table = tmp_path / "bert.csv"
    table.write_text("label,workers,nodes,throughput,precision\nbert,1,1,356.845,fp16\nbert,4,1,1422.25,fp16\n"
                     "bert,8,1,2871.89,fp16\n")
    code, err, _ = run_entry(["plan", "--from-csv", str(table), "--predict-workers", "8", "--instance-types",
                              "p3.16xlarge", "--measured-on", "p4d.24xlarge", "--work", "3e9"], monkeypatch, capsys)
    assert code == 0, err
    said = " ".join(err.split())
    assert "V100 against A100 (1 job(s), mixed;" in said and "0.54×" in said, said


def test_a_table_of_two_precisions_is_refused(tmp_path, monkeypatch, capsys) -> None:
    table = tmp_path / "two.csv"
    table.write_text("label,workers,throughput,precision\na,1,100,fp32\na,2,190,fp32\nb,1,300,fp16\nb,2,580,fp16\n")
    code, err, _ = run_entry(["plan", "--from-csv", str(table)], monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err and "split the table into one file per precision" in err, err


def test_measured_on_a_type_too_small_for_the_tables_nodes_is_said(tmp_path, monkeypatch, capsys) -> None:
    """NVIDIA's Tacotron2 on a DGX-1: 8 GPUs on one node, named as measured on p3.8xlarge (4 GPUs): its 8 were
    priced on two p3.8xlarge without a word, the table showing them measured on one node."""
    table = tmp_path / "taco.csv"
    table.write_text("label,workers,nodes,throughput\nt,1,1,9174\nt,4,1,32035\nt,8,1,58703\n")
    code, err, _ = run_entry(["plan", "--from-csv", str(table), "--instance-types", "p3.8xlarge", "--measured-on",
                              "p3.8xlarge", "--work", "2e9"], monkeypatch, capsys)
    assert code == 0, err
    said = " ".join(err.split())
    assert "p3.8xlarge has 4 GPU(s) per instance, but taco.csv ran 8 workers on 1 node(s)" in said, said


def test_small_throughputs_keep_their_digits(tmp_path, monkeypatch, capsys) -> None:
    """Jasper on a DGX-2 (13-188 samples/s): printed as 13 │ 13 │ 13, its band unreadable."""
    from scalelab.core.terminal import number_text

    assert [number_text(v) for v in (13.46, 188.1)] == ["13.5", "188"]
    assert number_text(35920.0) == "35,920"
    assert number_text(2.784e-05) == "0.0000278"
    assert number_text(0.5) == "0.500"


def test_a_plans_rates_read_one_way_whatever_the_confidence(monkeypatch, capsys) -> None:
    """The format of every rate was chosen from the table's smallest: a near-zero low end at 95% printed
    181,005.069 and at 99% 1.81e+05, and a time_s table's jobs per second always 2.784e-05. Each cell now
    reads as itself: whole numbers with separators, small rates in plain decimals, never e-notation."""
    tables = {}
    for level in ("0.9", "0.99"):
        code, err, out = run_entry(["plan", "--from-csv", str(SEED004), "--instance-types", "g3.4xlarge",
                                    "--confidence", level], monkeypatch, capsys)
        assert code == 0, err
        tables[level] = out[out.index("Predicted throughput"):out.index("Candidates")]
    for table in tables.values():
        assert "e-0" not in table and "e+0" not in table, table
        assert "0.0000278" in table, table  # one job in 10 h: 2.784e-05 jobs/s
    from scalelab.core.terminal import number_text

    assert [number_text(v) for v in (181005.069, 3013.474, 0.139, 4.219e-06)] == \
        ["181,005", "3,013", "0.139", "0.00000422"]
