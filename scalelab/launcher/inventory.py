"""What is under the runs directory: runs, sweeps and studies, for `launch ls` and `launch status`.

A row's state is verified, not copied from launch.json: a run recorded as still active is asked of its
backend (through `runner.settle`, which also records an end nobody followed), because a launch.json
saying RUNNING outlives a launcher killed with -9. A backend that cannot answer leaves the recorded
state, marked "?" so the reader knows it was not checked.

The runs of one listing are asked together (`Backends`): one backend per backend and options, told
every active run before the first is asked (`Backend.watch`), so a Slurm sweep's status is one sacct
query however many layouts it has.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from scalelab.core.errors import ScalelabError
from scalelab.core.lock import owner_of
from scalelab.core.rundir import (
    ACTIVE,
    GEMM_FILE,
    PENDING,
    STUDY_FILE,
    SWEEP_FILE,
    RunPaths,
    is_sweep,
    read_json,
    read_state,
    study_sweeps,
    sweep_runs,
)
from scalelab.core.spec import Spec, read_spec
from scalelab.core.terminal import prose_lines
from scalelab.launcher.backend import rank_log as rank_log  # one rank's lines of a log (`Backend.rank_logs`)

# The state of a sweep's layout whose directory is gone (`_unstarted`).
MISSING = "MISSING"

# The columns of `launch ls`, in order; JSON rows carry every one of them (None when not known).
COLUMNS = ("name", "kind", "backend", "layout", "state", "steps", "total_steps", "loss", "words_per_s", "eta_s",
           "cost_usd", "age_s")


# Directories another part writes under the runs directory, told by a file they hold: file -> (kind, "module:
# function" making the row from (path, now)), imported by name only when such a directory is listed (the part may
# be absent: `import_optional`), as `launcher.cli.LAZY_REPORTS` reports them.
LISTED_PARTS: dict[str, tuple[str, str]] = {"prep.json": ("prep", "scalelab.prep.listing:inventory_row")}


def kind_of(path: Path) -> str | None:
    """"study", "sweep", "run", "gemm", a part's kind ("prep") or None (not a directory scalelab wrote)."""
    if (path / STUDY_FILE).exists():
        return "study"
    if is_sweep(path):
        return "sweep"
    if RunPaths(path).spec.exists():
        return "run"
    if (path / GEMM_FILE).exists():
        return "gemm"
    return next((kind for marker, (kind, _) in LISTED_PARTS.items() if (path / marker).exists()), None)


def gemm_row(path: Path, now: float | None = None, backends: Backends | None = None) -> dict[str, Any]:
    """A GEMM study: COMPLETED once its gemm.json says so, else INCOMPLETE (still measuring, or stopped: its
    process is not recorded); on this machine's CPU; its age from that file. `launch report` reports it."""
    try:
        info = read_json(path / GEMM_FILE, GEMM_FILE, dict)
    except (ScalelabError, OSError):
        info = {}
    complete = info.get("complete") is True
    return {**dict.fromkeys(COLUMNS), "name": path.name, "path": str(path.absolute()), "kind": "gemm",
            "backend": "local", "state": "COMPLETED" if complete else "INCOMPLETE",
            "age_s": (now or time.time()) - (path / GEMM_FILE).stat().st_mtime}


class Backends:
    """The backends one listing asks, one per backend and options: the runs that share them (a sweep's
    layouts) are asked together. `watch` tells each backend every run it will be asked about before the
    first is (`Backend.watch`), so Slurm answers a whole sweep, or a whole runs directory, with one
    sacct query."""

    def __init__(self) -> None:
        self._made: dict[str, Any] = {}

    def of(self, spec: Spec):
        from scalelab.launcher.backend import get_backend

        key = json.dumps([spec.backend, spec.backend_options], sort_keys=True, default=str)
        if key not in self._made:
            self._made[key] = get_backend(spec.backend, spec.backend_options)
        return self._made[key]

    def watch(self, run_dirs: list[Path]) -> None:
        """Each run whose launch.json says it is active, to its backend; one that cannot be read is
        left to `verified_status`, which says so."""
        for run_dir in run_dirs:
            try:
                if RunPaths(run_dir).launch.exists() and _recorded(run_dir) in ACTIVE:
                    self.of(read_spec(run_dir)).watch(run_dir)
            except ScalelabError:
                pass


