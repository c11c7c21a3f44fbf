"""`launch report` keeps runs that differ in a setting other than the layout in series of their own.

A reviewer's report of two sweeps, one with `--prefetch 2` and one with `--prefetch 0`, showed one series
with two 1x1 rows (speedup 1.00 and 1.14) and no column saying which had prefetch on: the label named only
model, RNN, precision, engine and batch mode. These tests build run directories by hand (a spec.json and
per-rank records in the docs/records.md format, no training) and report them as `launch report` does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.analysis.results import build_report
from scalelab.core.rundir import write_json
from scalelab.core.spec import Spec, save_spec

WORDS = 6400  # words of one step over all ranks
STEPS, WARMUP = 12, 2
PLAIN = "nmt-tiny fused fp32 ddp strong"  # the label of a run of the default spec, as reports said it before


def _run(run_dir: Path, workers: int, step_s: float, nodes: int = 1, **fields) -> Path:
    """A completed run of `workers` ranks (over `nodes` nodes), every step `step_s` long on every rank
    (so its words/s is WORDS / step_s exactly); `fields`: spec fields by dotted key (`data.prefetch`)."""
    (run_dir / "records").mkdir(parents=True)
    spec = Spec(nodes=nodes, gpus_per_node=workers // nodes, steps=STEPS, warmup_steps=WARMUP)
    save_spec(spec.with_overrides(fields), run_dir)
    for rank in range(workers):
        recs = [{"kind": "start", "rank": rank, "world": workers, "time": 1000.0, "global_batch": 64}]
        recs += [{"kind": "step", "rank": rank, "world": workers, "step": step, "epoch": 0, "warmup": step <= WARMUP,
                  "step_s": step_s, "words": WORDS // workers, "samples": 64 // workers, "loss": 5.0 - 0.1 * step,
                  "time": 1000.0 + step * step_s} for step in range(1, STEPS + 1)]
        (run_dir / "records" / f"rank-{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_json(run_dir / "launch.json", {"backend": "local", "state": "COMPLETED", "run_dir": str(run_dir)})
    return run_dir


def _sweep(root: Path, runs: dict[str, tuple]) -> Path:
    """A sweep directory of finished layouts: name -> (workers, step_s, nodes, fields)."""
    root.mkdir(parents=True)
    for name, (workers, step_s, nodes, fields) in runs.items():
        _run(root / name, workers, step_s, nodes, **fields)
    write_json(root / "sweep.json", {"runs": list(runs), "layouts": [[n, w // n] for w, _, n, _ in runs.values()]})
    return root


def _rows(report) -> list[dict]:
    return json.loads(report.json_text)


def _by_label(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["label"], []).append(r)
    return out


def test_two_sweeps_that_differ_in_prefetch_are_two_series_each_over_its_own_1x1(tmp_path):
    """The reviewer's case: --prefetch 2 and --prefetch 0, each swept over 1 and 2 workers."""
    on = _sweep(tmp_path / "sweep-a", {"1x1": (1, 0.100, 1, {"data.prefetch": 2}),
                                       "1x2": (2, 0.060, 1, {"data.prefetch": 2})})
    off = _sweep(tmp_path / "sweep-b", {"1x1": (1, 0.114, 1, {"data.prefetch": 0}),
                                        "1x2": (2, 0.070, 1, {"data.prefetch": 0})})
    report = build_report([on, off], tmp_path / "rep", plots=False)
    series = _by_label(_rows(report))
    assert set(series) == {f"{PLAIN} prefetch=2", f"{PLAIN} prefetch=0"}, list(series)
    for label, step_1, step_2 in ((f"{PLAIN} prefetch=2", 0.100, 0.060), (f"{PLAIN} prefetch=0", 0.114, 0.070)):
        rows = {r["workers"]: r for r in series[label]}
        assert sorted(rows) == [1, 2]
        assert rows[1]["speedup"] == pytest.approx(1.0) and rows[1]["efficiency"] == pytest.approx(1.0)
        assert rows[2]["speedup"] == pytest.approx(step_1 / step_2)
        assert rows[2]["efficiency"] == pytest.approx(step_1 / step_2 / 2)
    # report.json says which setting tells the series apart, as spec.json spells it
    assert {json.dumps(r["settings"]) for r in _rows(report)} == {'{"data.prefetch": 2}', '{"data.prefetch": 0}'}
    md = report.markdown_path.read_text()
    assert f"{PLAIN} prefetch=2" in md and f"{PLAIN} prefetch=0" in md
    assert not any("merged into one series" in w for w in report.warnings), report.warnings


