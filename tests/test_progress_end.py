"""The progress display says why a run stopped short of its steps: the loss threshold."""

import io

from rich.console import Console

from scalelab.core.records import RecordWriter
from scalelab.launcher.progress import RunProgress


def write_run(run_dir, threshold_at=None):
    out = RecordWriter(run_dir, 0, 1)
    for step in range(1, 41):
        out.write("step", step=step, warmup=False, step_s=0.1, samples=8, words=80, loss=1.0)
    if threshold_at:
        out.write("val", step=threshold_at, epoch=0, val_loss=0.5, elapsed_s=4.0)
        out.event("threshold", step=threshold_at, elapsed_s=4.0, val_loss=0.5)
    out.close()


def test_the_bar_ends_with_threshold_reached(tmp_path):
    write_run(tmp_path, threshold_at=40)
    buf = io.StringIO()
    with RunProgress(tmp_path, 60, "run", console=Console(file=buf, force_terminal=True, width=100)) as prog:
        prog.poll()
    assert prog.snap.threshold_step == 40
    assert "threshold reached at step 40" in buf.getvalue()


def test_plain_output_says_threshold_reached(tmp_path, capsys):
    write_run(tmp_path, threshold_at=40)
    with RunProgress(tmp_path, 60, "run", console=Console(file=io.StringIO(), force_terminal=False)):
        pass
    assert "threshold reached at step 40" in capsys.readouterr().err


def test_without_a_threshold_the_bar_says_nothing_of_it(tmp_path, capsys):
    write_run(tmp_path)
    with RunProgress(tmp_path, 40, "run", console=Console(file=io.StringIO(), force_terminal=False)) as prog:
        prog.poll()
    assert prog.snap.threshold_step is None and "threshold" not in capsys.readouterr().err


def test_words_per_s_counts_the_workers_not_the_ps_server_ranks(tmp_path):
    """`--ps-placement separate`: 2 workers and a server (world 3): the server's steps carry no words and
    are left out, as the reports leave them out."""
    for rank, role in ((0, None), (1, None), (2, "server")):
        out = RecordWriter(tmp_path, rank, 3)
        out.write("start", global_batch=16, batch_this_rank=0 if role else 8, **({"role": role} if role else {}))
        out.write("step", step=1, warmup=False, step_s=0.5 if rank else 0.25, samples=0 if role else 8,
                  words=0 if role else 80, loss=None if role else 1.0, **({"role": role} if role else {}))
        out.close()
    with RunProgress(tmp_path, 10, "run", console=Console(file=io.StringIO(), force_terminal=False)) as prog:
        prog.poll()
    assert (prog.watch.world, prog.snap.words_per_s) == (3, 320.0)


def test_words_per_s_is_the_reports_definition_not_rank_0s_last_step(tmp_path):
    """The bar's words/s: every rank's words over each step's slowest rank, over the measured steps (the
    bar showed rank 0's last step: 2x the table's figure when rank 1 was slower)."""
    for rank, step_s in ((0, 0.1), (1, 0.2)):
        out = RecordWriter(tmp_path, rank, 2)
        out.write("step", step=1, warmup=True, step_s=5.0, samples=8, words=100, loss=2.0)
        for step in (2, 3):
            out.write("step", step=step, warmup=False, step_s=step_s, samples=8, words=100, loss=1.0)
        out.close()
    with RunProgress(tmp_path, 10, "run", console=Console(file=io.StringIO(), force_terminal=False)) as prog:
        prog.poll()
    assert prog.snap.words_per_s == 400 / 0.4  # 2 steps x 2 ranks x 100 words over 2 x 0.2 s (not 2,000)
    assert round(prog.snap.eta_s, 6) == round(7 * 0.2, 6)  # 7 steps left at the measured 0.2 s a step
