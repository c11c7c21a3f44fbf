"""`torchrun`, leaving without the interpreter's teardown: `python -m scalelab.core.torchrun ARGS`.

Why: after its ranks have ended, torchrun's agent spent about 0.45 s of CPU and wall time tearing down the
interpreter that `import torch` filled (docs/benchmarks.md, stop 64), and the launch of every DDP or `ps` run
on the local, Kubernetes and AWS backends waited for it (Slurm's srun starts the ranks without an agent).
Everything else is PyTorch's own `torch.distributed.run.main`: the arguments, the rendezvous, the `--tee`'d
output, the signals. Its import runs with Python's cyclic collector paused (PyTorch makes ~250,000
long-lived objects, which the collector walked again and again while they loaded), as the ranks' is
(scalelab/core/quickexit.py).

It exits at once only where the agent returned or called `sys.exit`: a failed run (ChildFailedError) or a
stop signal (SignalException) leaves as under torchrun, Python printing the traceback and exiting 1, which
the launcher reads (`quiet_stop_tracebacks`, `reported_exits`).

No PyTorch at import: `--dry-run` and the launch plan only name this module.
"""

from __future__ import annotations

import logging
import sys
from typing import NoReturn

from scalelab.core.quickexit import collector_paused, exit_without_teardown


def main() -> NoReturn:
    with collector_paused(collect=True):
        from torch.distributed import run  # here: the module is named in command lines rendered without PyTorch
    sys.argv[0] = "torchrun"  # its usage and messages name the program users know
    try:
        run.main()
        code = 0
    except SystemExit as exc:  # argparse's usage errors (2), --help (0)
        code = _exit_status(exc.code)
    logging.shutdown()  # the agent's log lines, flushed as an ordinary exit flushes them
    exit_without_teardown(code)


def _exit_status(code: object) -> int:
    """The status Python's own exit gives `sys.exit(code)`: None 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    main()
