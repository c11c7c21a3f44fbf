"""The per-GPU speed of an instance type relative to the type the measurements were made on, and
what that speed rests on (`speed_basis`).

A plan prices every candidate type at the measured throughput times a per-GPU speed factor. The
factor is only as good as its basis, and every candidate row says which it is:

- **measured**: the type the runs were made on (factor 1);
- **probe**: a type with its own runs of the same job (`launch probe`, or runs of the sweep on
  another type): its measured per-GPU throughput over the measured type's;
- **user**: given with `--speed GPU_OR_TYPE=FACTOR`, or an on-premise `--rate` without a GPU model
  that was neither measured nor probed (the user's own cluster, priced at the measured speed unless
  `--speed` says otherwise; a probed rate, e.g. `launch probe`'s local-2t, has its probe's speed);
- **published**: the per-GPU throughput ratio of the two GPU models measured on other jobs of the
  same kind of arithmetic (fp32/tf32 or mixed precision): scalelab/costs/data/gpu_speed_measured.csv
  (seed 004's K80 against M60, the published corpus's K80 against P100 and A100 against V100), the
  median over its jobs, band widened by κ = max(1.3, the jobs' spread): jobs differ (the corpus's
  K80/P100 ratios span 10 % over three CNNs, an LSTM can differ more). Preferred to spec ratios,
  which missed seed 004's K80/M60 by a factor 2;
- **estimate**: from the catalog's GPU specs (scalelab/costs/data/gpu_models.csv), a roofline-like ratio of
  the time per unit of work, `t_T / t_base = s · F_base/F_T + (1 − s) · B_base/B_T`, with F the peak
  FLOP/s at the run's precision and B the memory bandwidth; s (the compute-bound share of the time)
  is fitted on the probed types when there are any (least squares of the log speed ratios over a
  grid of s in [0, 1]), else 0.5 (a blend: nothing says which bound dominates).

Estimates are priced with a wider throughput band: both ends moved out by a factor κ (low / κ,
high · κ). κ = 2.2 without probes: on seed 004's two types (K80, M60) the 0.5 blend puts an M60 at
0.83× a K80 where the seed measured 1.78× (a factor 2.1 off), and no s in [0, 1] does better than a
factor 1.6 (a spec ratio cannot explain that pair). With probes κ = max(1.6, e^max|log residual|),
the worst miss of the fit on the probed types but never below what specs missed by on the seed. A
type with the GPU model of the measured type (or of probed types) gets that type's speed (factor 1,
or the probes' median ratio) and κ = 1.1: the same chip, but host CPUs, clocks and the instance's
PCIe layout still differ.

When the measured device is not in the catalog (a CPU run, or no `--measured-on`) nothing can be
estimated relative to it: such types are not priced, and the reason says what to give.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files

import numpy as np
import pandas as pd

from scalelab.costs.catalog import Catalog, GpuModel, InstanceType

__all__ = ["SPEED_BASES", "Speed", "resolve_speed", "check_speed", "speed_keys", "MAX_SPEED_FACTOR", "spec_time_ratio", "calibrate", "published_ratio"]

SPEED_BASES = ("measured", "probe", "published", "estimate", "user")
PUBLISHED_WIDENING = 1.3  # a ratio measured on other jobs: the corpus's K80/P100 ratios span 10 % over three CNNs
UNCALIBRATED_WIDENING = 2.2  # seed 004: the 0.5 blend is a factor 2.1 off on K80 -> M60
CALIBRATED_FLOOR = 1.6  # seed 004: the best blend in hindsight is still a factor 1.6 off
SAME_GPU_WIDENING = 1.1
DEFAULT_COMPUTE_SHARE = 0.5


@dataclass(frozen=True)
class Speed:
    """Per-GPU speed of a type relative to the measured type, its basis, and the factor κ its
    throughput band is widened by (1: not widened)."""

    factor: float
    basis: str
    widening: float = 1.0
    note: str = ""


def spec_time_ratio(target: GpuModel, ref: GpuModel, precision: str, share: float) -> float:
    """Time per unit of work on `target` over that on `ref`: `share` of the reference time scales
    with peak FLOP/s at `precision`, the rest with memory bandwidth."""
    f_t, f_r = target.peak_tflops(precision)[0], ref.peak_tflops(precision)[0]
    return share * f_r / f_t + (1.0 - share) * ref.mem_bandwidth_gbs / target.mem_bandwidth_gbs


def calibrate(catalog: Catalog, base: InstanceType, ratios: dict[str, float], precision: str) -> tuple[float, float]:
    """(compute share s, widening κ) from the probed types' measured speed ratios (type -> per-GPU
    speed over the base's); without usable probes (no GPU specs), (0.5, 2.2)."""
    ref = catalog.gpu(base)
    points = [(catalog.gpu(catalog.instance(t)), r) for t, r in ratios.items() if t in catalog.instances]
    points = [(g, r) for g, r in points if g is not None and r > 0 and g.name != (ref.name if ref else None)]
    if ref is None or not points:
        return DEFAULT_COMPUTE_SHARE, UNCALIBRATED_WIDENING
    grid = np.linspace(0.0, 1.0, 101)
    resid = np.array([[math.log(r * spec_time_ratio(g, ref, precision, s)) for g, r in points] for s in grid])
    best = int(np.argmin((resid ** 2).sum(axis=1)))
    return float(grid[best]), max(CALIBRATED_FLOOR, math.exp(float(np.abs(resid[best]).max())))


