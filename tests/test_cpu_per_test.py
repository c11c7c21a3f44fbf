"""scripts/cpu-per-test.py, the sampler docs/benchmarks.md's per-test CPU tables come from: it names each
process by its program and module (not by the run directories in its arguments, which name pytest in every
one), and sums the CPU per kind, file and test."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("cpu_per_test", ROOT / "scripts" / "cpu-per-test.py")
cpu = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(cpu)

RUN = "/tmp/pytest-of-root/pytest-4/popen-gw0/test_x0/runs/nmt-tiny-ddp-1x2"


def test_processes_are_named_by_program_and_module_not_by_their_arguments() -> None:
    py = "/work/.venv/bin/python"
    assert cpu.kind_of([py, "-m", "scalelab.train", RUN]) == "rank"
    assert cpu.kind_of([py, "/work/.venv/bin/torchrun", "--nnodes", "1", "-m", "scalelab.train", RUN]) == "torchrun agent"
    assert cpu.kind_of([py, "-m", "torch.distributed.run", "-m", "scalelab.train", RUN]) == "torchrun agent"
    assert cpu.kind_of([py, "-m", "scalelab.core.torchrun", "-m", "scalelab.train", RUN]) == "torchrun agent"
    assert cpu.kind_of([py, "/work/.venv/bin/horovodrun", "-np", "2", py, "-m", "scalelab.train"]) == "horovodrun"
    assert cpu.kind_of([py, "-m", "scalelab.core.horovodrun", "--gloo", "-np", "2", py, "-m", "scalelab.train"]) == "horovodrun"
    assert cpu.kind_of([py, "-m", "scalelab.launcher.cli", "report", RUN]) == "launch"
    assert cpu.kind_of([py, "-u", "-c", "import sys;exec(eval(sys.stdin.readline()))"]) == "xdist worker"
    assert cpu.kind_of([py, "-c", "print(1)", RUN]) == "python (other)"
    assert cpu.kind_of(["/usr/sbin/slurmd", "-D"]) == "slurmd"


def test_the_summary_sums_cpu_per_kind_file_and_test() -> None:
    rows = [{"test": "tests/test_a.py::test_one", "kind": "rank", "cpu_s": 2.0},
            {"test": "tests/test_a.py::test_one", "kind": "launch", "cpu_s": 0.5},
            {"test": "tests/test_b.py::test_two", "kind": "rank", "cpu_s": 3.0},
            {"test": None, "kind": "slurmd", "cpu_s": 1.0}]
    text = cpu.summary(rows)
    assert "| rank | 2 | 5 |" in text and "| tests/test_a.py | 2 | 2 |" in text
    assert "| tests/test_b.py::test_two | 1 | 3 |" in text and "| (no test) | 1 | 1 |" in text
    assert text.endswith("total: 4 processes, 6 s of CPU")


@pytest.mark.slow
def test_a_process_started_by_a_test_is_charged_to_that_test(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    sampler = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "cpu-per-test.py"), str(out)],
                               stderr=subprocess.PIPE, text=True)
    assert "sampling" in sampler.stderr.readline()  # its signal handlers are in place
    env = {**os.environ, "PYTEST_CURRENT_TEST": "tests/test_z.py::test_busy (call)"}
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 1.5\n"
                             "while time.process_time() < end: pass\ntime.sleep(3)"], env=env)
    busy.wait(timeout=60)
    time.sleep(0.2)
    sampler.send_signal(signal.SIGTERM)
    assert sampler.wait(timeout=30) == 0
    rows = [r for r in json.loads(out.read_text()) if r["pid"] == busy.pid]
    assert len(rows) == 1 and rows[0]["test"] == "tests/test_z.py::test_busy" and rows[0]["kind"] == "python (other)"
    assert 0.9 <= rows[0]["cpu_s"] <= 2.5, rows


def test_bad_arguments_are_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_bytes(b"\x00\xff not json")
    for args in ([], ["--summary"], ["--summary", str(tmp_path / "bad.json")], ["--summary", str(tmp_path / "none.json")],
                 [str(tmp_path / "no" / "such" / "out.json")]):
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / "cpu-per-test.py"), *args],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)
        assert "Traceback" not in done.stderr and ("usage" in done.stderr or "no folder" in done.stderr), (args, done.stderr)
