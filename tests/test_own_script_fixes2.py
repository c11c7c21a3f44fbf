"""Fixes to `launch --script` / `--module` found by a tester (second round).

1. Ctrl-C of a script that never saved a checkpoint said "`launch resume RUN` continues it" over an empty
   checkpoint/ folder; it now gives the no-checkpoint advice `launch status` gives.
2. A script (or --module) with a syntax error, or bytes that are no UTF-8 text, started every rank, printed a
   traceback per rank and left a FAILED run; it is refused in one line, exit 2, before any run directory.
3. --engine single with a torchrun-style script (an init_process_group that always runs, reading RANK...) failed
   in its rank ("environment variable RANK expected, but not set"); it is refused in one line naming --engine ddp.
   A script that calls it only under torchrun (examples/own-script/train_ddp.py) still runs.
4. A rank killed by SIGKILL was named after its peer that torchrun then stopped with SIGTERM.
5. The end note of a script without step records was one long line; it is wrapped as `launch report` wraps it.
6. `launch --help`'s "Start here" never named --script / --module.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, launch, on_cpu_where_gpus_are_short, read_jsonl

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


@pytest.mark.slow
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


@pytest.mark.parametrize("files,args,said", [
    pytest.param({"syntax.py": b"def f(:\n  pass\n"}, ["--script", "syntax.py"],
                 "launch: error: --script syntax.py: line 1: invalid syntax: fix the script (`python syntax.py` "
                 "shows it)", id="syntax"),
    pytest.param({"bin.py": bytes(range(128, 256)) * 2}, ["--script", "bin.py"],
                 "launch: error: --script bin.py is not Python source: line 1 is not UTF-8 text", id="not-utf8"),
    pytest.param({"pkg/__init__.py": b"", "pkg/mod.py": b"x = (\n"}, ["--module", "pkg.mod"],
                 "launch: error: --module pkg.mod (pkg/mod.py): line 1: '(' was never closed", id="module"),
])
def test_code_that_does_not_compile_is_refused_before_anything_starts(tmp_path, files, args, said) -> None:
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(data)
    proc = launch(*args, "--gpus-per-node", "2", cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(said), proc.stderr
    assert not (tmp_path / "runs").exists(), "a run directory was made"


DDP_TOP = """import torch, torch.distributed as dist
from scalelab import track
dist.init_process_group("gloo")
t = torch.ones(1); dist.all_reduce(t); track.step(items=1, loss=1.0)
"""


def test_single_refuses_a_script_that_always_reads_torchruns_variables(tmp_path) -> None:
    (tmp_path / "ddp1.py").write_text(DDP_TOP)
    proc = launch("--script", "ddp1.py", "--engine", "single", cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("launch: error: ddp1.py:3 calls init_process_group") and "--engine ddp" in lines[0]
    assert not (tmp_path / "runs").exists(), "a run directory was made"


@pytest.mark.parametrize("source,line", [
    (DDP_TOP, 3),
    ("import torch.distributed as dist\ndef main():\n    dist.init_process_group('gloo')\n"
     "if __name__ == '__main__':\n    main()\n", 3),
    ("import os, torch.distributed as dist\nif 'RANK' in os.environ:\n    dist.init_process_group('gloo')\n", None),
    ("import torch.distributed as dist\ndist.init_process_group('gloo', init_method='tcp://127.0.0.1:1', rank=0, "
     "world_size=1)\n", None),
    ((ROOT / "examples" / "own-script" / "train_ddp.py").read_text(), None),
])
def test_which_init_process_group_calls_need_torchrun(source, line) -> None:
    import ast

    from scalelab.launcher.owncode import env_rendezvous

    assert env_rendezvous(ast.parse(source)) == line


@pytest.mark.parametrize("exits", [{"0": -15, "1": -9}, {"0": 143, "1": 137}])
def test_the_rank_its_agent_stopped_is_said_after_the_killed_one(tmp_path, exits) -> None:
    """4. Rank 1 killed by SIGKILL; torchrun then stopped rank 0 with SIGTERM: rank 1 is named first."""
    import json

    from scalelab.core.spec import EngineSpec, Spec, save_spec
    from scalelab.launcher.backend import RankEnd, silent_ranks

    save_spec(Spec(engine=EngineSpec(name="ddp"), nodes=1, gpus_per_node=2, batch_per_worker=8, steps=10), tmp_path)
    (tmp_path / "launch.json").write_text(json.dumps({"state": "FAILED", "rank_exits": exits}))
    said = silent_ranks(tmp_path, [RankEnd(0, 2, None, None, [], []), RankEnd(1, 2, None, None, [], [])])
    assert said.startswith("rank 1 was killed by SIGKILL (signal 9)"), said
    assert "rank 0 was killed by SIGTERM (signal 15)" in said, said


def test_the_end_note_of_a_script_without_step_records_is_wrapped_to_the_terminal(tmp_path) -> None:
    """5. The note was printed as one 321-character line on an 80-column terminal; `launch report` wraps it."""
    (tmp_path / "silent.py").write_text("print('hello')\n")
    proc = launch("--script", "silent.py", "--engine", "single", cwd=tmp_path, env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    note = proc.stdout[proc.stdout.index("note: "):]
    assert "has no step records" in " ".join(note.split()), proc.stdout
    assert all(len(line) <= 80 for line in proc.stdout.splitlines()), proc.stdout


def test_the_top_level_help_starts_users_on_their_own_script_too() -> None:
    """6. `launch --help`'s "Start here" named only built-in presets; --script / --module were found by chance."""
    from click.testing import CliRunner

    from scalelab.launcher.cli import main

    out = CliRunner().invoke(main, ["--help"], prog_name="launch", env={"COLUMNS": "80"}).output
    start = out[out.index("Start here:"):out.index("`launch` with options")]
    assert "launch --script train.py" in start and "--module" in start, start
    assert max(len(line) for line in out.splitlines()) <= 80, out