def resolve_speed(inst: InstanceType, base: InstanceType | None, catalog: Catalog, speed: dict[str, float],
                  probes: dict[str, float], precision: str = "fp32") -> Speed | str:
    """The speed of `inst` relative to `base` (the measured type; None when unknown), or the reason
    it cannot be known (a sentence saying what to give). `probes` maps types to their measured
    per-GPU throughput (the base's among them)."""
    for key in (inst.name, inst.gpu_model):
        if key and key in speed:
            return Speed(float(speed[key]), "user")
    if base is not None and inst.name == base.name:
        return Speed(1.0, "measured")
    if base is not None and inst.name in probes and probes.get(base.name, 0) > 0:
        return Speed(probes[inst.name] / probes[base.name], "probe")
    if inst.provider == "rate" and not inst.gpu_model:  # after the probes: a probed rate has its own speed
        return Speed(1.0, "user", note=f"{inst.name}: an on-premise rate without a GPU model, priced at the measured "
                                       f"speed; give --speed {inst.name}=FACTOR if its GPUs differ")
    if base is None:
        return (f"{inst.name}: not priced, its speed cannot be estimated relative to the device the measurements "
                f"were made on (unknown or not in the catalog: a CPU run, a mix of types, or no --measured-on); give "
                f"--measured-on TYPE, --speed {inst.gpu_model or inst.name}=FACTOR, or probe it (launch probe)")
    return _estimate(inst, base, catalog, probes, precision)


def _estimate(inst: InstanceType, base: InstanceType, catalog: Catalog, probes: dict[str, float],
              precision: str) -> Speed | str:
    """The spec estimate of `inst` against `base` (module doc), or why there is none."""
    gpu, ref = catalog.gpu(inst), catalog.gpu(base)
    if gpu is None or ref is None:
        missing = inst.gpu_model if gpu is None else base.gpu_model
        return (f"{inst.name}: no GPU specs for {missing or 'its GPU'} (the measured {base.name} or this type) in the "
                f"catalog to estimate its speed from; give --speed {inst.gpu_model or inst.name}=FACTOR, probe it "
                f"(launch probe), or add the GPU to gpu_models in the prices file")
    base_speed = probes.get(base.name, 0)
    ratios = {t: v / base_speed for t, v in probes.items() if base_speed > 0 and t != base.name}
    same = {base.name: 1.0} if gpu.name == ref.name else {
        t: r for t, r in ratios.items() if t in catalog.instances and catalog.instance(t).gpu_model == gpu.name}
    if same:
        factor = float(np.median(list(same.values())))
        return Speed(factor, "estimate", SAME_GPU_WIDENING, f"{inst.name}: the GPU ({gpu.name}) of {', '.join(same)}: "
                     f"{factor:.2f}× the measured per-GPU speed, band widened ×{SAME_GPU_WIDENING:g}")
    published = published_ratio(gpu.name, ref.name, precision)
    if published is not None and not ratios:
        factor, kappa, jobs = published
        return Speed(factor, "published", kappa, f"{inst.name}: speed from published measurements of {gpu.name} against "
                     f"{ref.name} ({jobs}; scalelab/costs/data/gpu_speed_measured.csv): {factor:.2f}× the measured "
                     f"per-GPU speed, band widened ×{kappa:.2g}; probe it or give --speed {gpu.name}=FACTOR to narrow it")
    share, kappa = calibrate(catalog, base, ratios, precision)
    factor = 1.0 / spec_time_ratio(gpu, ref, precision, share)
    how = (f"compute share {share:.2f} fitted on {len(ratios)} probed type(s)" if ratios
           else f"compute share {share:.2f} assumed: no probed type to fit it on")
    fallbacks = [n for n in (ref.peak_tflops(precision)[1], gpu.peak_tflops(precision)[1]) if n]
    note = (f"{inst.name}: speed estimated from specs, {gpu.name} against the measured {ref.name} at {precision} "
            f"({gpu.peak_tflops(precision)[0]:g} vs {ref.peak_tflops(precision)[0]:g} TFLOP/s, "
            f"{gpu.mem_bandwidth_gbs:g} vs {ref.mem_bandwidth_gbs:g} GB/s; {how}): {factor:.2f}× the measured "
            f"per-GPU speed, band widened ×{kappa:.2g} either way" + "".join(f"; {n}" for n in fallbacks)
            + f"; probe it or give --speed {gpu.name}=FACTOR to narrow it")
    return Speed(factor, "estimate", kappa, note)


