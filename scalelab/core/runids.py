"""Short run ids: a unique prefix or suffix of a run directory's name, accepted wherever a run directory is.

Why: run directories are named `MODEL-ENGINE-LAYOUT-DATE-TIME` under `runs/`, and typing
`launch logs runs/nmt-small-ddp-1x2-20261126-151022 -f` from a second terminal is the friction that
made users not follow detached runs at all. `launch logs 151022 -f` (a suffix) or `launch status
nmt-small-ddp` (a prefix, when only one run starts so) name the same directory, as `docker` and
`sky` accept short ids. Ids are looked up in the one runs directory every command agrees on
(`runs_root`: --runs-dir, else $SCALELAB_RUNS_DIR, else a config file's runs-dir, else ./runs). A path
that exists always wins; an id matching several directories (the layout `1x2` of several sweeps) is one
error that lists them newest first, never a guess; an id matching none names the directory searched;
`launch status` with no id shows the newest run, `launch ls` every one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import click

from scalelab.core.errors import ScalelabError, shell_word
from scalelab.core.rundir import DEFAULT_RUNS_ROOT, STUDY_FILE, SWEEP_FILE

# Where runs live, one rule for every command (`runs_root`): --runs-dir, else $SCALELAB_RUNS_DIR, else a config
# file's `runs-dir`, else ./runs.
RUNS_DIR_ENV = "SCALELAB_RUNS_DIR"
RUNS_DIR_RULE = f"--runs-dir, else ${RUNS_DIR_ENV}, else a config file's runs-dir, else ./runs"
SHOWN = 6  # matches named in the error for an ambiguous id
# The files that make a directory one `launch ls` lists (`inventory.kind_of`): runs, sweeps, studies, GEMM studies
# and preps. Why all of them: `launch status` with no id said "no runs under runs" where `launch ls` listed preps.
LISTED = ("spec.json", SWEEP_FILE, STUDY_FILE, "gemm.json", "prep.json")


def runs_root(given: str | Path | None = None, configured: str | Path | None = None) -> Path:
    """The runs directory: `given` (--runs-dir on the command line), else $SCALELAB_RUNS_DIR, else
    `configured` (a config file's runs-dir), else ./runs. Why one function: `launch run` created runs
    under ./runs while `launch status` looked up short ids under $SCALELAB_RUNS_DIR, so a run just
    started could not be named by its id."""
    for choice in (given, os.environ.get(RUNS_DIR_ENV), configured):
        if choice is not None and str(choice).strip():
            return Path(choice)
    return DEFAULT_RUNS_ROOT


def runs_dir_callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    """The --runs-dir option's value as `runs_root` decides it: a flag given wins, the environment comes
    before a config file's default (click hands both in as the option's default)."""
    from click.core import ParameterSource

    source = ctx.get_parameter_source(param.name) if param.name else None
    if source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT, ParameterSource.PROMPT):
        return str(runs_root(value))  # converted (checked) by click already
    configured = value if source == ParameterSource.DEFAULT_MAP else None
    root = runs_root(configured=configured)
    if configured is None or str(root) != str(configured):  # the environment's or ./runs: click checked neither
        check_root(param, root, ctx)
    return str(root)


def check_root(param: click.Parameter, root: Path, ctx: click.Context) -> None:
    """A runs directory from $SCALELAB_RUNS_DIR or the ./runs default through the option's own type, as a flag
    given is (an OutputDir: a file or /dev/null there is one line before anything is made, not a mkdir
    traceback), the error naming where the directory came from and what to do."""
    from scalelab.core.checks import OutputDir

    if not isinstance(param.type, OutputDir):
        return  # the commands that only look runs up there make nothing
    from_env = os.environ.get(RUNS_DIR_ENV, "").strip()
    env = bool(from_env) and str(root) == from_env
    said = f"${RUNS_DIR_ENV}" if env else "the default runs directory (no --runs-dir, $SCALELAB_RUNS_DIR or config runs-dir):"
    fix = (f"point ${RUNS_DIR_ENV} at a directory (or unset it), or give --runs-dir DIR" if env else
           f"move {root} away, or give --runs-dir DIR (or set ${RUNS_DIR_ENV})")
    try:
        OutputDir(said).convert(str(root), param, ctx)
    except ScalelabError as exc:
        raise type(exc)(f"{exc}; {fix}") from None


def runs_dir_trouble(root: Path) -> str | None:
    """Why `root` cannot hold runs to look up, naming where it came from and the fix: it is a file (/dev/null) or it
    does not exist; None where it is a directory. Why: `SCALELAB_RUNS_DIR=/dev/null launch ls` said "pass --runs-dir
    DIR" without naming the variable, and `launch status --runs-dir /dev/null` "no runs under /dev/null"."""
    from scalelab.core.writes import what_it_is

    if root.is_dir():
        return None
    what = "does not exist" if not root.exists() else f"is {what_it_is(root)}, not a directory"
    ctx = click.get_current_context(silent=True)
    flag = ctx is not None and "runs_dir" in ctx.params and \
        ctx.get_parameter_source("runs_dir") == click.core.ParameterSource.COMMANDLINE
    if flag:
        fix = "give --runs-dir the directory that holds the runs"
    elif str(root) == os.environ.get(RUNS_DIR_ENV, "").strip():
        fix = f"it comes from ${RUNS_DIR_ENV}: point it at a directory (or unset it), or give --runs-dir DIR"
    elif root == DEFAULT_RUNS_ROOT:
        fix = f"it is the default; give --runs-dir DIR (or set ${RUNS_DIR_ENV}) where the runs are"
    else:
        fix = "it comes from a config file's runs-dir: change it, or give --runs-dir DIR"
    return f"runs directory {root} {what}; {fix}"


