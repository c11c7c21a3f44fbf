"""The review of the seed studies' tables: each figure says what it is computed from, the same dollars read
the same in every command, and a warning's number agrees with its words."""

import pytest
from test_trust import summary  # a layout's summary with every field set

from scalelab.analysis.scaling import scale_layouts, trust_warnings


def test_a_serial_fraction_just_over_one_reads_over_one():
    """1.003 was shown as "1.00 is outside [0, 1]"."""
    table = scale_layouts([summary(1, 1000.0), summary(2, 998.5)])  # e = 2/S - 1 = 1.003
    said = [w for w in trust_warnings(table) if "Karp-Flatt" in w]
    assert len(said) == 1 and "serial fraction 1.003 is outside [0, 1]" in said[0], said


def test_cost_and_report_show_the_same_small_dollars(tmp_path, monkeypatch):
    """Two short runs at $0.45 a GPU-hour, billed 60 s on 1 and 2 GPUs: $0.0075 and $0.0150. `launch report`
    showed those; `launch cost` showed 0.01 for both."""
    from click.testing import CliRunner
    from test_costs_cli import _fake_run

    from scalelab.launcher.cli import main

    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "no-prices.json"))
    _wide_console(monkeypatch)
    runs = [str(_fake_run(tmp_path, f"r{g}", g, 0.1, 6400, None)) for g in (1, 2)]
    cost = CliRunner().invoke(main, ["cost", *runs, "--rate", "0.45/gpu-hour"])
    report = CliRunner().invoke(main, ["report", *runs, "--rate", "0.45/gpu-hour", "--out", str(tmp_path / "rep")])
    assert cost.exit_code == 0 and report.exit_code == 0, (cost.output, report.output)
    for dollars in ("0.0075", "0.0150"):
        assert f"${dollars}" in report.output and f" {dollars} " in cost.output, (dollars, cost.output)
    assert " 0.01 " not in cost.output
    markdown = CliRunner().invoke(main, ["cost", *runs, "--rate", "0.45/gpu-hour", "--format", "markdown"])
    assert "| 0.0075 |" in markdown.output and "| 0.0150 |" in markdown.output, markdown.output


def test_usd_text_keeps_two_significant_digits_below_a_cent():
    from scalelab.core.terminal import usd_text

    assert [usd_text(x) for x in (1234.5, 0.0075, 0.015, 0.000042, 0.0)] == \
        ["1,234.50", "0.0075", "0.0150", "0.000042", "0.0000"]


def _wide_console(monkeypatch):
    """`launch cost`, `report --from-csv` and `report` print on their modules' consoles, sized when first
    imported: 200 columns here, so each table is boxed with a row a line whichever test imported it first."""
    from rich.console import Console

    from scalelab.costs import cli
    from scalelab.launcher import cli as launcher

    for module in (cli, launcher):
        monkeypatch.setattr(module, "console", Console(width=200, color_system=None))


