"""What a launch will cost, said before anything is paid for; a question above a threshold.

Why: a cloud launch (or an on-premise cluster that bills by the GPU-hour) spends money the moment it
starts, and a wrong `--nodes` or `--steps` is cheap to see and dear to find in the bill. So `launch
run`, `sweep` and `study` print the fleet's price per hour and the expected dollars of every layout
(costs.expected) before they submit anything, and above `--confirm-above-usd` they ask; `--yes`
answers, `--max-usd` refuses. How a backend's nodes are paid for is the backend's to say (its options
type's `fleet()`, read through the registry: `launcher.backend.fleet_of`): on-premise machines (local,
slurm, k8s) are only priced when a rate is set for them (`--rate local=...`, a rate named after the
backend in `--rate` or the prices file); a cloud fleet (AWS) always is, from its instance mix in the
catalog.

Step time, in this order: the runs of `--expect-from DIR` (a run, sweep or study directory), else
the newest completed runs under the runs directory with the same timing spec (model, batch, engine,
precision, data kind, instance type...: `timing_key`); a run of the same layout gives its measured
median step time and start-up, other layouts (two worker counts or more) a prediction of the
planner's throughput model (costs.planner.predict); nothing measured: costs.expected's assumption,
said as such.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import click

from scalelab.core.checks import NON_NEGATIVE
from scalelab.core.errors import ScalelabError, SpecError
from scalelab.core.rundir import RunPaths, read_json
from scalelab.core.runids import MeasuredRuns
from scalelab.core.spec import Spec, read_spec
from scalelab.costs.rates import named_rates, rate_options

#: Expected dollars above which a launch asks first (`--confirm-above-usd`, $SCALELAB_CONFIRM_USD).
DEFAULT_CONFIRM_USD = 20.0
# Spec fields that do not change how long a step takes (what `timing_key` leaves out).
_UNTIMED = ("name", "steps", "epochs", "seed", "warmup_steps", "lr", "lr_warmup_steps", "lr_ref_batch",
            "checkpoint_every", "loss_threshold", "clip_grad_norm", "profile_steps", "nodes", "gpus_per_node", "backend_options")


def price_options(func: Callable) -> Callable:
    """--yes, --max-usd, --confirm-above-usd, --expect-from, --rate, --prices: declared once, for
    run, sweep and study."""
    confirm_default = os.environ.get("SCALELAB_CONFIRM_USD", str(DEFAULT_CONFIRM_USD))
    options = [
        click.option("--yes", "-y", "yes", is_flag=True, help="Launch without asking, whatever the expected cost."),
        click.option("--max-usd", type=NON_NEGATIVE, help="Refuse to launch when the expected cost is over this many dollars."),
        click.option("--confirm-above-usd", type=NON_NEGATIVE, default=confirm_default, show_default=True,
                     help="Ask before launching above this expected cost [env: SCALELAB_CONFIRM_USD]."),
        click.option("--expect-from", type=MeasuredRuns("--expect-from"),
                     help="A run, sweep or study directory whose measured step times price this launch "
                          "[default: earlier runs of the same spec under --runs-dir]."),
    ]
    for option in reversed(options):
        func = option(func)
    return rate_options(func)


@dataclass
class Quote:
    """The expected cost of a launch: one line per layout and the total (NaN when not known)."""

    lines: list[str]
    total_usd: float
    usd_per_hour: float
    own_code: bool = False  # a --script/--module launch: its steps are the script's, not an option's

    def text(self) -> str:
        why = ("a --script decides its own steps: give --steps N, the steps it runs, for a price" if self.own_code
               else "--epochs of data whose steps per epoch are known once it is read: give --steps too, to bound it")
        from scalelab.core.terminal import dollars_text

        total = f"unknown ({why})" if math.isnan(self.total_usd) else f"${dollars_text(self.total_usd)}"
        return "\n".join([*self.lines, f"expected cost of the launch: {total}"])


def quote(specs: list[tuple[Spec, int]], params: dict[str, Any]) -> Quote | None:
    """The cost of running each spec `count` times, or None when nothing is priced (a backend with no
    rate that is not AWS: the local backend costs nothing)."""
    from scalelab.costs.catalog import DEFAULT_REGION, load_catalog
    from scalelab.costs.expected import expected_cost, is_priced
    from scalelab.launcher.backend import fleet_of

    fleet = fleet_of(specs[0][0])
    rates = named_rates(params.get("rates") or (), [specs[0][0].backend])
    catalog = load_catalog(params.get("prices_file"), rates, fleet.region or DEFAULT_REGION)
    if not is_priced(fleet, catalog):
        return None
    runs = _measured_runs(params, specs[0][0])
    lines, total, peak = [], 0.0, 0.0
    for spec, count in specs:
        step_s, startup_s, basis = step_time(spec, runs)
        est = expected_cost(spec, step_s, catalog, startup_s=startup_s, fleet=fleet_of(spec))
        if basis:
            est = est.with_step_basis(basis + measured_elsewhere(spec, runs))
        times = f"{count} x " if count > 1 else ""
        lines.append(f"{spec.nodes}x{spec.gpus_per_node}: {times}{est.line()}")
        lines += time_limit_warning(spec, est.hours)
        total += count * est.dollars
        peak = max(peak, est.usd_per_hour)
    return Quote(lines, total, peak, own_code=specs[0][0].own_code)


def _hardware(spec: Spec, run_dir: str | None = None) -> str:
    """Where a spec runs, as a price reader needs it: backend, instance type, and for a measured run its
    device (rank 0's start record: a CPU or which GPU)."""
    from scalelab.launcher.backend import fleet_of

    try:
        itype = fleet_of(spec).instance_type  # the backend's default type too (aws: g3.4xlarge)
    except ScalelabError:
        itype = spec.backend_options.get("instance_type")
    where = spec.backend + (f" {itype}" if itype else "")
    if run_dir is None:
        return where
    from scalelab.core.records import read_records

    path = RunPaths(Path(run_dir)).rank_records(0)
    try:
        start = next((r for r in read_records(path, [], tolerant=True) if r["kind"] == "start"), {})
    except ScalelabError:
        return where
    return f"{where} ({('GPU ' + start['gpu_model']) if start.get('gpu_model') else 'CPU'})"


def measured_elsewhere(spec: Spec, runs: list[tuple[Spec, dict[str, Any]]]) -> str:
    """A note for a step time measured on other hardware than the launch's (an --expect-from CPU sweep
    pricing a g5.xlarge): it is that hardware's step time, not the target's, and the reader must know."""
    target = _hardware(spec)
    seen = sorted({_hardware(s, m.get("run_dir")) for s, m in runs if _hardware(s) != target})
    if not seen:
        return ""
    return f"; step time from runs on {', '.join(seen)}, not on {target}: its speed is not applied"


def time_limit_warning(spec: Spec, hours: float) -> list[str]:
    """A warning line when the backend's time limit (`--time-limit-min`: AWS terminates everything then;
    a Kubernetes deadline) is shorter than the expected run, which would then be cut off unfinished."""
    from scalelab.launcher.backend import installed_options_type

    try:
        limit = float(installed_options_type(spec.backend).parse(spec.backend_options).get("timeout_min") or 0)
    except (ScalelabError, TypeError, ValueError):
        return []
    if not limit or math.isnan(hours) or hours * 60 <= limit:
        return []
    from scalelab.core.terminal import duration_text

    # durations said as durations (20 s, 12.5 min, 2.11 h): "the expected 0 min is longer than --time-limit-min 0.2"
    # read as a contradiction for a run of 20 s
    said = f" ({duration_text(limit * 60)})" if limit * 60 < 90 else ""
    return [f"  warning: the expected {duration_text(hours * 3600)} is longer than --time-limit-min {limit:g}{said}: the "
            f"run would be stopped at {limit:g} min; raise --time-limit-min (or lower --steps)"]


def fleet_rate(spec: Spec) -> float | None:
    """The fleet's price per hour as the catalog and prices file know it (recorded in launch.json, for
    `launch ls`'s cost so far); None where nothing prices it or the price is not known."""
    from scalelab.costs.catalog import DEFAULT_REGION, load_catalog
    from scalelab.costs.expected import fleet_price, is_priced
    from scalelab.launcher.backend import fleet_of

    try:
        fleet = fleet_of(spec)
        catalog = load_catalog(region=fleet.region or DEFAULT_REGION)
        return fleet_price(spec, catalog, fleet=fleet)[0] if is_priced(fleet, catalog) else None
    except ScalelabError:
        return None


def show_quote(specs: list[tuple[Spec, int]], params: dict[str, Any]) -> Quote | None:
    """For --dry-run: the price on stderr (stdout stays exactly what would be sent); no question."""
    q = quote(specs, params)
    if q is None:
        _no_price_note(specs[0][0])
        return None
    click.echo(q.text(), err=True)
    if params.get("max_usd") is not None and not q.total_usd <= params["max_usd"]:
        click.echo(f"(a launch would be refused: over --max-usd {params['max_usd']:g})", err=True)
    return q


def _no_price_note(spec: Spec) -> None:
    """On stderr, why --dry-run shows no cost for an unpriced on-premise backend and how to give a price; nothing
    for the local backend, whose runs cost nothing."""
    if spec.backend == "local":
        return
    from scalelab.core.terminal import make_console, prose_lines
    from scalelab.costs.expected import no_price_note

    click.echo(prose_lines("note: ", no_price_note(spec), make_console(stderr=True).width), err=True)


def guard(specs: list[tuple[Spec, int]], params: dict[str, Any]) -> Quote | None:
    """Before a real launch: say the price; refuse over --max-usd; above the threshold ask on a terminal
    (--yes answers), refuse off one. Raises ScalelabError (nothing is launched) when refused."""
    q = quote(specs, params)
    max_usd = params.get("max_usd")
    if q is None:
        if max_usd is not None:
            backend = specs[0][0].backend
            raise SpecError(f"--max-usd: the {backend} backend has no price; set one with --rate "
                            f"{backend}=USD/gpu-hour (or in the prices file) to check a launch against it")
        return None
    click.echo(q.text(), err=True)
    total, known = q.total_usd, not math.isnan(q.total_usd)
    if max_usd is not None and not (known and total <= max_usd):
        what = f"${total:,.2f}" if known else "not known (give --steps too, which bounds --epochs; with --script, --steps N)"
        raise ScalelabError(f"not launched: the expected cost {what} is over --max-usd {max_usd:g}; "
                            "raise --max-usd, or lower --steps (or --epochs) or the layout")
    threshold = params.get("confirm_above_usd", DEFAULT_CONFIRM_USD)
    if params.get("yes") or (known and total <= threshold):
        return q
    what = f"${total:,.2f}" if known else "not known"
    if not sys.stdin.isatty():
        raise ScalelabError(f"not launched: the expected cost {what} is above ${threshold:g} "
                            "(--confirm-above-usd) and there is no terminal to ask; pass --yes to launch")
    if not click.confirm(f"The expected cost is {what}. Launch?", default=False, err=True):
        raise ScalelabError("not launched: declined at the cost question")
    return q


# ---- measured step times -------------------------------------------------------------------------


def timing_key(spec: Spec) -> dict[str, Any]:
    """What sets a step's time, apart from the layout: two specs with equal keys have equal step times
    on equal layouts."""
    raw = spec.to_dict()
    key = {k: v for k, v in raw.items() if k not in _UNTIMED}
    key["instance_type"] = spec.backend_options.get("instance_type")
    return key


def _measured_runs(params: dict[str, Any], spec: Spec) -> list[tuple[Spec, dict[str, Any]]]:
    """(spec, summary) of completed runs: those under --expect-from, else the runs directory's of the
    same timing key; newest first."""
    explicit = params.get("expect_from")
    root = Path(explicit) if explicit else Path(params.get("runs_dir") or "runs")
    found = []
    for summary_path in _summaries(root):
        try:
            run_spec, summary = read_spec(summary_path.parent), read_json(summary_path, "summary", dict)
        except ScalelabError:
            continue
        if explicit or timing_key(run_spec) == timing_key(spec):
            found.append((summary_path.stat().st_mtime, run_spec, {**summary, "run_dir": str(summary_path.parent)}))
    if explicit and not found:
        raise SpecError(f"--expect-from {explicit}: no completed run (summary.json) under it to take step times from")
    if explicit:
        found = _of_this_model(explicit, spec, found)
    return [(s, summary) for _, s, summary in sorted(found, key=lambda f: -f[0])]


def _of_this_model(where: str, spec: Spec, found: list[tuple[float, Spec, dict[str, Any]]]):
    """The runs under --expect-from of the launch's own model or script. Why: other hardware is what the flag is
    for (a CPU sweep pricing a GPU launch, with a note), another model is not: nmt-tiny was priced from the step
    time of a hello.py found three folders down the directory given."""
    mine = [f for f in found if f[1].model == spec.model]
    if not mine:
        theirs = ", ".join(sorted({f[1].model for f in found}))
        raise SpecError(f"--expect-from {where}: none of its {len(found)} completed run(s) is of {spec.model} "
                        f"(they are of {theirs}); point it at runs of {spec.model}")
    return mine


def _summaries(root: Path) -> list[Path]:
    """summary.json of runs at the root, in sweeps (one level down) and in studies (two levels)."""
    if not root.is_dir():
        return []
    return [p for pattern in ("summary.json", "*/summary.json", "*/*/summary.json", "*/*/*/summary.json")
            for p in root.glob(pattern) if RunPaths(p.parent).spec.exists()]


def step_time(spec: Spec, runs: list[tuple[Spec, dict[str, Any]]]) -> tuple[float | None, float, str]:
    """(seconds per step, start-up seconds, basis) for `spec` from `runs`: the same layout measured,
    else predicted from two worker counts or more; (None, 0, "") when neither."""
    for run_spec, summary in runs:
        if (run_spec.nodes, run_spec.gpus_per_node) == (spec.nodes, spec.gpus_per_node) and summary.get("step_s_median"):
            startup = float(summary.get("startup_s") or 0.0)
            return float(summary["step_s_median"]), startup, f"median measured in {summary['run_dir']}"
    return _predicted_step_time(spec, runs)


def _predicted_step_time(spec: Spec, runs: list[tuple[Spec, dict[str, Any]]]) -> tuple[float | None, float, str]:
    """Samples per second at `spec.workers` from the planner's throughput model of the measured layouts."""
    import pandas as pd

    from scalelab.core.presets import PRESETS
    from scalelab.costs.planner import PlanRequest, predict

    rows = [{"label": "runs", "workers": s.workers, "nodes": s.nodes, "throughput": m["samples_per_s"]}
            for s, m in runs if m.get("samples_per_s")]
    if len({r["workers"] for r in rows}) < 2:
        return None, 0.0, ""
    try:
        _, table = predict(PlanRequest(measured=pd.DataFrame(rows), predict_workers=[spec.workers]))
    except ScalelabError:
        return None, 0.0, ""
    pred = table[table["workers"] == spec.workers]["predicted_throughput"]
    if not len(pred) or not float(pred.iloc[0]) > 0:
        return None, 0.0, ""
    if spec.own_code:  # a --script's batch is its own: the one its measured runs recorded (strong scaling)
        batches = [m.get("global_batch") or m["samples_per_s"] * m["step_s_median"] for _, m in runs
                   if m.get("global_batch") or (m.get("samples_per_s") and m.get("step_s_median"))]
        if not batches:
            return None, 0.0, ""
        batch = int(batches[0])
    else:
        batch = spec.resolved_global_batch(PRESETS[spec.model].default_batch)
    return batch / float(pred.iloc[0]), 0.0, f"predicted by the planner from {len(rows)} measured runs"
