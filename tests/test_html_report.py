"""`launch report RUN --format html`: one self-contained page, checked in a real headless Chromium."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import launch, made_once, only_run_dir

TINY = ["--model", "nmt-tiny", "--data", "task", "--warmup-steps", "1", "--prefetch", "1"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _dom(page: Path, tmp: Path) -> str:
    """The page's DOM after Chromium rendered it (headless, no network, a fresh profile)."""
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp / 'profile'}",
         "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.fixture(scope="module")
def html_report(tmp_path_factory) -> Path:
    """A DDP run's report page, made once in the pytest run (conftest's made_once); the tests only read it."""
    return made_once(tmp_path_factory, ["html-report", *TINY], _make_report)


def _make_report(tmp: Path) -> Path:
    runs = tmp / "runs"
    proc = launch(*TINY, "--engine", "ddp", "--gpus-per-node", "2", "--steps", "12", "--val-every", "4",
                  "--loss-threshold", "100", "--profile-steps", "2:3", "--runs-dir", str(runs), cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    proc = launch("report", str(only_run_dir(runs)), "--format", "html", "--out", str(tmp / "out"),
                  "--rate", "0.5/gpu-hour", cwd=tmp)  # the local backend has no price of its own
    assert proc.returncode == 0, proc.stderr
    page = Path(proc.stdout.strip().splitlines()[-1])
    assert page == tmp / "out" / "report.html" and page.is_file()
    return page


@pytest.mark.slow
def test_page_is_self_contained(html_report):
    text = html_report.read_text()
    assert text.count("data:image/png;base64,") >= 3  # phases, loss, timeline (one run: no one-dot speedup or cost plot)
    assert "src=\"http" not in text and "src='http" not in text and "<link" not in text


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/install.sh installs it with apt-get)")
def test_chromium_shows_the_report(html_report, tmp_path):
    dom = _dom(html_report, tmp_path)
    for heading in ("Provenance", "Warnings", "Profiler traces", "Speedup and efficiency", "Phase breakdown",
                    "Training and validation loss", "Per-rank timeline", "Cost", "Definitions"):
        assert f"<h2>{heading}</h2>" in dom, heading
    for what in ("PyTorch", "Horovod", "git commit", "CPU model", "GPU model", "backend", "local", "1x2"):
        assert what in dom, what
    assert "2.13" in dom  # the PyTorch version, read from the installed package