def test_balance_threads_and_replicas_each_split_naming_only_what_differs(tmp_path):
    """Runs given one by one (not in sweeps): each difference is a series of its own, and a label names only
    the fields that differ among the runs reported, in the words of their flags."""
    runs = [
        _run(tmp_path / "static-1x2", 2, 0.10, **{"balance": "static", "threads": 2}),
        _run(tmp_path / "dynamic-1x2", 2, 0.08, **{"balance": "dynamic", "threads": 2}),
        _run(tmp_path / "dynamic-1x1", 1, 0.12, **{"balance": "dynamic", "threads": 2}),
        _run(tmp_path / "static-1x1", 1, 0.12, **{"balance": "static", "threads": 2}),
        _run(tmp_path / "replicas-1x2", 2, 0.07, **{"balance": "static", "threads": 2,
                                                   "independent_replicas": True}),
        _run(tmp_path / "threads-1x1", 1, 0.2, **{"balance": "static", "threads": 1}),
    ]
    rows = _rows(build_report(runs, tmp_path / "rep", plots=False))
    series = _by_label(rows)
    assert set(series) == {
        f"{PLAIN} threads=2 exchange balance=static", f"{PLAIN} threads=2 exchange balance=dynamic",
        f"{PLAIN} threads=2 independent-replicas balance=static", f"{PLAIN} threads=1 exchange balance=static"}
    dynamic = {r["workers"]: r for r in series[f"{PLAIN} threads=2 exchange balance=dynamic"]}
    assert dynamic[1]["speedup"] == pytest.approx(1.0) and dynamic[2]["speedup"] == pytest.approx(0.12 / 0.08)
    static = {r["workers"]: r for r in series[f"{PLAIN} threads=2 exchange balance=static"]}
    assert static[1]["speedup"] == pytest.approx(1.0) and static[2]["speedup"] == pytest.approx(0.12 / 0.10)
    # its only layout, on 2 workers: no smaller layout to be a speedup over (not 1.00 over itself)
    assert all(r["speedup"] is None and r["efficiency"] is None
               for r in series[f"{PLAIN} threads=2 independent-replicas balance=static"])
    assert series[f"{PLAIN} threads=2 exchange balance=dynamic"][0]["settings"] == {
        "threads": 2, "independent_replicas": False, "balance": "dynamic"}


def test_repeats_of_one_spec_stay_one_series_beside_a_variant(tmp_path):
    """`--repeats 2`: the same spec.json twice per layout is one series of repeated measurements (its label as
    before, the common case unchanged), while a sweep that differs in prefetch is another."""
    repeated = _sweep(tmp_path / "sweep-r", {"1x1-r0": (1, 0.100, 1, {}), "1x1-r1": (1, 0.104, 1, {}),
                                             "1x2-r0": (2, 0.060, 1, {}), "1x2-r1": (2, 0.058, 1, {})})
    other = _sweep(tmp_path / "sweep-p", {"1x1": (1, 0.09, 1, {"data.prefetch": 0}),
                                          "1x2": (2, 0.05, 1, {"data.prefetch": 0})})
    series = _by_label(_rows(build_report([repeated, other], tmp_path / "rep", plots=False)))
    assert set(series) == {f"{PLAIN} prefetch=2", f"{PLAIN} prefetch=0"}
    assert sorted(r["workers"] for r in series[f"{PLAIN} prefetch=2"]) == [1, 1, 2, 2]
    alone = _by_label(_rows(build_report([repeated], tmp_path / "rep1", plots=False)))
    assert list(alone) == [PLAIN]  # nothing tells the runs apart: the label as it always was
    assert all(r["settings"] is None for r in alone[PLAIN])
    # the first 1x1 is the base of the series, its repeat is measured against it
    assert sorted(r["speedup"] for r in alone[PLAIN] if r["workers"] == 1) == pytest.approx([0.100 / 0.104, 1.0])


def test_what_a_sweep_derives_from_the_layout_does_not_split_a_series(tmp_path):
    """A sweep with growing work and a fixed batch runs more steps on more workers (12, 24); `launch probe`
    times the links only where there is more than one rank; the layouts differ in nodes; the runs ran under
    different job names (backend options) and seeds. None of it is a setting: one series per balance, which
    is one (the label names balance alone, not steps)."""
    common = {"work_scaling": "growing", "global_batch": 64}
    runs = []
    for balance in ("static", "dynamic"):
        runs += [
            _run(tmp_path / balance / "1x1", 1, 0.10, balance=balance, steps=12, seed=1, **common),
            _run(tmp_path / balance / "1x2", 2, 0.06, balance=balance, steps=24, seed=2, link_probe_mb=[1.0],
                 backend_options={"job_name": "b"}, **common),
            _run(tmp_path / balance / "2x1", 2, 0.07, nodes=2, balance=balance, steps=24, link_probe_mb=[1.0],
                 **common),
        ]
    rows = _rows(build_report(runs, tmp_path / "rep", plots=False))
    series = _by_label(rows)
    growing = PLAIN.replace(" strong", " batch-fixed-work-growing")  # both axes named: it is no strong sweep
    assert set(series) == {f"{growing} balance=static", f"{growing} balance=dynamic"}, list(series)
    for part in series.values():
        layouts = {(r["nodes"], r["gpus_per_node"]): r["speedup"] for r in part}
        assert layouts == pytest.approx({(1, 1): 1.0, (1, 2): 0.10 / 0.06, (2, 1): 0.10 / 0.07})
    # a run outside a sweep (no work axis, the preset's batch left unset) and a strong sweep's runs of the
    # same settings elsewhere (Slurm: no threads set per layout) are one series too
    lone = _run(tmp_path / "slurm" / "1x1", 1, 0.10, backend="slurm", balance="dynamic")
    swept = _run(tmp_path / "slurm" / "1x2", 2, 0.06, backend="slurm", balance="dynamic", work_scaling="fixed",
                 global_batch=16)  # nmt-tiny's own
    local = _run(tmp_path / "local" / "1x1", 1, 0.20, balance="static")
    slurm = _by_label(_rows(build_report([lone, swept, local], tmp_path / "rep2", plots=False)))
    assert sorted(slurm) == [f"{PLAIN} backend=local balance=static", f"{PLAIN} backend=slurm balance=dynamic"]
    assert sorted(r["speedup"] for r in slurm[f"{PLAIN} backend=slurm balance=dynamic"]) == pytest.approx(
        [1.0, 0.10 / 0.06])