def _recorded(run_dir: Path) -> str:
    return read_state(run_dir).get("state") or "PENDING"


def verified_status(run_dir: Path, spec: Spec, backends: Backends | None = None) -> tuple[str, str]:
    """(The run's state, asked of its backend while launch.json says it is active ("?" appended when the
    backend could not be asked; never-launched runs are "NEW"), the backend's words for it while it was asked:
    "Slurm job 7 PENDING (Dependency)"). `spec`: the run's, as its row read it."""
    from scalelab.launcher.runner import settle

    if not RunPaths(run_dir).launch.exists():
        return "NEW", ""
    recorded = _recorded(run_dir)
    if recorded not in ACTIVE:
        return recorded, ""
    try:
        status = settle((backends or Backends()).of(spec), run_dir)
        return status.state, status.detail
    except ScalelabError:
        return recorded + "?", ""


def run_row(run_dir: Path, now: float | None = None, backends: Backends | None = None) -> dict[str, Any]:
    """One run's row: backend and layout from spec.json, state verified, steps, loss and words/s from
    summary.json once it completed, else from its records as they are (step of total, last loss, ETA:
    `launcher.progress`), the cost so far when launch.json knows a price per hour, the age from the launch.
    spec.json is read once here, for all of them: it was read two or three times a row."""
    spec = read_spec(run_dir)
    state, detail = verified_status(run_dir, spec, backends)
    paths = RunPaths(run_dir)
    info = read_state(run_dir) if paths.launch.exists() else {}
    started = info.get("launched") or info.get("started")
    ended = info.get("ended") or now or time.time()
    rate = info.get("usd_per_hour")
    row = {
        "name": run_dir.name, "path": str(run_dir.absolute()), "kind": "run", "backend": spec.backend,
        "layout": f"{spec.nodes}x{spec.gpus_per_node}", "state": state, **_progress(run_dir, state, spec),
        "cost_usd": _cost_so_far(rate, ended - started) if rate is not None and started else None,
        "age_s": (now or time.time()) - started if started else None,
    }
    if state == PENDING and detail and "note" not in row:  # why it waits, as squeue's REASON column says it
        row["note"] = f"queued: {detail}"
    return row


def _cost_so_far(usd_per_hour: float, seconds: float) -> float:
    """Dollars of the fleet kept `seconds` at the price launch.json recorded: billed as every dollar is
    (costs.billing's per-second rule, 60 s minimum per instance)."""
    from scalelab.costs.billing import cost_at_rate

    return cost_at_rate(max(0.0, float(seconds)), "", 0, float(usd_per_hour), "on-demand", "").dollars


def _progress(run_dir: Path, state: str, spec: Spec) -> dict[str, Any]:
    """steps, total_steps, loss, words_per_s (in `unit`: words, or a --script run's own), eta_s: a completed run's from its summary, any other's from
    its records (a run that is training, or one that stopped: where it stopped; a completed one whose summary.json
    is damaged, with a note saying so: status, logs and report read such a run, so ls shows it too)."""
    paths = RunPaths(run_dir)
    note: dict[str, Any] = {}
    if state not in ACTIVE and paths.summary.exists():
        try:
            summary = read_json(paths.summary, "summary", dict)
        except ScalelabError as exc:  # its records still say where it ended, as status, logs and report read them
            note = {"note": f"its summary is damaged ({exc}); figures from its records"}
        else:
            steps = summary.get("steps_measured")
            steps = steps + summary.get("steps_warmup", 0) if steps is not None else None
            total = spec.steps  # a script's --steps is only the bar's total: never below its steps
            total = max(total, steps) if total and steps else total
            return {"steps": steps, "total_steps": total, "loss": summary.get("final_loss"),
                    "words_per_s": summary.get("words_per_s"), "unit": summary.get("unit") or "words", "eta_s": None}
    return {**_from_records(run_dir, state, spec), **note}


