"""`launch report --from-csv`, `launch cost`, `launch plan` through the real CLI (subprocess).

Published tables are the test data: seed 001's words/s per GPU count (speedups to the second
decimal) and seed 004's money-speed table (dollars to the cent). Run directories for `launch plan
RUN_DIR...` are written here in the record format of docs/records.md (the analysis under test reads
records, it does not train)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import launch, run_entry
from test_catalog import SEED_004, seed_mix
from test_scaling import SEED_001


@pytest.fixture(autouse=True)
def _prices(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "no-user-prices.json"))


def _env(tmp_path):
    return {"SCALELAB_PRICES": str(tmp_path / "no-user-prices.json")}


def _seed_001_csv(path: Path, column: str = "throughput") -> Path:
    lines = [f"label,workers,{column},mode"]
    for kind, rows in SEED_001.items():
        for gpus, t20, words, _ in rows:
            lines.append(f"{kind},{gpus},{words if column == 'throughput' else t20},weak")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("column", ["throughput", "time_s"])
def test_report_from_csv_reproduces_seed_001_speedups(tmp_path, column):
    csv = _seed_001_csv(tmp_path / "seed001.csv", column)
    r = launch("report", "--from-csv", str(csv), "--format", "json", cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert len(rows) == sum(len(v) for v in SEED_001.values())
    published = {(k, g): s for k, v in SEED_001.items() for g, _, _, s in v}
    for row in rows:
        assert {"label", "workers", column, "speedup", "efficiency"} <= set(row)
        s = published[(row["label"], row["workers"])]
        if s is None:
            assert row["speedup"] == pytest.approx(1.0)
        else:
            assert round(row["speedup"], 2) == pytest.approx(s, abs=0.0100001)
            assert row["efficiency"] == pytest.approx(row["speedup"] / row["workers"])


@pytest.mark.slow
def test_report_from_csv_writes_markdown_and_html(tmp_path):
    csv = _seed_001_csv(tmp_path / "seed001.csv")
    out = tmp_path / "rep"
    r = launch("report", "--from-csv", str(csv), "--out", str(out), cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "5.50" in r.stdout  # ps_cudnn_lstm, 8 GPUs
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 2 and "<img" in html and 'src="speedup' not in html
    assert (out / "report.md").exists()


@pytest.mark.slow
def test_cost_from_csv_reproduces_seed_004(tmp_path):
    csv = tmp_path / "seed004.csv"
    csv.write_text("label,seconds,instances\n" + "".join(
        f'"{name}",{sec},{seed_mix(p2, g3, g316)}\n' for name, p2, g3, g316, sec, _, _ in SEED_004))
    r = launch("cost", "--from-csv", str(csv), "--format", "json", cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["label"] for row in rows] == [s[0] for s in SEED_004]
    for row, (_, _, _, _, _, hours, dollars) in zip(rows, SEED_004):
        assert round(row["hours"], 2) == pytest.approx(hours)
        # the seed multiplied rounded hours by the price; ours is exact per-second billing
        assert round(round(row["hours"], 2) * row["usd_per_hour"] + 1e-9, 2) == pytest.approx(dollars)
        assert abs(row["dollars"] - dollars) <= 0.005 * row["usd_per_hour"] + 0.005 + 1e-9


@pytest.mark.slow
def test_cost_errors_are_one_line(tmp_path):
    cases = {
        "label,seconds,instances\na,10,g9.huge\n": "unknown instance type 'g9.huge'; known: ",
        "label,seconds,instances\na,ten,g3.4xlarge\n": ":2: column 'seconds': expected a run's length in seconds, > 0",
        "label,secs,instances\na,10,g3.4xlarge\n": "missing column 'seconds'",
        "label,seconds,instances,market\na,10,g3.4xlarge,reserved\n": ":2: column 'market': expected on-demand or spot",
    }
    for i, (text, expected) in enumerate(cases.items()):
        f = tmp_path / f"bad{i}.csv"
        f.write_text(text)
        r = launch("cost", "--from-csv", str(f), cwd=tmp_path, env=_env(tmp_path))
        assert r.returncode == 2, r.stdout
        assert expected in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.slow
def test_cost_spot_market_uses_spot_price(tmp_path):
    f = tmp_path / "c.csv"
    f.write_text("label,seconds,instances,market\nspot,3600,p2.xlarge,spot\nod,3600,p2.xlarge,\n")
    rows = json.loads(launch("cost", "--from-csv", str(f), "--format", "json", cwd=tmp_path, env=_env(tmp_path)).stdout)
    assert rows[0]["dollars"] == pytest.approx(0.1288) and rows[1]["dollars"] == pytest.approx(0.9)


@pytest.mark.slow
def test_plan_from_csv_predicts_requested_workers(tmp_path):
    f = tmp_path / "s.csv"
    rows = SEED_001["replica_cudnn_lstm"][:4]
    f.write_text("label,workers,throughput\n" + "".join(f"r,{g},{w}\n" for g, _, w, _ in rows))
    r = launch("plan", "--from-csv", str(f), "--predict-workers", "5,6,7,8", "--format", "json",
               cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    predicted = [row for row in out if row["predicted"]]
    assert [row["workers"] for row in predicted] == [5, 6, 7, 8]
    for row in predicted:
        assert row["label"] == "r" and row["interval_low"] < row["predicted_throughput"] < row["interval_high"]
    thr = [row["predicted_throughput"] for row in predicted]
    assert thr == sorted(thr) and thr[0] > rows[-1][2]


@pytest.mark.slow
def test_plan_prices_and_recommends(tmp_path):
    f = tmp_path / "s.csv"
    f.write_text("workers,throughput\n" + "".join(f"{g},{w}\n" for g, _, w, _ in SEED_001["replica_cudnn_lstm"][:5]))
    out = tmp_path / "plan"
    r = launch("plan", "--from-csv", str(f), "--predict-workers", "8,16", "--instance-types", "g3.4xlarge,g3.16xlarge",
               "--measured-on", "g3.4xlarge", "--work", "5e9", "--deadline-h", "10", "--format", "json", "--out", str(out),
               cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    rec = [row for row in rows if row["recommendation"]]
    assert len(rec) == 1 and rec[0]["hours"] <= 10
    assert rec[0]["dollars"] == pytest.approx(min(row["dollars"] for row in rows if row["hours"] <= 10))
    html = (out / "plan.html").read_text()
    assert "Pareto" in html or "frontier" in html
    assert html.count("data:image/png;base64,") >= 2


def test_plan_unknown_instance_type(tmp_path):
    f = tmp_path / "s.csv"
    f.write_text("workers,throughput\n1,10\n2,19\n")
    r = launch("plan", "--from-csv", str(f), "--instance-types", "g9.huge", "--work", "100", cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 2 and "unknown instance type 'g9.huge'; known:" in r.stderr
    assert "Traceback" not in r.stderr


def _fake_run(root: Path, name: str, gpus: int, step_s: float, words: int, instance: str | None,
              nodes: int = 1, backend: str = "local") -> Path:
    """A run directory in the docs/records.md format: spec.json + per-rank step records.
    `gpus` is the number of workers, `nodes` of nodes (gpus // nodes per node)."""
    from scalelab.core.spec import Spec, save_spec

    run = root / name
    (run / "records").mkdir(parents=True)
    spec = Spec()
    spec.backend, spec.nodes, spec.gpus_per_node, spec.steps = backend, nodes, gpus // nodes, 30
    if gpus > 1:
        spec.engine.name = "ddp"
    if instance:
        spec.backend_options = {"instance_type": instance}
    save_spec(spec, run)
    for rank in range(gpus):
        recs = [{"kind": "start", "rank": rank, "world": gpus, "time": 1000.0, "global_batch": 64}]
        for step in range(1, 31):
            recs.append({"kind": "step", "rank": rank, "world": gpus, "step": step, "epoch": 0, "warmup": step <= 5,
                         "step_s": step_s * (1.0 + 0.01 * rank), "words": words // gpus, "samples": 64 // gpus,
                         "data_s": 0.1 * step_s, "exchange_s": 0.2 * step_s if gpus > 1 else 0.0,
                         "loss": 5.0 - 0.1 * step, "time": 1000.0 + step * step_s})
        (run / "records" / f"rank-{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return run


@pytest.mark.slow
def test_plan_and_cost_from_run_directories(tmp_path):
    runs = [_fake_run(tmp_path, f"r{g}", g, 0.1 * (1 + 0.1 * g) / g, 6400, "g3.16xlarge") for g in (1, 2, 3, 4)]
    r = launch("plan", *map(str, runs), "--predict-workers", "6,8", "--work", "1e8", "--out", str(tmp_path / "p"),
               "--format", "json", cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {row["workers"] for row in rows} >= {1, 2, 3, 4, 6, 8}
    assert all(row["instance_type"] == "g3.16xlarge" for row in rows)
    html = (tmp_path / "p" / "plan.html").read_text()
    for section in ("Loss against time", "Phase breakdown", "Speedup and efficiency", "Cost against time"):
        assert section in html
    c = launch("cost", str(runs[1]), "--format", "json", cwd=tmp_path, env=_env(tmp_path))
    assert c.returncode == 0, c.stderr
    row = json.loads(c.stdout)[0]
    assert row["instances"] == "1*g3.16xlarge"
    assert row["seconds"] == pytest.approx(30 * 0.1 * 1.2 / 2)
    assert row["dollars"] == pytest.approx(4.56 * 60 / 3600)  # below the 60 s minimum


def test_cost_of_an_aws_run_on_an_instance_mix(tmp_path):
    """An aws run over 1*p2.xlarge+1*g3.4xlarge (two nodes) is billed for both instances for its whole
    time; the run's instance_type is read like --instance-type (it once became '2*1*p2.xlarge+...')."""
    run = _fake_run(tmp_path, "mix", 2, 4.0, 6400, "1*p2.xlarge+1*g3.4xlarge", nodes=2, backend="aws")
    r = launch("cost", str(run), "--format", "json", cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)[0]
    assert row["instances"] == "1*p2.xlarge+1*g3.4xlarge" and row["gpus"] == 2
    assert row["seconds"] == pytest.approx(120.0) and row["billed_seconds"] == 120
    assert row["usd_per_hour"] == pytest.approx(0.90 + 1.14)
    assert row["dollars"] == pytest.approx((0.90 + 1.14) * 120 / 3600)  # $0.068


@pytest.mark.slow
def test_cost_of_runs_reads_instances_with_the_launch_grammar(tmp_path):
    two_nodes = _fake_run(tmp_path, "two", 2, 4.0, 6400, "g3.4xlarge", nodes=2, backend="aws")
    rows = json.loads(launch("cost", str(two_nodes), "--format", "json", cwd=tmp_path, env=_env(tmp_path)).stdout)
    assert rows[0]["instances"] == "2*g3.4xlarge"  # a bare type: every node
    assert rows[0]["dollars"] == pytest.approx(2 * 1.14 * 120 / 3600)
    # --instances: a bare type is one per node of the run; an explicit count (e.g. per-GPU rate) as written
    rows = json.loads(launch("cost", str(two_nodes), "--instances", "g3.16xlarge", "--format", "json",
                             cwd=tmp_path, env=_env(tmp_path)).stdout)
    assert rows[0]["instances"] == "2*g3.16xlarge"
    rows = json.loads(launch("cost", str(two_nodes), "--rate", "slurm=0.5/gpu-hour", "--instances", "2*slurm",
                             "--format", "json", cwd=tmp_path, env=_env(tmp_path)).stdout)
    assert rows[0]["dollars"] == pytest.approx(2 * 0.5 * 120 / 3600)


@pytest.mark.slow
def test_cost_of_a_run_whose_mix_does_not_fit_its_nodes(tmp_path):
    run = _fake_run(tmp_path, "bad", 2, 4.0, 6400, "1*p2.xlarge+3*g3.4xlarge", nodes=2, backend="aws")
    r = launch("cost", str(run), cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "instance_type of the run: the instance mix '1*p2.xlarge+3*g3.4xlarge' has 4 instances" in r.stderr


@pytest.mark.slow
def test_plan_reads_the_runs_instance_type_with_the_mix_grammar(tmp_path):
    """`1*g3.16xlarge` is measured on g3.16xlarge; a mixed run is measured on no single type, so no
    type is priced at its speed without --measured-on (issue 15)."""
    one = [_fake_run(tmp_path, f"one{g}", g, 0.1 / g, 6400, "1*g3.16xlarge") for g in (1, 2)]
    r = launch("plan", *map(str, one), "--predict-workers", "4", "--work", "1e8", "--format", "json",
               cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = [row for row in json.loads(r.stdout) if row.get("instance_type")]
    assert {(row["instance_type"], row["speed_basis"]) for row in rows} == {("g3.16xlarge", "measured")}
    mixed = _fake_run(tmp_path, "mixed", 4, 0.03, 6400, "1*p2.xlarge+1*g3.4xlarge", nodes=2, backend="aws")
    args = ["plan", str(one[1]), str(mixed), "--predict-workers", "8", "--work", "1e8", "--instance-types",
            "g3.4xlarge", "--format", "json"]
    r = launch(*args, cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "g3.4xlarge: not priced, its speed cannot be estimated relative to the device the measurements were " \
           "made on (unknown or not in the catalog: a CPU run, a mix of types" in r.stderr
    r = launch(*args, "--measured-on", "g3.16xlarge", cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = [row for row in json.loads(r.stdout) if row.get("instance_type")]
    assert {(row["instance_type"], row["speed_basis"]) for row in rows} == {("g3.4xlarge", "estimate")}
    assert not any(row["measured"] for row in rows)


@pytest.mark.slow
def test_plan_runs_on_two_types_fit_one_and_probe_the_other(tmp_path):
    """Runs on g3.4xlarge (1, 2, 4 workers) and one on p2.xlarge (1 worker, 1.5x slower): the fit is on
    g3.4xlarge, p2.xlarge is priced at its probed speed; a CPU run prices nothing without a basis."""
    runs = [_fake_run(tmp_path, f"g{g}", g, 0.1 * (1 + 0.05 * g) / g, 6400, "g3.4xlarge") for g in (1, 2, 4)]
    runs.append(_fake_run(tmp_path, "p1", 1, 0.15 * 1.05, 6400, "p2.xlarge"))
    r = launch("plan", *map(str, runs), "--predict-workers", "4", "--work", "1e8", "--instance-types",
               "g3.4xlarge,p2.xlarge,g5.xlarge", "--format", "json", cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = {(row["instance_type"], row["workers"]): row for row in json.loads(r.stdout)}
    assert rows[("g3.4xlarge", 1)]["speed_basis"] == "measured" and rows[("g3.4xlarge", 1)]["measured"]
    assert rows[("p2.xlarge", 1)]["speed_basis"] == "probe"
    assert rows[("p2.xlarge", 1)]["speed_factor"] == pytest.approx(1 / 1.5, rel=1e-3)
    assert rows[("g5.xlarge", 4)]["speed_basis"] == "estimate" and rows[("g5.xlarge", 4)]["speed_widening"] >= 1.6
    cpu = [_fake_run(tmp_path, f"c{g}", g, 0.1 / g, 6400, None) for g in (1, 2)]
    r = launch("plan", *map(str, cpu), "--work", "1e8", "--instance-types", "p2.xlarge,g3.4xlarge", cwd=tmp_path,
               env=_env(tmp_path))
    # one reason for both types, said once (it was repeated once per type in one line)
    assert r.returncode == 2 and "p2.xlarge, g3.4xlarge: not priced, its speed cannot be estimated" in r.stderr
    assert r.stderr.count("not priced") == 1


def test_cost_list_json_has_the_catalog_columns(tmp_path):
    r = launch("cost", "--list", "--format", "json", "--interruptions-per-hour", "0.1", "--interruptions-per-hour",
               "g5.xlarge=0.3", cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = {row["instance_type"]: row for row in json.loads(r.stdout)}
    g5 = rows["g5.xlarge"]
    assert (g5["gpu_model"], g5["network_gbps"], g5["efa"], g5["interconnect"]) == ("A10G", 10.0, False, "PCIe")
    assert g5["gpu_bf16_tflops"] > g5["gpu_fp32_tflops"] > 0 and g5["gpu_mem_bandwidth_gbs"] == 600
    assert g5["spot_interruptions_per_hour"] == 0.3 and rows["p2.xlarge"]["spot_interruptions_per_hour"] is None
    assert rows["p5.48xlarge"]["efa"] is True and rows["p5.48xlarge"]["interconnect"] == "NVLink"
    assert "June 2025" in rows["p4d.24xlarge"]["on-demand_source"] and rows["p4d.24xlarge"]["on-demand_observed"]


@pytest.mark.parametrize("args", [["report", "RUN", "--rate", "nan"], ["report", "RUN", "--rate", "-1/gpu-hour"],
                                  ["report", "RUN", "--prices", "MISSING"], ["cost", "RUN", "--rate", "x=0.../gpu-hour"],
                                  ["cost", "--list", "--rate", "slurm=inf"], ["plan", "--from-csv", "CSV", "--rate", "0.5"]])
def test_a_bad_rate_or_a_missing_prices_file_is_one_error_line(tmp_path, args):
    """NaN, negative, unreadable or unnamed rates and a prices file that is not there: `launch: error:`, exit 2,
    no traceback (`--rate x=0...` was a ValueError's traceback)."""
    run = _fake_run(tmp_path, "r", 1, 0.1, 6400, None)
    csv = _seed_001_csv(tmp_path / "t.csv")
    args = [{"RUN": str(run), "MISSING": str(tmp_path / "missing.json"), "CSV": str(csv)}.get(a, a) for a in args]
    r = launch(*args, cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("launch: error:")]
    assert len(errors) == 1 and ("--rate" in errors[0] or "prices file not found" in errors[0]), r.stderr


def test_predict_layouts_from_runs_on_two_types_uses_every_type(tmp_path, monkeypatch, capsys):
    """Runs on g3.4xlarge (1, 2 nodes) and on p2.xlarge (1 node, 1.8x slower): `--predict` answers a p2
    layout from the p2 run and a g3 layout from the g3 runs, each at its own type's speed (issue 33: the
    layout path kept only the most-run type's rows and asked for a probe)."""
    g3 = [_fake_run(tmp_path, f"g{n}", n, 0.1 * (1 + 0.05 * n), 6400 * n, "g3.4xlarge", nodes=n, backend="aws")
          for n in (1, 2)]
    p2 = _fake_run(tmp_path, "p1", 1, 0.18, 6400, "p2.xlarge", backend="aws")
    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "no-user-prices.json"))
    code, err, out = run_entry(["plan", *map(str, [*g3, p2]), "--predict", "1x1@p2.xlarge,2x1@2*g3.4xlarge,2x1@2*p2.xlarge",
                                "--format", "json"], monkeypatch, capsys)
    assert code == 0, err
    rows = {row["layout"] if "layout" in row else row["label"]: row for row in json.loads(out)}
    thr = {k: v.get("predicted_throughput") or v.get("throughput") for k, v in rows.items()}
    p2_one = next(v for k, v in thr.items() if "1x1" in k and "p2" in k)
    g3_two = next(v for k, v in thr.items() if "2x1" in k and "g3" in k)
    p2_two = next(v for k, v in thr.items() if "2x1" in k and "p2" in k)
    assert p2_one == pytest.approx(6400 / 0.18 / 1.0, rel=0.05)  # the p2 run itself
    assert g3_two == pytest.approx(2 * 6400 / (0.1 * 1.1), rel=0.05)  # the 2-node g3 run itself
    assert p2_one < p2_two < g3_two


def test_cost_over_a_glob_skips_non_runs_and_prices_failed_runs_saying_so(tmp_path, monkeypatch, capsys):
    """`launch cost runs/*` (issue 35): a report folder and a stray file among the runs are skipped with a
    note; a failed run cost money and is priced, its state shown; nothing but non-runs is one error line."""
    from scalelab.core.rundir import record_state, start_state

    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "no-user-prices.json"))
    runs = tmp_path / "runs"
    ok = _fake_run(runs, "ok", 2, 0.1, 6400, "g3.4xlarge", backend="aws")
    failed = _fake_run(runs, "failed", 2, 0.1, 6400, "g3.4xlarge", backend="aws")
    for run, state in ((ok, "COMPLETED"), (failed, "FAILED")):
        start_state(run)
        record_state(run, state)
    (runs / "report-20261127").mkdir()
    (runs / "notes.txt").write_text("x")
    code, err, out = run_entry(["cost", *map(str, sorted(runs.iterdir())), "--format", "json"], monkeypatch, capsys)
    assert code == 0, err
    rows = {Path(r["run_dir"]).name: r for r in json.loads(out)}
    assert set(rows) == {"ok", "failed"} and rows["failed"]["state"] == "FAILED" and rows["failed"]["dollars"] > 0
    assert "skipped 2 path(s) that are not runs" in err and "notes.txt" in err
    code, err, out = run_entry(["cost", str(ok), str(failed)], monkeypatch, capsys)
    assert code == 0 and "FAILED" in out and "state" in out
    code, err, out = run_entry(["cost", str(ok)], monkeypatch, capsys)
    assert code == 0 and "state" not in out  # every run completed: no state column
    code, err, _ = run_entry(["cost", str(runs / "notes.txt"), str(runs / "report-20261127")], monkeypatch, capsys)
    assert code == 2 and "none of the 2 paths is a run" in err and "Traceback" not in err