def test_report_from_csv_shows_the_arrangement_its_nodes_give(tmp_path, monkeypatch):
    """Seed 004's 1x4, 2x2 and 4x1 rows of a published table (`nodes` given, no GPUs per node): three rows of
    4 workers read alike in the terminal and report.md; the layout now says which is which."""
    from click.testing import CliRunner

    from scalelab.launcher.cli import main

    _wide_console(monkeypatch)
    table = tmp_path / "arranged.csv"
    table.write_text("label,workers,nodes,time_s,mode\nbase,1,1,35920,strong\narranged,4,1,13156,strong\n"
                     "arranged,4,2,15820,strong\narranged,4,4,13973,strong\narranged,3,2,20000,strong\n")
    out = CliRunner().invoke(main, ["report", "--from-csv", str(table), "--out", str(tmp_path / "rep")],
                             env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    for layout, seconds in (("1x4", "13156"), ("2x2", "15820"), ("4x1", "13973"), ("3 on 2 nodes", "20000")):
        assert any(layout in line and seconds in line for line in lines), (layout, out.output)
    markdown = (tmp_path / "rep" / "report.md").read_text()
    assert "| 2x2 |" in markdown and "| 4x1 |" in markdown, markdown


def _steps(step_s: list[float], warmup: int, ranks: int = 1, per_rank_samples: list[int] | None = None):
    """The step table of one run: a step per entry of `step_s`, the first `warmup` of them warm-up."""
    import pandas as pd

    from scalelab.analysis.scaling import step_table

    recs = [{"rank": r, "step": i + 1, "epoch": i // 4, "warmup": i < warmup, "step_s": t, "words": 100,
             "samples": (per_rank_samples or [8] * ranks)[r]} for i, t in enumerate(step_s) for r in range(ranks)]
    return step_table(pd.DataFrame(recs))


def _study(*runs):
    from scalelab.analysis.studies import study_runs

    return study_runs([(key, summary(w, wps, steps_per_epoch=4, nodes=n, gpus_per_node=w // n, label=label,
                                     **changes), steps)
                       for key, label, n, w, wps, steps, changes in runs])


def test_arrangement_minutes_and_speedup_come_from_the_same_measured_steps():
    """Seed 004 at --scale test: a slow first (warm-up) step counted in the minutes per epoch but not in the
    words/s speed-up beside them, so 1x1 0.001 and 1x2 0.0026 min/epoch read "0.29" (their ratio: 0.38). Now
    both are the measured steps', and the speed-up is the seed's t1/tn of the time column."""
    from scalelab.analysis.studies import seed_table, speedup_note

    data = _study(("a/1x1", "a", 1, 1, 1000.0, _steps([3.0, 1.0, 1.0, 1.0, 1.0], warmup=1), {}),
                  ("a/1x2", "a", 1, 2, 500.0, _steps([0.5, 2.0, 2.0, 2.0, 2.0], warmup=1), {}))
    table = seed_table("arrangement", data)
    minutes = table["Time (min/epoch)"].tolist()
    assert minutes == [0.0667, 0.133]  # 4 steps an epoch of 1 s and of 2 s, to 3 significant digits
    assert table["Speed-up"].tolist() == [1.0, 0.5]  # 4 s over 8 s an epoch: the warm-up steps left out
    assert "Speed-up from" not in table.columns
    note = speedup_note(data, "arrangement")
    assert "minutes per epoch" in note and "measured steps" in note


def test_convergence_speedup_and_efficiency_against_the_base_and_seconds_to_three_digits():
    """Seed 004 computes speedup and efficiency from the time to its loss threshold too; the study's
    convergence table, report.md and report.json had times only, and 0.06 s and 0.14 s both read "0.1 s"."""
    import math

    from scalelab.analysis.report import table_rows
    from scalelab.analysis.scaling import scale_layouts
    from scalelab.analysis.studies import seed_table

    reached = {"loss_threshold": 0.5, "reached_threshold": True, "steps_to_threshold": 4}
    steps = _steps([1.0] * 5, warmup=1)
    data = _study(("a/1x1", "a", 1, 1, 1000.0, steps, {**reached, "time_to_threshold_s": 0.14}),
                  ("a/1x2", "a", 1, 2, 1900.0, steps, {**reached, "time_to_threshold_s": 0.06}),
                  ("a/1x4", "a", 1, 4, 3000.0, steps, {"loss_threshold": 0.5, "reached_threshold": False}),
                  ("b/2x1", "b", 2, 2, 1500.0, steps, {**reached, "time_to_threshold_s": 0.1}))
    conv = seed_table("convergence", data)
    assert conv["time to threshold (s)"].tolist()[:2] == [0.14, 0.06]
    assert conv["Speed-up to threshold"].tolist()[:2] == [1.0, 2.33] and math.isnan(conv["Speed-up to threshold"][2])
    assert conv["Efficiency to threshold"].tolist()[:2] == [1.0, 1.17]
    # b has no run at 1 worker: measured against the study's baseline, a 1x1, as its other speed-ups
    assert conv["Speed-up to threshold"][3] == 1.4 and conv["Speed-up base"][3] == "a 1x1"

    table = scale_layouts([summary(1, 1000.0, **reached, time_to_threshold_s=0.14),
                           summary(2, 1900.0, **reached, time_to_threshold_s=0.06)])
    assert table["speedup_to_threshold"].tolist() == [1.0, 0.14 / 0.06]
    assert table["efficiency_to_threshold"].tolist() == [1.0, 0.14 / 0.06 / 2]
    headers, rows = table_rows(table)
    cells = dict(zip(headers, zip(*rows)))
    assert cells["time to threshold"] == ("0.140 s (4 steps)", "0.0600 s (4 steps)")
    assert cells["speedup to threshold"] == ("1.00", "2.33") and cells["efficiency to threshold"][1] == "116.7 %"


def test_a_balanced_runs_batch_per_gpu_is_what_its_workers_took():
    """Seed 004's dynamic balancer at --scale test: "Batch size (per GPU)" read 8 (16 / 2 workers) while its
    step records held shares of 2 to 14."""
    import pandas as pd

    from scalelab.analysis.studies import seed_table, study_runs, worker_batches

    shares = [(8, 8), (4, 12), (4, 12), (2, 14), (2, 14)]  # the first step is warm-up: not measured
    records = pd.DataFrame([{"kind": "step", "rank": r, "step": i + 1, "warmup": i == 0, "samples": pair[r],
                             "step_s": 0.1, "words": 10} for i, pair in enumerate(shares) for r in (0, 1)])
    assert worker_batches(records) == "2–14 (rank means 3.0, 13.0)"
    assert worker_batches(records.assign(samples=8)) is None  # an even split: global batch / workers says it
    data = study_runs([(key, summary(w, wps, global_batch=16, label=key[0], gpus_per_node=w), _steps([1.0] * 5, 1))
                       for key, w, wps in (("a/1x1", 1, 1000.0), ("b/1x2", 2, 1500.0))],
                      {"b/1x2": {"worker_batch": worker_batches(records)}})
    assert seed_table("throughput", data)["Batch size (per GPU)"].tolist() == [16, "2–14 (rank means 3.0, 13.0)"]


def test_a_balanced_runs_worker_batches_leave_out_profiled_steps_and_superseded_attempts():
    """`worker_batches` filtered the step records itself: a step traced by --profile-steps (not timed, as warm-up)
    and the first attempt of a step re-done after a resume counted, so its range read 1–15 where the steps the
    throughput measured held 6 to 10."""
    import pandas as pd

    from scalelab.analysis.studies import worker_batches

    # (step, time, shares, profiled): step 1 warm-up, step 2 profiled, step 3 done twice (resumed), step 4
    attempts = [(1, 1.0, (8, 8), False), (2, 2.0, (1, 15), True), (3, 3.0, (3, 13), False),
                (3, 10.0, (6, 10), False), (4, 11.0, (6, 10), False)]
    records = pd.DataFrame([{"kind": "step", "rank": r, "step": step, "time": t, "warmup": step == 1,
                             "profiled": profiled, "samples": shares[r], "step_s": 0.1, "words": 10}
                            for step, t, shares, profiled in attempts for r in (0, 1)])
    assert worker_batches(records) == "6–10 (rank means 6.0, 10.0)"


def test_a_variant_that_resolves_to_its_baselines_settings_is_named_and_threads_are_shown_where_they_differ():
    """Seed 001 --scale cpu on 2 cores: "cudnn_lstm 2 host threads" sets interop_threads 2, PyTorch's default
    there, and ran as the baseline did (start records: threads 1, interop_threads 2 in both); the study
    reported it as a result of its own with no threads column."""
    from scalelab.analysis.studies import (VariantRun, resolved_settings, same_settings_warnings, seed_table,
                                           study_runs)

    start = {"threads": 1, "interop_threads": 2}
    base = {"rnn": "fused", "threads": 1, "interop_threads": None, "data.prefetch": 2}
    runs = [VariantRun(label, layout, given, resolved_settings(given, start))
            for label, given in (("all-reduce", base), ("no prefetch", {**base, "data.prefetch": 0}),
                                 ("2 host threads", {**base, "interop_threads": 2}))
            for layout in ("1x1", "1x2")]
    said = same_settings_warnings(runs)
    assert len(said) == 1, said
    assert said[0].startswith("variant '2 host threads' ran with the same settings as 'all-reduce' on 1x1, 1x2")
    assert "sets interop_threads 2" in said[0] and "threads 1, interop_threads 2" in said[0]
    # where the machine gives the default more threads (a GPU host's cores), the variant differs: no warning
    many = [VariantRun(r.variant, r.layout, r.given, resolved_settings(r.given, {"threads": 1, "interop_threads":
                       2 if r.variant == "2 host threads" else 16})) for r in runs]
    assert same_settings_warnings(many) == []

    def study(threads):
        return study_runs([(f"{v}/1x1", summary(1, 1000.0, label=v), _steps([1.0] * 3, 1)) for v in threads],
                          {f"{v}/1x1": {"threads": 1, "interop_threads": t} for v, t in threads.items()})

    shown = seed_table("throughput", study({"a": 16, "b": 2}))
    assert shown["Host threads (intra-op / inter-op)"].tolist() == ["1 / 16", "1 / 2"]
    assert "Host threads (intra-op / inter-op)" not in seed_table("throughput", study({"a": 2, "b": 2})).columns


@pytest.mark.slow
def test_a_study_names_the_variant_its_machine_ran_as_the_baseline(tmp_path):
    """`launch study` end to end: a variant setting 1 inter-op thread against the default. Where PyTorch's
    default here is 1 too (its start records say), study.md and warnings.json name it; where it is more, the
    throughput table shows each row's threads instead."""
    import json

    import pandas as pd
    from conftest import launch, only_run_dir

    recipe = tmp_path / "threads.yaml"
    recipe.write_text("title: threads\nseed_scale: a test\nmode: weak\nlayouts: [1x1]\n"
                      "base: {model: nmt-tiny, engine: {name: ddp}, data: {kind: synthetic}, batch_per_worker: 4, "
                      "steps: 3, warmup_steps: 1}\n"
                      "variants:\n  - {label: default threads}\n  - {label: one interop thread, set: {interop_threads: 1}}\n"
                      "tables: [throughput]\n")
    proc = launch("study", str(recipe), "--runs-dir", "runs", "-y", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    study = only_run_dir(tmp_path / "runs")
    first = next((study / json.loads((study / "study.json").read_text())["sweeps"][0]["dir"] / "1x1" / "records")
                 .glob("rank-0.jsonl"))
    default = next(r for r in map(json.loads, first.read_text().splitlines()) if r["kind"] == "start")["interop_threads"]
    table = pd.read_csv(study / "throughput.csv")
    warned = [w for w in json.loads((study / "warnings.json").read_text()) if "ran with the same settings" in w]
    if default == 1:
        assert len(warned) == 1 and "'one interop thread'" in warned[0] and "WARNING: variant" in (study / "study.md").read_text()
    else:
        assert not warned and table["Host threads (intra-op / inter-op)"].str.endswith(f"/ {default}").iloc[0]
        assert table["Host threads (intra-op / inter-op)"].iloc[1].endswith("/ 1")
