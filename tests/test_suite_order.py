"""The suite's own order (conftest's pytest_collection_modifyitems): the tests that wait spread through the run.

Why it is tested: the order decides whether three workers wait at once with the cores idle (docs/benchmarks.md,
stops 65 and 67), and a mistake in it would drop or repeat a test without any test failing."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from tests.conftest import pytest_collection_modifyitems

# what pytest's item holds of a module-scoped fixture, as far as conftest's _module_scoped reads it
MODULE_FIXTURE = SimpleNamespace(name2fixturedefs={"made": [SimpleNamespace(scope="module")]})


@dataclass
class Item:
    nodeid: str
    fixturenames: tuple[str, ...] = field(default=())
    _fixtureinfo: object = None


def _suite() -> list[Item]:
    items = [Item(f"tests/test_busy{m:02d}.py::test_{k}") for m in range(30) for k in range(4)]
    items[40:40] = [Item(f"tests/test_stalls.py::test_stall[{k}]") for k in range(6)]
    items[10:10] = [Item(f"tests/test_slurm_cluster.py::test_{k}", ("slurm_cluster",)) for k in range(9)]
    for m in range(6):  # modules with one waiting test each (a Slurm case beside quick tests)
        items[20 * m:20 * m] = [Item(f"tests/test_one{m}.py::test_a"),
                                Item(f"tests/test_one{m}.py::test_slurm", ("slurm_cluster",))]
    # a module whose waiting test shares a module-scoped fixture with its other tests: it moves whole
    items[60:60] = [Item("tests/test_shared.py::test_a", (), MODULE_FIXTURE),
                    Item("tests/test_shared.py::test_slurm", ("slurm_cluster",), MODULE_FIXTURE),
                    Item("tests/test_shared.py::test_b", (), MODULE_FIXTURE)]
    return items


def _ordered() -> tuple[list[str], list[str]]:
    items = _suite()
    before = [i.nodeid for i in items]
    pytest_collection_modifyitems(None, None, items)
    return before, [i.nodeid for i in items]


def test_every_test_is_kept_once_and_the_busy_modules_stay_whole_and_in_order() -> None:
    before, after = _ordered()
    assert sorted(after) == sorted(before) and len(set(after)) == len(after)
    busy = [n for n in after if "busy" in n]
    assert busy == [n for n in before if "busy" in n]
    for m in range(30):  # a module's busy tests together, none of the waiting ones inside it
        at = [k for k, n in enumerate(after) if n.startswith(f"tests/test_busy{m:02d}.py")]
        assert at == list(range(at[0], at[0] + 4))
    shared = [k for k, n in enumerate(after) if n.startswith("tests/test_shared.py")]
    assert shared == list(range(shared[0], shared[0] + 3))  # made once: the module moved whole, in its order
    assert [after[k] for k in shared] == ["tests/test_shared.py::test_a", "tests/test_shared.py::test_slurm",
                                          "tests/test_shared.py::test_b"]


def test_one_modules_waiting_tests_are_spread_over_the_run_not_one_after_another() -> None:
    """Before: the spread kept the waiting tests in file order, so test_stalls' cases came together at one point
    of the run (within a minute on three workers), each worker asleep on a 25-s stall give-up."""
    _, after = _ordered()
    for module, n in (("test_stalls", 6), ("test_slurm_cluster", 9)):
        at = [k for k, name in enumerate(after) if module in name]
        assert len(at) == n
        gaps = [b - a for a, b in zip(at, at[1:])]
        assert min(gaps) >= 5, (module, at)  # never two of them within a few tests of each other
        assert at[0] < len(after) * 0.2 and at[-1] > len(after) * 0.6, (module, at)  # over most of the run
    stalls = [k for k, name in enumerate(after) if "test_stalls" in name]
    assert [after[k] for k in stalls] == [f"tests/test_stalls.py::test_stall[{k}]" for k in range(6)]  # own order


def test_modules_of_one_waiting_test_each_do_not_land_together() -> None:
    """The review's case: a sort on (k + 0.5) / n put every module of one waiting test at 0.5, one after another
    in the middle of the run."""
    _, after = _ordered()
    at = sorted(k for k, name in enumerate(after) if name.startswith("tests/test_one") and name.endswith("test_slurm"))
    assert len(at) == 6 and at[-1] - at[0] > len(after) * 0.4, at
    assert min(b - a for a, b in zip(at, at[1:])) >= 5, at
