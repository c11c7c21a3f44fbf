"""The suite's own order (conftest's pytest_collection_modifyitems): the tests that wait spread through the run.

Why it is tested: the order decides whether three workers wait at once with the cores idle (docs/benchmarks.md,
stops 65 and 67), and a mistake in it would drop or repeat a test without any test failing."""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.conftest import pytest_collection_modifyitems


@dataclass
class Item:
    nodeid: str
    fixturenames: tuple[str, ...] = field(default=())
    _fixtureinfo: None = None


def _suite() -> list[Item]:
    items = [Item(f"tests/test_busy{m:02d}.py::test_{k}") for m in range(30) for k in range(4)]
    items[40:40] = [Item(f"tests/test_stalls.py::test_stall[{k}]") for k in range(6)]
    items[10:10] = [Item(f"tests/test_slurm_cluster.py::test_{k}", ("slurm_cluster",)) for k in range(9)]
    return items


def test_every_test_is_kept_once_and_the_busy_modules_stay_whole_and_in_order() -> None:
    items = _suite()
    before = [i.nodeid for i in items]
    pytest_collection_modifyitems(None, None, items)
    after = [i.nodeid for i in items]
    assert sorted(after) == sorted(before) and len(set(after)) == len(after)
    busy = [n for n in after if "busy" in n]
    assert busy == [n for n in before if "busy" in n]
    for m in range(30):  # a module's busy tests together, none of the waiting ones inside it
        at = [k for k, n in enumerate(after) if n.startswith(f"tests/test_busy{m:02d}.py")]
        assert at == list(range(at[0], at[0] + 4))


def test_one_modules_waiting_tests_are_spread_over_the_run_not_one_after_another() -> None:
    """Before: the spread kept the waiting tests in file order, so test_stalls' cases came together at one point
    of the run (within a minute on three workers), each worker asleep on a 25-s stall give-up."""
    items = _suite()
    pytest_collection_modifyitems(None, None, items)
    after = [i.nodeid for i in items]
    for module, n in (("test_stalls", 6), ("test_slurm_cluster", 9)):
        at = [k for k, name in enumerate(after) if module in name]
        assert len(at) == n
        gaps = [b - a for a, b in zip(at, at[1:])]
        assert min(gaps) >= 5, (module, at)  # never two of them within a few tests of each other
        assert at[0] < len(after) * 0.2 and at[-1] > len(after) * 0.6, (module, at)  # over most of the run
    stalls = [k for k, name in enumerate(after) if "test_stalls" in name]
    assert [after[k] for k in stalls] == [f"tests/test_stalls.py::test_stall[{k}]" for k in range(6)]  # own order
