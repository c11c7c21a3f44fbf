"""A torchrun user's review of own scripts (`launch --script`), the run's edges:

- `launch logs` made every state of a tqdm-style bar (carriage returns) a tagged line of its own, where the
  terminal that followed the run showed one line;
- TORCHELASTIC_RUN_ID was "none" in every run (torchrun's static rendezvous), so scripts that name their output
  folder by it wrote every run into one;
- stopping a run whose ranks had live DataLoader workers printed "DataLoader worker ... killed by signal:
  Terminated" tracebacks, one through scalelab's own exit path, which it cut short.

Each on every engine it touches: ddp and horovod, and `single` where one process is the rank.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, launch, needs_horovod, only_run_dir, read_jsonl
from scalelab.train.track import HOLD_AT_STEP_ENV

ENGINES = ["single", "ddp", pytest.param("horovod", marks=needs_horovod)]

# A bar of 50 states on stderr, each after a carriage return, as tqdm draws one; then a line on stdout.
BAR = r"""import sys
from scalelab import track
for i in range(1, 51):
    sys.stderr.write(f"\r{i * 2}%|{'#' * (i // 5)}| {i}/50")
    sys.stderr.flush()
    track.step(items=1, loss=1.0)
sys.stderr.write("\n")
print("done", flush=True)
"""


def ranks(engine: str) -> str:
    return "1" if engine == "single" else "2"


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.slow
def test_logs_show_a_progress_bar_in_its_last_state_once_per_rank(engine: str, tmp_path: Path) -> None:
    (tmp_path / "bar.py").write_text(BAR)
    proc = launch("--script", "bar.py", "--engine", engine, "--gpus-per-node", ranks(engine), "--device", "cpu",
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = only_run_dir(tmp_path / "runs")
    logs = launch("logs", str(run), cwd=tmp_path)
    bars = [line for line in logs.stdout.splitlines() if "/50" in line]
    assert len(bars) == int(ranks(engine)) and all(line.endswith("100%|##########| 50/50") for line in bars), \
        logs.stdout[-3000:]
    if engine != "single":  # each under its rank's tag
        assert sorted(line.split(":")[0] for line in bars) in (["[rank0]", "[rank1]"], ["[0]<stderr>", "[1]<stderr>"])
    one = launch("logs", str(run), "--rank", "0", cwd=tmp_path)
    (bar,) = [line for line in one.stdout.splitlines() if "/50" in line]
    assert bar.endswith("100%|##########| 50/50") and "done" in one.stdout, one.stdout[-3000:]


def test_a_rewritten_line_keeps_its_last_state_under_its_tag() -> None:
    from scalelab.core.terminal import visible_text

    assert visible_text("[rank0]:\r2%\r4%\r100% 5/5\nnext\n") == "[rank0]:100% 5/5\nnext\n"
    assert visible_text("[1]<stderr>:\r[1]<stderr>:2%\r[1]<stderr>:100%\n") == "[1]<stderr>:100%\n"
    # two ranks' bars interleaved on one line (horovodrun tags every state): each last state keeps its own rank's tag
    both = "[1]<stderr>:\r[0]<stderr>:\r[1]<stderr>:2%\r[0]<stderr>:100% 5/5\n[1]<stderr>:100% 5/5\n"
    assert visible_text(both) == "[0]<stderr>:100% 5/5\n[1]<stderr>:100% 5/5\n"
    assert visible_text("[0]<stderr>:\r[1]<stderr>:\r") == "[0]<stderr>:\n[1]<stderr>:"  # nothing drawn yet


def test_one_ranks_lines_of_two_bars_drawn_at_once_are_its_own(tmp_path: Path) -> None:
    """`launch logs --rank R` of a combined log (horovodrun's) where two ranks' bars interleaved on one line."""
    from scalelab.core.terminal import visible_text
    from scalelab.launcher.backend import rank_log

    both = "[1]<stderr>:\r[0]<stderr>:\r[1]<stderr>:2%\r[0]<stderr>:100% 5/5\n[1]<stderr>:100% 5/5\nlaunch: done\n"
    assert visible_text(rank_log(tmp_path, both, 0)) == "[0]<stderr>:100% 5/5\n"
    assert visible_text(rank_log(tmp_path, both, 1)) == "[1]<stderr>:100% 5/5\n"
    # as horovodrun interleaved them in a run: the line ends with the other rank's stdout, its bar goes on after
    run = ("[1]<stderr>:\r[1]<stderr>:2% 1/9\r[0]<stderr>:\r[0]<stderr>:2% 1/9\r[1]<stdout>:done\n"
           "[0]<stderr>:9/9\r[1]<stderr>:9/9\n[0]<stderr>:\n[0]<stdout>:done\n")
    assert visible_text(rank_log(tmp_path, run, 0)) == "[0]<stderr>:9/9\n[0]<stdout>:done\n"
    assert visible_text(run) == "[1]<stdout>:done\n[1]<stderr>:9/9\n[0]<stderr>:9/9\n[0]<stdout>:done\n"
    torchrun = "[rank0]:\r2%\r100% 5/5\n[rank1]:\r100% 5/5\n"  # a state without a tag is the line's rank's
    assert visible_text(rank_log(tmp_path, torchrun, 0)) == "[rank0]:100% 5/5\n"
    assert visible_text("a\r\nb\rc\r\n\rd") == "a\nc\nd"  # \r\n a line break; an empty last state is no state
    assert visible_text("bell:\x07\rshown\n") == "shown\n"


# Each rank writes its TORCHELASTIC_RUN_ID; in the first launch both then fail (once the other has written its
# own: a rank failing first would have torchrun end its peer before it wrote), so that `launch resume` runs it again.
RUN_ID = """import os, sys, time
rank = os.environ["RANK"]
mine, other = f"run-ids-{rank}", f"run-ids-{1 - int(rank)}"
first = not os.path.exists(mine)
with open(mine, "a") as out:
    out.write(f"{os.environ.get('TORCHELASTIC_RUN_ID')}\\n")
if first:
    deadline = time.monotonic() + 60
    while not (os.path.exists(other) and os.path.getsize(other)) and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(3)
"""


@pytest.mark.slow
def test_torchelastic_run_id_is_the_runs_own_and_stays_on_resume(tmp_path: Path) -> None:
    (tmp_path / "rid.py").write_text(RUN_ID)
    first = launch("--script", "rid.py", "--engine", "ddp", "--gpus-per-node", "2", "--device", "cpu", cwd=tmp_path)
    assert first.returncode == 1, first.stderr[-3000:]
    run = only_run_dir(tmp_path / "runs")
    again = launch("resume", str(run), cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    for rank in (0, 1):
        assert (tmp_path / f"run-ids-{rank}").read_text().split() == [run.name, run.name]


def test_a_sweeps_layouts_have_run_ids_of_their_own(tmp_path: Path) -> None:
    from scalelab.core.spec import EngineSpec, Spec
    from scalelab.train.script import RUN_ID_ENV, set_run_id

    sweep = tmp_path / "sweep-a-strong-1"
    (sweep / "1x2").mkdir(parents=True)
    (sweep / "sweep.json").write_text(json.dumps({"runs": ["1x2"]}))
    before = os.environ.get(RUN_ID_ENV)
    try:
        os.environ.pop(RUN_ID_ENV, None)
        set_run_id(Spec(model="nmt-tiny", engine=EngineSpec(name="horovod")), sweep / "1x2")
        assert RUN_ID_ENV not in os.environ  # torchrun's variable: not horovodrun's
        set_run_id(Spec(model="nmt-tiny", engine=EngineSpec(name="ddp")), sweep / "1x2")
        assert os.environ[RUN_ID_ENV] == "sweep-a-strong-1-1x2"
    finally:
        os.environ.pop(RUN_ID_ENV, None)
        if before is not None:
            os.environ[RUN_ID_ENV] = before


# Its DataLoader's iterator is a module global (the module's function keeps the globals in a cycle, so the
# iterator and its two workers outlive the script's frame until a collection, in the runner's exit path).
LOADER = """import time, torch
from torch.utils.data import DataLoader, TensorDataset
from scalelab import track
loader = iter(DataLoader(TensorDataset(torch.randn(100000, 4)), batch_size=4, num_workers=2))
def helper():
    return 1
for _ in range(100000):
    next(loader)
    time.sleep(0.01)
    track.step(items=4, loss=1.0)
"""
HOLD = 3


def start(tmp_path: Path, engine: str) -> tuple[subprocess.Popen, Path]:
    """`launch --script loader.py` in the background, once every rank holds at step HOLD (its workers alive)."""
    (tmp_path / "loader.py").write_text(LOADER)
    argv = ["--script", "loader.py", "--engine", engine, "--gpus-per-node", ranks(engine), "--device", "cpu"]
    proc = subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", *argv], cwd=tmp_path, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", HOLD_AT_STEP_ENV: str(HOLD)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        runs = [p for p in (tmp_path / "runs").glob("*") if p.is_dir()] if (tmp_path / "runs").exists() else []
        held = runs and all((runs[0] / "records" / f"rank-{r}.jsonl").exists() and any(
            rec.get("step") == HOLD for rec in read_jsonl(runs[0] / "records" / f"rank-{r}.jsonl"))
            for r in range(int(ranks(engine))))
        if held:
            return proc, runs[0]
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the ranks did not reach step {HOLD}: {proc.communicate()}")


def quiet_stop(proc: subprocess.Popen, run: Path, engine: str) -> None:
    _, err = proc.communicate(timeout=120)
    assert proc.returncode in (1, 130) and ("was cancelled" in err or "launch: interrupted" in err), err[-3000:]
    assert "killed by signal" not in err and "scalelab/train/script.py" not in err and "Traceback" not in err, err
    assert json.loads((run / "launch.json").read_text())["state"] == "CANCELLED"
    for rank in range(int(ranks(engine))):
        ends = [r for r in read_jsonl(run / "records" / f"rank-{rank}.jsonl") if r.get("event") == "end"]
        assert [(e["reason"], e["exit_code"]) for e in ends] == [("interrupted", 143)], ends
    logs = launch("logs", str(run), cwd=run.parent.parent)
    assert "killed by signal" not in logs.stdout and "scalelab/train/script.py" not in logs.stdout, logs.stdout


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.slow
def test_a_cancel_ends_the_dataloaders_workers_without_their_tracebacks(engine: str, tmp_path: Path) -> None:
    proc, run = start(tmp_path, engine)
    try:
        cancel = launch("cancel", str(run), cwd=tmp_path)
        assert cancel.returncode == 0 and "CANCELLED" in cancel.stdout, cancel.stdout + cancel.stderr
        quiet_stop(proc, run, engine)
    finally:
        proc.kill()


@pytest.mark.slow
def test_ctrl_c_ends_the_dataloaders_workers_without_their_tracebacks(tmp_path: Path) -> None:
    proc, run = start(tmp_path, "ddp")
    try:
        proc.send_signal(signal.SIGINT)
        quiet_stop(proc, run, "ddp")
    finally:
        proc.kill()
