"""One owner per run directory, with a lock that outlives crashes.

Two launchers following one run directory (a `launch resume` of a run that is still going) write
into the same records and checkpoints: the ranks load different checkpoints and hang. The owner
writes `owner.json` (host, pid, process start time, command line) complete, then links it into
place, which fails if it exists (an exclusive create). Another
launcher that finds it checks whether that very process still lives (`ProcessRef.alive`: pid reuse
after a crash does not count as alive); a dead owner's lock is taken over, a live one's refused with
a message that says how to stop it. A lock from another host cannot be checked from here: it is
refused with the host named, and `launch cancel` or removing the file (once that host is known to
be down) clears it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from types import TracebackType

from scalelab.core.errors import ScalelabError, shell_word
from scalelab.core.procs import ProcessRef
from scalelab.core.rundir import dir_locked, write_text
from scalelab.core.writes import WriteError, write_failure

OWNER_FILE = "owner.json"
LOCK_FIX = "or choose a writable --runs-dir"


class RunBusy(ScalelabError):
    """The run directory is owned by a live launcher."""


class RunLock:
    """`with RunLock(run_dir): ...` - hold the run directory for this process."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / OWNER_FILE
        self.me = ProcessRef.of(os.getpid())
        self.held = False

    def acquire(self) -> "RunLock":
        """Take the run directory, or raise RunBusy (a live owner) or WriteError (cannot write here).

        owner.json appears complete or not at all: it is written to a file of this process first and
        linked into place (`os.link` fails if the name exists, as O_EXCL does), so a second launcher never
        reads it half written and takes it for stale.
        """
        mine = self.path.with_name(f".{OWNER_FILE}.{os.getpid()}.tmp")
        try:
            write_text(mine, json.dumps(self.me.to_dict() if self.me else {}), shown=self.path)
            for _ in range(3):
                try:
                    os.link(mine, self.path)
                except FileExistsError:
                    self._refuse_or_clear()
                    continue
                except OSError as exc:
                    raise WriteError(write_failure(self.path, exc, "the run lock", LOCK_FIX)) from None
                self.held = True
                return self
        except FileNotFoundError:
            raise ScalelabError(f"cannot take the run directory {self.path.parent}: it does not exist; "
                                "the run directory must exist and be writable") from None
        except WriteError as exc:
            raise WriteError(f"cannot take the run directory {self.path.parent}: {exc}") from None
        finally:
            _remove(mine)
        raise RunBusy(f"could not take {self.path}: another launcher keeps taking it")

    def _refuse_or_clear(self) -> None:
        """Refuse if a live process owns the run; remove a stale (dead or unreadable) lock.

        Under a lock on the directory, so that two launchers finding one stale owner cannot both remove
        it: the second one to look reads the first one's (live) owner.json, or none.
        """
        with dir_locked(self.path.parent):
            try:
                raw = json.loads(self.path.read_text())
            except FileNotFoundError:
                return
            except (OSError, ValueError):
                raw = None
            owner = ProcessRef.from_dict(raw) if isinstance(raw, dict) else None
            run = self.path.parent
            if owner is None:  # garbage names no process that could be live: said, then taken over (issue #37)
                print(f"launch: warning: {self.path} names no launcher (not the owner record scalelab writes: "
                      "edited by hand or damaged); no process can own the run through it, so it is replaced",
                      file=sys.stderr, flush=True)
            if owner is not None and owner.host != socket.gethostname():
                raise RunBusy(f"{run} is owned by pid {owner.pid} on host {owner.host}; stop that launcher "
                              f"(`launch cancel {shell_word(run)}`), or delete {self.path} if that host is down")
            if owner is not None and owner.alive():
                raise RunBusy(f"{run} is still running (launcher pid {owner.pid}); stop it first with "
                              f"`launch cancel {shell_word(run)}` (or wait for it), then `launch resume {shell_word(run)}`")
            self.path.unlink(missing_ok=True)

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def owner_of(run_dir: Path) -> ProcessRef | None:
    """The live local owner of `run_dir`, if any (for status reports)."""
    try:
        raw = json.loads((Path(run_dir) / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    ref = ProcessRef.from_dict(raw) if isinstance(raw, dict) else None
    return ref if ref is not None and ref.alive() else None


def _remove(path: Path) -> None:
    """Remove this launcher's own temporary file, if there is one. Why an OSError is swallowed: on a read-only
    filesystem unlink fails with EROFS even for a file that was never made, and that error replaced the one
    line naming owner.json with the temporary file's name."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass
