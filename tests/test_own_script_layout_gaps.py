"""A torchrun user's review of own scripts (`launch --script`), as each defect was seen:

- a sweep whose second layout resumed from the first layout's checkpoint (in a folder of the script's own) and took
  no step made the whole sweep's report an error (exit 2, no table), telling a script that calls `track.step`
  to add it: the layout is now left out with why, the others reported;
- the terminal table of a script sweep lost its only throughput column (samples/s, droppable as the built-in
  models' second column) where it had to leave columns out;
- a DataLoader worker's exception made the run's one-line error a block of the worker's whole traceback;
- `launch status` of a run whose rank 1 exited 3 said "exit codes [1]", torchrun's agent's status.

Each on every engine it touches: ddp and horovod (the `single` engine where one process is the rank).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import launch, needs_horovod, only_run_dir

ENGINES = ["ddp", pytest.param("horovod", marks=needs_horovod)]

# Trains 12 steps unless an earlier layout left its mark in the working directory (as a script that saves to
# ./ckpt and resumes from there): then it takes no step and exits 0. IMPORT says where it imports track.
SKIPS = """import os, sys, time
{top}
if os.path.exists("trained"):
    print("resumed after the last step: nothing to do", flush=True)
    sys.exit(0)
{inside}
for _ in range(12):
    time.sleep(0.01)
    track.step(items=4, loss=1.0)
if (os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or "0") == "0":
    open("trained", "w").close()
"""
IMPORT = "from scalelab import track"


def prose(text: str) -> str:
    """Warnings and notes, wrapped between words in the terminal, as one line."""
    return " ".join(text.split())


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.slow
def test_a_layout_that_took_no_step_is_left_out_of_its_sweeps_report_saying_why(engine: str, tmp_path: Path) -> None:
    (tmp_path / "skips.py").write_text(SKIPS.format(top=IMPORT, inside=""))
    proc = launch("sweep", "--script", "skips.py", "--engine", engine, "--workers", "1,2", "--device", "cpu",
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = only_run_dir(tmp_path / "runs")
    said = prose(proc.stderr)
    assert "1x2: skips.py ran" in said and "recorded no step, though it imports scalelab.track" in said, said
    assert "left out of the report" in said and "to measure it, add" not in said, said
    assert [r["workers"] for r in json.loads((sweep / "report.json").read_text())] == [1]
    assert "samples/s" in proc.stdout and "1x1" in proc.stdout, proc.stdout
    again = launch("report", str(sweep), cwd=tmp_path)
    assert again.returncode == 0 and "recorded no step, though it imports scalelab.track" in prose(again.stderr), \
        again.stderr[-3000:]


@pytest.mark.slow
def test_a_layout_whose_script_never_used_track_is_told_to_add_it(tmp_path: Path) -> None:
    """The advice to add track stands where the script never imported it (here: only on the path that trains)."""
    (tmp_path / "skips.py").write_text(SKIPS.format(top="", inside=IMPORT))
    proc = launch("sweep", "--script", "skips.py", "--workers", "1,2", "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = prose(proc.stderr)
    assert "1x2: skips.py ran" in said and "has no step records; to measure it, add `from scalelab import track`" \
        in said and "though it imports" not in said, said


def test_a_script_tables_throughput_column_stays_whatever_else_must_go() -> None:
    """samples/s is a --script's headline (its items); for the built-in models it is the second column, which goes
    before the others where the table is too wide."""
    from test_trust import summary

    from scalelab.analysis.report import fitting_columns
    from scalelab.analysis.scaling import scale_layouts

    script = scale_layouts([summary(1, 1000.0, unit="samples", samples_per_s=1000.0),
                            summary(2, 1900.0, unit="samples", samples_per_s=1900.0)])
    builtin = scale_layouts([summary(1, 1000.0), summary(2, 1900.0)])
    for width in (60, 100, 200):
        assert "samples/s" in [h for h, _, _ in fitting_columns(script, width)], width
        assert "words/s" in [h for h, _, _ in fitting_columns(builtin, width)], width
    assert "samples/s" not in [h for h, _, _ in fitting_columns(builtin, 60)]


# Rank 0's DataLoader worker raises on sample 37: torch re-raises it in the rank with the worker's whole traceback
# in the message.
DL_ERROR = """import os, torch
from torch.utils.data import DataLoader, Dataset
class Samples(Dataset):
    def __len__(self):
        return 100
    def __getitem__(self, i):
        if i == 37 and (os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or "0") == "0":
            raise ValueError(f"bad sample {i}")
        return torch.tensor([float(i)])
