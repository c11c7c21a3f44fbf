"""core.waiting.wait_until, the one "until this is true, or give up" loop, on a fake clock (no sleeping)."""

from __future__ import annotations

import pytest

import scalelab.core.waiting as waiting
from scalelab.core.waiting import wait_until


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    """The pauses taken, in order; time advances by exactly each pause."""
    now, pauses = [1000.0], []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(waiting.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(waiting.time, "sleep", sleep)
    return pauses


def test_returns_the_first_true_answer_and_backs_off(clock) -> None:
    answers = iter([None, "", 0, [], "gone"])
    assert wait_until(lambda: next(answers), timeout_s=60, interval_s=1.0) == "gone"
    assert clock == [0.25, 0.5, 1.0, 1.0], "pauses double from the first up to the interval"


def test_gives_up_after_the_timeout_with_the_last_answer(clock) -> None:
    asked = []
    assert wait_until(lambda: asked.append(1) or False, timeout_s=3.0, interval_s=2.0) is False
    assert sum(clock) == pytest.approx(3.0), "it waited the whole timeout, no longer"
    assert clock[-1] < 2.0, "the last pause is cut to the time left"
    assert len(asked) == len(clock) + 1, "asked once more after the last pause"


def test_a_zero_timeout_asks_once(clock) -> None:
    asked = []
    assert wait_until(lambda: asked.append(1) or None, timeout_s=0) is None
    assert asked == [1] and clock == []