def test_profile_steps_write_a_chrome_trace_per_rank_that_the_page_links(html_report):
    """--profile-steps 2:3: each rank's torch.profiler trace of steps 2..3, in Chrome trace format,
    linked from the page by a relative path; the traced steps are marked and left out of timings."""
    import json
    from urllib.parse import unquote

    run = only_run_dir(html_report.parent.parent / "runs")
    traces = sorted((run / "profile").glob("*.json"))
    assert [p.name for p in traces] == ["rank-0.json", "rank-1.json"]
    for trace in traces:
        events = json.loads(trace.read_text())["traceEvents"]
        assert any(e.get("ph") == "X" and "aten::" in e.get("name", "") for e in events)
    steps = [json.loads(x) for x in (run / "records" / "rank-0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r.get("profiled")] == [2, 3]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps_measured"] == 1 and summary["steps_warmup"] == 3  # 1 warm-up + 2 traced; stopped at 4
    page = html_report.read_text()
    assert "<h2>Profiler traces</h2>" in page
    hrefs = [h.split("'")[0] for h in page.split("href='")[1:]]
    linked = {(html_report.parent / unquote(h)).resolve() for h in hrefs if h.endswith(".json")}
    assert linked == {t.resolve() for t in traces}


@pytest.mark.parametrize("value, words", [("5:3", "1 <= A <= B"), ("-1:2", "1 <= A <= B"), ("0:2", "1 <= A <= B"),
                                          ("2-3", "takes A:B"), ("4:50", "ends after the last step (12)")])
def test_bad_profile_steps_are_refused_before_anything_runs(tmp_path, value, words):
    proc = launch(*TINY, "--steps", "12", "--profile-steps", value, "--runs-dir", str(tmp_path / "runs"),
                  "--dry-run", cwd=tmp_path)
    assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_the_page_shows_every_trust_warning(html_report):
    """warnings.json's warnings (1 measured step, the threshold at the first validation) are on the
    page, in a section of their own before the numbers."""
    import html
    import json

    warnings = json.loads((html_report.parent / "warnings.json").read_text())
    assert any("measured step" in w for w in warnings) and any("first validation" in w for w in warnings)
    page = html_report.read_text()
    assert page.index("<h2>Warnings</h2>") < page.index("<h2>Speedup and efficiency</h2>")
    for warning in warnings:
        assert html.escape(warning) in page, warning


@pytest.mark.slow
def test_a_study_gets_one_page_with_its_tables(tmp_path):
    """`launch report STUDY --format html`: the study's runs (every variant's sweep) on one page, titled
    by the study, with its seed-shaped tables; before, a study directory was refused."""
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text("title: 'Tiny study: two layouts'\nseed_scale: none, a test\nmode: strong\nlayouts: [1x1, 1x2]\n"
                      "base: {model: nmt-tiny, data: {kind: task, prefetch: 1}, engine: {name: ddp}, steps: 6,\n"
                      "       warmup_steps: 1, global_batch: 8}\n"
                      "variants: [{label: fused}]\ntables: [throughput]\n")
    proc = launch("study", str(recipe), "--runs-dir", "runs", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    study = only_run_dir(tmp_path / "runs")
    proc = launch("report", str(study), "--format", "html", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    page = Path(proc.stdout.strip().splitlines()[-1])
    assert page == study / "report.html"
    text = page.read_text()
    assert "<title>Study: Tiny study: two layouts</title>" in text
    assert "<h2>Study table: throughput</h2>" in text and "Processing speed (words/s)" in text
    assert text.count("<tr><td>fused</td>") >= 2  # the variant's series: both layouts in the scaling table
    if CHROMIUM:  # issue 35: the study's page fits 1280 px too (its tables scroll inside their boxes)
        from test_html_pages import _screenshot, _widths

        assert _widths(page, tmp_path)["page"] <= 1280
        assert _screenshot(page, tmp_path).stat().st_size > 10_000
    proc = launch("report", str(study), "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0 and sorted(r["workers"] for r in __import__("json").loads(proc.stdout)) == [1, 2]


_PROVENANCE_FIELDS = ("host", "cpu_model", "gpu_model", "scalelab_version", "torch_version", "horovod_version",
                      "python_version", "git_commit")


def _rewrite_start_records(run: Path, change) -> None:
    import json

    for path in (run / "records").glob("rank-*.jsonl"):
        recs = [json.loads(x) for x in path.read_text().splitlines()]
        path.write_text("".join(json.dumps(change(r) if r["kind"] == "start" else r) + "\n" for r in recs))


@pytest.mark.slow
def test_provenance_is_what_the_ranks_recorded(html_report, tmp_path):
    """The start records carry the machine (every rank) and the software (rank 0) that ran; the page
    shows those, not the report machine's; runs recorded before that show "unknown"."""
    import json
    import platform

    import torch

    from tests.conftest import ROOT

    run = only_run_dir(html_report.parent.parent / "runs")
    start = [json.loads(x) for x in (run / "records" / "rank-0.jsonl").read_text().splitlines()][0]
    other = [json.loads(x) for x in (run / "records" / "rank-1.jsonl").read_text().splitlines()][0]
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert start["host"] == platform.node() == other["host"] and start["torch_version"] == torch.__version__
    assert start["git_commit"].removesuffix("+dirty") == head and start["gpu_model"] is None  # CPU ranks
    assert "git_commit" not in other and other["cpu_model"] == start["cpu_model"]

    elsewhere, old = tmp_path / "elsewhere", tmp_path / "old"
    shutil.copytree(run, elsewhere)
    shutil.copytree(run, old)
    _rewrite_start_records(elsewhere, lambda r: {**r, "host": "node-a17", "gpu_model": "Tesla V100-SXM2-16GB"})
    _rewrite_start_records(old, lambda r: {k: v for k, v in r.items() if k not in _PROVENANCE_FIELDS})
    for copy in (elsewhere, old):
        proc = launch("report", str(copy), "--format", "html", "--out", str(copy / "html"), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    page = (elsewhere / "html" / "report.html").read_text()
    assert "<tr><td>host</td><td>node-a17</td></tr>" in page
    assert "<tr><td>GPU model</td><td>Tesla V100-SXM2-16GB</td></tr>" in page
    assert f"<tr><td>git commit</td><td>{start['git_commit']}</td></tr>" in page
    page = (old / "html" / "report.html").read_text()
    for label in ("host", "git commit", "CPU model", "PyTorch"):
        assert f"<tr><td>{label}</td><td>unknown</td></tr>" in page, label


# ---- issue #28: what the page shows, looked at in a screenshot ----------------------------------


def _run_of(page: Path):
    from scalelab.core.records import load_run

    return load_run(only_run_dir(page.parent.parent / "runs"))


@pytest.mark.slow
def test_phase_colours_agree_and_the_loss_has_one_clock(html_report):
    from scalelab.analysis.html import PHASE_COLORS, plot_phases
    from scalelab.analysis.results import summarize_dir
    from scalelab.analysis.runhtml import _name, plot_loss_curves, plot_rank_timeline
    from scalelab.analysis.scaling import scale_layouts
    from matplotlib.colors import to_hex

    run = _run_of(html_report)
    table = scale_layouts([summarize_dir(run.run_dir)])

    def legend_colours(fig):
        ax = fig.axes[0]
        handles, labels = ax.get_legend_handles_labels()
        return {lab.split()[0]: to_hex(h.patches[0].get_facecolor() if hasattr(h, "patches") else h.get_facecolor())
                for h, lab in zip(handles, labels)}

    breakdown, timeline = legend_colours(plot_phases(table)), legend_colours(plot_rank_timeline(run))
    shared = set(breakdown) & set(timeline)
    assert {"forward", "backward", "optimizer"} <= shared
    assert all(breakdown[p] == timeline[p] == PHASE_COLORS[p] for p in shared), (breakdown, timeline)

    by_step, by_time = plot_loss_curves([run], 100.0).axes
    train, val = by_time.get_lines()[0], by_time.get_lines()[1]
    first_val = int(run.val["step"].iloc[0])
    train_at = dict(zip(run.steps[run.steps["rank"] == 0]["step"], train.get_xdata()))
    assert val.get_xdata()[0] >= train_at[first_val]  # validated after the step it follows, on the same clock
    assert _name(run) in by_step.get_legend_handles_labels()[1][0] and "1x2 1x2" not in _name(run)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/install.sh installs it with apt-get)")
def test_a_screenshot_shows_the_phase_colours_and_the_ddp_note(html_report, tmp_path):
    """Chromium renders the page to a PNG (looked at by hand for issue #28: one palette in the breakdown and
    the timeline, readable cost axes); here its pixels hold the shared phase colours, and the DOM the note
    that DDP's exchange overlaps the backward (it read 0%)."""
    from PIL import Image

    from scalelab.analysis.html import PHASE_COLORS

    shot = tmp_path / "report.png"
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,7000", f"--screenshot={shot}",
         html_report.resolve().as_uri()], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 7000)
    counts = {c: n for n, c in image.getcolors(maxcolors=1 << 20)}

    def near(hex_colour: str) -> int:
        target = tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
        return sum(n for c, n in counts.items() if max(abs(a - b) for a, b in zip(c, target)) <= 6)

    for phase in ("forward", "backward"):
        assert near(PHASE_COLORS[phase]) > 2000, phase  # the breakdown's bars and the timeline's
    assert "overlaps the backward" in _dom(html_report, tmp_path)