def _from_records(run_dir: Path, state: str, spec: Spec) -> dict[str, Any]:
    """The progress columns from the run's records as they are: a run that is training, one that stopped
    (where it stopped), or a completed one whose summary.json cannot be read."""
    from scalelab.launcher.progress import snapshot_of

    paths = RunPaths(run_dir)
    snap = snapshot_of(run_dir, spec=spec) if paths.records.exists() else None
    if snap is None:
        return {"steps": None, "total_steps": spec.steps, "loss": None, "words_per_s": None,
                "unit": "words", "eta_s": None}
    return {"steps": snap.step, "total_steps": snap.total, "loss": snap.loss, "words_per_s": snap.words_per_s,
            "unit": snap.unit, "eta_s": snap.eta_s if state.rstrip("?") in ACTIVE else None}


def combined_state(states: list[str]) -> str:
    """A sweep's state from its layouts': active while any is, else the worst end; INCOMPLETE where some
    layouts ended well and others never started (or are missing). Why not NEW: a sweep stopped after its
    first layout completed (Ctrl-C between layouts) read NEW, as if nothing had run, though its finished
    layouts are reported and `launch resume` continues the rest. NEW only when no layout started."""
    for state in ("RUNNING", "PENDING", "FAILED", "UNKNOWN", "CANCELLED", "INCOMPLETE"):
        if any(s.rstrip("?") == state for s in states):
            return state
    if any(s in ("NEW", MISSING) for s in states):
        return "NEW" if all(s == "NEW" for s in states) else "INCOMPLETE"
    return states[0] if states else "NEW"


def group_row(path: Path, kind: str, layouts: list[dict[str, Any]]) -> dict[str, Any]:
    """A sweep's or study's row from its layouts' rows: sums of steps and cost, the newest age."""
    known = [r for r in layouts if r["age_s"] is not None]
    costs = [r["cost_usd"] for r in layouts if r["cost_usd"] is not None]
    return {
        "name": path.name, "path": str(path.absolute()), "kind": kind,
        "backend": ",".join(sorted({r["backend"] for r in layouts if r["backend"]})) or None,
        "layout": ",".join(dict.fromkeys(r["layout"] for r in layouts)) or None,
        "state": combined_state([r["state"] for r in layouts]),
        "steps": sum(r["steps"] for r in layouts if r["steps"] is not None) if layouts else None,
        "total_steps": None, "loss": None,
        "eta_s": max((r["eta_s"] for r in layouts if r.get("eta_s") is not None), default=None),
        "words_per_s": max((r["words_per_s"] for r in layouts if r["words_per_s"] is not None), default=None),
        "unit": next((r["unit"] for r in layouts if r.get("words_per_s") is not None), "words"),  # one sweep, one unit
        "cost_usd": sum(costs) if costs else None,
        "age_s": min(r["age_s"] for r in known) if known else None,
        "layouts": layouts,
    }


def sweep_row(sweep_dir: Path, now: float | None = None, backends: Backends | None = None) -> dict[str, Any]:
    """A sweep: one row per layout (in sweep order; layouts not started yet are "NEW", a layout whose directory
    is gone "MISSING"), and, where it stopped part way, a note saying how far it got and what continues it:
    the reader of `launch ls` needs "1 of 2 layouts completed", not a bare state."""
    rows = [run_row(p, now, backends) if RunPaths(p).spec.exists() else _unstarted(p) for p in sweep_runs(sweep_dir)]
    row = group_row(sweep_dir, "sweep", rows)
    if row["state"] in ("INCOMPLETE", "NEW") and any(r["state"] == "NEW" for r in rows) and owner_of(sweep_dir):
        row["state"] = "RUNNING"  # its launcher is alive, between two layouts
    note = sweep_note(sweep_dir, rows, row["state"])
    if note:
        row["note"] = note
    return row


