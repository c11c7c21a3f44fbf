"""`horovodrun`, without its start-up check that imports PyTorch: `python -m scalelab.core.horovodrun ARGS`.

Why: before it starts a rank, `horovodrun --gloo` asks whether Horovod was built with Gloo by forking a
process that imports each framework's extension in turn (`horovod.common.util.gloo_built`), and
`horovod.torch` imports PyTorch. That was 4.4-4.7 s of CPU and of wall time on every Horovod launch
(docs/benchmarks.md), one more `import torch` beside the ranks' own. The extension library answers the same
question itself (`horovod_gloo_built()`, the function `ext.gloo_built()` calls) when loaded with ctypes, as
the launcher asks it before any launch (`scalelab.launcher.backend.horovod_build_problem`). Everything
else is Horovod's own `run_commandline`: the arguments, the ssh to other hosts, the signals, the exit code.

No PyTorch and no Horovod at import: `--dry-run` and the launch plan only name this module.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
import sysconfig
from pathlib import Path


def extension_library() -> Path | None:
    """Horovod's PyTorch extension library (what `import horovod.torch` loads), found without importing it;
    None when Horovod is not installed. The file may be missing (Horovod built without PyTorch)."""
    spec = importlib.util.find_spec("horovod")
    if not spec or not spec.origin:
        return None
    return Path(spec.origin).parent / "torch" / f"mpi_lib_v2{sysconfig.get_config_var('EXT_SUFFIX')}"


def built_with(what: str) -> bool | None:
    """Whether the PyTorch extension was built with `what` ("gloo" or "mpi"): None when it is missing or
    does not load (horovod.common.util's answer too, where the import fails)."""
    library = extension_library()
    if library is None or not library.exists():
        return None
    try:
        return bool(getattr(ctypes.CDLL(str(library)), f"horovod_{what}_built")())
    except OSError:
        return None


def main() -> int:
    from horovod.runner import launch  # here: the module is named in command lines rendered without Horovod

    # launch.py imported these names from horovod.common.util; its checks call them by these names
    launch.gloo_built = lambda verbose=False: built_with("gloo")
    launch.mpi_built = lambda verbose=False: built_with("mpi")
    sys.argv[0] = "horovodrun"  # its usage and messages name the program users know
    return launch.run_commandline()


if __name__ == "__main__":
    sys.exit(main())
