"""`python -m train RUN_DIR`: the per-rank entry point every backend starts."""

import sys

from train.loop import main

sys.exit(main())
