"""`launch plan` fixes (second round): `--predict` past the measured node counts is bounded and said so, absurd
layouts, misspelt or absurd `--speed`, GPU-hour rates at several GPUs per node, and clearer one-line errors."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import pytest
from conftest import launch

DATA = Path(str(files("scalelab.costs") / "data"))
MONEY = DATA / "seed004_money_speed.csv"
SCALING = DATA / "seed004_sentiment_scaling.csv"


def _env(tmp_path: Path) -> dict[str, str]:
    return {"SCALELAB_PRICES": str(tmp_path / "no-user-prices.json")}


def _refused(r, *words: str) -> None:
    """One clear line, exit 2, no traceback, naming every one of `words`."""
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


def _rows(r) -> list[dict]:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_predict_past_the_measured_nodes_loses_efficiency_and_says_how_far(tmp_path):
    """Before, 16 and 256 g3.4xlarge nodes scaled almost linearly (3,895 s and 250 s: 256 workers as efficient
    as 16) because the across-node latency fitted to zero."""
    rows = {r["layout"]: r for r in _rows(launch(
        "plan", "--from-csv", str(MONEY), "--predict", "16x1@16*g3.4xlarge,256x1@256*g3.4xlarge", "--format", "json",
        cwd=tmp_path, env=_env(tmp_path)))}
    t16, t256 = rows["16x1@16*g3.4xlarge"]["predicted_time_s"], rows["256x1@256*g3.4xlarge"]["predicted_time_s"]
    assert t256 * 256 > 2 * t16 * 16  # GPU-seconds grow: the exchange grows with the nodes
    r = launch("plan", "--from-csv", str(MONEY), "--predict", "256x1@256*g3.4xlarge", cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 0 and "extrapolation to 256 nodes, 64x the most nodes measured (4)" in " ".join(
        (r.stdout + r.stderr).split()), r.stderr


def test_the_two_planners_agree_within_their_bands_at_16_workers(tmp_path):
    layout = _rows(launch("plan", "--from-csv", str(MONEY), "--predict", "16x1@16*g3.4xlarge", "--format", "json",
                          cwd=tmp_path, env=_env(tmp_path)))[0]
    workers = [r for r in _rows(launch("plan", "--from-csv", str(SCALING), "--instance-types", "g3.4xlarge",
                                       "--predict-workers", "16", "--format", "json", cwd=tmp_path, env=_env(tmp_path)))
               if r.get("workers") == 16][0]
    w_point, w_low, w_high = (workers[k] * 3600 for k in ("hours", "hours_low", "hours_high"))
    assert w_low <= layout["predicted_time_s"] <= w_high
    assert layout["time_low_s"] <= w_point <= layout["time_high_s"]


def test_an_absurd_layout_is_refused_in_one_line(tmp_path):
    r = launch("plan", "--from-csv", str(MONEY), "--predict", "1000000x1@1000000*g3.4xlarge", cwd=tmp_path,
               env=_env(tmp_path))
    _refused(r, "1000000", "at most 4096 nodes")


@pytest.mark.parametrize("speed, words", [(["V10=3"], ["V10", "did you mean V100"]),
                                          (["V100=3", "Z99=5"], ["Z99"]),
                                          (["A10G=1e300"], ["1e300", "<= 1000"])])
def test_a_speed_that_cannot_apply_is_refused(tmp_path, speed, words):
    """Before, V10 and Z99 were ignored without a word and A10G=1e300 priced rows at 0 s."""
    flags = [x for s in speed for x in ("--speed", s)]
    r = launch("plan", "--from-csv", str(SCALING), "--instance-types", "g3.4xlarge,p3.2xlarge", *flags,
               "--deadline-h", "3", cwd=tmp_path, env=_env(tmp_path))
    _refused(r, *words)


@pytest.mark.parametrize("layout", ["1x2@slurm", "1x2@2*slurm"])
def test_a_gpu_hour_rate_holds_any_gpus_per_node_billed_per_gpu(tmp_path, layout):
    """Before, 1x2@slurm said slurm has 1 GPU, and 1x2@2*slurm said to write 1x2@1*slurm."""
    f = tmp_path / "sl.csv"
    f.write_text("label,workers,nodes,instance_type,time_s\na,1,1,slurm,100\na,2,1,slurm,60\n")
    (row,) = _rows(launch("plan", "--from-csv", str(f), "--rate", "slurm=0.45/gpu-hour", "--predict", layout,
                          "--format", "json", cwd=tmp_path, env=_env(tmp_path)))
    assert row["instance_type"] == "2*slurm" and row["workers"] == 2
    assert row["dollars"] == pytest.approx(2 * max(60, row["predicted_time_s"]) * 0.45 / 3600)


def test_small_messages_name_the_problem(tmp_path):
    r = launch("plan", "--from-csv", str(SCALING), "--predict-batch", "8,16,64,0", cwd=tmp_path, env=_env(tmp_path))
    _refused(r, "'0'")
    r = launch("plan", "--from-csv", str(SCALING), "--instance-types", "1*p2.xlarge+3*g3.4xlarge", cwd=tmp_path,
               env=_env(tmp_path))
    _refused(r, "--predict")
    assert "known:" not in r.stderr


def test_one_reason_per_cause_and_grammar():
    from scalelab.costs.cli import _none_named, _one_reason_each

    why = ("not priced, its speed cannot be estimated relative to the device; give --measured-on TYPE, "
           "--speed A10G=FACTOR, or probe it")
    line = _one_reason_each([f"g5.xlarge: {why}", f"g5.12xlarge: {why}"])
    assert line.count("not priced") == 1 and line.startswith("g5.xlarge, g5.12xlarge: ")
    assert _none_named(["run-1"]) == "run-1 names none" and _none_named(["a", "b"]) == "a, b name none"
