"""The review of the seed studies' tables: each figure says what it is computed from, the same dollars read
the same in every command, and a warning's number agrees with its words."""

import dataclasses

from scalelab.analysis.scaling import LayoutSummary, scale_layouts, trust_warnings


def summary(workers: int, wps: float, **changes) -> LayoutSummary:
    base = LayoutSummary(
        label="s", workers=workers, nodes=1, gpus_per_node=workers, engine="ddp", rnn="fused", model="m",
        mode="strong", global_batch=64, steps_measured=100, steps_warmup=5, steps_incomplete=0, words_per_s=wps,
        samples_per_s=wps / 10, step_s_mean=0.2, step_s_median=0.2, step_s_p90=0.21, step_s_std=0.01,
        share_data=None, share_forward=None, share_backward=None, share_exchange=None, share_optimizer=None,
        final_loss=1.0, final_val_loss=None, loss_threshold=None, reached_threshold=None,
        time_to_threshold_s=None, steps_to_threshold=None)
    return dataclasses.replace(base, **changes)


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
    monkeypatch.setenv("COLUMNS", "200")
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


def test_report_from_csv_shows_the_arrangement_its_nodes_give(tmp_path):
    """Seed 004's 1x4, 2x2 and 4x1 rows of a published table (`nodes` given, no GPUs per node): three rows of
    4 workers read alike in the terminal and report.md; the layout now says which is which."""
    from click.testing import CliRunner

    from scalelab.launcher.cli import main

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
