"""Run one spec on a backend: submit it, follow it to the end, summarise its records.

`execute` = `submit` + `follow`. They are separate so that a sweep on a queueing backend (Slurm) can
submit every layout first and then follow each in turn.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from core.errors import ScalelabError
from core.rundir import write_json
from core.spec import Spec, save_spec

err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def submit(backend, spec: Spec, run_dir: Path) -> str:
    """Save the spec into the run directory and send exactly the request `--dry-run` prints."""
    save_spec(spec, run_dir)
    return backend.schedule(backend.submit_dryrun(spec, run_dir))


def follow(backend, spec: Spec, run_dir: Path, label: str | None = None):
    """Show progress until the run ends; one clear error if it did not complete; else its summary."""
    from analysis.results import summarize_dir, total_steps
    from launcher.progress import RunProgress

    with RunProgress(run_dir, total_steps(spec), label or run_dir.name, err_console) as progress:
        status = backend.wait(run_dir, on_poll=progress.poll)
    if status.state == "CANCELLED":
        raise ScalelabError(f"run {run_dir} was cancelled; `launch resume {run_dir}` continues it from its last checkpoint")
    if status.state != "COMPLETED":
        logs = backend.logs(run_dir)
        # a rank that stopped on a user error said so in one line: show that, not the launcher's traceback
        said = list(dict.fromkeys(line.split("scalelab: error:", 1)[1].strip()
                                  for line in logs.splitlines() if "scalelab: error:" in line))
        if said:
            raise ScalelabError("; ".join(said) + f" (run directory {run_dir})")
        raise ScalelabError(f"run {run_dir} {status.state.lower()} ({status.detail}); last lines of its logs:\n" + tail(logs, 25))
    summary = summarize_dir(run_dir)
    write_json(run_dir / "summary.json", summary.to_dict())
    return summary


def execute(backend, spec: Spec, run_dir: Path, label: str | None = None):
    submit(backend, spec, run_dir)
    return follow(backend, spec, run_dir, label)


def tail(text: str, n: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])
