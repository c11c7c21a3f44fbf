"""Issue 35 ask 5: `launch logs` as a person following a run reads it: one line for a stop that was asked
for whatever the engine, Slurm's per-task files summarised, `--rank N` streaming that rank, and where the
ranks are before the first step."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_entry

from scalelab.core.records import RecordWriter
from scalelab.launcher.backend import quiet_stop_tracebacks
from scalelab.launcher.inventory import RankLines, follow

# horovodrun's own output after `launch cancel` of a 1x2 Horovod run (Gloo), as logs/launcher.log held it
HOROVOD_CANCELLED = """Process 1 exit with status code -15.
Process 0 exit with status code -15.
Traceback (most recent call last):
  File "/work/main/.venv/bin/horovodrun", line 8, in <module>
    sys.exit(run_commandline())
             ^^^^^^^^^^^^^^^^^
  File "/work/main/.venv/lib/python3.11/site-packages/horovod/runner/launch.py", line 837, in run_commandline
    _run(args)
  File "/work/main/.venv/lib/python3.11/site-packages/horovod/runner/launch.py", line 827, in _run
    return _run_static(args)
           ^^^^^^^^^^^^^^^^^
  File "/work/main/.venv/lib/python3.11/site-packages/horovod/runner/launch.py", line 685, in _run_static
    _launch_job(args, settings, nics, command)
  File "/work/main/.venv/lib/python3.11/site-packages/horovod/runner/launch.py", line 800, in _launch_job
    run_controller(args.use_gloo, gloo_run_fn,
  File "/work/main/.venv/lib/python3.11/site-packages/horovod/runner/launch.py", line 754, in run_controller
    gloo_run()
  File "/work/main/.venv/lib/python3.11/site-packages/horovod/runner/launch.py", line 792, in gloo_run_fn
    gloo_run(settings, nics, env, driver_ip, command)
  File "/work/main/.venv/lib/python3.11/site-packages/horovod/runner/gloo_run.py", line 300, in gloo_run
    launch_gloo(command, exec_command, settings, nics, env, server_ip)
  File "/work/main/.venv/lib/python3.11/site-packages/horovod/runner/gloo_run.py", line 284, in launch_gloo
    raise RuntimeError('Horovod detected that one or more processes exited with non-zero '
RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing the job to be terminated. The first process to do so was:
Process name: 1
Exit code: -15

"""


def test_a_cancelled_horovod_run_reads_as_one_line():
    quiet = quiet_stop_tracebacks("[1,0]<stdout>:hello\n" + HOROVOD_CANCELLED)
    assert quiet.startswith("[1,0]<stdout>:hello\n")
    assert "Traceback" not in quiet and "RuntimeError" not in quiet and "exit with status code" not in quiet
    assert "horovodrun: 2 ranks stopped by SIGTERM, as asked; its traceback is left out" in quiet
    assert len([line for line in quiet.splitlines() if line.strip()]) == 2


def test_a_cancelled_torchrun_run_reads_as_one_line_with_its_agents_warnings():
    """DDP and the parameter server (torchrun): the agent's warnings as it passed SIGTERM on went with it."""
    text = ("W1127 05:45:47.911000 5912 torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal, "
            "shutting down workers\n"
            "W1127 05:45:47.911000 5912 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 5929 "
            "closing signal SIGTERM\n"
            "W1127 05:45:47.911000 5912 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 5930 "
            "closing signal SIGTERM\n"
            "Traceback (most recent call last):\n  File \"/venv/bin/torchrun\", line 8, in <module>\n"
            "    sys.exit(main())\n"
            "torch.distributed.elastic.multiprocessing.api.SignalException: Process 5912 got signal: 15\n")
    assert quiet_stop_tracebacks(text) == "torchrun agent (pid 5912) stopped by SIGTERM, as asked; its traceback is left out\n"
    warnings_only = text.split("Traceback")[0]  # without the traceback (a failure's own report): kept
    assert quiet_stop_tracebacks(warnings_only) == warnings_only


def test_a_horovod_rank_that_failed_keeps_its_traceback():
    failed = HOROVOD_CANCELLED.replace("Process 1 exit with status code -15.", "Process 1 exit with status code 1.") \
        .replace("Exit code: -15", "Exit code: 1")
    assert quiet_stop_tracebacks(failed) == failed
    ctrl_c = HOROVOD_CANCELLED.replace("-15", "-2")
    assert "stopped by SIGINT" in quiet_stop_tracebacks(ctrl_c)


def test_slurm_task_files_are_summarised_and_stay_whole_on_disk(tmp_path):
    from scalelab.slurm.backend import summarised_task_logs

    info = "submitit INFO (2026-11-27 05:00:00,123) - Starting with JobEnvironment(job_id=12, hostname=c1)\n" \
           "submitit INFO (2026-11-27 05:00:00,124) - Loading pickle: /x/12_submitted.pkl\n"
    files = []
    for rank in range(8):
        for ext, extra in (("out", ""), ("err", "scalelab: Horovod rendezvous on port 1234\n" if rank == 0 else "")):
            path = tmp_path / f"12_{rank}_log.{ext}"
            path.write_text(info + extra)
            files.append(path)
    text = summarised_task_logs(files)
    assert "submitit INFO (" not in text and "Starting with JobEnvironment" not in text
    assert "==> " + str(tmp_path / "12_0_log.err") + " <==\nscalelab: Horovod rendezvous on port 1234" in text
    assert text.count("==> ") == 1  # the 15 files with only submitit's lines: one line, not 15 headers
    assert "submitit's own lines and the task files holding nothing else are left out" in text
    assert all(f.read_text().startswith("submitit INFO") for f in files)  # the files are untouched


def _records(run_dir: Path, world: int = 2, steps: int = 3) -> None:
    (run_dir / "records").mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        out = RecordWriter(run_dir, rank, world)
        out.write("start", world=world, device="cpu", host="vm")
        for step in range(1, steps + 1):
            out.write("step", step=step, warmup=step == 1, step_s=0.0123, data_s=0.001, forward_s=0.003,
                      backward_s=0.007, exchange_s=0.002, optimizer_s=0.001, samples=8, words=80, loss=4.1 + rank)
        out.close()


def test_rank_lines_stream_one_ranks_records(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # each record on one line (at 80 columns a step line wraps between words)
    _records(tmp_path)
    lines = RankLines(tmp_path, 1)
    first = lines.read()
    assert "[rank 1] started (world 2, device cpu, host vm)" in first
    assert "[rank 1] step 3  loss 5.1000  12.3 ms: data 1.0 fwd 3.0 bwd 7.0 (exch 2.0) opt 1.0  80 words" in first
    assert "(warm-up)" in first.splitlines()[2] and "loss 4.1000" not in first  # rank 0's are not in it
    out = RecordWriter(tmp_path, 1, 2)
    out.write("val", step=3, epoch=0, val_loss=4.05, elapsed_s=1.0)
    out.close()
    again = lines.read()
    assert again.startswith(first) and again[len(first):] == "[rank 1] validation at step 3: loss 4.0500\n"


def test_follow_writes_what_each_file_adds_as_tail_does():
    """Several files (Slurm's task files; a rank's log and its records) are followed apart: a file that grows
    adds its new lines under its header again, instead of the whole text being printed again."""
    reads = iter([("==> a.log <==\nlog a\n\n==> b.log <==\nb 1\n", "==> rank-1 <==\nrec 1\n"),
                  ("==> a.log <==\nlog a\nlog b\n\n==> b.log <==\nb 1\n", "==> rank-1 <==\nrec 1\nrec 2\n"),
                  ("==> a.log <==\nlog a\nlog b\n\n==> b.log <==\nb 1\n", "==> rank-1 <==\nrec 1\nrec 2\nrec 3\n")])
    states = iter([True, True, False])
    written: list[str] = []
    follow(lambda: next(reads), lambda: next(states), written.append, poll_s=0)
    assert "".join(written) == ("==> a.log <==\nlog a\n\n==> b.log <==\nb 1\n\n==> rank-1 <==\nrec 1\n"
                                "\n==> a.log <==\nlog b\n\n==> rank-1 <==\nrec 2\nrec 3\n")


def test_follow_holds_a_half_written_line_until_it_is_whole():
    reads = iter(["==> a.log <==\nstep 1\nste", "==> a.log <==\nstep 1\nstep 2\nlast wo", "==> a.log <==\nstep 1\nstep 2\nlast words"])
    states = iter([True, True, False])
    written: list[str] = []
    follow(lambda: next(reads), lambda: next(states), written.append, poll_s=0)
    assert written == ["==> a.log <==\nstep 1\n", "step 2\n", "last words\n"]


def test_follow_holds_a_half_written_line_of_every_file_not_only_the_last():
    """The local backend shows each torchrun rank's own files one after the other (files joined by a blank line):
    a rank's line still being written, in a file before the last, was shown cut, then its file again whole."""
    reads = iter(["==> a.log <==\nline 1\nhalf\n==> b.log <==\nb 1\n",
                  "==> a.log <==\nline 1\nhalf done\n\n==> b.log <==\nb 1\n",
                  "==> a.log <==\nline 1\nhalf done\n\n==> b.log <==\nb 1\n"])
    states = iter([True, True, False])
    written: list[str] = []
    follow(lambda: next(reads), lambda: next(states), written.append, poll_s=0)
    assert written == ["==> a.log <==\nline 1\n", "\n==> b.log <==\nb 1\n", "\n==> a.log <==\nhalf done\n"]


# what srun and slurmstepd wrote into task 0's file when `launch cancel` stopped a 2x2 Horovod job (real cluster)
SLURM_CANCELLED = """scalelab: Horovod rendezvous on port 48375 for 2 node(s) x 2 rank(s): node1,node2
srun: Job step aborted: Waiting up to 32 seconds for job step to finish.
srun: got SIGCONT
slurmstepd-node1: error: *** STEP 270.0 ON node1 CANCELLED AT 2026-11-27T05:17:43 ***
slurmstepd-node1: error: *** JOB 270 ON node1 CANCELLED AT 2026-11-27T05:17:43 ***
srun: forcing job termination
srun: error: node1: tasks 0-1: Exited with exit code 143
srun: launch/slurm: _step_signal: Terminating StepId=270.0
srun: error: node2: tasks 2-3: Exited with exit code 143
"""


def test_a_cancelled_slurm_job_reads_as_one_line():
    from scalelab.slurm.backend import quiet_slurm_stop

    quiet = quiet_slurm_stop(SLURM_CANCELLED)
    assert quiet.splitlines() == [
        "scalelab: Horovod rendezvous on port 48375 for 2 node(s) x 2 rank(s): node1,node2",
        "slurm: job 270 cancelled at 2026-11-27T05:17:43; tasks exited 143, as asked; srun's messages left out"]
    failed = SLURM_CANCELLED.replace("tasks 2-3: Exited with exit code 143", "tasks 2-3: Exited with exit code 1")
    assert quiet_slurm_stop(failed) == failed  # a task that failed on its own: every line stays


def _run_dir(tmp_path: Path, world: int = 2) -> Path:
    from scalelab.core.spec import Spec, save_spec

    run = tmp_path / "run-1x2"
    run.mkdir()
    spec = Spec()
    spec.gpus_per_node, spec.steps = world, 3
    spec.engine.name = "ddp"
    save_spec(spec, run)
    return run


class Running:
    """A backend whose run is active, with a launcher log of headers only (ranks print little)."""

    def status(self, run_dir):
        from scalelab.launcher.backend import RunStatus

        return RunStatus("RUNNING", "")

    def logs(self, run_dir):
        return "==> launcher.log <==\n"

    def rank_logs(self, run_dir, rank):
        from scalelab.launcher.inventory import rank_log

        return rank_log(run_dir, self.logs(run_dir), rank)


def test_logs_rank_prints_that_ranks_records(tmp_path, monkeypatch, capsys):
    from scalelab.launcher import cli

    run = _run_dir(tmp_path)
    _records(run)
    monkeypatch.setattr(cli, "_backend_of", lambda run_dir: (Running(), Path(run_dir)))
    code, err, out = run_entry(["logs", str(run), "--rank", "1"], monkeypatch, capsys)
    assert code == 0, err
    assert "[rank 1] step 2  loss 5.1000" in out and "[rank 0]" not in out
    code, err, _ = run_entry(["logs", str(run), "--rank", "2"], monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1 and "the run has ranks 0..1" in err


def test_a_followers_progress_says_starting_ranks_before_the_first_step(tmp_path, monkeypatch, capsys):
    """A detached run's follower saw a bare header for ~45 s: now where the ranks are, while the run is active."""
    from scalelab.launcher import cli

    run = _run_dir(tmp_path)
    (run / "records").mkdir()
    RecordWriter(run, 0, 2).write("start", world=2, device="cpu", host="vm")
    monkeypatch.setattr(cli, "_backend_of", lambda run_dir: (Running(), Path(run_dir)))
    code, err, out = run_entry(["logs", str(run)], monkeypatch, capsys)
    assert code == 0, err
    assert "[progress] starting ranks: 1 of 2 up" in out


def test_status_of_a_run_before_its_first_step_says_how_many_ranks_are_up(tmp_path, monkeypatch, capsys):
    from scalelab.launcher import cli

    run = _run_dir(tmp_path)
    (run / "records").mkdir()
    RecordWriter(run, 1, 2).write("start", world=2, device="cpu", host="vm")
    monkeypatch.setattr(cli, "_backend_of", lambda run_dir: (Running(), Path(run_dir)))
    monkeypatch.setattr("scalelab.launcher.runner.settle", lambda backend, path: backend.status(path))
    code, err, out = run_entry(["status", str(run)], monkeypatch, capsys)
    assert code == 0, err
    assert "RUNNING" in out and "starting ranks: 1 of 2 up" in out


def test_a_scripts_step_lines_say_its_unit_and_no_phases_it_did_not_time():
    """`launch logs RUN --rank N` of a script that never called track.unit printed
    'step 46 loss 0.2399 208.1 ms: data — fwd — bwd — opt — 32 words'."""
    from scalelab.launcher.inventory import record_line

    rec = {"kind": "step", "step": 46, "loss": 0.2399, "step_s": 0.2081, "samples": 32, "words": 32}
    assert record_line(rec, "samples") == "step 46  loss 0.2399  208.1 ms  32 samples"
    assert record_line(rec, "tokens").endswith("32 tokens")
    timed = {**rec, "data_s": 0.001, "forward_s": 0.05, "backward_s": 0.1, "optimizer_s": 0.01, "words": 900}
    assert "fwd 50.0" in record_line(timed) and record_line(timed).endswith("900 words")


BINARY = "[rank0]:nul:\x00 bell:\x07 bs:\x08 title:\x1b]0;pwned\x07 clear:\x1b[2J \x1b[31mred\x1b[0m ff:\x0c del:\x7f c1:\x9b tab:\tend\n"


class Binary(Running):
    """A run whose log holds a rank's binary write; `state`: what it is now (RUNNING, or ended)."""

    def __init__(self, state="RUNNING"):
        self.state = state

    def status(self, run_dir):
        from scalelab.launcher.backend import RunStatus

        return RunStatus(self.state, "")

    def logs(self, run_dir):
        return "==> launcher.log <==\n" + BINARY


@pytest.mark.parametrize("follow", [False, True])
def test_logs_show_control_bytes_escaped_and_keep_colours(tmp_path, monkeypatch, capsys, follow):
    """A rank's binary output reached the terminal raw (a NUL, a bell, a backspace, a title or clear-screen
    sequence): each is shown as \\xNN; colours (SGR) and tabs stay; the line stays one line."""
    import json

    from scalelab.launcher import cli

    run = _run_dir(tmp_path)
    (run / "launch.json").write_text(json.dumps({"backend": "local", "state": "COMPLETED"}))
    monkeypatch.setattr(cli, "_backend_of", lambda run_dir: (Binary("COMPLETED" if follow else "RUNNING"),
                                                              Path(run_dir)))
    code, err, out = run_entry(["logs", str(run), *(["-f"] if follow else [])], monkeypatch, capsys)
    assert code == 0, err
    assert "nul:\\x00 bell:\\x07 bs:\\x08 title:\\x1b]0;pwned\\x07 clear:\\x1b[2J" in out, out
    assert "ff:\\x0c del:\\x7f c1:\\x9b tab:\tend" in out, out
    assert not set(out) & ({chr(c) for c in range(32) if chr(c) not in "\t\n\x1b"} | {chr(c) for c in range(0x7f, 0xa0)})
    assert [line for line in out.splitlines() if "nul:" in line][0].endswith("tab:\tend"), out


def test_a_form_feed_does_not_cut_a_dropped_line(tmp_path):
    """The agent's copy of a rank's line is left out whole: splitting at the form feed in it left its rest behind."""
    from scalelab.launcher.backend import log_text
    from scalelab.launcher.local import TORCHRUN_TEE

    log = tmp_path / "launcher.log"
    log.write_text("agent line\n[rank0]:before\x0cafter\nlast\n")
    text = log_text([log], drop=TORCHRUN_TEE.match)
    assert "after" not in text and "agent line\nlast\n" in text, text
