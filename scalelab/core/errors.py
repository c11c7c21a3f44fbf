"""The one exception type that reaches the user as a message instead of a traceback.

Anything the user can fix (a wrong flag, a missing file, an impossible layout, a failed submission)
raises `ScalelabError` with a message that names what is wrong and how to fix it. The CLI prints the
message and exits non-zero; every other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class ScalelabError(Exception):
    """A problem the user can fix; its message is shown as it is, without a traceback."""

    exit_code: int = 2


class RunFailed(ScalelabError):
    """A run that started and did not complete (failed, cancelled, lost). It exits 1, as torchrun and
    `sbatch --wait` do for a failed job, where a wrong flag or file exits 2 before anything starts: a
    script or a retry loop can tell "fix the command" from "the job failed"."""

    exit_code: int = 1

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message  # why, without the run it names: what `launch report` quotes of it


class RunCancelled(RunFailed):
    """A followed run that was cancelled (`launch cancel` from elsewhere, a scheduler's cancel): exit 1 as a failed
    run's, told apart so that the runs stopped with it are recorded CANCELLED too, not FAILED."""


class NotQueued(ScalelabError):
    """A submission the scheduler refused (`sbatch --test-only`, sbatch itself) before anything was queued: a new
    run directory it was for holds nothing to follow, resume or report, so the launcher removes it."""


class SpecError(ScalelabError):
    """The experiment spec (YAML or flags) is invalid."""


class DataError(ScalelabError):
    """A data file is missing, unreadable or malformed."""


class RecordError(ScalelabError):
    """A run directory or one of its record files is missing or corrupt."""


class EngineError(ScalelabError):
    """A distributed engine is unavailable or misconfigured (e.g. Horovod built without PyTorch)."""


def shell_word(value: object) -> str:
    """`value` (a run directory, a file) as one word of a command a message suggests (`launch resume RUN`): as
    it is where the shell takes it whole, else quoted ('sp ace/rüns x/run'), so that the command can be pasted
    as shown. Why one helper: the hints named paths bare, and one with a space ran another command."""
    import shlex

    return shlex.quote(str(value))
