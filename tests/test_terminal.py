"""The terminal: scaling tables that fit 100 columns without breaking a number, cells without
True/False/inf, `--help` grouped with the common options first."""

import io
import re

import pytest

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
    from scalelab.analysis.report import fitting_columns, terminal_frame

    df = scale_layouts([summary(1, 1437.6), summary(2, 2600.0), summary(4, 4800.5)])
    df["label"] = ["nmt-tiny fused fp32 ddp strong with a long series name", "other series name", "third"]
    out = printed(df, 100)
    words = set(re.findall(r"[^\s┃│┏┓┗┛━┳┻╇╈┡┩┃]+", out))
    for header, _, _ in fitting_columns(terminal_frame(df, "Scaling")[0], 100):
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


# ---- issue 35 ask 6: every table readable at 80 and 100 columns ---------------------------------------

_RULES = "┃│┏┓┗┛━┳┻╇╈┡┩┃┠┨╋┼─└┘┌┐├┤┬┴"


def _header_words_whole(out: str, headers: list[str]) -> None:
    words = set(re.findall(rf"[^\s{_RULES}]+", out))
    for header in headers:
        for word in header.split():
            assert word in words, (word, out)


def _no_zero_width_column(out: str) -> None:
    """A column rich squeezed to nothing shows as two rules side by side (┃┃ in the header, ││ in a row)."""
    for pair in ("┃┃", "││", "┏┳", "┳┳", "┗┻", "└┴", "┴┴", "╇╇", "┡╇"):
        assert pair not in out, (pair, out)


def _two_series_cpu_sweep():
    rows = []
    for engine in ("horovod", "ddp"):
        for w, wps in ((1, 37404.0), (2, 14117.0), (4, 26001.0)):
            rows.append(summary(w, wps, label=f"nmt-tiny fused fp32 {engine} strong", engine=engine,
                                precision="fp32", peak_mem_bytes=340_000_000, mem_kind="max_rss",
                                share_data=0.06, share_exchange=0.33, loss_threshold=None))
    return scale_layouts(rows)


@pytest.mark.parametrize("width", [80, 100])
def test_report_table_readable_at_80_and_100_columns(width):
    """The report at 80 columns gave the label zero width and split "words/ s" and "efficienc y"; at 100 the
    label wrapped to 3 lines repeating the precision column. Now: the words every label shares are in the
    title, each row's label keeps what tells its series apart, the precision is said once."""
    from scalelab.analysis.report import fitting_columns, terminal_frame

    df = _two_series_cpu_sweep()
    out = printed(df, width)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= width, out
    _no_zero_width_column(out)
    shown, _ = terminal_frame(df, "Scaling")
    _header_words_whole(out, [h for h, _, _ in fitting_columns(shown, width)])
    assert "Scaling: nmt-tiny fused fp32 strong" in out
    assert out.count("fp32") == 1, out  # in the title, not in every label nor a precision column
    assert "precision" not in out
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == 6, out  # one line per layout: no label wrapped over 3-4 lines
    assert any("horovod" in r and "37,404" in r for r in rows) and any("ddp" in r and "26,001" in r for r in rows)
    assert "RSS/rank" in out and "MiB RSS" not in out  # said once in the header, not in every cell
    assert "threshold" not in out  # no threshold: a column of dashes says nothing


def test_a_label_keeps_what_the_precision_column_does_not_say():
    """Series named with --name (no precision word in the label) keep their precision column."""
    from scalelab.analysis.report import terminal_frame

    df = scale_layouts([summary(1, 1000.0, label="mine a", precision="bf16"),
                        summary(1, 900.0, label="mine b", precision="fp32")])
    shown, title = terminal_frame(df, "Scaling")
    assert title == "Scaling: mine" and list(shown["label"]) == ["a", "b"] and "precision" in shown.columns
    out = printed(df, 80)
    assert "bf16" in out and "fp32" in out


def _ls_rows():
    base = {"kind": "run", "backend": "local", "layout": "1x2", "total_steps": 5000, "loss": 3.705,
            "words_per_s": 9179.0, "eta_s": None, "cost_usd": None, "age_s": 200.0}
    return [{**base, "name": "nmt-tiny-horovod-1x2-20261127-045954", "state": "CANCELLED", "steps": 343},
            {**base, "name": "sweep-nmt-tiny-strong-20261127-045753", "kind": "sweep", "layout": "1x1,1x2",
             "state": "COMPLETED", "steps": 24, "total_steps": None, "loss": None, "words_per_s": 37404.0},
            {**base, "name": "nmt-small-ddp-2x2-20261127-050101", "backend": "slurm", "layout": "2x2",
             "state": "RUNNING", "steps": 40, "eta_s": 75.0, "cost_usd": 0.1234}]


