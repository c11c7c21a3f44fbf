"""Dynamic load balancing for mixed hardware (seed 004): batch shares in proportion to speed.

With workers of different speeds, an equal split makes every step as slow as the slowest worker.
Giving each worker a share of the global batch proportional to its measured samples per second makes
them finish together. All ranks compute the same shares from the same all-gathered measurements, so
no coordinator is needed.
"""

from __future__ import annotations

import math


def proportional_shares(global_batch: int, speeds: list[float], min_share: int = 1) -> list[int]:
    """Integer shares summing to `global_batch`, proportional to `speeds` (largest remainder method).

    Every worker keeps at least `min_share` samples (a worker with nothing to do would still pay for
    the exchange, and its speed could no longer be measured).
    """
    n = len(speeds)
    if n == 0:
        raise ValueError("no workers")
    if global_batch < n * min_share:
        raise ValueError(f"global batch {global_batch} cannot give {n} workers {min_share} sample(s) each")
    if any(not (s > 0 and math.isfinite(s)) for s in speeds):
        return equal_shares(global_batch, n)
    spare = global_batch - n * min_share
    total = sum(speeds)
    exact = [spare * s / total for s in speeds]
    shares = [min_share + int(e) for e in exact]
    order = sorted(range(n), key=lambda i: (-(exact[i] - int(exact[i])), i))
    for i in order[: global_batch - sum(shares)]:
        shares[i] += 1
    return shares


def equal_shares(global_batch: int, n: int) -> list[int]:
    base, extra = divmod(global_batch, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def offsets(shares: list[int]) -> list[tuple[int, int]]:
    """[start, stop) of each rank's slice of the global batch."""
    out, start = [], 0
    for s in shares:
        out.append((start, start + s))
        start += s
    return out
