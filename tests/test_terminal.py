"""The terminal: scaling tables that fit 100 columns without breaking a number, cells without
True/False/inf, `--help` grouped with the common options first."""

import io
import re

from click.testing import CliRunner
from rich.console import Console
from test_trust import summary

from scalelab.analysis.report import print_scaling
from scalelab.analysis.scaling import scale_layouts
from scalelab.launcher.cli import main


def printed(df, width):
    buf = io.StringIO()
    print_scaling(df, console=Console(file=buf, width=width, force_terminal=False))
    return buf.getvalue()


def test_scaling_table_fits_100_columns_and_keeps_numbers_whole():
    df = scale_layouts([summary(1, 1437.6), summary(2, 2600.0), summary(4, 4800.5, steps_measured=100)])
    df["noise_scale"] = 123456.0
    for width in (160, 100, 70):
        out = printed(df, width)
        assert max(len(line) for line in out.splitlines()) <= min(width, 100)
        assert "1,438" in out and "4,800" in out  # whole, on one line
        assert not re.search(r"\bTrue\b|\bFalse\b|\binf\b", out)
    assert "more columns in report.md" in printed(df, 70)


def test_infinite_values_show_as_a_dash():
    df = scale_layouts([summary(1, 1000.0), summary(2, 2000.0)])
    df.loc[1, "karp_flatt"] = float("inf")
    assert "inf" not in printed(df, 160)


def test_run_help_lists_common_options_first_and_each_backend_in_its_section():
    out = CliRunner().invoke(main, ["run", "--help"]).output
    sections = re.findall(r"^((?:\S.* )?options):$", out, flags=re.M | re.I)
    assert sections[0] == "Options" and {"slurm backend options", "k8s backend options", "aws backend options"} <= set(sections)
    common = out.split("Options:")[1].split("backend options:")[0]
    assert "--model" in common and "--partition" not in common


def test_study_results_print_as_tables_not_markdown(tmp_path, capsys):
    from scalelab.launcher.study import show_study

    path = tmp_path / "study.md"
    path.write_text("# Study\n\n| workers | words/s |\n|--:|--:|\n| 1 | 1,437.6 |\n| 2 | 2,701.0 |\n")
    show_study(path)
    out = capsys.readouterr().out
    assert "1,437.6" in out and "|--" not in out and "| 1 |" not in out
    assert "study report:" in out


def test_scaling_headers_never_split_inside_a_word_at_100_columns():
    """The label wraps between its words instead ("speedu/p", "threshol/d" were split at 100 columns)."""
    from scalelab.analysis.report import fitting_columns

    df = scale_layouts([summary(1, 1437.6), summary(2, 2600.0), summary(4, 4800.5)])
    df["label"] = "nmt-tiny fused fp32 ddp strong with a long series name"
    out = printed(df, 100)
    words = set(re.findall(r"[^\s┃│┏┓┗┛━┳┻╇╈┡┩┃]+", out))
    for header, _, _ in fitting_columns(df, 100):
        for word in header.split():
            assert word in words, (word, out)
    assert max(len(line) for line in out.splitlines()) <= 100


def test_ddp_exchange_reads_in_backward_not_a_dash():
    """DDP overlaps its all-reduce with the backward: no exchange is timed apart, and the table says where it is."""
    df = scale_layouts([summary(1, 1437.6), summary(2, 2600.0)])
    df["engine"], df["share_data"], df["share_exchange"] = "ddp", 0.05, None
    from scalelab.analysis.report import render_table

    console = Console(file=io.StringIO(), width=250, color_system=None)
    console.print(render_table(df, "Scaling"))  # every column
    out = console.file.getvalue()
    assert "5 % / in backward" in out  # the 2-worker row
    assert "5 % / —" in out  # one worker exchanges nothing
