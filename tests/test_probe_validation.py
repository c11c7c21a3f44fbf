"""scalelab/costs/probe_validation.py on a probe directory written by hand (the layout `launch probe` leaves:
probe.json, sweep.json and one run directory per candidate and layout), with step times made of
known parts: compute per type plus an exchange per link class shared by both types."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scalelab.costs.probe_validation import evaluate_probe, probe_runs, probe_summary

# seconds per step: compute of each type at 16 samples per worker, exposed exchange of each layout
COMPUTE_S = {"local-1t": 0.10, "local-2t": 0.25}
EXCHANGE_S = {(1, 1): 0.0, (1, 2): 0.02, (2, 2): 0.05}  # inside a node 0.02, across nodes 0.03 more
WORDS_PER_SAMPLE = 10


def _run(probe: Path, name: str, itype: str, nodes: int, gpus: int) -> None:
    from scalelab.core.spec import Spec, save_spec

    run, workers = probe / name, nodes * gpus
    (run / "records").mkdir(parents=True)
    spec = Spec()
    spec.nodes, spec.gpus_per_node, spec.steps, spec.batch_per_worker = nodes, gpus, 30, 16
    spec.backend_options, spec.name = {"instance_type": itype}, f"nmt-tiny on {itype}"
    if workers > 1:
        spec.engine.name = "ddp"
    save_spec(spec, run)
    step_s = COMPUTE_S[itype] + EXCHANGE_S[(nodes, gpus)]
    for rank in range(workers):
        recs = [{"kind": "start", "rank": rank, "world": workers, "time": 1000.0, "global_batch": 16 * workers}]
        recs += [{"kind": "step", "rank": rank, "world": workers, "step": k, "epoch": 0, "warmup": k <= 5,
                  "step_s": step_s, "words": 16 * WORDS_PER_SAMPLE, "samples": 16, "loss": 5.0 - 0.01 * k,
                  "time": 1000.0 + k * step_s} for k in range(1, 31)]
        (run / "records" / f"rank-{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def _probe(tmp_path: Path, skip: str | None = None) -> Path:
    probe = tmp_path / "probe-nmt-tiny"
    probe.mkdir()
    cands, names = [], []
    for itype in COMPUTE_S:
        runs = [f"{itype}-{n}x{g}" for n, g in EXCHANGE_S]
        for (n, g), name in zip(EXCHANGE_S, runs):
            if name != skip:
                _run(probe, name, itype, n, g)
        cands.append({"name": itype, "gpus": 2, "layouts": [list(k) for k in EXCHANGE_S], "runs": runs})
        names += runs
    (probe / "probe.json").write_text(json.dumps({"backend": "local", "mode": "weak", "candidates": cands}))
    (probe / "sweep.json").write_text(json.dumps({"runs": names}))
    return probe


def test_probe_runs_read_every_layout_of_both_types(tmp_path: Path) -> None:
    runs = probe_runs(_probe(tmp_path))
    assert list(runs["instance_type"]) == ["local-1t"] * 3 + ["local-2t"] * 3
    assert list(runs["layout"]) == ["1x1", "1x2", "2x2"] * 2 and set(runs["batch_scaling"]) == {"growing"}
    one = runs.set_index(["instance_type", "layout"])["throughput"]
    # weak scaling: every worker does 160 words a step
    assert one[("local-2t", "2x2")] == pytest.approx(4 * 160 / 0.30)
    assert one[("local-1t", "1x1")] == pytest.approx(160 / 0.10)
    assert runs["step_s_median"].tolist() == pytest.approx([0.10, 0.12, 0.15, 0.25, 0.27, 0.30])
    assert runs["step_p90_over_p10"].tolist() == pytest.approx([1.0] * 6)  # every step alike


def test_evaluation_of_a_probe_with_known_parts(tmp_path: Path) -> None:
    rows = evaluate_probe(probe_runs(_probe(tmp_path)), confidence=0.9)
    assert {t: int(n) for t, n in rows["task"].value_counts().items()} == {"own": 2, "cross": 4, "steptime": 4}
    # the second type is predicted at its probe's speed, never at the fitted type's
    assert set(rows.loc[rows["task"] == "cross", "speed_basis"]) == {"probe"}
    assert set(rows.loc[rows["task"] == "own", "speed_basis"]) == {"measured"}
    # the step-time model carries the other type's exchange over exactly: its parts are the truth here
    st = rows[rows["task"] == "steptime"]
    assert st["error"].abs().max() < 1e-6 and st["covered"].all()
    # the probe ratio misses because the exchange is a larger share of the faster type's step
    cross = rows[rows["task"] == "cross"].set_index(["instance_type", "layout"])
    assert cross.loc[("local-2t", "2x2"), "error"] < -0.05 < 0.05 < cross.loc[("local-1t", "2x2"), "error"]
    for _, r in rows.iterrows():  # the error and coverage columns say what the numbers say
        assert r["error"] == pytest.approx(r["predicted"] / r["measured"] - 1)
        assert r["covered"] == (r["low"] <= r["measured"] <= r["high"])
    summary = {s["task"]: s for s in probe_summary(rows)}
    assert summary["steptime"]["mean_abs_error"] < 1e-6 and summary["cross"]["predictions"] == 4


@pytest.mark.slow
def test_a_missing_run_is_left_out_and_the_cli_reports_json(tmp_path: Path) -> None:
    probe = _probe(tmp_path, skip="local-2t-2x2")
    rows = evaluate_probe(probe_runs(probe))
    assert not ((rows["instance_type"] == "local-2t") & (rows["layout"] == "2x2")).any()
    done = subprocess.run([sys.executable, "-m", "scalelab.costs.validation", "--probe", str(probe)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert len(out["runs"]) == 5 and {s["task"] for s in out["summary"]} == {"own", "cross", "steptime"}


def test_not_a_probe_directory_is_one_clear_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "scalelab.costs.validation", "--probe", str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2 and "no probe.json; give a directory `launch probe` made" in done.stderr
    assert "Traceback" not in done.stderr