def sweep_note(sweep_dir: Path, rows: list[dict[str, Any]], state: str) -> str | None:
    """How far a stopped sweep got and what to do: "1 of 2 layouts completed; `launch resume DIR` continues the
    others", naming missing layout directories (resume makes them again from sweep.json and a sibling's spec).
    None for a sweep that is active, wholly completed or never started."""
    from scalelab.core.errors import shell_word

    if state.rstrip("?") in ACTIVE or all(r["state"] == "COMPLETED" for r in rows) or not rows:
        return None
    done = sum(r["state"] == "COMPLETED" for r in rows)
    missing = [r["name"] for r in rows if r["state"] == MISSING]
    gone = (f"; layout director{'ies' if len(missing) > 1 else 'y'} {', '.join(missing)} "
            f"{'are' if len(missing) > 1 else 'is'} missing (resume makes {'them' if len(missing) > 1 else 'it'} "
            "again)") if missing else ""
    return (f"{done} of {len(rows)} layouts completed{gone}; `launch resume {shell_word(sweep_dir)}` continues "
            "the others")


def study_row(study_dir: Path, now: float | None = None, backends: Backends | None = None) -> dict[str, Any]:
    """A study: the layouts of all its variants' sweeps, each labelled with its variant."""
    rows = []
    for label, sweep_dir in _study_sweeps(study_dir):
        rows += [{**r, "variant": label} for r in sweep_row(sweep_dir, now, backends)["layouts"]]
    row = group_row(study_dir, "study", rows)
    if row["state"] in ("INCOMPLETE", "NEW") and any(r["state"] == "NEW" for r in rows) and owner_of(study_dir):
        row["state"] = "RUNNING"  # its launcher is alive, between two layouts
    note = sweep_note(study_dir, rows, row["state"])  # how far it got; `launch resume STUDY` goes on
    if note:
        row["note"] = note
    return row


def _study_sweeps(study_dir: Path) -> list[tuple[str | None, Path]]:
    """(variant label, sweep directory) of each of the study's sweeps that exists."""
    return [(label, d) for label, d in study_sweeps(study_dir) if (d / SWEEP_FILE).exists()]  # names checked there


def _runs_in(path: Path, kind: str) -> list[Path]:
    """The started runs of a run, sweep or study directory."""
    if kind == "run":
        return [path]
    if kind == "gemm" or kind not in ("sweep", "study"):
        return []
    sweeps = [path] if kind == "sweep" else [d for _, d in _study_sweeps(path)]
    return [p for d in sweeps for p in sweep_runs(d) if RunPaths(p).spec.exists()]


def _unstarted(path: Path) -> dict[str, Any]:
    """A layout with no spec.json: NEW when its directory is there (written, not launched), MISSING when the
    directory itself is gone (deleted by hand): a sweep showed such a layout as NEW, and resume then failed."""
    return {**dict.fromkeys(COLUMNS), "name": path.name, "path": str(path.absolute()), "kind": "run",
            "backend": None, "layout": path.name, "state": "NEW" if path.is_dir() else MISSING}


def describe(path: Path, now: float | None = None) -> dict[str, Any]:
    """The row of a run, sweep or study directory; a clear error for anything else. Its runs' states
    are asked of their backends together (`Backends`): one sacct query for a Slurm sweep."""
    path = Path(path)
    kind = _kind_or_error(path)
    backends = Backends()
    backends.watch(_runs_in(path, kind))
    return _row(path, kind, now, backends)


def _kind_or_error(path: Path) -> str:
    if not path.is_dir():
        raise ScalelabError(f"{path} is not a directory; `launch ls` lists the runs, sweeps and studies")
    kind = kind_of(path)
    if kind is None:
        raise ScalelabError(f"{path} is not a run, sweep or study directory (no spec.json, {SWEEP_FILE} or "
                            f"{STUDY_FILE}); `launch ls` lists them")
    return kind


def _row(path: Path, kind: str, now: float | None, backends: Backends) -> dict[str, Any]:
    own = {"study": study_row, "sweep": sweep_row, "run": run_row, "gemm": gemm_row}
    if kind in own:
        return own[kind](path, now, backends)
    return _part_row(path, kind, now)


def _part_row(path: Path, kind: str, now: float | None) -> dict[str, Any]:
    """The row another part makes of its directory (`LISTED_PARTS`); one saying so where that part is not
    installed here."""
    from scalelab.launcher.backend import import_optional

    ref = next(ref for _, (k, ref) in LISTED_PARTS.items() if k == kind)
    module, function = ref.split(":")
    loaded = import_optional(module)
    if loaded is None:
        raise ScalelabError(f"{path} is a {kind} directory, and scalelab's {kind} part is not installed here")
    return getattr(loaded, function)(path, now)


