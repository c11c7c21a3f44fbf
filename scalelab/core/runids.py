"""Short run ids: a unique prefix or suffix of a run directory's name, accepted wherever a run directory is.

Why: run directories are named `MODEL-ENGINE-LAYOUT-DATE-TIME` under `runs/`, and typing
`launch logs runs/nmt-small-ddp-1x2-20261126-151022 -f` from a second terminal is the friction that
made users not follow detached runs at all. `launch logs 151022 -f` (a suffix) or `launch status
nmt-small-ddp` (a prefix, when only one run starts so) name the same directory, as `docker` and
`sky` accept short ids. A path that exists always wins; an id matching several directories is one
error that lists them, never a guess.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from scalelab.core.errors import ScalelabError
from scalelab.core.rundir import DEFAULT_RUNS_ROOT

# Where short ids are looked up: $SCALELAB_RUNS_DIR, else `runs/` (the default --runs-dir).
RUNS_DIR_ENV = "SCALELAB_RUNS_DIR"
SHOWN = 6  # matches named in the error for an ambiguous id


def runs_root() -> Path:
    """The directory short ids are looked up in."""
    return Path(os.environ.get(RUNS_DIR_ENV) or DEFAULT_RUNS_ROOT)


def _candidates(root: Path) -> list[Path]:
    """Run, sweep and study directories under `root`, and the layouts of its sweeps (one level down)."""
    if not root.is_dir():
        return []
    top = [p for p in sorted(root.iterdir()) if p.is_dir() and not p.is_symlink()]
    inner = [q for p in top for q in sorted(p.iterdir()) if q.is_dir() and not q.is_symlink()
             and (q / "spec.json").exists()]
    return top + inner


def resolve_run_dir(text: str, root: Path | None = None) -> str:
    """`text` itself when it exists (or looks like a path); else the one directory under the runs root
    whose name starts or ends with it. No match: `text` unchanged, so the command says what is missing."""
    if not text or Path(text).exists() or os.sep in text:
        return text
    found = [p for p in _candidates(root or runs_root()) if p.name.startswith(text) or p.name.endswith(text)]
    exact = [p for p in found if p.name == text]
    if exact:
        found = exact[:1]
    if len(found) > 1:
        names = ", ".join(str(p) for p in found[:SHOWN]) + (f" and {len(found) - SHOWN} more" if len(found) > SHOWN else "")
        raise ScalelabError(f"run id {text!r} matches {len(found)} directories ({names}); give more of the name")
    return str(found[0]) if found else text


class RunDir(click.ParamType):
    """A run, sweep or study directory, or a short id of one (see the module docstring)."""

    name = "RUN_DIR"

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        return resolve_run_dir(str(value))  # an ambiguous id: ScalelabError, one line like every user error
