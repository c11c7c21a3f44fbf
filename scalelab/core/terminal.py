"""The one way our commands set up a rich console.

Off a terminal (CI logs, pipes, a file) rich would wrap every table at 80 columns and cut the help
and the reports' rows; there it gets $COLUMNS, else 160 columns. On a terminal rich measures it. Every
command module (`launch`, `launch cost`/`plan`, `launch bench`, `launch prep`'s report, the runner's
messages) makes its consoles here, so they agree.
"""

from __future__ import annotations

import math
import re
import sys

from rich.console import Console

#: Columns of a console that does not write to a terminal.
OFF_TERMINAL_WIDTH = 160


def make_console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr): the terminal's width, or OFF_TERMINAL_WIDTH off one."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else columns_env() or OFF_TERMINAL_WIDTH)


def columns_env() -> int | None:
    """$COLUMNS when it is a sensible width: a user who sets it (or `script`, `watch`, a CI with a known
    width) gets tables of that width off a terminal too, as on one."""
    import os

    value = os.environ.get("COLUMNS", "")
    return int(value) if value.isdigit() and 20 <= int(value) <= 1000 else None


def duration_text(seconds: float) -> str:
    """A duration at a glance: 45 s, 12.5 min, 2.11 h (a short job was "0.00 h"). Here, with no pandas or
    matplotlib, so `launch cost` renders its wall column without loading the HTML report's libraries."""
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        return "—"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def number_text(value: float, digits: int = 3) -> str:
    """A measured or predicted rate for people: `digits` significant digits in plain decimals, whole numbers
    in full with thousands separators (181,005; 13.5; 0.0000278). Why: `launch plan`'s table chose one format
    for all its cells from the smallest, so the same plan printed 181,005.069 at one --confidence and
    1.81e+05 at another, and a time_s table's jobs per second always read 2.784e-05."""
    if value != value or value in (float("inf"), float("-inf")):
        return "—"
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def usd_text(dollars: float) -> str:
    """Dollars, without the sign: cents from a dollar up (1,234.50), four decimals below one (0.0075), and
    more where four would show a non-zero amount as 0.0000 (two significant digits: 0.000042). The one
    rounding of every command: `launch report` showed $0.0075 and $0.0150 where `launch cost` showed 0.01 for
    both runs."""
    if dollars != dollars or dollars in (float("inf"), float("-inf")):
        return "—"
    if abs(dollars) >= 1:
        return f"{dollars:,.2f}"
    if dollars == 0:
        return "0.0000"
    return f"{dollars:.{max(4, 1 - math.floor(math.log10(abs(dollars))))}f}"


def dollars_text(dollars: float) -> str:
    """Dollars without the sign as `launch cost` and `launch plan` show them: `usd_text`'s rounding (cents,
    four decimals below a dollar), and "never" where the arithmetic says inf (a run that never finishes:
    `costs.billing.spot_stall`). Why one function: the plan's answer line and plan.html printed cents ($0.32)
    beside its table's 0.3167."""
    return "never" if math.isinf(dollars) else usd_text(dollars)


def break_name(name: str, room: int) -> str:
    """A run's name on lines of at most `room` characters, broken after a hyphen where one fits (a name
    cut inside a number, "...-04575/3", read as another run), as `ls` does: `launch ls`, `launch cost`."""
    lines = []
    while len(name) > room > 0:
        cut = name.rfind("-", 0, room) + 1 or room
        lines.append(name[:cut])
        name = name[cut:]
    return "\n".join([*lines, name])


def middle_ellipsis(text: str, room: int) -> str:
    """`text` in at most `room` characters with an ellipsis in the middle: its start (a run's name) and its
    end (what tells a sweep's runs apart: engine, layout) both stay, as a file manager shortens a path.
    The end gets the odd character."""
    if len(text) <= room:
        return text
    if room < 3:
        return text[:room]
    tail = room // 2
    return text[:room - 1 - tail] + "…" + text[len(text) - tail:]