def inventory(root: Path) -> list[dict[str, Any]]:
    """Every run, sweep and study directly under `root`, newest first; unreadable ones say why. Every
    active run is asked of its backend together with the others (`Backends`)."""
    root = Path(root)
    if not root.is_dir():
        from scalelab.core.runids import runs_dir_trouble

        raise ScalelabError(runs_dir_trouble(root) or f"runs directory {root} is not a directory")
    now, backends = time.time(), Backends()
    found = [(p, kind_of(p)) for p in sorted(root.iterdir()) if p.is_dir()]
    found = [(p, k) for p, k in found if k]
    for path, kind in found:
        try:
            backends.watch(_runs_in(path, kind))
        except ScalelabError:
            pass  # its row says what is wrong
    rows = []
    for path, kind in found:
        try:
            rows.append(_row(path, kind, now, backends))
        except ScalelabError as exc:
            rows.append({**dict.fromkeys(COLUMNS), "name": path.name, "path": str(path.absolute()),
                         "kind": kind, "state": "UNREADABLE", "error": str(exc)})
    return sorted(rows, key=lambda r: r["age_s"] if r["age_s"] is not None else float("inf"))


# ---- cells --------------------------------------------------------------------------------------


def cell(value: Any, digits: int = 0) -> str:
    """A table cell: no True/False/inf/None, numbers with thousands separators."""
    if value is None or (isinstance(value, float) and value != value):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "—" if value in (float("inf"), float("-inf")) else f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def age(seconds: float | None) -> str:
    """An age in the largest unit that keeps it short: 45s, 12m, 3h, 2d."""
    if seconds is None:
        return "—"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


# ---- logs of one rank, and following them -------------------------------------------------------

def record_line(rec: dict[str, Any], unit: str = "words") -> str | None:
    """One record of a rank as a line a person reads (`launch logs --rank N`): its step with loss, time and
    phases (those it timed: a --script times none), what it processed in `unit` (a script's own, `track.unit`,
    or samples), a validation, an event, an error; None for what says nothing there (links, placements)."""
    kind = rec.get("kind")
    if kind == "start":
        where = ", ".join(f"{k} {rec[k]}" for k in ("world", "device", "host", "role") if rec.get(k) is not None)
        return f"started ({where})" if where else "started"
    if kind == "step":
        def ms(key: str) -> str:
            value = rec.get(key)
            return "—" if value is None else f"{1000 * float(value):.1f}"

        loss = rec.get("loss")
        head = f"step {rec.get('step')}" + ("  loss —" if loss is None else f"  loss {float(loss):.4f}")
        exchange = f" (exch {ms('exchange_s')})" if rec.get("exchange_s") is not None else ""  # inside the backward
        timed = any(rec.get(k) is not None for k in ("data_s", "forward_s", "backward_s", "optimizer_s"))
        phases = (f": data {ms('data_s')} fwd {ms('forward_s')} bwd {ms('backward_s')}{exchange} "
                  f"opt {ms('optimizer_s')}") if timed else ""
        marks = " (warm-up)" if rec.get("warmup") else " (profiled)" if rec.get("profiled") else ""
        count = rec.get("words") if unit == "words" else rec.get("samples", rec.get("words"))
        return f"{head}  {ms('step_s')} ms{phases}  {int(count or 0):,} {unit}{marks}"
    if kind == "val":
        return f"validation at step {rec.get('step')}: loss {float(rec.get('val_loss') or 0):.4f}"
    if kind == "event":
        rest = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in rec.items()
                         if k not in ("kind", "event", "rank", "world", "time"))
        return f"{rec.get('event')}" + (f": {rest}" if rest else "")
    if kind == "error":
        return f"error: {rec.get('message')}"
    return None


