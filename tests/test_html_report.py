"""`launch report RUN --format html`: one self-contained page, checked in a real headless Chromium."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import launch, only_run_dir

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
    tmp = tmp_path_factory.mktemp("html")
    runs = tmp / "runs"
    proc = launch(*TINY, "--engine", "ddp", "--gpus-per-node", "2", "--steps", "12", "--val-every", "4",
                  "--loss-threshold", "100", "--runs-dir", str(runs), cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    proc = launch("report", str(only_run_dir(runs)), "--format", "html", "--out", str(tmp / "out"), cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    page = Path(proc.stdout.strip().splitlines()[-1])
    assert page == tmp / "out" / "report.html" and page.is_file()
    return page


def test_page_is_self_contained(html_report):
    text = html_report.read_text()
    assert text.count("data:image/png;base64,") >= 5  # speedup, throughput, phases, loss, timeline, cost
    assert "src=\"http" not in text and "src='http" not in text and "<link" not in text


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/install.sh installs it with apt-get)")
def test_chromium_shows_the_report(html_report, tmp_path):
    dom = _dom(html_report, tmp_path)
    for heading in ("Provenance", "Speedup and efficiency", "Throughput", "Phase breakdown",
                    "Training and validation loss", "Per-rank timeline", "Cost against time", "Definitions"):
        assert f"<h2>{heading}</h2>" in dom, heading
    for what in ("PyTorch", "Horovod", "git commit", "CPU model", "GPU model", "backend", "local", "1x2"):
        assert what in dom, what
    assert "2.13" in dom  # the PyTorch version, read from the installed package