for batch in DataLoader(Samples(), batch_size=4, num_workers=2):
    pass
"""


def error_lines(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("launch: error:"))
    return lines[first:]


@pytest.mark.parametrize("engine", ["single", *ENGINES])
@pytest.mark.slow
def test_a_dataloader_workers_error_is_one_line_naming_the_rank_to_read(engine: str, tmp_path: Path) -> None:
    (tmp_path / "dlerr.py").write_text(DL_ERROR)
    ranks = "1" if engine == "single" else "2"
    proc = launch("--script", "dlerr.py", "--engine", engine, "--gpus-per-node", ranks, "--device", "cpu",
                  cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    run = only_run_dir(tmp_path / "runs")
    (line,) = error_lines(proc.stderr)  # nothing of the worker's traceback after it
    assert "dlerr.py raised ValueError in DataLoader worker process" in line and ": bad sample 37 (" in line, line
    assert f"its full traceback: launch logs {run} --rank 0)" in line and "Traceback" not in line, line
    report = launch("report", str(run), cwd=tmp_path)
    (said,) = error_lines(report.stderr)
    assert report.returncode == 2 and "bad sample 37" in said, report.stderr
    logs = launch("logs", str(run), "--rank", "0", cwd=tmp_path)  # where the line sends the reader: the whole of it
    assert "ValueError: bad sample 37" in logs.stdout and "Original Traceback" in logs.stdout, logs.stdout[-3000:]


def test_a_message_of_several_lines_is_said_in_one() -> None:
    """load_state_dict's mismatch list, a DataLoader worker's wrapped traceback, and a plain message."""
    import torch

    from scalelab.train.script import one_line_message

    try:
        torch.nn.Linear(2, 3).load_state_dict(torch.nn.Linear(3, 2).state_dict())
    except RuntimeError as exc:
        said, where, cut = one_line_message(exc)
    assert said.startswith("Error(s) in loading state_dict for Linear: size mismatch for weight") and \
        "\n" not in said and where == "" and cut, said
    wrapped = ValueError("Caught ValueError in DataLoader worker process 1.\nOriginal Traceback (most recent call "
                         "last):\n  File \"x.py\", line 3, in f\n    raise ValueError('bad index 37')\nValueError: bad "
                         "index 37\n")
    assert one_line_message(wrapped) == ("bad index 37", " in DataLoader worker process 1", True)
    assert one_line_message(KeyError("plain")) == ("'plain'", "", False)
    assert one_line_message(AssertionError()) == ("", "", False)


def test_several_ranks_with_the_same_shortened_error_say_it_once() -> None:
    from scalelab.core.records import error_messages

    recs = [{"rank": r, "world": 2, "message": f"a.py raised ValueError: x (its full traceback: launch logs R --rank {r})"}
            for r in (1, 0)]
    assert error_messages(recs) == ["a.py raised ValueError: x (its full traceback: launch logs R --rank 1)"]


EXIT_3 = """import os, sys, time
from scalelab import track
rank = os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or "0"
track.step(items=1, loss=1.0)
if rank == "1":
    sys.exit(3)
time.sleep(3)
"""


@pytest.mark.parametrize("engine", ["single", *ENGINES])
def test_status_of_a_failed_run_says_its_ranks_exit_statuses(engine: str, tmp_path: Path) -> None:
    (tmp_path / "exit3.py").write_text(EXIT_3.replace('"1"', '"0"') if engine == "single" else EXIT_3)
    failing = 0 if engine == "single" else 1
    proc = launch("--script", "exit3.py", "--engine", engine, "--gpus-per-node", "1" if engine == "single" else "2",
                  "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 1 and "exited with status 3" in proc.stderr, proc.stderr[-3000:]
    run = only_run_dir(tmp_path / "runs")
    status = launch("status", str(run), cwd=tmp_path)
    first = status.stdout.splitlines()[0]
    assert f"FAILED rank {failing} exited with status 3" in first and "exit codes" not in first, status.stdout