#: Where a cell of text may go on in the next line: after a space, a comma, the `+` of an instance mix or
#: the `@` of a layout, and before the `:` of `:dynamic`; after a hyphen only in a name (a run's, a
#: series'), as `break_name` breaks it. Never inside a word or a number: at 80 columns rich cut
#: `2*p2.8xla / rge`, `on-dema / nd` and `104.74 / h`, which read as other values.
_BREAK_AFTER = " ,+@"
_BREAK_BEFORE = ":"


def cell_pieces(line: str, hyphens: bool = False) -> list[str]:
    """One line of a cell cut at every place `fold_cell` may break it (a piece keeps its trailing separator)."""
    after = _BREAK_AFTER + ("-" if hyphens else "")
    pieces: list[str] = []
    start = 0
    for i, ch in enumerate(line):
        if ch in _BREAK_BEFORE and i > start:
            pieces.append(line[start:i])
            start = i
        elif ch in after:
            pieces.append(line[start:i + 1])
            start = i + 1
    return [*pieces, line[start:]] if start < len(line) else pieces


def unbreakable_width(text: str, hyphens: bool = False) -> int:
    """The narrowest a cell can be folded to without cutting a word or a number: its longest piece."""
    return max((len(p.rstrip()) for line in text.split("\n") for p in cell_pieces(line, hyphens)), default=0)


def fold_cell(text: str, room: int, hyphens: bool = False) -> str:
    """`text` on lines of at most `room` characters, broken only between `cell_pieces` (a piece longer
    than `room` stays whole on its own line: the caller sizes `room` from `unbreakable_width`)."""
    return "\n".join(_fold_line(line, room, hyphens) for line in text.split("\n"))


def _fold_line(line: str, room: int, hyphens: bool) -> str:
    lines: list[str] = []
    now = ""
    for piece in cell_pieces(line, hyphens):
        if now and len((now + piece).rstrip()) > room:
            lines.append(now.rstrip())
            now = piece
        else:
            now += piece
    return "\n".join([*lines, now.rstrip()])


def prose_lines(lead: str, text: str, width: int, whole: tuple[str, ...] = ()) -> str:
    """`lead` + `text` wrapped at spaces to `width`, a word longer than a line (a run directory's path) kept whole
    on a line of its own, never broken inside; the lines after the first indented under the text. Why: rich
    folded a warning's path mid-word ("run/sum" / "mary.json"), so it could not be copied or searched. `whole`:
    phrases of `text` never broken at their spaces either (a command to paste: `launch resume RUN`)."""
    import textwrap

    glue = "\x00"
    for phrase in whole:
        text = text.replace(phrase, phrase.replace(" ", glue))
    return textwrap.fill(text, width=max(width, 20), initial_indent=lead, subsequent_indent=" " * len(lead),
                         break_long_words=False, break_on_hyphens=False).replace(glue, " ")


def wrap_help_at_spaces() -> None:
    """Make click's help wrap at spaces only. Why: click wraps with textwrap's default, which also breaks after
    a hyphen, so at 80 columns a flag named in a help text came out as `--cpus-per-` / `task` and a default as
    `[default: us-` / `east-1]`: half a flag to copy. click builds its wrapper from `click._textwrap` at each
    call, so the subclass set there is the one every command's help uses (a word longer than the line is still
    cut, as before)."""
    from click import _textwrap

    if getattr(_textwrap.TextWrapper, "spaces_only", False):
        return

    class SpacesOnly(_textwrap.TextWrapper):
        spaces_only = True

        def __init__(self, *args, **kwargs) -> None:
            kwargs.setdefault("break_on_hyphens", False)
            super().__init__(*args, **kwargs)

    _textwrap.TextWrapper = SpacesOnly


