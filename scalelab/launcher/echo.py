"""The ranks' output on the launcher's terminal while it follows a run, as torchrun shows its ranks' (`--tee`).

Why: a script's own `print` is the first thing its author looks at, and every launcher they know shows it; the
launcher showed its progress bar only, and the lines needed `launch logs RUN -f` in a second terminal.

Each backend names the files its ranks' output lands in on this machine (`Backend.rank_output_files`: a torchrun
rank's own stdout.log and stderr.log, horovodrun's tagged lines in the launcher's log, a Slurm task's files, the
AWS nodes' logs as mirrored from S3). `RankEcho` reads what each file gained since the last tick, from where it
stood before this launch (a resume does not show the earlier launches' lines again), and writes every whole line
once, tagged `[rankR]:` whatever the engine; a rank's stderr goes to stderr. A line still being written waits
for its end (at the run's end it is shown as it is). `--rank-output` chooses the ranks: all, none, or a list.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from scalelab.core.errors import SpecError, shell_word
from scalelab.launcher.backend import Backend, RankOutput, rank_tag

ALL = "all"
NONE = "none"
RANK_OUTPUT_HELP = ("Whose output to show while the launcher follows the run, each line tagged [rankR]: all, "
                    "none, or ranks such as 0 or 0,3 (as torchrun's --local-ranks-filter) [default: all for "
                    "--script/--module; none for a built-in model, which prints only a failure's traceback]. "
                    "`launch logs RUN` shows it afterwards either way.")
RELIST_S = 1.0  # how often the files are looked for again (a rank's file appears once it writes)
CHUNK_BYTES = 4 << 20  # read at most this much of one file per tick: a flood of output does not stall the loop

# A line's own tag where the file mixes ranks: horovodrun's `[R]<stdout>:`, mpirun's `[JOB,R]<stderr>:`, torchrun's
# `[rankR]:`; the stream named is where the line goes
_LINE_TAG = re.compile(r"\[(?:\d+,)?\d+\]<(?P<stream>stdout|stderr)>:|\[rank\d+\]:")
# horovodrun's own word on a rank's exit, written on the same line as the rank's last output where that had no
# newline ("[0]<stdout>:50%Process 0 exit with status code 143."): not the rank's, so not shown as its line
_AGENT_TAIL = re.compile(r"(?<=.)Process \d+ exit with status code -?\d+\.(?=\n?$)")


def parse_rank_output(text: str, world: int) -> frozenset[int]:
    """The ranks `--rank-output TEXT` shows, for a run of `world` ranks; SpecError names a bad value."""
    value = text.strip().lower()
    if value == ALL:
        return frozenset(range(world))
    if value == NONE:
        return frozenset()
    try:
        ranks = {int(part) for part in value.split(",")}
    except ValueError:
        raise SpecError(f"--rank-output {text!r}: give all, none, or ranks such as 0 or 0,3") from None
    wrong = sorted(r for r in ranks if not 0 <= r < world)
    if wrong:
        raise SpecError(f"--rank-output {text!r}: the run has ranks 0..{world - 1}, not "
                        f"{', '.join(map(str, wrong))}")
    return frozenset(ranks)


def sizes_before(run_dir: Path) -> dict[str, int]:
    """The size of every file under the run directory now, before a launch: where its ranks' lines begin (a
    resume appends to horovodrun's log and starts new files beside the old ones). Links are not followed."""
    sizes: dict[str, int] = {}
    for folder, _dirs, files in os.walk(run_dir):
        for name in files:
            path = os.path.join(folder, name)
            try:
                sizes[os.path.realpath(path)] = os.lstat(path).st_size
            except OSError:
                continue
    return sizes


class RankEcho:
    """Writes the ranks' new whole lines, tagged, through `write(text, err)` on every `tick()`."""

    def __init__(self, backend: Backend, run_dir: Path, ranks: Iterable[int], before: dict[str, int],
                 write: Callable[[str, bool], None]) -> None:
        self.backend, self.run_dir, self.ranks, self.write = backend, Path(run_dir), frozenset(ranks), write
        self.offsets = dict(before)  # real path -> bytes already shown (or there before this launch)
        self.partial: dict[str, bytes] = {}  # real path -> a line not yet ended
        self.files: list[RankOutput] = []
        self.listed_at = float("-inf")
        self.unavailable = False

    def tick(self) -> None:
        """Show what the files gained since the last tick (whole lines only)."""
        if not self.ranks or self.unavailable:
            return
        if time.monotonic() - self.listed_at >= RELIST_S:
            self._list()
        for output in self.files:
            self._show(output, self._new_lines(output))

    def close(self) -> None:
        """The last lines once the run has ended, a line without its end included."""
        if not self.ranks:
            return
        self.listed_at = float("-inf")
        self.tick()
        for output in self.files:
            rest = self.partial.pop(os.path.realpath(output.path), b"")
            if rest:
                self._show(output, [rest.decode(errors="replace") + "\n"])

    def _list(self) -> None:
        self.listed_at = time.monotonic()
        try:
            files = self.backend.rank_output_files(self.run_dir)
        except OSError:
            return  # a folder being made or removed under it: looked at again next time
        if files is None:
            self.unavailable = True
            self.write(f"(the ranks' output is not shown while a {self.backend.name} run is followed: "
                       f"`launch logs {shell_word(self.run_dir)} -f` shows it)\n", True)
            return
        self.files = files

    def _new_lines(self, output: RankOutput) -> list[str]:
        key = os.path.realpath(output.path)
        try:
            with open(output.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                start = self.offsets.get(key, 0)
                if size < start:  # rewritten shorter (a mirror's new copy): from its end on, nothing shown twice
                    self.offsets[key] = size
                    return []
                f.seek(start)
                data = f.read(CHUNK_BYTES)
        except OSError:
            return []
        self.offsets[key] = start + len(data)
        data = self.partial.pop(key, b"") + data
        whole, _, rest = data.rpartition(b"\n")
        if rest:
            self.partial[key] = rest
        if not whole and not data.endswith(b"\n"):
            return []
        return [line + "\n" for line in (whole.decode(errors="replace")).split("\n")]

    def _show(self, output: RankOutput, lines: list[str]) -> None:
        out: list[tuple[str, bool]] = []
        for line in lines:
            if output.skip is not None and output.skip(line.rstrip("\n")):
                continue
            tag, text, err = self._tagged(output, line)
            if tag is not None and rank_tag(tag)[0] in self.ranks:
                out.append((tag + text, err))
        for err in (False, True):
            text = "".join(line for line, e in out if e is err)
            if text:
                self.write(text, err)

    @staticmethod
    def _tagged(output: RankOutput, line: str) -> tuple[str | None, str, bool]:
        """(`[rankR]:` or None where the line is no rank's, the line without its own tag, whether stderr)."""
        if output.tag is not None:
            return output.tag, line, output.err
        m = _LINE_TAG.match(line)
        rank = rank_tag(line, at_start=True)[0] if m else None
        if rank is None:
            return None, line, False
        line = _AGENT_TAIL.sub("", line)
        return f"[rank{rank}]:", line[m.end():], m["stream"] == "stderr" if m["stream"] else output.err
