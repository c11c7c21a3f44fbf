"""Write the bytecode (.pyc) of every module the test suite's processes import, before the suite runs.

Why: the suite starts hundreds of Python processes (`launch`, torchrun and horovodrun agents, ranks,
reports). Where nothing wrote their bytecode (uv installs without it; PYTHONDONTWRITEBYTECODE=1, as on
this project's machines, stops Python writing it), every one of them compiles pandas, rich, click and
scalelab from source again: about 1 s of CPU per `launch` on 2 cores. Python reads bytecode whatever
PYTHONDONTWRITEBYTECODE says, and checks it against the source, so a stale file is never used.

Not only what they import at start: a rank's first optimizer step imports `torch._dynamo` (torch.optim's
step wrappers do, lazily), and with it sympy and mpmath, about 800 modules. Where nothing else compiles
them, every rank compiles them from source: in a virtualenv without their bytecode, a 10-step two-rank DDP
launch took 29 s of CPU on the AVX2 machine kind, 15 s with it. (CI's virtualenv had them anyway, written
early in the suite by a process started without PYTHONDONTWRITEBYTECODE; scripts/test.sh now unsets it.)

Run by scripts/test.sh after the install; a second run only compares timestamps (a few seconds).
Usage: python scripts/bytecode.py [TREE]   (TREE: the scalelab source tree, default: this one)
"""

from __future__ import annotations

import compileall
import importlib
import sys
from pathlib import Path

# What a launcher, a rank, an agent and a report import; whatever these pull in is compiled with them.
ENTRY_MODULES = (
    "scalelab.launcher.cli", "scalelab.launcher.runner", "scalelab.launcher.local", "scalelab.launcher.progress",
    "scalelab.analysis.results", "scalelab.analysis.report", "scalelab.costs.expected",
    "scalelab.train.loop", "scalelab.train.engines", "scalelab.train.script",
    "torch.distributed.run", "horovod.torch", "horovod.runner.launch",
    # imported late: by DDP's constructor and PyTorch's own optimizers, as a user's script builds them (torch._dynamo
    # -> sympy, mpmath; the trainer's optimizers do not: scalelab/train/optim.py), by the profiler, by DDP, by
    # torchrun's static rendezvous, by pandas' Arrow conversion, by rich's emoji markup
    "torch._dynamo", "torch.nn.parallel", "torch.distributed.elastic.rendezvous.static_tcp_rendezvous",
    "torch.profiler._cupti_monitor", "pyarrow.pandas_compat", "rich._emoji_codes",
)
# Packages compiled whole: their modules are picked at run time by name (rich's Unicode table per version).
WHOLE_PACKAGES = ("rich._unicode_data",)


def imported_sources(names: tuple[str, ...]) -> set[str]:
    """The .py files of every module loaded by importing `names` (those that are not installed are left out)."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional part (Horovod) that is absent or broken is not ours to judge here
            pass
    return {m.__file__ for m in list(sys.modules.values())
            if isinstance(getattr(m, "__file__", None), str) and m.__file__.endswith(".py")}


def main() -> int:
    tree = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
    # The imports below compile every module they load; let them write what they compile (whatever
    # PYTHONDONTWRITEBYTECODE says) so that compile_file finds it up to date instead of compiling it again:
    # 30 s instead of 48 s on the AVX2 machine kind, in a virtualenv without bytecode (docs/benchmarks.md).
    sys.dont_write_bytecode = False
    ok = compileall.compile_dir(tree / "scalelab", quiet=1)
    for source in sorted(imported_sources(ENTRY_MODULES + WHOLE_PACKAGES)):
        ok = compileall.compile_file(source, quiet=1) and ok  # skips a file whose bytecode is up to date
    for name in WHOLE_PACKAGES:  # imported just above, where it is installed
        for folder in getattr(sys.modules.get(name), "__path__", []):
            ok = compileall.compile_dir(folder, quiet=1, maxlevels=0) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