def _ls(width: int) -> str:
    from scalelab.launcher.cli import rows_table

    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(rows_table(_ls_rows(), None, width))
    return console.file.getvalue()


def test_ls_shows_backend_and_cost_at_100_columns():
    """`launch ls` at 100 columns hid the backend and the cost beside 37-character run names."""
    out = _ls(100)
    header = out.splitlines()[0].split()
    assert header[:2] == ["name", "backend"] and "cost" in header, out
    assert "slurm" in out and "0.12" in out and "sweep-nmt-tiny-strong-20261127-045753" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_ls_at_80_columns_keeps_numbers_whole_and_breaks_names_at_hyphens():
    out = _ls(80)
    assert max(len(line) for line in out.splitlines()) <= 80, out
    for cell in ("343/5,000", "37,404", "RUNNING", "COMPLETED", "1x1,1x2"):
        assert cell in out, (cell, out)
    names = [line.split()[0] for line in out.splitlines()[2:] if line.strip()]
    # a name that does not fit goes on in the next line after a hyphen, never inside a number
    assert all(part.endswith("-") or part[-1].isdigit() and len(part) >= 6 for part in names), names
    joined = "".join(names)
    assert "sweep-nmt-tiny-strong-20261127-045753" in joined and "nmt-tiny-horovod-1x2-20261127-045954" in joined


@pytest.mark.parametrize("width", [80, 100])
def test_the_progress_bar_fits_with_its_bar_and_step_count(tmp_path, width):
    """At 80 columns rich squeezed the bar and the step count to nothing ("nmt-tiny-horovod-1x2-202611… 2 rank(s)
    loss 4.150 val 4.100 14,117 words/s …"); at 100 the line was cut. Now every piece it shows is whole."""
    from scalelab.core.records import RecordWriter
    from scalelab.launcher.progress import RunProgress

    for rank in (0, 1):
        out = RecordWriter(tmp_path, rank, 2)
        for step in range(1, 2401):
            out.write("step", step=step, warmup=step <= 5, step_s=0.1, samples=8, words=600, loss=4.15)
        out.write("val", step=2400, epoch=0, val_loss=4.1, elapsed_s=4.0)
        out.close()
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=width, color_system=None)
    with RunProgress(tmp_path, 5000, "nmt-tiny-horovod-1x2-20261127-045954", console=console) as prog:
        prog.poll()
    last = [line for line in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue()).replace("\r", "\n").splitlines()
            if line.strip()][-1]
    assert len(last) < width, last
    assert "━" in last and " 2400/5000 " in last, last  # the bar and the step count
    assert "loss 4.150" in last and "12,000 words/s" in last and "ETA 4m20s" in last, last
    assert last.startswith("nmt-tiny-horovod-1x2 "), last  # the name whole, without its date stamp
    assert ("val 4.100" in last) == (width >= 100)


def test_the_bar_says_starting_ranks_before_the_first_step(tmp_path):
    from scalelab.core.records import RecordWriter
    from scalelab.launcher.progress import RunProgress

    RecordWriter(tmp_path, 0, 2).write("start", world=2)
    buf = io.StringIO()
    with RunProgress(tmp_path, 60, "run", console=Console(file=buf, force_terminal=True, width=80)) as prog:
        prog.poll()
    assert "starting ranks: 1 up" in buf.getvalue()


def test_a_priced_threshold_sweep_at_80_columns_keeps_its_layouts():
    """2x4 and 1x8 are both 8 workers: the layout column stays before the dollars to the threshold."""
    from test_report import _summary

    from scalelab.analysis.report import fitting_columns, terminal_frame

    df = scale_layouts([_summary(1, 1, 50000.0, 0.250, True, 300.0), _summary(1, 2, 92000.0, 0.270, True, 170.0),
                        _summary(1, 4, 156000.0, 0.320, False, None, exchange=None),
                        _summary(2, 4, 274000.0, 0.365, None, None)])
    df["dollars"], df["dollars_to_threshold"] = [0.0123, 0.02, 0.05, 1.5], [0.01, 0.015, None, None]
    out = printed(df, 80)
    assert max(len(line) for line in out.splitlines()) <= 80, out
    _no_zero_width_column(out)
    _header_words_whole(out, [h for h, _, _ in fitting_columns(terminal_frame(df, "Scaling")[0], 80)])
    for cell in ("2x4", "300 s (150 steps)", "not reached", "$1.50", "274,000", "5.48"):
        assert cell in out, (cell, out)


