"""Every model the planner can use, in one registry: worker-count models and layout models alike.

A worker-count model predicts the throughput of N GPUs of the measured kind (on the nodes the data
places them: scalelab/costs/calibration.py chooses among them on the published tables and calibrates
their bands); a layout model predicts the step time of a named layout `NODESxGPUS@INSTANCES`,
mixed fleets included (scalelab/costs/steptime.py chooses among the `choosable` ones by the table's
own held-out rows; the others sit on the committee that widens the band). Both are asked the same
question through one planner (scalelab/costs/planner.py: `plan`), and `launch plan` names the model
behind every row from this registry (a fit on two counts: the two models its point combines, `a&b`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelInfo", "REGISTRY", "names"]


@dataclass(frozen=True)
class ModelInfo:
    """One model: its kind (worker-count | layout), whether it sees nodes, whether a plan may choose it
    as its point (else it only widens bands), and what it assumes."""

    name: str
    kind: str
    sees_nodes: bool
    choosable: bool
    what: str


REGISTRY: dict[str, ModelInfo] = {m.name: m for m in (
    ModelInfo("naive", "worker-count", False, True, "the last measured per-GPU rate carried forward"),
    ModelInfo("decay", "worker-count", False, True,
              "the per-GPU rate keeps losing, per doubling, what it lost between the last two counts"),
    ModelInfo("half-decay", "worker-count", False, True, "decay at half the rate"),
    ModelInfo("node-decay", "worker-count", True, True,
              "decay, except that a first step onto several nodes is paid once, not carried forward"),
    ModelInfo("ernest", "worker-count", False, True, "serial, parallel, tree and per-worker terms (NNLS)"),
    ModelInfo("comm", "worker-count", True, True, "serial, parallel and ring all-reduce terms (NNLS)"),
    ModelInfo("ps", "worker-count", True, True, "serial, parallel and parameter-server exchange terms (NNLS)"),
    ModelInfo("decay+comm", "worker-count", True, True, "geometric mean of decay and comm"),
    ModelInfo("decay+ps", "worker-count", True, True, "geometric mean of decay and ps"),
    ModelInfo("decay+half-decay", "worker-count", False, True, "geometric mean of decay and half-decay"),
    ModelInfo("node-decay+comm", "worker-count", True, True, "geometric mean of node-decay and comm"),
    ModelInfo("steptime", "layout", True, True,
              "compute per GPU type + exposed exchange by topology + data, one link class each"),
    ModelInfo("steptime-links", "layout", True, True, "steptime with each bytes term over its link's bandwidth"),
    ModelInfo("steptime-scaled", "layout", True, False,
              "steptime with the exchange paced by the slowest worker (a band's committee member)"),
)}


def names(kind: str, choosable: bool | None = None) -> tuple[str, ...]:
    """The registered models of `kind`, in the registry's order (ties in a choice go to the first)."""
    return tuple(m.name for m in REGISTRY.values()
                 if m.kind == kind and (choosable is None or m.choosable == choosable))
