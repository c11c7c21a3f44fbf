"""`python -m scalelab.train RUN_DIR`: the per-rank entry point every backend starts.

The rank leaves with `os._exit` once its records are closed and its engine shut down: interpreter
teardown would otherwise run C++ static destructors while Gloo's threads may still be joinable,
which aborts the process now and then ("terminate called without an active exception") after a
run that finished correctly, and the launcher would report a failure.

The imports run with the cyclic garbage collector paused; one collection then frees what they left
behind, and the rest is frozen out of the collector's reach (`gc.freeze`). PyTorch and `torch._dynamo`
(which every `torch.optim` optimizer imports when it is built) make about 450,000 objects that live as
long as the rank, and the collector would otherwise walk them again and again while they load and at
every full collection of the run: a sixth of a rank's start-up CPU, paid by every rank of every launch
(docs/benchmarks.md, tenth stop).
"""

import gc
import os
import sys

gc.disable()
from scalelab.train.loop import main  # noqa: E402
import torch._dynamo  # noqa: E402,F401  - imported by the optimizer anyway; here, inside the pause
gc.collect()
gc.freeze()
gc.enable()

code = main()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
