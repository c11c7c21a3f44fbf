"""Sample every process's CPU twice a second and charge it to the pytest test that started it.

Why: the suite is CPU-bound on CI's two cores, and most of its CPU is spent in processes the tests start
(ranks, torchrun and horovodrun agents, `launch`), which `--durations` does not see. pytest puts
PYTEST_CURRENT_TEST in its workers' environment and every process a test starts inherits it, so reading
/proc/PID/environ with /proc/PID/stat gives the CPU of each test's processes. A process is undercounted by
at most one interval, and one shorter than that may be missed. An xdist worker's own environment never
names a test (pytest sets the variable after the worker started), so in-process tests' CPU is "(no test)".

Usage: python scripts/cpu-per-test.py OUT.json   (runs until SIGTERM/SIGINT; then writes OUT.json:
one row per process: pid, test, kind, cpu_s)
       python scripts/cpu-per-test.py --summary OUT.json   (CPU per kind of process, per test file, per test)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def kind_of(argv: list[str]) -> str:
    """A short name for what the process is (the groups docs/benchmarks.md reports), from its command line:
    its program and module, not its arguments (run directories under /tmp/pytest-of-*/ name every process)."""
    program = Path(argv[0]).name if argv else "?"
    if program.startswith("python") and len(argv) > 1 and not argv[1].startswith("-"):
        program = Path(argv[1]).name  # a console script run by its shebang: `python .../bin/torchrun ...`
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    if program == "torchrun" or module in ("torch.distributed.run", "scalelab.core.torchrun"):
        return "torchrun agent"
    if program == "horovodrun" or module.startswith("horovod.runner") or module == "scalelab.core.horovodrun":
        return "horovodrun"
    if program == "launch" or module == "scalelab.launcher.cli":
        return "launch"
    if module.startswith("scalelab.train"):
        return "rank"
    if argv[1:2] == ["-u"] and "exec(eval(sys.stdin.readline()))" in " ".join(argv):
        return "xdist worker"  # execnet's bootstrap
    if program.startswith("python"):
        return f"python -m {module}" if module else "python (other)"
    return program


def test_of(pid: int) -> str | None:
    """The pytest test in the process's environment at its exec; None where there is none or it cannot be read."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # another user's process, or gone
        return None
    return next((e[len(b"PYTEST_CURRENT_TEST="):].decode(errors="replace").rsplit(" (", 1)[0]
                 for e in env if e.startswith(b"PYTEST_CURRENT_TEST=")), None)


def sample(seen: dict[tuple[int, str], dict]) -> None:
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            cpu = (int(fields[11]) + int(fields[12])) / TICK
            key = (pid, fields[19])  # a pid and its start time: pids are reused within a suite
            row = seen.get(key)
            argv = [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]
            if row is None or (argv and argv[:6] != row["argv"]):  # new, or exec'd since (fork then exec, a wrapper)
                row = seen[key] = {"pid": pid, "test": test_of(pid), "kind": kind_of(argv), "argv": argv[:6],
                                   "cpu_s": row["cpu_s"] if row else 0.0}
            row["cpu_s"] = max(row["cpu_s"], cpu)
        except (OSError, ValueError, IndexError):
            continue


def summary(rows: list[dict], top: int = 25) -> str:
    """CPU seconds per kind of process, per test file and per test (the most expensive first)."""
    lines = []
    for title, key in (("kind", lambda r: r["kind"]),
                       ("file", lambda r: (r["test"] or "(no test)").split("::")[0]),
                       ("test", lambda r: r["test"] or "(no test)")):
        cpu: dict[str, float] = {}
        count: dict[str, int] = {}
        for row in rows:
            cpu[key(row)] = cpu.get(key(row), 0.0) + row["cpu_s"]
            count[key(row)] = count.get(key(row), 0) + 1
        lines.append(f"| {title} | processes | CPU s |")
        lines.append("|---|---:|---:|")
        lines += [f"| {k} | {count[k]} | {v:.0f} |" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])[:top]]
        lines.append("")
    lines.append(f"total: {len(rows)} processes, {sum(r['cpu_s'] for r in rows):.0f} s of CPU")
    return "\n".join(lines)


USAGE = "usage: python scripts/cpu-per-test.py OUT.json | --summary OUT.json"


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--summary"] and len(args) == 2:
        try:
            print(summary(json.loads(Path(args[1]).read_text())))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"cpu-per-test: error: {args[1]} is not a sampler's output ({exc}); {USAGE}", file=sys.stderr)
            return 2
        return 0
    if len(args) != 1 or args[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    out = Path(args[0])
    if not out.parent.is_dir():
        print(f"cpu-per-test: error: no folder {out.parent} to write {out.name} into", file=sys.stderr)
        return 2
    seen: dict[tuple[int, str], dict] = {}
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    print(f"cpu-per-test: sampling every 0.5 s into {out} until SIGTERM or SIGINT", file=sys.stderr, flush=True)
    while not stop:
        sample(seen)
        time.sleep(0.5)
    out.write_text(json.dumps(list(seen.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
