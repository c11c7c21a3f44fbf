"""The one wait loop for "until this is true, or give up": a scheduler, cluster or cloud asked again
and again while something ends (a Slurm job leaves the queue, pods are deleted, instances terminate).

Every such wait backs off the same way: asked again soon at first (most waits end quickly: a job
that already left, a pod already gone), then less and less often up to `interval_s`, so a slow end
does not cost one API call a second. The follow loop of a run (scalelab/launcher/runner.py) is the other
loop, and the only one: it also records states and handles signals.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")

FIRST_WAIT_S = 0.25  # the first pause; each next one is twice as long, up to the caller's interval


def wait_until(check: Callable[[], T], timeout_s: float, interval_s: float = 1.0,
               first_s: float = FIRST_WAIT_S) -> T:
    """Call `check()` until it returns something true, and return that; after `timeout_s` return its
    last (false) answer, asked once more at the end so a slow last step is not missed.

    The pauses double from `first_s` up to `interval_s`; a negative or zero timeout asks once.
    """
    deadline = time.monotonic() + max(0.0, timeout_s)
    delay = min(first_s, interval_s)
    while True:
        answer = check()
        left = deadline - time.monotonic()
        if answer or left <= 0:
            return answer
        time.sleep(min(delay, left))
        delay = min(delay * 2, interval_s)