def test_plain_progress_says_once_when_the_ranks_are_up(tmp_path, capsys):
    """Off a terminal (CI, a pipe) the log said nothing until the first tenth of the run."""
    from scalelab.core.records import RecordWriter
    from scalelab.launcher.progress import RunProgress

    prog = RunProgress(tmp_path, 60, "run", console=Console(file=io.StringIO(), force_terminal=False))
    prog.watch.expected = 2
    RecordWriter(tmp_path, 0, 2).write("start", world=2)
    prog.poll()
    assert capsys.readouterr().err == ""  # one of two ranks up: nothing yet
    RecordWriter(tmp_path, 1, 2).write("start", world=2)
    prog.poll()
    prog.poll()
    assert re.fullmatch(r"\[run\] starting ranks: 2 of 2 up \(\d+s\)\n", capsys.readouterr().err)


def test_one_run_shows_no_speedup_of_one():
    """A single run's table said speedup 1.00 and efficiency 100.0 %: nothing to compare, so not shown."""
    out = printed(scale_layouts([summary(2, 12602.0, label="nmt-tiny fused fp32 ddp strong")]), 80)
    assert "12,602" in out and "speedup" not in out and "efficiency" not in out and "100.0 %" not in out
    assert "speedup" in printed(scale_layouts([summary(1, 1000.0), summary(2, 1900.0)]), 80)


@pytest.mark.parametrize("width", [80, 100])
def test_cost_table_tells_runs_of_one_label_apart(tmp_path, monkeypatch, capsys, width):
    """Three runs of one series and layout all read "nmt-tiny fused fp32 horovod strong 1x2" in `launch cost`:
    the shared words go into the title, each row names its run directory."""
    from conftest import run_entry
    from test_costs_cli import _fake_run

    import scalelab.costs.cli as costs_cli

    monkeypatch.setattr(costs_cli, "console", Console(file=io.StringIO(), width=width, color_system=None))
    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "none.json"))
    runs = [_fake_run(tmp_path / "runs", name, 2, 0.05, 6400, "g3.16xlarge") for name in ("run-a-0945", "run-b-1012")]
    code, err, _ = run_entry(["cost", *map(str, runs)], monkeypatch, capsys)
    assert code == 0, err
    out = costs_cli.console.file.getvalue()
    assert max(len(line) for line in out.splitlines()) <= width, out
    assert "Cost per run: " in out and "run-a-0945" in out and "run-b-1012" in out, out
    _no_zero_width_column(out)


def _progress_line(tmp_path, width: int, name: str) -> str:
    from scalelab.core.records import RecordWriter
    from scalelab.launcher.progress import RunProgress

    out = RecordWriter(tmp_path, 0, 1)
    for step in range(1, 41):
        out.write("step", step=step, warmup=step <= 5, step_s=0.1, samples=8, words=600, loss=4.15)
    out.close()
    buf = io.StringIO()
    with RunProgress(tmp_path, 200, name, console=Console(file=buf, force_terminal=True, width=width,
                                                           color_system=None)) as prog:
        prog.poll()
    return [line for line in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue()).replace("\r", "\n").splitlines()
            if line.strip()][-1]


@pytest.mark.parametrize("width", [80, 100])
def test_the_progress_line_keeps_a_long_names_start_and_end(tmp_path, width):
    """Issue 35: the bar cut a long run name from the front ("…scaling-study-2026-ddp-1x2"), which no longer
    said which experiment it was. Now the ellipsis is in the middle: the start and the layout both stay."""
    last = _progress_line(tmp_path, width, "translation-baseline-lstm-nmt-tiny-strong-scaling-study-ddp-1x2-20261127-081724")
    assert len(last) < width, last
    name = last.split()[0]
    assert name.startswith("translation-") and name.endswith("ddp-1x2") and "…" in name, last
    assert " 40/200 " in last and "━" in last and "loss 4.150" in last, last  # the name took only spare room


LONG_NAMES = ("translation-baseline-lstm-nmt-tiny-ddp-strong-scaling-study-2026",
              "sentiment-small-bf16-dynamic-balance-ablation-number-07")


def _named_fake_runs(root, names):
    from test_costs_cli import _fake_run

    from scalelab.core.spec import read_spec, save_spec

    runs = []
    for name in names:
        run = _fake_run(root, name, 2, 0.05, 6400, "g3.16xlarge")
        spec = read_spec(run)
        spec.name = name  # the series label `launch cost` shows
        save_spec(spec, run)
        runs.append(run)
    return runs


