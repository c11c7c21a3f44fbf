"""`launch prep` defects fixed: an existing --out is never emptied of the user's files, Ctrl-C says
one line, a failed prep records why (and `launch report` says it), the scaling table fits 80 columns."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason='launch prep needs Dask: pip install "scalelab[prep]"')
pytest.importorskip("pyarrow", reason='launch prep needs pyarrow: pip install "scalelab[prep]"')

from scalelab.core.errors import DataError  # noqa: E402
from scalelab.prep import tasks  # noqa: E402
from scalelab.prep.bench import generate  # noqa: E402
from scalelab.prep.corpus import Storage  # noqa: E402
from tests.conftest import ROOT, launch, only_run_dir  # noqa: E402


def nmt_corpus(where: Path, lines: int = 2000) -> tuple[Path, Path]:
    made = generate(where / "gen", "nmt", lines)
    return Path(made["train_src"][0]), Path(made["train_tgt"][0])


# ---- 1. an existing --out ------------------------------------------------------------------------


def test_an_out_folder_holding_the_users_files_is_refused_and_left_alone(tmp_path: Path) -> None:
    """The reviewer's case: the inputs and a vocabulary of the user's in --out. Was: vocab.en.txt
    deleted, exit 0, nothing said."""
    src, tgt = nmt_corpus(tmp_path)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "src.txt").write_bytes(src.read_bytes())
    (corpus / "tgt.txt").write_bytes(tgt.read_bytes())
    (corpus / "vocab.en.txt").write_text("my vocabulary\n")
    before = {p.name: p.read_bytes() for p in corpus.iterdir()}
    done = launch("prep", "--runs-dir", "runs", "--workers", "1", "--model", "nmt-tiny", "--train-src", "corpus/src.txt",
                  "--train-tgt", "corpus/tgt.txt", "--out", "corpus", "--shard-size", "1000", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert {p.name: p.read_bytes() for p in corpus.iterdir()} == before
    assert "--out corpus is not empty" in done.stderr and "vocab.en.txt" in done.stderr
    assert "another --out" in done.stderr and "Traceback" not in done.stderr


def test_prepare_out_cleans_only_a_marked_unfinished_prep_and_never_its_inputs(tmp_path: Path) -> None:
    storage, out = Storage(), tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    with pytest.raises(DataError, match=r"not empty and no earlier prep made it \(notes.txt\)"):
        tasks.prepare_out(storage, str(out), "run-a", ())
    assert (out / "notes.txt").read_text() == "mine\n"

    fresh = tmp_path / "fresh"
    tasks.prepare_out(storage, str(fresh), "run-a", ())
    assert json.loads((fresh / tasks.MARKER).read_text())["run"] == "run-a"
    # an interrupted prep left shards; an input the user keeps there looks like one of them
    (fresh / "train-00000.arrow").write_text("stale")
    (fresh / "vocab.src.txt").write_text("stale")
    (fresh / "vocab.input.txt").write_text("an input\n")
    _, stats = tasks.prepare_out(storage, str(fresh), "run-b", (str(fresh / "vocab.input.txt"),))
    assert stats["stale_files_removed"] == 3  # the two stale files and _held
    assert (fresh / "vocab.input.txt").read_text() == "an input\n"
    assert not (fresh / "train-00000.arrow").exists() and not (fresh / "vocab.src.txt").exists()
    assert json.loads((fresh / tasks.MARKER).read_text())["run"] == "run-b"

    (fresh / "manifest.json").write_text("{}")
    with pytest.raises(DataError, match="already holds shards"):
        tasks.prepare_out(storage, str(fresh), "run-c", ())


def test_an_empty_out_folder_is_used(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    tasks.prepare_out(Storage(), str(tmp_path / "empty"), "run", ())
    assert (tmp_path / "empty" / tasks.MARKER).is_file() and (tmp_path / "empty" / "_held").is_dir()


# ---- 2. Ctrl-C ------------------------------------------------------------------------------------


def _descendants(pid: int) -> set[int]:
    """The processes below `pid` now (Dask's nanny and worker processes of a local prep)."""
    out, todo = set(), [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
            children = {int(c) for c in task.read_text().split()}
            out |= children
            todo += children
    return out


def _alive(pids: set[int], wait_s: float = 5.0) -> list[str]:
    """The command lines of `pids` still running (not zombies: a worker that ended and awaits its reaping),
    after up to `wait_s` for them to end."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = []
        for pid in pids:
            try:
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except (OSError, IndexError):
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


@pytest.mark.parametrize("how", ["ctrl-c", "kill"])
@pytest.mark.slow
def test_ctrl_c_during_a_prep_says_one_line(tmp_path: Path, how: str) -> None:
    """SIGINT to the process group (Ctrl-C) or SIGTERM to the launcher (`kill PID`) once the tasks run. Was, for
    Ctrl-C: ~100 lines of `Task exception was never retrieved ... AllExit` and the workers' KeyboardInterrupt
    tracebacks before the launcher's line; for SIGTERM: an exit without a word or a record (the prep listed as
    INCOMPLETE) and multiprocessing's "leaked semaphore objects" warning. Nothing of it is left running."""
    train = generate(tmp_path / "gen", "rnnlm", 120_000)["train"][0]  # ~6 MB: ~600 index tasks of 10 KiB
    proc = subprocess.Popen(
        [sys.executable, "-m", "scalelab.launcher.cli", "prep", "--model", "rnnlm-tiny", "--train", train,
         "--out", str(tmp_path / "out"), "--workers", "1", "--block-mb", "0.01", "--shard-size", "200",
         "--runs-dir", str(tmp_path / "runs")],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = []
    for line in proc.stderr:  # the cluster is up and its workers past their start once a phase is done
        lines.append(line)
        if line.startswith("prep prepare"):
            break
    assert lines and lines[-1].startswith("prep prepare"), "".join(lines)
    time.sleep(0.5)  # amid the index phase: hundreds of tasks being gathered
    workers = _descendants(proc.pid)
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    said = [line for line in err.splitlines() if line.strip() and not line.startswith("prep ")]
    assert proc.returncode == (130 if how == "ctrl-c" else 143), err
    assert said == ["launch: interrupted; every process of the run was stopped"], err
    assert workers and not _alive(workers), f"a Dask process is left: {_alive(workers)}"
    run = only_run_dir(tmp_path / "runs")
    assert not (tmp_path / "out" / "_held").exists()
    records = [json.loads(line) for line in (run / "records" / "prep.jsonl").read_text().splitlines()]
    assert records[-1]["kind"] == "failure" and records[-1]["error"] == "interrupted"


def test_a_stop_signal_that_arrives_inside_a_gc_callback_is_not_lost() -> None:
    """Python drops an exception raised in a garbage collector's callback (Dask's scheduler keeps one in the
    launcher of `launch prep`): a Ctrl-C handled there was lost, and the prep ran on. It comes again, outside."""
    from scalelab.launcher.runner import Interrupted, stop_signals_interrupt

    sent = []

    def callback(phase: str, info: dict) -> None:
        if phase == "start" and not sent:
            sent.append(time.monotonic())
            signal.raise_signal(signal.SIGTERM)
            sum(range(10_000))  # the handler runs here, inside the callback

    gc.callbacks.append(callback)
    try:
        with pytest.raises(Interrupted) as stopped, stop_signals_interrupt():
            gc.collect()
            while time.monotonic() < (sent[0] if sent else time.monotonic()) + 5:
                time.sleep(0.01)
    finally:
        gc.callbacks.remove(callback)
    assert sent and stopped.value.signum == signal.SIGTERM


def test_a_dropped_stop_signal_stops_a_block_that_ends_before_it_comes_again() -> None:
    """An `Interrupted` dropped (as in a gc callback, above), then the block ends at once: the block's end raises
    it, and the signal is not sent again after the block, where the handler before it (here: one that counts)
    would take it."""
    from types import SimpleNamespace

    from scalelab.launcher.runner import Interrupted, stop_signals_interrupt

    after = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: after.append(signum))
    try:
        with pytest.raises(Interrupted) as stopped, stop_signals_interrupt():
            sys.unraisablehook(SimpleNamespace(exc_value=Interrupted(signal.SIGTERM)))  # what Python does with it
        time.sleep(0.2)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert stopped.value.signum == signal.SIGTERM and after == []


# ---- 3. a failed prep's record -------------------------------------------------------------------


@pytest.mark.slow
def test_a_failed_prep_records_why_and_report_says_it(tmp_path: Path) -> None:
    """Was: `launch report RUN` said "no manifest phase in its records; see RUN/logs", a folder that
    does not exist, and `_held/` stayed in --out. The bad line lies past what `launch prep` checks up front
    (`core.datafiles.LABEL_LIMIT`), so a task finds it, as it finds any past there."""
    from scalelab.core.datafiles import LABEL_LIMIT

    bad = tmp_path / "bad.tsv"
    good = "pos\tgood film\n"
    bad.write_text(good * (LABEL_LIMIT // len(good) + 1) + "no tab here\n")
    line = LABEL_LIMIT // len(good) + 2
    done = launch("prep", "--model", "sentiment-tiny", "--train", str(bad), "--out", "out", "--workers", "1",
                  "--runs-dir", "runs", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    run = only_run_dir(tmp_path / "runs")
    assert not (tmp_path / "out" / "_held").exists()
    report = launch("report", str(run), cwd=tmp_path)
    assert report.returncode == 2
    assert f"the prep did not finish (it failed: {bad}:{line}: expected LABEL<TAB>text" in report.stderr, report.stderr
    assert "/logs" not in report.stderr
    again = launch("prep", "--model", "sentiment-tiny", "--train", str(bad), "--out", "out", "--workers", "1",
                   "--runs-dir", "runs", cwd=tmp_path)  # the folder is the failed prep's: used again, not refused
    assert "not empty" not in again.stderr and "expected LABEL<TAB>text" in again.stderr


# ---- 4. the scaling table in 80 columns ----------------------------------------------------------


@pytest.mark.slow
def test_the_prep_scaling_table_fits_80_columns_without_cutting_numbers(tmp_path: Path) -> None:
    """Was: every cell cut to 1-2 characters and an ellipsis at 80 columns."""
    src, tgt = nmt_corpus(tmp_path)
    done = launch("prep", "--model", "nmt-tiny", "--train-src", str(src), "--train-tgt", str(tgt), "--out", "out",
                  "--workers", "1", "--shard-size", "1000", "--runs-dir", "runs", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run = only_run_dir(tmp_path / "runs")
    shown = launch("report", str(run), cwd=tmp_path, env={"COLUMNS": "80"})
    assert shown.returncode == 0, shown.stderr
    table = shown.stdout.splitlines()
    assert max(len(line) for line in table) <= 80 and "…" not in shown.stdout, shown.stdout
    assert "more columns in report.md and report.json" in shown.stdout
    row = json.loads((run / "report.json").read_text())[0]
    assert f"{row['lines_per_s']:,.0f}" in shown.stdout and f"{row['wall_s']:.2f}" in shown.stdout
    for header in ("workers", "lines/s", "speedup"):
        assert header in shown.stdout
    wide = launch("report", str(run), cwd=tmp_path, env={"COLUMNS": "200"})
    assert "lines/s/worker" in wide.stdout and "more columns" not in wide.stdout
    assert not (tmp_path / "out" / ".scalelab-prep").exists()  # finished: the manifest marks it now


@pytest.mark.parametrize("content, said", [(b"", "data file is empty: {path} (--train); give a file with text in it"),
                                           (bytes(range(256)) * 4, "{path} is not a text file (binary or not UTF-8)"),
                                           (None, "data file not found: {path} (check --train)")])
@pytest.mark.parametrize("dry_run", [False, True])
def test_an_empty_binary_or_missing_train_file_is_refused_before_the_cluster_starts(content, said, dry_run,
                                                                                      tmp_path: Path) -> None:
    """Before: an empty or binary --train was found by a Dask task, after the cluster started (exit 2 with a
    runs/prep-* directory and an empty --out left behind), and a dry run did not look at the inputs at all."""
    path = tmp_path / "corpus.txt"
    if content is not None:
        path.write_bytes(content)
    proc = launch("prep", "--model", "rnnlm-tiny", "--train", str(path), "--out", str(tmp_path / "out"),
                  *(["--dry-run"] if dry_run else []), cwd=tmp_path)
    assert proc.returncode == 2 and said.format(path=path) in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == (["corpus.txt"] if content is not None else [])
