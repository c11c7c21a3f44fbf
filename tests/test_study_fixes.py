"""The studies' review defects, each pinned: money on wall time, speedups against the study's baseline,
tables printed intact on any terminal, the GEMM study's progress, noise and report, the seed's GEMM
names, and what ran at which scale."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest

from scalelab.launcher.study import load_study
from tests.conftest import ROOT, launch, study_made_once

EXAMPLES = ROOT / "examples"


def _layout(label: str, nodes: int, gpn: int, words_per_s: float, wall_to_threshold_s: float | None = None):
    from scalelab.analysis.scaling import LayoutSummary

    fields = {f: None for f in LayoutSummary.__dataclass_fields__}
    fields.update(label=label, workers=nodes * gpn, nodes=nodes, gpus_per_node=gpn, mode="strong", global_batch=8,
                  steps_measured=4, steps_warmup=0, steps_incomplete=0, words_per_s=words_per_s, samples_per_s=1.0,
                  step_s_mean=0.5, step_s_median=0.5, step_s_p90=0.5, step_s_std=0.0, loss_threshold=1.0,
                  reached_threshold=wall_to_threshold_s is not None, steps_to_threshold=2 if wall_to_threshold_s else None,
                  time_to_threshold_s=1.0 if wall_to_threshold_s else None, wall_to_threshold_s=wall_to_threshold_s)
    return LayoutSummary(**fields)


def _steps(step_s: float) -> pd.DataFrame:
    from scalelab.analysis.scaling import step_table

    return step_table(pd.DataFrame({"rank": 0, "step": [1, 2, 3, 4], "epoch": [0, 0, 1, 1], "step_s": step_s,
                                    "words": 10, "samples": 1}))


# ---- 1. the money table bills wall time ----------------------------------------------------------


def test_money_total_is_billed_on_wall_time_never_below_the_price_to_threshold():
    """Total Price priced the training seconds (100 s) while the price to the threshold priced the wall
    time (110 s): the total came out smaller. Both are wall time now (docs/costs.md's rule)."""
    from scalelab.analysis.studies import study_runs
    from scalelab.costs.catalog import builtin_catalog
    from scalelab.costs.studies import price_money_table

    data = study_runs([("a/1x1", _layout("a", 1, 1, 100.0, wall_to_threshold_s=110.0), _steps(25.0))],
                      {"a/1x1": {"wall_s": 130.0, "backend": "local"}})
    money = price_money_table(data.rows, {("a", "1x1"): "1*g3.4xlarge"}, "on-demand", builtin_catalog())
    row = money.iloc[0]
    assert row["Wall seconds"] == 130.0 and row["Wall seconds to threshold"] == 110.0
    assert row["Total Price ($)"] == pytest.approx(round(1.14 * 130 / 3600, 4))  # g3.4xlarge $1.14/h, not 100 s
    assert row["Total Price ($)"] >= row["Price to threshold ($)"]
    assert row["Ran on"] == "local" and "Seconds (all steps)" not in money.columns


def test_money_without_a_wall_time_has_no_total_rather_than_the_training_seconds():
    """The reviewer's rows: training 100 s, wall to the threshold 110 s, no wall time to the end known."""
    from scalelab.costs.studies import price_money_table

    rows = pd.DataFrame([{"label": "strong scaling", "nodes": 1, "gpus_per_node": 1, "train_s": 100.0,
                          "wall_to_threshold_s": 110.0, "reached_threshold": True}])
    money = price_money_table(rows, {("strong scaling", "1x1"): "1*g3.4xlarge"}, "on-demand")
    assert money["Total Price ($)"].isna().all() and money["Price to threshold ($)"].iloc[0] > 0


def test_money_hours_have_sensible_precision():
    """7.7 s read "0.0" hours beside "7.7" seconds."""
    from scalelab.analysis.studies import money_table

    rows = pd.DataFrame([{"label": "a", "nodes": 1, "gpus_per_node": 1, "train_s": 0.1, "wall_s": 7.7,
                          "reached_threshold": False},
                         {"label": "a", "nodes": 1, "gpus_per_node": 2, "train_s": 1.0, "wall_s": 35920.0,
                          "reached_threshold": False}])
    money = money_table(rows, {}, "on-demand", lambda mix, s, m: 0.0)
    assert money["Wall hours"].tolist() == [0.00214, 9.98]


# ---- 2. speedups against the study's baseline, said where they are shown -------------------------


def test_a_single_layout_variant_is_measured_against_the_baseline_not_itself():
    """Even when it comes first in the study: its base was rows.iloc[0], itself (speedup 1.00)."""
    from scalelab.analysis.studies import seed_table, speedup_note, study_runs

    data = study_runs([("arr/2x1", _layout("same 2 arranged", 2, 1, 50.0), _steps(1.0)),
                       ("s/1x1", _layout("strong", 1, 1, 100.0), _steps(1.0)),
                       ("s/1x2", _layout("strong", 1, 2, 150.0), _steps(1.0))])
    assert data.baseline == "strong 1x1"
    assert data.rows.set_index("run")["speedup"].to_dict() == pytest.approx({"arr/2x1": 0.5, "s/1x1": 1.0, "s/1x2": 1.5})
    for name, col in (("arrangement", "Speed-up base"), ("throughput", "Speedup base")):
        table = seed_table(name, data)
        assert table[col].tolist() == ["strong 1x1"] * 3, name
    note = speedup_note(data)
    # its only layout: report.md shows no speedup for it (scaling._alone_on_many), not 1.00
    assert "strong 1x1" in note and "same 2 arranged, of one layout, show(s) none there" in note, note


def test_study_markdown_carries_each_tables_note():
    from scalelab.analysis.studies import money_note, seed_table, study_markdown, study_runs

    data = study_runs([("s/1x1", _layout("strong", 1, 1, 100.0), _steps(1.0))])
    text = study_markdown("T", "the seed", "strong", ["strong"], {"throughput": seed_table("throughput", data)},
                          "report.md", "Here (--scale test): x", {"throughput": "NOTE-THROUGHPUT"})
    assert text.index("| strong |") < text.index("NOTE-THROUGHPUT") < text.index("## Scaling")
    assert "Here (--scale test): x" in text
    assert "local backend" in money_note("on-demand", ["local", "local"])


# ---- 3. study tables on the terminal: every cell as written, nothing cut ---------------------------


def _printed(path: Path, width: int) -> str:
    from rich.console import Console

    from scalelab.launcher.study import show_study

    buf = io.StringIO()
    show_study(path, Console(file=buf, width=width, color_system=None, force_terminal=False))
    return buf.getvalue()


@pytest.mark.parametrize("width", [80, 200])
def test_study_tables_print_every_cell_intact(tmp_path, width):
    """`1*p2.xlarge+1*g3.4xlarge` lost its stars to Markdown italics and columns were cut at 100 columns
    (`cudnn_ls…`, `1*g3.4xl…`): each cell's text appears whole on one line, at 80 and 200 columns."""
    from scalelab.analysis.report import markdown_table

    money = pd.DataFrame({"Experiment": ["cudnn_lstm independent replicas 1x2", "p2 + g3 dynamic balancer 1x2"],
                          "Ran on": ["local", "local"], "Instances": ["2*g3.4xlarge", "1*p2.xlarge+1*g3.4xlarge"],
                          "Wall seconds": [7.7, 12.5], "Wall hours": [0.00214, 0.00347],
                          "Total Price ($)": [0.038, 0.034], "Wall seconds to threshold": [6.1, 3.0],
                          "Price to threshold ($)": [0.038, 0.034]})
    small = pd.DataFrame({"variant": ["a|b", "c"], "workers": [1, 2]})
    path = tmp_path / "study.md"
    path.write_text(f"# Study\n\nSome *prose* 1*x.\n\n## Money\n\n{markdown_table(money)}\n\n## Small\n\n"
                    f"{markdown_table(small)}\n")
    out = _printed(path, width)
    lines = out.splitlines()
    for cell in [*map(str, money.astype(str).values.ravel()), "a|b"]:
        assert any(cell in line for line in lines), (cell, out)
    assert "…" not in out and "|---" not in out
    assert max(len(line) for line in lines if not line.startswith("study report:")) <= width
    assert "Some *prose* 1*x." in out
    if width == 200:  # the wide terminal draws the money table as one table, each row on one line
        assert any("1*p2.xlarge+1*g3.4xlarge" in line and "p2 + g3 dynamic balancer 1x2" in line for line in lines)


# ---- 4 and 5. the GEMM study: progress, noise, its report, the seed's op names ----------------------


def test_gemm_sweep_reports_progress_spread_and_the_seeds_op_names():
    from scalelab.train.bench import gemm_sweep, step_sweep

    seen = []
    rows = gemm_sweep([64], [16, 32], repeats=3, progress=lambda done, total, pts: seen.append((done, total, len(pts))))
    assert seen == [(1, 2, 3), (2, 2, 3)]
    assert [r["op"] for r in rows[:3]] == ["NN forward", "TN backward", "NT update"]  # as the seed and cuBLAS
    assert all(r["spread"] >= 0 for r in rows)
    seen.clear()
    steps = step_sweep("rnnlm-tiny", [16], [1, 2], steps=3, progress=lambda d, t, pts: seen.append((d, t)))
    assert seen == [(1, 2), (2, 2)] and all("spread" in r for r in steps)


def test_timing_spread_is_the_interquartile_range_over_the_median():
    from scalelab.train.bench import timing_spread

    assert timing_spread([1.0, 1.0, 1.0, 1.0, 1.0]) == 0.0
    assert timing_spread([1.0, 1.0, 1.0, 1.0, 9.0]) == 0.0  # one outlier does not make a point noisy
    assert timing_spread([1.0, 1.5, 2.0, 2.5, 3.0]) == pytest.approx(0.5)


def test_batch_advice_ignores_noisy_points():
    """A noisy dip is not counted, and a noisy peak above the steady best withholds the advice."""
    from scalelab.analysis.studies import batch_knees, knee_advice

    dip = pd.DataFrame({"hidden": 64, "batch": [1, 8, 16, 32], "words_per_s": [1000.0, 4700.0, 3700.0, 5000.0],
                        "spread": [0.05, 0.05, 0.6, 0.05]})
    k = batch_knees(dip, "words_per_s")[64]
    assert (k.batch, k.best_batch, [b for b, _, _ in k.noisy]) == (8, 32, [16])
    line = knee_advice(64, "the step", "words/s", k)
    assert "at batch 8" in line and "not counted" in line and "16 (60%)" in line
    peak = dip.assign(words_per_s=[1000.0, 5794.0, 4842.0, 4641.0], spread=[0.05, 0.5, 0.05, 0.05])
    line = knee_advice(64, "the step", "words/s", batch_knees(peak, "words_per_s")[64])
    assert "no advice" in line and "5,794" in line
    noisy = dip.assign(spread=0.9)
    assert "no batch was measured steadily" in knee_advice(64, "the step", "words/s", batch_knees(noisy, "words_per_s")[64])


def test_gemm_study_writes_as_it_goes_says_where_it_is_and_reports(tmp_path, capsys):
    from scalelab.launcher.study import GEMM_FILE, gemm_study, report_gemm

    recipe = tmp_path / "gemm.yaml"
    recipe.write_text("title: 'G'\nseed_scale: the seed's GPUs\nkind: gemm\ngemm: {hiddens: [256]}\n"
                      "scales:\n  tiny:\n    gemm: {hiddens: [64], batches: [16, 32], preset: rnnlm-tiny, step_hiddens: [16]}\n")
    path = gemm_study(load_study(recipe, "tiny"), tmp_path / "runs")
    err = capsys.readouterr().err
    assert "[gemm 1/2] hidden 64, batch 16" in err and "[step 2/2] hidden 16, batch 32" in err
    meta = json.loads((path.parent / GEMM_FILE).read_text())
    assert meta["complete"] and meta["scale"] == "tiny" and meta["kind"] == "gemm"
    text = path.read_text()
    assert "Here (--scale tiny)" in text and "hidden 64" in text and "the seed's GPUs" in text
    assert "TN backward" in text and "NT update" in text and "column-major" in text and "NT backward" not in text
    assert set(pd.read_csv(path.parent / "gemm.csv")["op"]) == {"NN forward", "TN backward", "NT update"}
    report_gemm([path.parent], None, "html")
    page = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert page == path.parent / "report.html" and "Where to pick the batch" in page.read_text()
    report_gemm([path.parent], None, "json")
    assert json.loads(capsys.readouterr().out)["advice"]
    # `launch report DIR` and `launch ls` find it by its gemm.json (they refused it / did not list it)
    proc = launch("report", str(path.parent), "--format", "html", cwd=tmp_path)
    assert proc.returncode == 0 and "report.html" in proc.stdout, proc.stderr[-2000:]
    listed = launch("ls", "--runs-dir", str(path.parent.parent), "--format", "json", cwd=tmp_path)
    rows = json.loads(listed.stdout)
    assert [(r["name"], r["kind"], r["state"]) for r in rows] == [(path.parent.name, "gemm", "COMPLETED")], listed.stdout


# ---- 6. what ran, at which scale ------------------------------------------------------------------


def test_study_md_says_what_ran_at_its_scale_not_the_seeds_or_cpus():
    from scalelab.launcher.study import scaling_here

    for path in EXAMPLES.glob("seed*.yaml"):
        assert "Here" not in load_study(path).seed_scale, path  # what ran is made from what ran
    here = scaling_here(load_study(EXAMPLES / "seed004-sentiment.yaml", "test"))
    assert "--scale test" in here and "sentiment-tiny" in here and "sentiment-small" not in here
    assert "20 steps" in here and "1x1, 1x2, 2x1" in here
    assert "the file's base scale" in scaling_here(load_study(EXAMPLES / "seed004-sentiment.yaml"))


def test_study_json_records_the_scale(tmp_path, monkeypatch):
    """study.json (written before the first run, with every variant's sweep) names the scale and the command
    line's overrides, and the study file is copied beside it: what `launch resume STUDY` loads again."""
    import scalelab.launcher.study as study_mod

    ran = []
    monkeypatch.setattr(study_mod, "continue_sweep", lambda backend, sweep, within: ran.append((sweep, within)))
    source = EXAMPLES / "seed004-sentiment.yaml"
    study_dir = study_mod.run_study(load_study(source, "test", {"backend": "local"}), tmp_path)
    meta = json.loads((study_dir / "study.json").read_text())
    assert meta["scale"] == "test" and meta["overrides"] == {"backend": "local"} and len(meta["sweeps"]) == 3
    assert [sweep.name for sweep, _ in ran] == [s["dir"] for s in meta["sweeps"]]
    assert all(within == study_dir for _, within in ran)
    assert (study_dir / "study.yaml").read_bytes() == source.read_bytes()


@pytest.mark.slow
def test_seed004_money_and_speedups_end_to_end(tmp_path_factory):
    study, printed = study_made_once(tmp_path_factory, EXAMPLES / "seed004-sentiment.yaml", "--scale", "test")
    money = pd.read_csv(study / "money.csv")
    assert (money["Wall seconds"] >= money["Wall seconds to threshold"]).all()
    assert (money["Total Price ($)"] >= money["Price to threshold ($)"]).all()
    assert "1*p2.xlarge+1*g3.4xlarge" in printed  # printed whole
    thr = pd.read_csv(study / "throughput.csv")
    assert set(thr["Speedup base"]) == {"strong scaling 1x1"}
    assert json.loads((study / "study.json").read_text())["scale"] == "test"
    assert "sentiment-tiny" in (study / "study.md").read_text()


def test_a_study_dry_run_names_its_placeholder_as_the_real_study_is_named(tmp_path, monkeypatch, capsys):
    """`launch study --dry-run` wrote every request under RUNS/study-DRYRUN whatever the study; run, sweep and probe
    dry runs name theirs NAME-DRYRUN (`dryrun_dir`) after the name the real directory gets."""
    from tests.conftest import run_entry

    runs = tmp_path / "runs"
    code, err, out = run_entry(["study", str(EXAMPLES / "seed001-nmt-data-parallel.yaml"), "--scale", "test",
                                "--dry-run", "--runs-dir", str(runs)], monkeypatch, capsys)
    assert code == 0, err
    assert f"{runs}/study-seed-001-DRYRUN/1x2" in out and "study-DRYRUN" not in out, out[-2000:]
    assert not runs.exists()