def _cost_output(tmp_path, monkeypatch, capsys, width, names) -> str:
    from conftest import run_entry

    import scalelab.costs.cli as costs_cli

    monkeypatch.setattr(costs_cli, "console", Console(file=io.StringIO(), width=width, color_system=None))
    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "none.json"))
    code, err, _ = run_entry(["cost", *map(str, _named_fake_runs(tmp_path / "runs", names))], monkeypatch, capsys)
    assert code == 0, err
    return costs_cli.console.file.getvalue()


@pytest.mark.parametrize("width", [80, 100])
def test_cost_table_breaks_long_run_names_after_hyphens_at_80_and_100_columns(tmp_path, monkeypatch, capsys, width):
    """Issue 35: `launch cost` with long run names was rough at 80 columns (rich cut "scalin" / "g-study").
    Now a name that does not fit goes on in the next line after a hyphen, as `launch ls` breaks names."""
    out = _cost_output(tmp_path, monkeypatch, capsys, width, LONG_NAMES)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= width, out
    _no_zero_width_column(out)
    cells = [line.split("│")[1].strip() for line in lines if line.startswith("│")]
    assert "".join(cells) == "".join(LONG_NAMES), out  # each whole when its lines are put together (1x2: in the title)
    assert all(cell.endswith("-") or cell.endswith(LONG_NAMES) or any(n.endswith(cell) for n in LONG_NAMES)
               for cell in cells), cells  # broken after a hyphen, never inside a word
    for cell in ("g3.16xlarge", "on-demand", "$/hour", "dollars"):
        assert cell in out, (cell, out)


def test_cost_title_keeps_one_long_shared_name_whole_at_80_columns(tmp_path, monkeypatch, capsys):
    """Two layouts of one long series: the name goes into the title, which wrapped at the table's 56 columns
    and cut the name inside a word ("...-stu" / "dy-2026"); above the table it keeps it whole."""
    from test_costs_cli import _fake_run

    from scalelab.core.spec import read_spec, save_spec

    runs = [_fake_run(tmp_path / "runs", f"r{g}", g, 0.05, 6400, "g3.16xlarge") for g in (1, 2)]
    for run in runs:
        spec = read_spec(run)
        spec.name = LONG_NAMES[0]
        save_spec(spec, run)
    from conftest import run_entry

    import scalelab.costs.cli as costs_cli

    monkeypatch.setattr(costs_cli, "console", Console(file=io.StringIO(), width=80, color_system=None))
    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "none.json"))
    code, err, _ = run_entry(["cost", *map(str, runs)], monkeypatch, capsys)
    assert code == 0, err
    out = costs_cli.console.file.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert f"Cost per run: {LONG_NAMES[0]}" in out, out
    assert "1x1" in out and "1x2" in out


def _stderr_on_a_terminal(args: list[str], cwd, columns: int = 80) -> tuple[int, str]:
    """`launch ARGS` with its stderr on a pseudo-terminal `columns` wide: (exit code, what it showed, colours removed)."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    leader, follower = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=follower, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(columns)})
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal's other end closed: the process is done writing
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    proc.communicate(timeout=60)
    return proc.returncode, re.sub(r"\x1b\[[0-9;]*m", "", shown.decode()).replace("\r\n", "\n")


def test_an_error_at_a_terminal_is_wrapped_between_words_with_its_command_whole(tmp_path):
    """An error's one long line was folded by the terminal at 80 columns, mid-word: half a path, half a command."""
    runs = tmp_path / ("a-runs-directory-" + "with-a-long-name-" * 3)
    runs.mkdir()
    code, shown = _stderr_on_a_terminal(["status", "nosuchrun", "--runs-dir", str(runs)], tmp_path)
    assert code == 2, shown
    lines = shown.rstrip("\n").split("\n")
    assert len(lines) > 1 and lines[0].startswith("launch: error: no run matches 'nosuchrun'"), shown
    assert all(len(line) <= 80 for line in lines if str(runs) not in line), shown  # a path longer than a line stays whole
    assert all(line.startswith(" " * len("launch: error: ")) for line in lines[1:]), shown
    command = f"`launch ls --runs-dir {runs}`"
    assert any(command in line for line in lines), shown  # the command to paste, on one line
    assert " ".join(" ".join(lines).split()) == " ".join(shown.split())


def test_an_error_off_a_terminal_stays_one_line(tmp_path):
    from tests.conftest import launch

    runs = tmp_path / ("a-runs-directory-" + "with-a-long-name-" * 3)
    runs.mkdir()
    done = launch("status", "nosuchrun", "--runs-dir", str(runs), cwd=tmp_path, env={"COLUMNS": "80"})
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and done.stderr.startswith("launch: error: "), done.stderr