class RankLines:
    """One rank's records as lines (`record_line`), read as they are appended: `launch logs --rank N` streams
    them, as ranks print little of their own (the launcher's log held only the progress line)."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        from scalelab.core.records import RecordTail

        from scalelab.core.terminal import make_console

        self.rank = rank
        self.width = make_console().width
        self.tail = RecordTail(RunPaths(Path(run_dir)).records / f"rank-{rank}.jsonl")
        self.text = ""
        try:  # a script's items are samples until its `unit` event says otherwise; the trainer's are words
            self.unit = "samples" if read_spec(Path(run_dir)).own_code else "words"
        except (ScalelabError, OSError, ValueError):
            self.unit = "words"

    def read(self) -> str:
        """Every line so far (the header first): what follow() shows the new part of."""
        if not self.text:
            self.text = f"==> {self.tail.path} (rank {self.rank}'s records) <==\n"
        for rec in self.tail.read():
            if rec.get("kind") == "event" and rec.get("event") == "unit" and rec.get("unit"):
                self.unit = str(rec["unit"])
            line = record_line(rec, self.unit)
            if line:  # wrapped between words at the terminal's width (a step line ran to ~105 columns)
                self.text += prose_lines(f"[rank {self.rank}] ", line, self.width) + "\n"
        return self.text


def follow(read: Any, active: Any, write: Any, poll_s: float = 1.0, progress: Any = None,
           progress_every_s: float = 5.0) -> None:
    """Write what `read()` returns, then only what it adds, until `active()` is false (a last read
    after it). `read()` returns a text, or several (a rank's log and its records), of files under
    `==> PATH <==` headers: each file is followed apart, as `tail -f` does, its header written again when
    another file's lines came between (several Slurm task files no longer reprint everything when one grows).
    `progress()`, when given, is a line saying where the run is (from its records): written
    when it changed, at most every `progress_every_s`, and always after the run ended, so the follower
    sees the last step. Ctrl-C stops following and nothing else: the run goes on."""
    shown: dict[str, str] = {}
    last: str | None = None  # the file whose lines were written last
    said, said_at = None, float("-inf")
    try:
        while True:
            running = active()
            texts = read()
            for key, body in _sections([texts] if isinstance(texts, str) else list(texts), whole=not running):
                before = shown.get(key)
                shown[key] = body
                if before == body:
                    continue
                header = f"{key}\n" if key else ""
                if before is not None and body.startswith(before) and last == key:
                    write(body[len(before):])
                elif before is not None and body.startswith(before):
                    write("\n" + header + body[len(before):])
                else:  # a new file, or one rewritten shorter: whole
                    write(("\n" if last is not None and header else "") + header + body)
                last = key
            line = progress() if progress else None
            if line and line != said and (not running or time.monotonic() - said_at >= progress_every_s):
                write(f"[progress] {line}\n")
                said, said_at, last = line, time.monotonic(), "[progress]"
            if not running:
                return
            time.sleep(poll_s)
    except KeyboardInterrupt:
        write("\n(stopped following; the run goes on)\n")


def _sections(texts: list[str], whole: bool = False) -> list[tuple[str, str]]:
    """(header line or "", its lines) of each file in the texts, blank lines at a file's end left out; a
    file's last line without its newline is held back until it is whole (or, `whole`, the run has ended)."""
    out: list[tuple[str, str]] = []
    for text in texts:
        key, lines = "", []
        for line in text.splitlines(keepends=True):
            if line.startswith("==> ") and line.rstrip("\n").endswith(" <=="):
                _section(out, key, lines, whole, last=False)
                key, lines = line.rstrip("\n"), []
            else:
                lines.append(line)
        _section(out, key, lines, whole, last=True)
    return out


def _section(out: list[tuple[str, str]], key: str, lines: list[str], whole: bool, last: bool) -> None:
    """Add one file's (header, lines) to `out`. Its last line is half-written where it has no newline of its
    own: at the text's end, no newline; before another file's header, no blank line after it (files are
    joined with one, `backend.log_text`). Why the second: the local backend shows each torchrun rank's own
    files one after the other, and a rank's line still being written came out cut, then again whole."""
    half = bool(lines) and (not lines[-1].endswith("\n") if last else bool(lines[-1].strip()))
    if half and whole:
        lines[-1] = lines[-1].rstrip("\n") + "\n"
    elif half:
        lines.pop()
    if key or any(x.strip() for x in lines):
        out.append((key, "".join(lines).rstrip("\n") + "\n" if "".join(lines).strip() else ""))