def nothing_ran_yet(root: Path) -> bool:
    """Whether `root` is the default runs directory (./runs) and does not exist: no run was started here yet, which `launch ls` says as it says an empty one (it exited 2, "pass --runs-dir DIR")."""
    return Path(root) == DEFAULT_RUNS_ROOT and not os.path.lexists(root)


def _candidates(root: Path) -> list[Path]:
    """Run, sweep and study directories under `root`, and the layouts of its sweeps (one level down)."""
    if not root.is_dir():
        return []
    top = [p for p in sorted(root.iterdir()) if p.is_dir() and not p.is_symlink()]
    inner = [q for p in top for q in sorted(p.iterdir()) if q.is_dir() and not q.is_symlink()
             and (q / "spec.json").exists()]
    return top + inner


def _newest_first(paths: list[Path]) -> list[Path]:
    """`paths` newest first: by when their spec (a sweep's or study's file) was written, then by name
    (the names end in their date and time)."""
    def born(p: Path) -> float:
        for marker in LISTED:
            if (p / marker).exists():
                return (p / marker).stat().st_mtime
        return p.stat().st_mtime

    return sorted(paths, key=lambda p: (born(p), p.name, str(p)), reverse=True)


def _matching(text: str, candidates: list[Path]) -> list[Path]:
    """The candidates named exactly `text`, else those whose name starts or ends with it."""
    found = [p for p in candidates if p.name.startswith(text) or p.name.endswith(text)]
    return [p for p in found if p.name == text] or found


def resolve_run_dir(text: str, root: Path | None = None, command: str = "launch status") -> str:
    """`text` itself when it exists (or looks like a path); else the one directory under the runs root
    whose name is exactly `text`, or else starts or ends with it. No match: `text` unchanged, so the
    command says what is missing. Several (the layout `1x2` of several sweeps): one error listing them,
    newest first, with how to name one exactly; never a guess."""
    if not text or Path(text).exists() or os.sep in text:
        return text
    found = _matching(text, _candidates(root or runs_root()))
    if len(found) > 1:
        found = _newest_first(found)
        names = ", ".join(str(p) for p in found[:SHOWN]) + (f" and {len(found) - SHOWN} more" if len(found) > SHOWN else "")
        raise ScalelabError(f"run id {text!r} matches {len(found)} directories, newest first: {names}; name one "
                            f"exactly by its path (`{command} {found[0]}`) or give more of the name "
                            "(`launch ls` lists every run)")
    return str(found[0]) if found else text


def newest_run_dir(root: Path | None = None) -> Path:
    """The newest run, sweep or study directory directly under the runs root (what `launch status` with
    no argument shows); an error when there is none."""
    root = root or runs_root()
    top = [p for p in _candidates(root) if p.parent == root and any((p / marker).exists() for marker in LISTED)]
    if not top:
        trouble = runs_dir_trouble(root) if os.path.lexists(root) else None  # a file: not "no runs under" it
        if trouble:
            raise ScalelabError(trouble)
        raise ScalelabError(f"no runs under {root} ({RUNS_DIR_RULE}): give RUN_DIR, or start one with "
                            "`launch run`")
    return _newest_first(top)[0]