@lru_cache(maxsize=1)
def _measured_ratios() -> pd.DataFrame:
    return pd.read_csv(files("scalelab.costs.data") / "gpu_speed_measured.csv")


def _family(gpu: str) -> str:
    """The chip of a GPU model name (V100-32GB -> V100): memory variants share published ratios."""
    return gpu.split("-")[0]


def published_ratio(gpu: str, ref: str, precision: str) -> tuple[float, float, str] | None:
    """(per-GPU speed of `gpu` over `ref`, widening κ, the jobs in words) from published measurements
    at the run's kind of arithmetic (mixed for fp16/bf16, else fp32), or None when there are none."""
    kind = "mixed" if precision in ("fp16", "bf16") else "fp32"
    table = _measured_ratios()
    table = table[table["precision"] == kind]
    g, r = _family(gpu), _family(ref)
    direct = table[(table["gpu"] == g) & (table["reference_gpu"] == r)]
    inverse = table[(table["gpu"] == r) & (table["reference_gpu"] == g)]
    ratios = [*direct["ratio"], *(1.0 / inverse["ratio"])]
    if not ratios or g == r:
        return None
    median = float(np.median(ratios))
    spread = math.exp(max(abs(math.log(x / median)) for x in ratios))
    return median, max(PUBLISHED_WIDENING, spread), f"{len(ratios)} job(s), {kind}"


#: the largest `--speed` factor taken: a thousand times the measured GPU is past any GPU generation's step
#: (K80 to H100 is about 20x); 1e300 priced every layout at "0 s"
MAX_SPEED_FACTOR = 1000.0


def speed_keys(catalog: Catalog) -> list[str]:
    """What `--speed KEY=FACTOR` may name: the catalog's GPU models, instance types and rate names (`resolve_speed`
    looks a type up by its name, then by its GPU model)."""
    models = set(catalog.gpu_models) | {i.gpu_model for i in catalog.instances.values() if i.gpu_model}
    return sorted(models | set(catalog.names()))


def check_speed(speed: dict[str, float], catalog: Catalog) -> str | None:
    """Why `speed` cannot be applied (a key the catalog does not know, with the nearest valid one), or None.
    Why: `--speed V10=3` was ignored without a word, and the plan read as if the factor were applied."""
    known = speed_keys(catalog)
    lower = {k.lower(): k for k in known}
    for key in speed:
        if key in known:
            continue
        close = difflib.get_close_matches(key.lower(), list(lower), n=1)
        hint = f"did you mean {lower[close[0]]}? " if close else ""
        return (f"--speed {key}: no GPU model, instance type or rate of that name; {hint}give a GPU model (e.g. "
                f"{', '.join(sorted(catalog.gpu_models)[:4])}), a type or a rate that `launch cost --list` shows")
    return None
