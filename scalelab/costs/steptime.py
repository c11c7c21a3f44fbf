"""Step time with its parts apart: compute + exposed exchange + data, per layout (issue 15).

The scaling models of scalelab/costs/fitting.py see a layout as (workers, nodes): 1x4, 2x2 and 4x1 look
alike to them, every GPU is the measured one, and a mixed fleet cannot be written down. This
model sees what a step is made of, so those differ:

    step(layout, b) = compute + exposed exchange + data

- **compute** of a worker with GPU type t and per-worker batch b: c0_t + c1_t·b (seed 003: the
  step time depends on the batch, and not proportionally). Each GPU type's c0, c1 come from the
  single-GPU measurements of that type only (several batches fit both; one batch fits c1 alone,
  compute proportional to the batch). A GPU type is the catalog's GPU model (g3.4xlarge and
  g3.16xlarge both hold M60s), or the type's name when the catalog does not say.
- **mixed fleets**: under a static split every worker gets b, so the slowest worker sets the step
  (max over workers of c_t(b)); under dynamic balancing (scalelab/train/balance.py: shares proportional to
  each worker's measured speed s_w = b / c_w(b)) the workers finish together, so the compute part
  is the global batch over the summed speeds, N·b / Σ s_w.
- **exchange**, by the topology of the layout NODESxGPUS (g GPUs on each of n nodes, bytes S):
  ring inside a node when n = 1: 2(g−1) latencies and 2(g−1)/g·S over the node's GPU link;
  ring across nodes when g = 1: 2(n−1) latencies and 2(n−1)/n·S over the network;
  hierarchical otherwise: reduce-scatter inside the node, all-reduce across nodes on each GPU's
  slice S/g, all-gather inside: the inside ring's terms plus the across ring's, whose g slices
  share the node's one network link, so the network still carries 2(n−1)/n·S per node.
  The four terms (intra latency, intra bytes, inter latency, inter bytes) are fitted by NNLS to
  what the multi-GPU measurements left after their compute, so their coefficients are the
  *exposed* exchange (what overlap with backward did not hide) and the gradient size need not be
  known. A latency term is fitted only when the layouts can tell it from bandwidth (it adds to
  the rank of the fit): with one multi-node layout the exchange is taken as bandwidth-bound.
  Variant `steptime-links` divides each bytes term by the link's bandwidth: measured (`Known`,
  e.g. by `launch probe`), else the catalog's (`intra_gbps` where it gives NVLink/PCIe figures,
  else 80 Gbit/s; the instance network, else 10 Gbit/s), so a faster network shortens the
  exchange; `steptime` fits one coefficient per link class, the same for every type.
- **data**: the input pipeline's seconds per sample that compute did not hide (the trainer's
  phase breakdown records it; `Known`); 0 unless given, since a table's times cannot tell it from
  compute.

Units: a table gives throughput (work per second) or a time for a fixed (or per-worker) amount of
work. Its global batch B (the `global_batch` column, else b = 1 nominal per worker under
`batch_scaling=growing`, or B = 1 nominal under `fixed`) turns 1/throughput into a step time up to
one constant factor, which the fit absorbs: the model predicts ratios between layouts exactly.

One interface: every model here answers "step time of (layout, per-worker batch)" (`LayoutModel`:
`step_s`, `parts`, `why_not`): `StepModel` from the parts above, `WorkerCountModel` from a
worker-count model of scalelab/costs/fitting.py (throughput of N workers on n nodes, one GPU type).
Which model: `steptime`, `steptime-links`, and (for tables of one GPU type, which is all they can
describe) the existing ernest/comm/ps models, each judged by its leave-one-out error over the
table's rows; the lowest is used (`fit_layout_model` builds it). Its band at `confidence` is the
conformal quantile of those held-out relative errors (the ⌈(n+1)c⌉-th smallest of n); with fewer than
c/(1−c) held-out predictions, the band calibrated on the published scaling tables widened to the
model's worst miss on the table (`predict_layouts`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Protocol, Sequence

import numpy as np
import pandas as pd

from scalelab.core.errors import DataError
from scalelab.core.spec import BALANCE_MODES
from scalelab.costs.billing import Mix, instances_for
from scalelab.costs.calibration import band_class, band_spread, calibrate, conformal_quantile, k_class, measured_noise
from scalelab.costs.catalog import Catalog, CatalogError
from scalelab.costs.fitting import FitError, FitResult, LinkModel, fit_series, nnls
from scalelab.costs.registry import names

__all__ = ["Known", "Layout", "parse_fleet_layout", "parse_fleet_layouts", "exchange_terms", "StepModel", "fit_step_model",
           "prepare", "held_out", "choose", "predict_layouts", "STEP_MODELS", "LayoutModel", "WorkerCountModel",
           "fit_layout_model", "corpus_band"]

STEP_MODELS = names("layout", choosable=True)  # scalelab/costs/registry.py; steptime-scaled only widens bands
_DEFAULT_LINK = LinkModel()
#: the largest layout `--predict` takes: 4096 nodes (32,768 GPUs of 8-GPU nodes, the scale of the largest training
#: clusters) and 1024 GPUs per node (a GPU-hour rate's node has any shape); past them a prediction is no answer
MAX_NODES = 4096
MAX_GPUS_PER_NODE = 1024
_LAYOUT = re.compile(r"\s*(\d+)\s*x\s*(\d+)\s*@\s*([^:]+?)\s*(?::\s*(\w+)\s*)?")


# ---- layouts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """g GPUs on each of n nodes, one instance type per node (in node order), split statically or
    balanced dynamically."""

    nodes: int
    gpus_per_node: int
    node_types: tuple[str, ...]
    balance: str = "static"
    units: int = 1  # billed units per node: 1 an instance, or its GPUs at a GPU-hour rate (billing.instances_for)

    @property
    def workers(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def instances(self) -> str:
        """The instances in the one mix grammar (costs.billing.Mix), counted in node order."""
        items: list[list[Any]] = []
        for t in self.node_types:
            if items and items[-1][1] == t:
                items[-1][0] += self.units
            else:
                items.append([self.units, t])
        return str(Mix(tuple((n, t) for n, t in items)))

    @property
    def text(self) -> str:
        """As `--predict` reads it: NODESxGPUS@INSTANCES, with `:dynamic` where the balancer is (two layouts on
        the same instances, static and dynamic, were printed alike)."""
        return f"{self.nodes}x{self.gpus_per_node}@{self.instances}" + (":dynamic" if self.balance == "dynamic" else "")


def _layout(nodes: int, gpus: int, mix: Mix, balance: str, catalog: Catalog, what: str) -> Layout:
    """A checked layout: one instance per node, each with at least `gpus` GPUs. A rate per GPU-hour has no shape
    (docs/costs.md): its node holds any GPUs and is billed per GPU (`billing.instances_for`), so `1x2@slurm` and
    `1x2@2*slurm` are both one node of two GPUs billed as 2 GPU-hours an hour."""
    if all(catalog.instance(t).per_gpu for _, t in mix.items):
        return _per_gpu_layout(nodes, gpus, mix, balance, catalog, what)
    if mix.count() != nodes:
        raise DataError(f"{what}: {nodes} node(s) but {mix.count()} instance(s) ({mix}); give one instance per node, "
                        f"e.g. {nodes}x{gpus}@{nodes}*{mix.items[0][1]}")
    for _, t in mix.items:
        have = catalog.instance(t).gpus
        if have < gpus:
            raise DataError(f"{what}: {t} has {have} GPU(s) but the layout puts {gpus} on each node; use a type with "
                            f"{gpus} or more GPUs, or fewer GPUs per node")
    if balance not in BALANCE_MODES:
        raise DataError(f"{what}: balance must be static or dynamic, got {balance!r}")
    return Layout(nodes, gpus, tuple(mix.node_types()), balance)


def _per_gpu_layout(nodes: int, gpus: int, mix: Mix, balance: str, catalog: Catalog, what: str) -> Layout:
    """A layout at GPU-hour rates: one rate term per node, or one per GPU (`NODES*GPUS` of them)."""
    units = instances_for(1, gpus, mix.items[0][1], catalog).count()
    types = mix.node_types()
    if len(types) == nodes * units and units > 1:
        types = types[::units]
    elif len(types) != nodes:
        raise DataError(f"{what}: {nodes} node(s) of {gpus} GPU(s) at a GPU-hour rate are {nodes} node(s) or "
                        f"{nodes * gpus} GPU(s), but {mix} names {mix.count()}; write e.g. "
                        f"{nodes}x{gpus}@{mix.items[0][1]} (a bare rate is every node)")
    if balance not in BALANCE_MODES:
        raise DataError(f"{what}: balance must be static or dynamic, got {balance!r}")
    return Layout(nodes, gpus, tuple(types), balance, units)


def parse_fleet_layout(text: str, catalog: Catalog) -> Layout:
    """A layout on instance types, `NODESxGPUS@INSTANCES[:static|:dynamic]` (`launch plan --predict`),
    e.g. `4x1@1*p2.xlarge+3*g3.4xlarge:dynamic`; a bare type after @ is one instance per node
    (`4x1@g3.4xlarge`). Not a sweep's bare NODESxGPUS: that is `launcher.sweep.parse_layouts`."""
    m = _LAYOUT.fullmatch(text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise DataError(f"--predict: cannot read layout {text!r}; write NODESxGPUS@INSTANCES, e.g. 4x1@4*g3.4xlarge, "
                        "2x2@2*g3.16xlarge or 4x1@1*p2.xlarge+3*g3.4xlarge:dynamic (NODES, GPUS >= 1)")
    nodes, gpus = int(m.group(1)), int(m.group(2))
    if nodes > MAX_NODES or gpus > MAX_GPUS_PER_NODE:
        raise DataError(f"--predict {text!r}: {nodes} node(s) of {gpus} GPU(s) is past what a layout may have (at most "
                        f"{MAX_NODES} nodes and {MAX_GPUS_PER_NODE} GPUs per node, the scale of the largest training "
                        "clusters); predict a smaller layout")
    try:
        mix = Mix.parse(m.group(3), catalog, nodes=nodes)
    except CatalogError as exc:
        raise DataError(f"--predict {text!r}: {exc}") from None
    return _layout(nodes, gpus, mix, (m.group(4) or "static").lower(), catalog, f"--predict {text!r}")


def parse_fleet_layouts(text: str, catalog: Catalog) -> list[Layout]:
    """Comma-separated layouts on instance types (parse_fleet_layout); an empty list is an error."""
    items = [t for t in str(text).split(",") if t.strip()]
    if not items:
        raise DataError("--predict needs at least one layout, e.g. 4x1@4*g3.4xlarge,2x2@2*g3.16xlarge")
    return [parse_fleet_layout(t, catalog) for t in items]


def gpu_key(instance_type: str, catalog: Catalog) -> str:
    """What sets a worker's compute: the GPU model, or the type's name when it is not known."""
    return catalog.instance(instance_type).gpu_model or instance_type


# ---- the exchange ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Known:
    """What was measured outside the table: the data seconds per sample (the trainer's phase
    breakdown) and link bandwidths per instance type, {"g3.16xlarge": {"intra_gbps": 60,
    "network_gbps": 18}} (e.g. from `launch probe`), which take precedence over the catalog's."""

    data_s_per_sample: float = 0.0
    link_gbps: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


def _gbps(layout: Layout, catalog: Catalog, attr: str, default: float,
          measured: Mapping[str, Mapping[str, float]]) -> float:
    """The slowest link of a kind over the layout's node types: measured, else the catalog's
    figure, else `default`."""
    vals = []
    for t in set(layout.node_types):
        v = measured.get(t, {}).get(attr) or getattr(catalog.instance(t), attr, None)
        vals.append(float(v) if v else default)
    return min(vals)


def exchange_terms(layout: Layout, catalog: Catalog | None = None, bandwidth: bool = False,
                   measured: Mapping[str, Mapping[str, float]] | None = None) -> np.ndarray:
    """[intra latencies, intra bytes, inter latencies, inter bytes] of one all-reduce of the layout
    (module doc: ring inside, ring across, hierarchical). Bytes are in units of the gradient; with
    `bandwidth` they are divided by the link's Gbit/s (`measured`, else the catalog's) relative to
    the defaults (80 inside, 10 across)."""
    g, n = layout.gpus_per_node, layout.nodes
    intra = [2.0 * (g - 1), 2.0 * (g - 1) / g] if g > 1 else [0.0, 0.0]
    inter = [2.0 * (n - 1), 2.0 * (n - 1) / n] if n > 1 else [0.0, 0.0]
    if bandwidth and catalog is not None:
        intra[1] *= _DEFAULT_LINK.intra_gbps / _gbps(layout, catalog, "intra_gbps", _DEFAULT_LINK.intra_gbps,
                                                     measured or {})
        inter[1] *= _DEFAULT_LINK.inter_gbps / _gbps(layout, catalog, "network_gbps", _DEFAULT_LINK.inter_gbps,
                                                     measured or {})
    return np.array(intra + inter)


# ---- the model ----------------------------------------------------------------------------------


@dataclass
class StepModel:
    """Fitted parts: compute (c0, c1) per GPU type, the four exchange coefficients (seconds per
    term), which link classes the measurements saw, and the data seconds per sample."""

    name: str
    catalog: Catalog
    compute: dict[str, tuple[float, float]] = field(default_factory=dict)
    links: np.ndarray = field(default_factory=lambda: np.zeros(4))
    seen: tuple[bool, bool] = (False, False)  # (inside a node, across nodes)
    known: Known = field(default_factory=lambda: Known())
    nodes_measured: int = 0  # the most nodes of a fitted multi-GPU row: past it the exchange is extrapolated
    reading: str = "blend"  # past nodes_measured: "bandwidth", "latency" or their geometric mean ("blend")

    @property
    def bandwidth(self) -> bool:
        return self.name == "steptime-links"

    def why_not(self, layout: Layout) -> str | None:
        """Why this model cannot predict `layout` (a GPU type or a link class never measured), or None."""
        for t in dict.fromkeys(layout.node_types):
            key = gpu_key(t, self.catalog)
            if key not in self.compute:
                return f"no single-GPU measurement of {key} ({t}), so its compute is unknown"
        if layout.gpus_per_node > 1 and not self.seen[0]:
            return "no measurement with several GPUs in one node, so the exchange inside a node is unknown"
        if layout.nodes > 1 and not self.seen[1]:
            return "no measurement on several nodes, so the exchange across nodes is unknown"
        return None

    def worker_compute_s(self, layout: Layout, b: float) -> np.ndarray:
        """Each worker's compute seconds at per-worker batch b (node order)."""
        out = []
        for t in layout.node_types:
            c0, c1 = self.compute[gpu_key(t, self.catalog)]
            out += [c0 + c1 * b] * layout.gpus_per_node
        return np.array(out)

    def compute_s(self, layout: Layout, b: float) -> float:
        """Static: the slowest worker; dynamic: the global batch over the summed speeds."""
        each = self.worker_compute_s(layout, b)
        if layout.balance == "dynamic" and np.all(each > 0):
            return float(layout.workers * b / np.sum(b / each))
        return float(each.max())

    def exchange_s(self, layout: Layout) -> float:
        """The exposed exchange. Past the most nodes measured (nk) the table cannot tell a bandwidth-bound
        ring (bytes 2(n−1)/n: flat in n, near-linear scaling for ever) from a latency-bound one (2(n−1)
        steps) where the across-node latency fitted to zero: the exchange measured at nk read as latency
        grows as n/nk times the bytes reading. Both are physics; the point is their geometric mean (as the worker planner's two-count
        point is), the band holds both (`predict_layouts`). Before, a fitted latency of zero predicted
        1,000,000 g3.4xlarge nodes at 0.06 s for a 10 h job."""
        terms = self.exchange_terms(layout)
        bandwidth = float(terms @ self.links)
        nk, n = self.nodes_measured, layout.nodes
        if self.reading == "bandwidth" or nk < 2 or n <= nk or self.links[2] > 0:  # a fitted latency grows already
            return bandwidth
        latency = bandwidth + float(terms[3] * self.links[3]) * (n / nk - 1.0)
        return latency if self.reading == "latency" else math.sqrt(bandwidth * latency)

    def exchange_terms(self, layout: Layout) -> np.ndarray:
        return exchange_terms(layout, self.catalog, self.bandwidth, self.known.link_gbps)

    def step_s(self, layout: Layout, b: float) -> float:
        """compute + exposed exchange + data (module doc)."""
        return self.compute_s(layout, b) + self.exchange_s(layout) + self.known.data_s_per_sample * b

    def parts(self, layout: Layout, b: float) -> dict[str, float]:
        return {"compute": self.compute_s(layout, b), "exchange": self.exchange_s(layout),
                "data": self.known.data_s_per_sample * b}


@dataclass
class ScaledStepModel(StepModel):
    """steptime with the exposed exchange scaled by the slowest worker's compute over the compute of the
    GPU type whose layouts measured it. On layouts of that type it is steptime exactly, so no table of
    one type can tell them apart; on a mixed fleet or another type it says what happens if the exchange
    is paced by the slow worker (its host, PCIe and network) rather than fixed. A committee member for
    the band (`predict_layouts`), never the point."""

    ref: str = ""

    def step_s(self, layout: Layout, b: float) -> float:
        base = self.compute_s(layout, b)
        c0, c1 = self.compute.get(self.ref, (0.0, 0.0))
        scale = base / (c0 + c1 * b) if self.ref in self.compute and c0 + c1 * b > 0 else 1.0
        return base + self.exchange_s(layout) * scale + self.known.data_s_per_sample * b


def fit_scaled_model(rows: pd.DataFrame, catalog: Catalog, known: Known | None = None) -> ScaledStepModel:
    """`ScaledStepModel` on prepared `rows`: steptime's fit, referred to the type of its multi-GPU rows."""
    base = fit_step_model(rows, catalog, "steptime", known)
    multi = rows[(rows["workers"] > 1) & rows["layout"].map(lambda lay: _one_known_type(base, lay))]
    keys = multi["layout"].map(lambda lay: gpu_key(lay.node_types[0], catalog))
    return ScaledStepModel("steptime-scaled", catalog, base.compute, base.links, base.seen, base.known,
                           base.nodes_measured, ref=str(keys.mode().iloc[0]) if len(keys) else "")


def fit_step_model(rows: pd.DataFrame, catalog: Catalog, name: str = "steptime",
                   known: Known | None = None) -> StepModel:
    """Fit compute per GPU type on the single-GPU rows, then the exchange on what the multi-GPU
    rows of one GPU type left after compute and data. Mixed fleets are predicted, never fitted:
    what they add beyond the slowest worker or the balanced shares (an imbalanced first epoch,
    the balancer's own cost) is not a property of the links. `rows` as from `prepare`. A fit the arithmetic
    cannot do is a FitError naming the model, not numpy's LinAlgError traceback."""
    try:
        return _fit_step_model(rows, catalog, name, known)
    except (FitError, np.linalg.LinAlgError) as exc:
        raise FitError(f"the {name} model could not be fitted to the table's layouts: {exc}; check its times, "
                       "throughputs and batches") from None


def _fit_step_model(rows: pd.DataFrame, catalog: Catalog, name: str, known: Known | None) -> StepModel:
    model = StepModel(name, catalog, known=known or Known())
    data_s_per_sample = model.known.data_s_per_sample
    single = rows[rows["workers"] == 1]
    for key, part in single.groupby(single["layout"].map(lambda lay: gpu_key(lay.node_types[0], catalog))):
        b, s = part["b"].to_numpy(float), part["step"].to_numpy(float) - data_s_per_sample * part["b"].to_numpy(float)
        if len(np.unique(b)) < 2:  # one batch: compute proportional to it
            model.compute[key] = (0.0, float(nnls((b / s)[:, None], np.ones_like(s))[0]))
        else:
            c0, c1 = nnls(np.column_stack([1.0 / s, b / s]), np.ones_like(s))
            model.compute[key] = (float(c0), float(c1))
    multi = rows[(rows["workers"] > 1) & rows["layout"].map(lambda lay: _one_known_type(model, lay))]
    if len(multi):
        model.seen = (bool((multi["layout"].map(lambda lay: lay.gpus_per_node) > 1).any()),
                      bool((multi["layout"].map(lambda lay: lay.nodes) > 1).any()))
        model.nodes_measured = int(multi["layout"].map(lambda lay: lay.nodes).max())
        feats = np.vstack([model.exchange_terms(lay) for lay in multi["layout"]])
        rest = np.array([s - model.compute_s(lay, b) - data_s_per_sample * b
                         for lay, b, s in zip(multi["layout"], multi["b"], multi["step"])])
        w = 1.0 / multi["step"].to_numpy(float)  # relative residuals
        cols = _identifiable(feats * w[:, None])
        model.links = np.zeros(4)
        model.links[cols] = nnls(feats[:, cols] * w[:, None], rest * w)
    return model


def _one_known_type(model: StepModel, layout: Layout) -> bool:
    keys = {gpu_key(t, model.catalog) for t in layout.node_types}
    return len(keys) == 1 and keys <= set(model.compute)


def _identifiable(a: np.ndarray) -> list[int]:
    """The bytes columns that vary, then each latency column that adds to the rank: latency is
    fitted only where the layouts can tell it from bandwidth."""
    cols = [c for c in (1, 3) if np.any(a[:, c] != 0)]
    for c in (0, 2):
        if np.any(a[:, c] != 0) and np.linalg.matrix_rank(a[:, cols + [c]]) > np.linalg.matrix_rank(a[:, cols]):
            cols.append(c)
    return sorted(cols)


# ---- a table's rows -----------------------------------------------------------------------------


def prepare(measured: pd.DataFrame, catalog: Catalog, where: str = "the table") -> pd.DataFrame:
    """The rows of a scaling table (costs.tables.read_scaling_csv, throughput computed) as the
    model reads them: layout, per-worker batch b, global batch, and step (global batch / throughput)."""
    missing = [c for c in ("nodes", "instance_type") if c not in measured.columns or measured[c].isna().any()]
    if missing:
        raise DataError(f"{where}: the step-time model needs the columns nodes and instance_type (or instance) on "
                        f"every row; missing or empty: {', '.join(missing)}")
    out = []
    for _, r in measured.iterrows():
        what = f"{where}:{int(r['_line'])}" if "_line" in r and pd.notna(r.get("_line")) else where
        workers, nodes = int(r["workers"]), int(r["nodes"])
        if workers % nodes:
            raise DataError(f"{what}: {workers} workers do not split evenly over {nodes} nodes; the model needs the "
                            "same GPUs on every node")
        try:
            mix = Mix.parse(str(r["instance_type"]), catalog, nodes=nodes)
        except CatalogError as exc:
            raise DataError(f"{what}: column 'instance_type': {exc}") from None
        layout = _layout(nodes, workers // nodes, mix, str(r.get("balance") or "static"), catalog, what)
        glob = _global_batch(r, workers)
        out.append({"label": r.get("label", ""), "layout": layout, "workers": workers, "nodes": nodes,
                    "b": glob / workers, "global_batch": glob, "throughput": float(r["throughput"]),
                    "step": glob / float(r["throughput"]), "per": _per(r, workers)})
    return pd.DataFrame(out)


def _global_batch(r: pd.Series, workers: int) -> float:
    """The row's global batch, or the nominal one of its batch axis (module doc: Units)."""
    if "global_batch" in r and pd.notna(r.get("global_batch")):
        return float(r["global_batch"])
    return float(workers) if r.get("batch_scaling") == "growing" else 1.0


def _per(r: pd.Series, workers: int) -> float:
    """Work units of the row's time: the whole job (fixed), or one per worker (growing)."""
    return float(workers) if r.get("work_scaling") == "growing" else 1.0


# ---- held-out error and the choice ----------------------------------------------------------------


def held_out(rows: pd.DataFrame, catalog: Catalog, name: str, known: Known | None = None) -> list[float]:
    """Leave-one-out relative errors of throughput, |pred − true| / true, of every row the others
    can predict (a row whose GPU type or link class only it measured is skipped)."""
    errs = []
    for i in range(len(rows)):
        model = fit_step_model(rows.drop(index=rows.index[i]), catalog, name, known)
        r = rows.iloc[i]
        if model.why_not(r["layout"]) is not None:
            continue
        step = model.step_s(r["layout"], r["b"])
        pred = r["global_batch"] / step if step > 0 else math.nan
        errs.append(abs(pred - r["throughput"]) / r["throughput"] if math.isfinite(pred) else 1.0)
    return errs


def _baseline_errors(rows: pd.DataFrame, catalog: Catalog) -> dict[str, list[float]]:
    """The existing models' leave-one-out errors, only for a table of one GPU type (they cannot
    tell types apart) with three or more rows."""
    keys = {gpu_key(t, catalog) for lay in rows["layout"] for t in lay.node_types}
    df = rows[["workers", "nodes", "throughput"]].reset_index(drop=True)
    if len(keys) != 1 or len(df) < 3 or df["workers"].nunique() < 2:
        return {}
    out: dict[str, list[float]] = {}
    for i in range(len(df)):
        train = df.drop(index=i)
        if train["workers"].nunique() < 2:
            continue
        fit = fit_series("", train)
        for m in fit.models:
            p = fit.predict([df["workers"][i]], [df["nodes"][i]], m)[0]
            out.setdefault(m, []).append(abs(p - df["throughput"][i]) / df["throughput"][i] if np.isfinite(p) else 1.0)
    return out


def choose(rows: pd.DataFrame, catalog: Catalog, known: Known | None = None) -> tuple[str, dict[str, list[float]]]:
    """(the model with the lowest mean held-out error, every candidate's held-out errors). Ties go
    to the one listed first (steptime: fewest assumptions)."""
    errors = {name: held_out(rows, catalog, name, known) for name in STEP_MODELS}
    errors.update(_baseline_errors(rows, catalog))
    scored = {k: float(np.mean(v)) for k, v in errors.items() if v}
    if not scored:
        return STEP_MODELS[0], errors
    best = min(scored.values())
    return next(k for k in scored if scored[k] <= best + 1e-12), errors


# ---- predictions for --predict --------------------------------------------------------------------


def _measured_types(rows: pd.DataFrame) -> set[str]:
    return {t for lay in rows["layout"] for t in lay.node_types}


def _batch_of(rows: pd.DataFrame, measured: pd.DataFrame, workers: int) -> tuple[float, float]:
    """(per-worker batch, global batch) of a predicted layout on the table's batch axis."""
    growing = "batch_scaling" in measured.columns and (measured["batch_scaling"] == "growing").mean() >= 0.5
    if growing:
        b = float(rows["b"].median())
        return b, b * workers
    glob = float(rows["global_batch"].median())
    return glob / workers, glob


def _per_of(measured: pd.DataFrame, workers: int) -> float:
    """Work units of a predicted time on the table's work axis (mostly growing: one per worker)."""
    growing = "work_scaling" in measured.columns and (measured["work_scaling"] == "growing").mean() >= 0.5
    return float(workers) if growing else 1.0


def _refuse_unmeasured(layout: Layout, measured_types: set[str], source: str) -> None:
    """speed_basis is `measured` only: a type the table never ran on is refused, not guessed."""
    missing = [t for t in dict.fromkeys(layout.node_types) if t not in measured_types]
    if missing:
        raise DataError(f"--predict {layout.text}: {', '.join(missing)} was not measured in {source} (measured: "
                        f"{', '.join(sorted(measured_types))}); add its rows (one GPU alone, and a multi-GPU layout) "
                        "or probe it (launch probe); no type is priced at another type's speed")


class LayoutModel(Protocol):
    """What every model of a layout answers: its step time at a per-worker batch, the step's parts,
    and why it cannot predict a layout (None when it can)."""

    def step_s(self, layout: Layout, b: float) -> float: ...

    def parts(self, layout: Layout, b: float) -> dict[str, float]: ...

    def why_not(self, layout: Layout) -> str | None: ...


@dataclass(frozen=True)
class WorkerCountModel:
    """A worker-count model (scalelab/costs/fitting.py) behind the step-time interface: a step of N
    workers at batch b each takes N·b over the predicted throughput of N workers on the layout's
    nodes. It knows one GPU type and nothing of the topology beyond the node count."""

    fit: FitResult
    name: str
    gpu_types: frozenset[str]
    catalog: Catalog

    def step_s(self, layout: Layout, b: float) -> float:
        thr = float(self.fit.predict([layout.workers], [layout.nodes], self.name)[0])
        return b * layout.workers / thr if thr > 0 else math.inf

    def parts(self, layout: Layout, b: float) -> dict[str, float]:
        return {}

    def why_not(self, layout: Layout) -> str | None:
        other = {gpu_key(t, self.catalog) for t in layout.node_types} - self.gpu_types
        return f"the {self.name} model knows one GPU type, not {', '.join(sorted(other))}" if other else None


def fit_layout_model(rows: pd.DataFrame, catalog: Catalog, name: str, known: Known | None = None) -> LayoutModel:
    """The model `name` (a step-time variant or a worker-count model) fitted on prepared `rows`."""
    if name in STEP_MODELS:
        return fit_step_model(rows, catalog, name, known)
    keys = frozenset(gpu_key(t, catalog) for lay in rows["layout"] for t in lay.node_types)
    return WorkerCountModel(fit_series("", rows[["workers", "nodes", "throughput"]]), name, keys, catalog)


def _point(model: LayoutModel, layout: Layout, b: float, glob: float) -> tuple[float, dict]:
    """(predicted throughput, parts in seconds or {}) of one layout."""
    step = model.step_s(layout, b)
    return (glob / step if 0 < step < math.inf else math.nan), model.parts(layout, b)


def predict_layouts(measured: pd.DataFrame, layouts: Sequence[Layout], catalog: Catalog, confidence: float,
                    source: str = "the table", time_based: bool = True,
                    known: Known | None = None) -> tuple[pd.DataFrame, list[str]]:
    """(one row per layout, notes): the predicted throughput and, when the table gave time_s
    (`time_based`), the time of its job, each with its band (module doc). Pricing and recommending are
    the planner's (scalelab/costs/planner.py: `plan` with `layouts`), as for every other candidate."""
    rows = prepare(measured, catalog, source)
    types = _measured_types(rows)
    for layout in layouts:
        _refuse_unmeasured(layout, types, source)
    chosen, errors = choose(rows, catalog, known)
    model = fit_layout_model(rows, catalog, chosen, known)
    errs = errors.get(chosen, [])
    q = conformal_quantile(errs, confidence) if errs else math.inf
    notes = [f"model {chosen}: held-out error {np.mean(errs):.1%} over {len(errs)} row(s); "
             + "; ".join(f"{k} {np.mean(v):.1%}" for k, v in errors.items() if v and k != chosen) if errs else
             f"model {chosen}: no row could be predicted from the others"]
    if math.isinf(q) or q >= 1:
        notes.append(f"{len(errs)} held-out prediction(s) are too few for a {confidence:.0%} band (it needs "
                     f"{math.ceil(confidence / (1 - confidence) - 1e-9)}): the band is the one calibrated on the "
                     "published scaling tables for as many measured GPU counts (scalelab/costs/calibration.py; the class "
                     "of predictions that cross onto new nodes for layouts beyond the measured ones), widened to the "
                     "largest error the model made on this table's own held-out rows and to every other step-time "
                     "model's answer")
    others: dict[str, LayoutModel] = {name: fit_layout_model(rows, catalog, name, known)
                                      for name in STEP_MODELS if name != chosen}
    others["steptime-scaled"] = fit_scaled_model(rows, catalog, known)
    others |= _readings(model if isinstance(model, StepModel) else others["steptime"])
    out = [_layout_row(model, chosen, layout, rows, measured, q, time_based, errs, confidence, others, catalog)
           for layout in layouts]
    notes += _beyond_notes(layouts, rows)
    return pd.DataFrame(out), notes


def _readings(model: StepModel) -> dict[str, StepModel]:
    """The two readings of the exchange past the most nodes measured, bandwidth- and latency-bound
    (`StepModel.exchange_s`), as committee members: the band holds both, the point is between them."""
    return {f"{model.name}-{r}": replace(model, reading=r) for r in ("bandwidth", "latency")}


def nodes_beyond(layout: Layout, rows: pd.DataFrame) -> float | None:
    """How many times the most nodes of a measured multi-GPU row the layout spans (None when not past them,
    or when no row spans nodes: such a layout is refused by `why_not`)."""
    most = int(rows.loc[rows["workers"] > 1, "nodes"].max()) if (rows["workers"] > 1).any() else 0
    return layout.nodes / most if most >= 2 and layout.nodes > most else None


def _beyond_notes(layouts: Sequence[Layout], rows: pd.DataFrame) -> list[str]:
    """One note per layout predicted past the most nodes measured, saying how far."""
    out = []
    for layout in layouts:
        far = nodes_beyond(layout, rows)
        if far is not None:
            out.append(f"{layout.text}: an extrapolation to {layout.nodes} nodes, {far:.3g}x the most nodes measured "
                       f"({round(layout.nodes / far)}): the exchange across nodes is read both bandwidth-bound and "
                       "latency-bound (a ring's 2(n-1) steps), the point between them and the band holding both; "
                       "measure a layout on more nodes to narrow it")
    return out


def corpus_band(rows: pd.DataFrame, confidence: float, errs: Sequence[float],
                layout: Layout | None = None) -> tuple[pd.DataFrame, float, float, float]:
    """(the table's rows as worker-count measurements, low and high log quantiles, the largest
    |log error| of its own held-out rows): the band of the published tables for a table with too
    few rows to calibrate its own, never narrower than the misses the model already made on it. A
    layout that puts a type on more nodes than it was measured on, or mixes types never measured
    together, takes the band of predictions that cross onto new nodes (`new_ground`)."""
    fitted = rows[["workers", "throughput"]].astype(float)
    k = fitted["workers"].nunique()
    cal = calibrate(confidence)[band_class(k, layout is not None and new_ground(layout, rows))]
    worst = max((-math.log(1 - min(e, 0.99)) for e in errs), default=0.0)  # |e| relative: the wider side
    return fitted, min(cal.lo, 0.0), max(cal.hi, 0.0), worst


def new_ground(layout: Layout, rows: pd.DataFrame) -> bool:
    """Whether a layout goes where the measurements did not: a type on more nodes than any of its
    measured layouts, or a mix of types no measured layout held."""
    nodes: dict[str, int] = {}
    mixes = set()
    for lay in rows["layout"]:
        mixes.add(frozenset(lay.node_types))
        for t in set(lay.node_types):
            nodes[t] = max(nodes.get(t, 0), lay.node_types.count(t))
    types = set(layout.node_types)
    if len(types) > 1 and frozenset(layout.node_types) not in mixes:
        return True
    return any(layout.node_types.count(t) > nodes.get(t, 0) for t in types)


def layout_bounds(layout: Layout, rows: pd.DataFrame) -> tuple[float, float]:
    """(floor, ceiling) of a layout's throughput from the measured rows (scalelab/costs/calibration.py's
    physical bounds, per GPU type): the ceiling is every GPU at its type's best measured per-GPU rate
    (linear scaling; unbounded when a type has no single-type row), the floor what the fewest measured
    GPUs of the layout's one type delivered, for a layout of at least that many GPUs on no more nodes
    (zero otherwise)."""
    per_type: dict[str, list[tuple[int, int, float]]] = {}
    for _, r in rows.iterrows():
        types = set(r["layout"].node_types)
        if len(types) == 1:
            per_type.setdefault(types.pop(), []).append((int(r["workers"]), int(r["nodes"]), float(r["throughput"])))
    rates = {t: max(thr / w for w, _, thr in seen) for t, seen in per_type.items()}
    ceiling = sum(layout.gpus_per_node * rates.get(t, math.inf) for t in layout.node_types)
    floor = 0.0
    if len(set(layout.node_types)) == 1 and layout.node_types[0] in per_type:
        seen = per_type[layout.node_types[0]]
        fewest = min(w for w, _, _ in seen)
        # more GPUs over no more nodes: a layout that adds a network hop (2x2 after 1x4) may be slower
        floor = max((thr for w, n, thr in seen if w == fewest and layout.workers >= w and layout.nodes <= n), default=0.0)
    return floor, ceiling


def _layout_row(model: LayoutModel, chosen: str, layout: Layout, rows: pd.DataFrame, measured: pd.DataFrame, q: float,
                time_based: bool, errs: list[float], confidence: float = 0.9,
                others: Mapping[str, LayoutModel] | None = None, catalog: Catalog | None = None) -> dict[str, Any]:
    """One output row: point, band, parts and where the speed came from. The band holds every other
    step-time model's answer too (they fit the measurements alike: which one is right is not known)."""
    if model.why_not(layout):
        raise DataError(f"--predict {layout.text}: {model.why_not(layout)}; add such a measurement to the table")
    b, glob = _batch_of(rows, measured, layout.workers)
    thr, parts = _point(model, layout, b, glob)
    if math.isinf(q) or q >= 1:  # too few held-out rows for the table's own band: the corpus's (module doc)
        fitted, lo, hi, worst = corpus_band(rows, confidence, errs, layout)
        spread = float(band_spread(fitted, [layout.workers])[0])
        low, high = thr * math.exp(min(lo * spread, -worst)), thr * math.exp(max(hi * spread, worst))
    else:
        low, high = thr / (1 + q), thr / (1 - q)
    for other in (others or {}).values():
        if other.why_not(layout) is None:
            alt, _ = _point(other, layout, b, glob)
            low, high = (min(low, alt), max(high, alt)) if math.isfinite(alt) else (low, high)
    _, ceiling = layout_bounds(layout, rows)  # physics: never past linear scaling (a measured drop is possible)
    thr, low, high = (min(v, ceiling) for v in (thr, low, high))
    seen = _measured_as(layout, rows, catalog)
    basis = "model"
    if len(seen):  # a measured layout is its measurement, with its own band
        thr, low, high = _measured_band(seen["throughput"].to_numpy(float), rows, confidence)
        basis = "measured"
    row: dict[str, Any] = {"layout": layout.text, "instances": layout.instances, "workers": layout.workers,
                           "nodes": layout.nodes, "balance": layout.balance}
    row |= {"predicted_throughput": thr, "throughput_low": low, "throughput_high": high}
    if time_based:
        per = _per_of(measured, layout.workers)
        row |= {"predicted_time_s": per / thr, "time_low_s": per / high,
                "time_high_s": per / low if low > 0 else math.inf, "work": per}  # the table's job, in its units
    total = sum(parts.values())
    row |= {f"{k}_share": v / total for k, v in parts.items()} if total > 0 else {}
    far = nodes_beyond(layout, rows) if basis == "model" else None
    row["nodes_beyond_measured"] = far  # how many times the most nodes measured (None: inside them)
    return row | {"model": chosen, "basis": basis, "held_out_error": float(np.mean(errs)) if errs else None,
                  "held_out_predictions": len(errs), "speed_basis": "measured"}


def _measured_band(values: np.ndarray, rows: pd.DataFrame, confidence: float) -> tuple[float, float, float]:
    """(mean, low, high) of a measured layout: the spread of its repeats, never narrower than a measurement's
    noise (`calibration.measured_noise`). Not the calibrated extrapolation band at d = 0, whose width grows
    with the loss per doubling of every row of the table, mixed types and all (scalelab/costs/model.py does
    the same for worker counts)."""
    lo, hi = measured_noise(calibrate(confidence)[k_class(rows["workers"].nunique())])
    thr = float(values.mean())
    return thr, min(float(values.min()), thr * math.exp(lo)), max(float(values.max()), thr * math.exp(hi))


def _measured_as(layout: Layout, rows: pd.DataFrame, catalog: Catalog | None = None) -> pd.DataFrame:
    """The rows that measured `layout`: the same nodes, GPUs per node and instances, and the same balance where
    the GPUs differ. On one GPU model the balance is moot: dynamic shares proportional to equal speeds are equal
    shares (N·b / Σ s_w = b / s), so `:dynamic` is answered by the static measurement; modelled instead, 2x4 on
    two g3.16xlarge came out 9 % faster than its own static measurement (the model's error, not the balancer's)."""
    def key(lay: Layout) -> tuple:
        return (lay.nodes, lay.gpus_per_node, sorted(lay.node_types),
                "static" if _one_gpu_model(lay, catalog) else lay.balance)
    want = key(layout)
    return rows[rows["layout"].map(lambda lay: key(lay) == want)]


def _one_gpu_model(layout: Layout, catalog: Catalog | None) -> bool:
    """Whether every worker of `layout` has the same GPU (`gpu_key`; the type's name without a catalog)."""
    return len({gpu_key(t, catalog) if catalog is not None else t for t in layout.node_types}) == 1