# A colour or style (SGR: ESC [ numbers m), kept; any other control character - C0 but tab and newline, DEL, C1 -
# matched alone, to be shown escaped.
_SHOWN_CONTROLS = re.compile(r"\x1b\[[0-9;:]*m|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible_text(text: str) -> str:
    """`text` (a log, as a run's processes wrote it) safe to print on a terminal: control characters shown as
    `\\xNN` (a NUL, a bell, a backspace, an escape sequence that moves the cursor, sets the title or clears the
    screen), colours (SGR sequences) kept, tabs and newlines as they are, of a line rewritten with carriage
    returns (a progress bar) only its last state (`last_rewrites`). Why: `launch logs` printed a log's raw bytes,
    which a terminal executes; a binary write in a rank's output garbled or hid the lines around it."""
    text = last_rewrites(text)
    return _SHOWN_CONTROLS.sub(lambda m: m[0] if len(m[0]) > 1 else f"\\x{ord(m[0]):02x}", text)


# A rank's tag at the start of a log line (torchrun's `[rank1]:`, horovodrun's `[1]<stderr>:`, a Slurm task's
# `[0,1]<stdout>:`, torchrun's local `[default1]:`): kept before a rewritten line's last state
_LINE_TAG = re.compile(r"\[(?:rank\d+|\d+(?:,\d+)?|default\d+)\](?:<std(?:out|err)>)?:")
# A text's lines, each with its newline: cut at a newline only, not at a bar's carriage return (the launcher's
# `log_lines`, which stays free of Rich, cuts the same way).
_LINES = re.compile(r"[^\n]*\n|[^\n]+$")


def untangled(text: str) -> str:
    """`text` (a log of several ranks) with each state of a line rewritten with carriage returns (a progress bar)
    on the line of the rank that drew it: a line ends where its own rank's newline comes. Why: horovodrun tags
    every state it passes on (`[R]<stderr>:`), and two ranks' bars drawn at once interleave on one line, which
    `launch logs` showed under the line's first tag, one rank's bar under the other's, and cut off. A state
    without a tag (torchrun tags a line once) is of the tag before it on its line. A `\\r\\n` is a line break."""
    if "\r" not in text:
        return text
    out: list[str] = []
    open_lines: dict[str, list[str]] = {}  # per tag, the states of its line so far
    for line in _LINES.findall(text.replace("\r\n", "\n")):
        body, end = (line[:-1], "\n") if line.endswith("\n") else (line, "")
        tag = ""
        for part in body.split("\r"):
            if m := _LINE_TAG.match(part):
                tag, part = m[0], part[m.end():]
            open_lines.setdefault(tag, []).append(part)
        if end:
            out.append(tag + "\r".join(open_lines.pop(tag)) + end)
    rest = "\n".join(tag + "\r".join(parts) for tag, parts in open_lines.items())
    out.append(rest + "\n" if rest and text.endswith("\n") else rest)  # a text that ended a line still does
    return "".join(out)


def last_rewrites(text: str) -> str:
    """Each line of `text` as a terminal leaves it when the line was rewritten with carriage returns (a tqdm bar):
    what follows its last carriage return (the last part with something in it), under the line's rank tag. Why:
    `launch logs` turned every state of a 50-step bar into a line of its own (51 lines), where the terminal that
    followed the run showed one. A `\\r\\n` is a line break. Ranks' states interleaved on one line are first put
    back on their own ranks' lines (`untangled`)."""
    if "\r" not in text:
        return text
    lines = _LINES.findall(untangled(text))
    out = []
    for line in lines:
        body, end = (line[:-1], "\n") if line.endswith("\n") else (line, "")
        if "\r" in body:
            parts = body.split("\r")
            tag = m[0] if (m := _LINE_TAG.match(parts[0])) else ""
            shown = next((part for part in reversed(parts) if part.removeprefix(tag).strip()), parts[0])
            body = shown if shown.startswith(tag) else tag + shown
        out.append(body + end)
    return "".join(out)
