"""`python -m scalelab.train RUN_DIR`: the per-rank entry point every backend starts.

The rank leaves with `os._exit` once its records are closed and its engine shut down: interpreter
teardown would otherwise run C++ static destructors while Gloo's threads may still be joinable,
which aborts the process now and then ("terminate called without an active exception") after a
run that finished correctly, and the launcher would report a failure.
"""

import os
import sys

from scalelab.train.loop import main

code = main()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
