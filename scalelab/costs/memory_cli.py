"""`launch memory`: will a model and batch fit a GPU? The predicted peak per rank against every GPU type.

Why a command of its own: the question comes before any run (which batch can I use on a 16 GB T4?) and
after an out-of-memory error (whose message points here). `launch plan` uses the same prediction to
mark the layouts that do not fit (scalelab/costs/memory.py).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

from scalelab.core.errors import SpecError
from scalelab.core.flags import shared_flags, spec_from_flags
from scalelab.core.options import parse_pairs
from scalelab.core.presets import PRESETS, config_with_overrides, model_overrides
from scalelab.core.terminal import make_console
from scalelab.costs.catalog import InstanceType, builtin_catalog, unknown_type_message
from scalelab.costs.memory import GIB, HEADROOM, MemoryPrediction, predict_peak

console = make_console()


def gpu_types(names: list[str] | None = None) -> list[InstanceType]:
    """One instance type per GPU model and memory (the smallest), or the named types."""
    catalog = builtin_catalog()
    if names:
        unknown = [n for n in names if n not in catalog.instances]
        if unknown:
            raise SpecError(unknown_type_message(unknown[0], catalog.names(),
                                                 "launch memory checks the built-in catalog's types only"))
        return [catalog.instance(n) for n in names]
    seen: dict[tuple[str | None, float | None], InstanceType] = {}
    for inst in sorted(catalog.instances.values(), key=lambda i: (i.gpus, i.name)):
        if inst.gpu_mem_gib:
            seen.setdefault((inst.gpu_model, inst.gpu_mem_gib), inst)
    return sorted(seen.values(), key=lambda i: (i.gpu_mem_gib or 0, i.gpu_model or ""))


def fit_rows(prediction: MemoryPrediction, types: list[InstanceType], precision: str = "fp32") -> list[dict]:
    """Per type: its GPU, the GPU's memory, whether the predicted peak fits (HEADROOM of it), and whether
    the GPU has the precision's arithmetic at all (`runs_precision`: a K80 or M60 has no bf16 or fast fp16,
    so a bf16 rank does not "fit" there whatever its memory)."""
    catalog = builtin_catalog()
    rows = []
    for t in types:
        gpu = catalog.gpu(t)
        rate = getattr(gpu, f"{precision}_tflops", None) if gpu is not None and precision in ("bf16", "fp16") else 1.0
        runs = gpu is None or rate is not None  # unknown GPUs are not refused on a guess
        rows.append({"instance_type": t.name, "gpu": t.gpu_model, "gpu_mem_gib": t.gpu_mem_gib,
                     "runs_precision": runs,
                     "fits": runs and bool(t.gpu_mem_gib) and prediction.fits(float(t.gpu_mem_gib)),
                     "used_share": prediction.peak_bytes / (float(t.gpu_mem_gib) * GIB) if t.gpu_mem_gib else None})
    return rows


@click.command("memory")
@shared_flags("--model", "--model-arg", "--batch-per-worker", "--precision", "--engine", "--output-loss", "--optimizer")
@click.option("--instance-types", help="Check these types [default: one per GPU model in the catalog].")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def memory_cmd(instance_types: str | None, fmt: str, **params: Any) -> None:
    """Predict a rank's peak GPU memory for a model, batch, precision and engine, and which GPUs it fits.

    The peak counts tensors, as torch.cuda.max_memory_allocated does; a GPU fits when the peak is at
    most 90% of its memory (the rest: the CUDA context and the allocator's cache). The model, engine,
    precision, output loss and optimizer flags and their defaults are `launch run`'s; it takes no others
    (`--rnn stepwise` and `--ps-state cpu` change a rank's memory too, but the prediction models only the
    fused cuDNN/oneDNN LSTM and the optimizer state on the rank). Without --batch-per-worker a rank takes the
    model's batch (its preset's default_batch: what one worker of `launch run --model M` trains)."""
    # `spec_from_flags` reads the spec fields' flags only: --model-arg joins the spec here, typed naming the flag
    # (as `launch run` does), so that validate refuses a field the model never reads, as `launch run` does
    flagged = model_overrides(parse_pairs(params["model_args"], "--model-arg"), "--model-arg")
    spec = dataclasses.replace(spec_from_flags(params), model_args=flagged).validate()  # ps in fp16: refused too
    model_name, precision, engine = spec.model, spec.precision, spec.engine.name
    cfg = config_with_overrides(PRESETS[model_name], spec.model_args)
    batch_per_worker = spec.batch_per_worker if spec.batch_per_worker is not None else cfg.default_batch
    prediction = predict_peak(cfg, batch_per_worker, precision, engine, spec.output_loss, spec.optimizer, device="cuda")
    names = [n.strip() for n in instance_types.split(",") if n.strip()] if instance_types is not None else None
    if names == []:  # '' or ',' listed the default types without a word (`launch plan` refuses it)
        raise SpecError(f"--instance-types {instance_types!r} names no type: give types, e.g. g5.xlarge,p4d.24xlarge, "
                        "or leave the flag out for the default ones")
    rows = fit_rows(prediction, gpu_types(names), precision)
    if fmt == "json":
        click.echo(json.dumps({"model": model_name, "batch_per_worker": batch_per_worker, "precision": precision,
                               "engine": engine, "output_loss": spec.output_loss, "optimizer": spec.optimizer,
                               "peak_gib": prediction.peak_gib, "model_state_gib": prediction.model_state / GIB,
                               "activations_gib": prediction.activations / GIB,
                               "output_layer_gib": prediction.output_layer / GIB, "types": rows}, indent=2))
        return
    width = min(console.width, PROSE_WIDTH)
    console.print(f"{model_name}, {batch_text(batch_per_worker, spec.batch_per_worker is None)}, {precision}, {engine}: "
                  "predicted peak "
                  f"[bold]{size_text(prediction.peak_bytes)}[/] per rank (model state "
                  f"{size_text(prediction.model_state)}, activations {size_text(prediction.activations)}, "
                  f"output layer and loss {size_text(prediction.output_layer)})", width=width)
    shares = [f"{share_text(r['used_share'])} used" if r["used_share"] is not None else "memory unknown" for r in rows]
    # each column as wide as its widest cell: "19197% used" ran into the status, which needs the room to say
    # both its reasons within 80 columns
    room = max(map(len, shares), default=0)
    name = max((len(r["instance_type"]) for r in rows), default=0)
    gpu = max((len(r["gpu"] or "?") for r in rows), default=0)
    for r, share in zip(rows, shares):
        console.print(f"  {r['instance_type']:<{name}} {r['gpu'] or '?':<{gpu}} {r['gpu_mem_gib'] or 0:>3.0f} GiB  "
                      f"{share:<{room}}  {fit_status(r, prediction, precision)}", no_wrap=True, overflow="ignore",
                      crop=False)
    notes = []
    if any(not r["runs_precision"] for r in rows):
        notes.append(f"\"no {precision} arithmetic\": the GPU has no {precision} units, whatever its memory")
    if any(not memory_fits(r, prediction) for r in rows):
        notes.append(f"a rank fits where its peak is at most {HEADROOM:.0%} of the GPU's memory; where it does "
                     f"not, use {remedies_left(precision, spec.output_loss)}")
    if notes:
        text = "; ".join(notes)
        console.print(f"{text[0].upper()}{text[1:]}.", width=width)

def memory_fits(row: dict, prediction: MemoryPrediction) -> bool:
    """Whether the peak fits the row's GPU memory, whatever its arithmetic (a row's `fits` needs both)."""
    return bool(row["gpu_mem_gib"]) and prediction.fits(float(row["gpu_mem_gib"]))


def fit_status(row: dict, prediction: MemoryPrediction, precision: str) -> str:
    """fits, or every reason it does not: the memory and the arithmetic. Why both: a 1,536 GiB rank on a V100 read
    only "no bf16 arithmetic", as if a V100 with bf16 would hold it."""
    if row["fits"]:
        return "fits"
    why = [] if memory_fits(row, prediction) else ["does not fit"]
    if not row["runs_precision"]:
        why.append(f"no {precision} arithmetic")
    return f"[red]{'; '.join(why)}[/]"


#: Prose lines (the prediction, the footer) wrap at the console's width, and at most this many columns.
PROSE_WIDTH = 80


def batch_text(batch: int, defaulted: bool) -> str:
    """The batch per rank, and where it came from when no --batch-per-worker said it: `launch memory --model
    nmt-tiny` was refused for a missing --batch-per-worker, though the model has a batch of its own."""
    return f"{batch} per rank" + (" (the model's default batch; --batch-per-worker N for another)" if defaulted else "")


def size_text(nbytes: float) -> str:
    """Bytes as GiB, or MiB below 0.1 GiB (a tiny model's peak read "0.00 GiB")."""
    if nbytes <= 0:
        return "0 MiB"
    if nbytes >= 0.1 * GIB:
        return f"{nbytes / GIB:.2f} GiB"
    mib = nbytes / 2**20
    return "<0.1 MiB" if mib < 0.1 else f"{mib:.1f} MiB" if mib < 10 else f"{mib:.0f} MiB"


def share_text(share: float) -> str:
    """A share of a GPU's memory: "<1%" below one percent (a tiny model's read "0%")."""
    return "<1%" if 0 < share < 0.01 else f"{share:.0%}"


def remedies_left(precision: str, output_loss: str) -> str:
    """The ways to a smaller peak that the command's flags have not already taken."""
    fixes = ["a smaller --batch-per-worker"]
    if precision == "fp32":
        fixes.append("--precision bf16")
    if output_loss == "full":
        fixes.append("--output-loss compiled")
    return fixes[0] if len(fixes) == 1 else ", ".join(fixes[:-1]) + " or " + fixes[-1]
