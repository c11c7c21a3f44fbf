"""Fixes to `launch --script` / `--module` found by a tester (second round).

1. Ctrl-C of a script that never saved a checkpoint said "`launch resume RUN` continues it" over an empty
   checkpoint/ folder; it now gives the no-checkpoint advice `launch status` gives.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, on_cpu_where_gpus_are_short, read_jsonl

LONG = """import time, torch, torch.distributed as dist
from scalelab import track
dist.init_process_group("gloo")
for i in range(1000):
    time.sleep(0.2); t = torch.ones(1); dist.all_reduce(t); track.step(items=1, loss=1.0)
"""


def _stepped(runs: Path) -> Path | None:
    """The one run directory under `runs` once its rank 0 recorded a step."""
    for run in runs.glob("*"):
        try:
            if any(r.get("kind") == "step" for r in read_jsonl(run / "records" / "rank-0.jsonl")):
                return run
        except (FileNotFoundError, ValueError):
            pass
    return None


def test_ctrl_c_of_a_script_with_no_checkpoint_does_not_promise_to_continue_it(tmp_path) -> None:
    (tmp_path / "long.py").write_text(LONG)
    args = on_cpu_where_gpus_are_short(("--script", "long.py", "--gpus-per-node", "2"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    fg = subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", *args], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _stepped(tmp_path / "runs") is None and time.monotonic() < deadline and fg.poll() is None:
            time.sleep(0.2)
        run = _stepped(tmp_path / "runs")
        assert run is not None, fg.stderr.read() if fg.poll() is not None else "no step recorded"
        fg.send_signal(signal.SIGINT)
        _, err = fg.communicate(timeout=120)
    finally:
        fg.kill()
    said, run = " ".join(err.split()), run.relative_to(tmp_path)
    assert fg.returncode == 130 and "Traceback" not in err, err
    assert "continues it" not in said, err
    assert f"no checkpoint was saved ({run}/checkpoint/ is empty)" in said, err
    assert f"`launch resume {run}` starts it again with nothing to continue from" in said, err