def short_id(run_dir: Path | str, root: Path | None = None) -> str:
    """The shortest tail of a run directory's name, at a hyphen (its time, `044202`; else its date and time), that
    names it alone among the runs under the runs root, where the commands look short ids up; else its path. Why:
    the lines after a run (`launch report X`, `launch resume X`, a detached run's four) held its path twice and ran
    past 80 columns. A second run started in the same second (`...-044202-1`) gets `044202-1`, never `1`, which the
    next run whose name ends in 1 would share."""
    path = Path(run_dir)
    ctx = click.get_current_context(silent=True)
    root = root or runs_root(configured=configured_runs_dir(ctx))
    try:
        if path.parent.resolve() != root.resolve():
            return str(run_dir)  # elsewhere (--runs-dir, a sweep's layout): only its path names it
    except OSError:
        return str(run_dir)
    parts = path.name.split("-")
    candidates: list[Path] | None = None  # listed once, every tail matched against it as `resolve_run_dir` does
    for count in range(1, len(parts)):
        tail = "-".join(parts[-count:])
        if count == 1 and not re.fullmatch(r"\d{6}", tail):
            continue  # a word ("strong"), or the `-1` of a second run in the same second, is no id on its own
        if Path(tail).exists():  # `resolve_run_dir` takes it as that path, not as an id
            continue
        candidates = _candidates(root) if candidates is None else candidates
        found = _matching(tail, candidates)
        if len(found) == 1 and found[0].resolve() == path.resolve():  # several: a longer tail
            return tail
    return str(run_dir)


def configured_runs_dir(ctx: click.Context | None) -> str | None:
    """A config file's `runs-dir` as the commands see it: click's `default_map` (scalelab/launcher/cli.py
    `ConfigDefaults`, one map for every command, so a command without --runs-dir of its own reads it too)."""
    defaults = ctx.default_map if ctx is not None else None
    value = defaults.get("runs_dir") if isinstance(defaults, dict) and "runs_dir" in defaults else None
    return str(value) if value is not None and str(value).strip() else None


class RunDir(click.ParamType):
    """A run, sweep or study directory, or a short id of one (see the module docstring)."""

    name = "RUN_DIR"

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        command = ctx.command_path if ctx is not None else "launch status"
        if not str(value).strip():  # "" named the current directory (". is not a run directory"): refused as empty
            optional = ctx is not None and param is not None and not param.required and param.nargs == 1
            raise ScalelabError(f"{command}: the run id is empty; give a run, sweep or study directory or a unique "
                                f"part of its name (`launch ls` lists them){', or leave it out for the newest' if optional else ''}")
        given = ctx.params.get("runs_dir") if ctx is not None else None  # --runs-dir: eager, read before
        root = runs_root(given, configured=configured_runs_dir(ctx))  # report, cost, plan: no --runs-dir
        # an ambiguous id: ScalelabError, one line like every user error
        found = resolve_run_dir(str(value), root, command=command)
        if found == str(value) and found and not Path(found).exists() and os.sep not in found:
            if nothing_ran_yet(root):  # `launch ls --runs-dir runs` would only say the same
                raise ScalelabError(f"no run matches {found!r}: no run was started here yet (no ./{root}); give the "
                                    f"run's directory, or --runs-dir DIR where its runs are")
            trouble = runs_dir_trouble(root)
            if trouble:
                raise ScalelabError(f"no run matches {found!r}: {trouble}")
            listing = "launch ls" + ("" if root == DEFAULT_RUNS_ROOT else f" --runs-dir {shell_word(root)}")
            raise ScalelabError(f"no run matches {found!r} under {root} (`{listing}` lists them)")
        return found


def holds_runs(path: Path) -> bool:
    """Whether `path` is a run, sweep or study directory (its spec.json, sweep.json or study.json at the top)."""
    return any((path / name).is_file() for name in ("spec.json", SWEEP_FILE, STUDY_FILE))


class MeasuredRuns(click.ParamType):
    """A flag's run, sweep or study directory of measured runs (`--expect-from`), as its help says. Why:
    `--expect-from /tmp` was taken without a word (a launch with no price never read it; one with a price took
    a stranger's run from three folders down); without the flag the runs directory is searched already."""

    name = "DIR"

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        path = Path(str(value))
        if not path.exists():
            self.fail(f"{self.flag} {value}: no such directory; give a run, sweep or study directory", param, ctx)
        if not path.is_dir():
            self.fail(f"{self.flag} {value}: a file, not a run, sweep or study directory", param, ctx)
        if not holds_runs(path):
            self.fail(f"{self.flag} {value}: not a run, sweep or study directory (no spec.json, {SWEEP_FILE} or "
                      f"{STUDY_FILE} in it); give the directory of the runs whose step times price this launch, "
                      "e.g. runs/sweep-... (`launch ls` lists them), or leave the flag out to search the runs "
                      "directory", param, ctx)
        return str(value)
