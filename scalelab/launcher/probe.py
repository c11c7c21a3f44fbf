"""`launch probe`: measure each candidate instance type briefly, on the user's own spec, before planning.

A plan is only as good as the speed it assumes for each candidate. A probe measures it: for every
candidate, short runs of the user's spec (its warm-up plus `--probe-steps` measured steps) on one
instance with one GPU, on one instance with all its GPUs, and on two such instances (1x1, 1xG, 2xG;
1x1 and 2x1 when G is 1), each run also timing an all-reduce over its ranks after the last step
(`spec.link_probe_mb`, scalelab/train/links.py): GPU to GPU inside the instance (1xG) and instance to
instance (2xG). What a candidate is depends on the backend:

- aws: an EC2 instance type of the catalog (`g5.xlarge`); its GPUs come from the catalog; --spot;
- slurm: a GPU type as the cluster's GRES names it (`a100`: sbatch --gres=gpu:a100:N), a partition
  and a GPU type (`gpu/a100`), or a whole partition (`gpu/`); GPUs per node from `sinfo`, or
  --gpus-per-node where sinfo cannot be asked (a dry run away from the cluster);
- local: a variant of this machine, `local-<T>t[-<precision>]`: T threads per worker (and the
  precision), an "instance" of --gpus-per-node workers (2 by default): two variants that really
  differ in speed, for trying the whole path on one machine.

A probe directory is a sweep directory (sweep.json) whose runs are the candidates' layouts, so
everything that works on sweeps works on it: the one submit-and-follow loop (scalelab/launcher/sweep.py) with
its teardown on every way out, `launch resume`, `status`, `cancel`, `report`, and `launch plan
PROBE_DIR` (each run's spec names its candidate as `instance_type` and its series as "... on
CANDIDATE"). probe.json adds what the probe was (candidates, layouts, expected cost) and, at the
end, per candidate its throughput, step times, links and what it cost. Before anything starts the
expected cost is printed (scalelab/costs/expected.py; on AWS the command asks, or needs --yes); after, the
cost billed for the measured wall times (scalelab/costs/billing.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click

from scalelab.core.errors import ScalelabError, SpecError, shell_word
from scalelab.core.rundir import SWEEP_FILE, RunPaths, dryrun_dir, new_run_dir, read_json, write_json
from scalelab.core.spec import Spec, save_spec
from scalelab.launcher.cli import GroupedCommand, build_spec, console, spec_options
from scalelab.launcher.runner import err_console

PROBE_FILE = "probe.json"
DEFAULT_PROBE_STEPS = 30
DEFAULT_LINK_SIZES_MB = "0.004,1,16"
LOCAL_GPUS = 2  # workers of one local "instance" unless --gpus-per-node says otherwise
_NAME = r"[A-Za-z][\w.\-]*"
_LOCAL = re.compile(r"local-(\d+)t(?:-(fp32|bf16|fp16))?")


@dataclass(frozen=True)
class Candidate:
    """One thing to probe: its name (the `instance_type` the planner prices), GPUs per instance, and
    what it changes in the spec (fields) and in the backend options."""

    name: str
    gpus: int
    fields: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    def layouts(self) -> list[tuple[int, int]]:
        """1x1, 1xG and 2xG (G = the instance's GPUs), without repeats."""
        return list(dict.fromkeys([(1, 1), (1, self.gpus), (2, self.gpus)]))

    def run_name(self, nodes: int, gpus: int) -> str:
        return f"{self.name.replace('/', '-').rstrip('-')}-{nodes}x{gpus}"


# ---- candidates ----------------------------------------------------------------------------------


def parse_candidates(text: str | None, backend: str, gpus_per_node: int | None, catalog=None) -> list[Candidate]:
    """The candidates of `--instance-types`, each checked for `backend`; SpecError names a bad one."""
    names = [t.strip() for t in (text or "").split(",") if t.strip()]
    if not names:
        raise SpecError("--instance-types needs at least one candidate, e.g. --instance-types g5.xlarge,g6.xlarge "
                        "(aws), a100,v100 (slurm GPU types) or local-1t,local-2t (local variants)")
    if len(set(names)) != len(names):
        raise SpecError(f"--instance-types lists a candidate twice: {','.join(names)}")
    if backend == "aws":
        return [_aws_candidate(n, gpus_per_node, catalog) for n in names]
    if backend == "slurm":
        nodes = None if gpus_per_node else slurm_gpu_nodes()
        return [_slurm_candidate(n, gpus_per_node, nodes) for n in names]
    if backend == "local":
        return [_local_candidate(n, gpus_per_node) for n in names]
    raise SpecError(f"launch probe runs on --backend local, slurm or aws, not {backend}")


def _aws_candidate(name: str, gpus_per_node: int | None, catalog) -> Candidate:
    from scalelab.costs.catalog import load_catalog

    inst = (catalog or load_catalog()).instance(name, provider="aws")  # unknown: lists the known types
    if gpus_per_node and gpus_per_node > inst.gpus:
        raise SpecError(f"--gpus-per-node {gpus_per_node}: {name} has {inst.gpus} GPU(s); give at most that, or "
                        "leave it out to use all of them")
    return Candidate(name, gpus_per_node or inst.gpus, options={"instance_type": name})


def _local_candidate(name: str, gpus_per_node: int | None) -> Candidate:
    m = _LOCAL.fullmatch(name)
    if not m or int(m[1]) < 1:
        raise SpecError(f"unknown local variant {name!r}: write local-<THREADS>t or local-<THREADS>t-<PRECISION>, "
                        "e.g. local-1t,local-2t or local-2t-bf16 (threads per worker, precision)")
    fields: dict[str, Any] = {"threads": int(m[1])}
    if m[2]:
        fields["precision"] = m[2]
    return Candidate(name, gpus_per_node or LOCAL_GPUS, fields, {"instance_type": name})


def _slurm_candidate(name: str, gpus_per_node: int | None, nodes: list[tuple[str, str, int]] | None) -> Candidate:
    m = re.fullmatch(rf"(?:({_NAME})/)?({_NAME})?", name)
    if not m or not (m[1] or m[2]) or ("/" in name and not m[1]):
        raise SpecError(f"cannot read Slurm candidate {name!r}: write a GPU type (a100), PARTITION/TYPE "
                        "(gpu/a100) or a partition with any GPU (gpu/)")
    partition, gpu_type = m[1] or "", m[2] or ""
    gpus = gpus_per_node or _slurm_gpus(name, partition, gpu_type, nodes or [])
    options = {"instance_type": name.replace("/", "-").rstrip("-"), "gpu_type": gpu_type}
    return Candidate(name, gpus, options={**options, **({"partition": partition} if partition else {})})


def slurm_gpu_nodes() -> list[tuple[str, str, int]]:
    """(partition, GPU type or '', GPUs) of every node, from `sinfo` (read only); SpecError without it."""
    if shutil.which("sinfo") is None:
        raise SpecError("sinfo is not on PATH, so the GPUs per node of each candidate are unknown: give "
                        "--gpus-per-node (GPUs of one node), or probe from a login node of the cluster")
    done = subprocess.run(["sinfo", "-h", "-N", "-o", "%P %G"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise SpecError(f"sinfo failed ({done.stderr.strip() or done.returncode}); give --gpus-per-node")
    out = []
    for line in done.stdout.splitlines():
        part, _, gres = line.strip().partition(" ")
        for gtype, count in re.findall(r"gpu:(?:([^:(,\s]+):)?(\d+)", gres):
            out.append((part.rstrip("*"), gtype, int(count)))
    return out


def _slurm_gpus(name: str, partition: str, gpu_type: str, nodes: list[tuple[str, str, int]]) -> int:
    fits = [n for p, t, n in nodes if (not partition or p == partition) and (not gpu_type or t == gpu_type)]
    if not fits:
        seen = sorted({f"{p}/{t}" if t else f"{p}/" for p, t, _ in nodes})
        raise SpecError(f"no node of the cluster matches candidate {name!r} (nodes with GPUs, as PARTITION/TYPE: "
                        f"{', '.join(seen) or 'none'})")
    return max(fits)


# ---- the probe's runs ----------------------------------------------------------------------------


def probe_specs(base: Spec, candidates: list[Candidate], mode: str, probe_steps: int,
                link_sizes_mb: list[float]) -> list[tuple[Candidate, Spec]]:
    """Every probe run's validated spec: the user's spec on each candidate's layouts, short, its
    series named after the candidate, links timed wherever there is more than one rank."""
    from scalelab.analysis.results import run_label
    from scalelab.launcher.sweep import sweep_specs

    out = []
    for cand in candidates:
        refuse_trainer_variant(base, cand)
        spec = base.with_overrides({**cand.fields, "steps": base.warmup_steps + probe_steps})
        spec.epochs, spec.loss_threshold = None, None  # minutes, not hours: a probe never waits for a loss
        spec.backend_options = {**base.backend_options, **cand.options}
        for s in sweep_specs(spec, cand.layouts(), mode):
            s.name = f"{run_label(s)} on {cand.name}"  # one series per candidate (the user's --name first)
            s.link_probe_mb = list(link_sizes_mb) if s.workers > 1 else []
            out.append((cand, s.validate()))
    return out


def refuse_trainer_variant(base: Spec, cand: Candidate) -> None:
    """A precision variant (`local-2t-bf16`) probed with --script / --module: the candidate sets the built-in
    trainer's precision, which the user's code never reads, so its runs would measure nothing the name says.
    Refused naming the candidate (the spec's own refusal blamed a --precision the user never gave)."""
    if base.own_code and "precision" in cand.fields:
        plain = _LOCAL.sub(r"local-\1t", cand.name)
        raise SpecError(f"probe candidate {cand.name} sets the built-in trainer's precision ({cand.fields['precision']}), "
                        f"which {base.script_label} does not read: a precision variant measures nothing for your own "
                        f"code; probe {plain} instead (your script chooses its own precision, e.g. from its "
                        "arguments after `--`)")


def parse_sizes(text: str) -> list[float]:
    try:
        sizes = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(not 0 < s <= 4096 for s in sizes):
        raise SpecError(f"--link-sizes-mb takes sizes in MB above 0 and at most 4096, e.g. 0.004,1,16; got {text!r}")
    return sizes


def expected_rows(runs: list[tuple[str, Spec]], catalog=None) -> list[dict[str, Any]]:
    """Per run: price per hour and its basis, the seconds assumed (the backend's start-up, steps at the
    assumed step time) and the dollars billed for them: `costs.expected.expected_cost`, the launches'
    preview (per second, 60 s minimum per instance: `costs.billing.run_cost`)."""
    from scalelab.costs.expected import expected_cost
    from scalelab.launcher.backend import assumed_startup_s, fleet_of

    rows = []
    for name, spec in runs:
        est = expected_cost(spec, catalog=catalog, startup_s=assumed_startup_s(spec.backend), fleet=fleet_of(spec))
        rows.append({"run": name, "usd_per_hour": est.usd_per_hour, "rate_basis": est.rate_basis,
                     "seconds": est.hours * 3600, "step_basis": f"{est.steps} steps x {est.step_s:g} s ({est.step_basis})",
                     "dollars": est.dollars})
    return rows


def actual_row(run_dir: Path, spec: Spec, catalog) -> dict[str, Any]:
    """What one finished probe run cost: its wall time from launch.json, billed per second with the
    60 s minimum at the fleet's price (on AWS each instance its own seconds, from launch.json), through
    `costs.billing.run_cost` with the instances `costs.expected.fleet_pricing` counts."""
    from scalelab.costs.billing import Mix, run_cost
    from scalelab.costs.expected import fleet_pricing
    from scalelab.launcher.backend import fleet_of

    fleet = fleet_of(spec)
    info = read_json(RunPaths(run_dir).launch, "launch file", dict) if RunPaths(run_dir).launch.exists() else {}
    started = info.get("launched") or info.get("started") or info.get("submitted")
    wall = max(0.0, float(info.get("ended") or time.time()) - float(started)) if started else 0.0
    if fleet.cloud:  # each instance its own seconds (launch.json); none started, nothing paid
        dollars = sum(run_cost(max(0.0, float(i.get("ended") or time.time()) - float(i["launched"])),
                               Mix(((1, i["type"]),)), catalog, fleet.market, fleet.region, measured=True).dollars
                      for i in info.get("instances", []))
    else:  # nothing launched, nothing paid
        dollars = fleet_pricing(spec, fleet, catalog).cost(wall, measured=True).dollars if wall else 0.0
    return {"run": run_dir.name, "state": info.get("state"), "wall_s": wall, "dollars": dollars}


# ---- the manifest --------------------------------------------------------------------------------


def candidate_results(probe_dir: Path, cand: dict[str, Any]) -> dict[str, Any]:
    """One candidate's figures from its runs: per layout throughput and step time (summary.json),
    per link scope the latency (time of the smallest all-reduce) and bus bandwidth (of the largest)."""
    from scalelab.core.records import read_records

    layouts, links = [], {}
    for name in cand["runs"]:
        run_dir = probe_dir / name
        summary = read_json(RunPaths(run_dir).summary, "summary", dict) if RunPaths(run_dir).summary.exists() else {}
        layouts.append({"run": name, "layout": name.rsplit("-", 1)[1], "words_per_s": summary.get("words_per_s"),
                        "step_s_median": summary.get("step_s_median"), "share_exchange": summary.get("share_exchange")})
        rank0 = RunPaths(run_dir).rank_records(0)
        recs = [r for r in read_records(rank0, [], tolerant=True) if r["kind"] == "link"] if rank0.exists() else []
        if recs:
            small, large = min(recs, key=lambda r: r["mb"]), max(recs, key=lambda r: r["mb"])
            links[small["scope"]] = {"run": name, "ranks": small["world"], "latency_s": small["time_s"],
                                     "busbw_bytes_per_s": large["busbw"], "largest_mb": large["mb"],
                                     "sizes": [{k: r[k] for k in ("mb", "time_s", "algbw", "busbw")} for r in recs]}
    one = next((row["words_per_s"] for row in layouts if row["layout"] == "1x1"), None)
    return {"layouts": layouts, "links": links, "words_per_s_one_gpu": one}


def write_results(probe_dir: Path, catalog=None) -> dict[str, Any]:
    """Fill probe.json's results: per candidate its figures and cost; the probe's actual cost."""
    from scalelab.core.spec import read_spec
    from scalelab.costs.catalog import load_catalog

    manifest = read_json(probe_dir / PROBE_FILE, PROBE_FILE)
    catalog = catalog or load_catalog(rates=manifest.get("rates", []))
    costs = {}
    for cand in manifest["candidates"]:
        cand["results"] = candidate_results(probe_dir, cand)
        for name in cand["runs"]:
            costs[name] = actual_row(probe_dir / name, read_spec(probe_dir / name), catalog)
        cand["results"]["dollars"] = sum(costs[n]["dollars"] for n in cand["runs"])
    manifest["actual"] = {"dollars": sum(c["dollars"] for c in costs.values()), "runs": list(costs.values()),
                          "basis": "measured wall time of each run, billed per second with a 60 s minimum"}
    write_json(probe_dir / PROBE_FILE, manifest)
    return manifest


def create_probe_dir(runs_root: Path, name: str, backend: str, mode: str, probe_steps: int,
                     runs: list[tuple[Candidate, Spec]], expected: list[dict[str, Any]],
                     rates: tuple[str, ...] = ()) -> Path:
    """The probe directory: every run's directory and spec, sweep.json (its runs) and probe.json."""
    from scalelab.launcher.sweep import removed_on_failure

    probe_dir = new_run_dir(runs_root, name)
    with removed_on_failure(probe_dir):
        for cand, spec in runs:
            run_dir = probe_dir / cand.run_name(spec.nodes, spec.gpus_per_node)
            run_dir.mkdir()
            save_spec(spec, run_dir)
        names = [cand.run_name(s.nodes, s.gpus_per_node) for cand, s in runs]
        write_json(probe_dir / SWEEP_FILE, {"runs": names, "layouts": [[s.nodes, s.gpus_per_node] for _, s in runs],
                                            "probe": True})
        seen = list({c.name: c for c, _ in runs}.values())
        write_json(probe_dir / PROBE_FILE, {
            "backend": backend, "mode": mode, "probe_steps": probe_steps, "created": time.time(), "rates": list(rates),
            "candidates": [{**asdict(c), "layouts": [list(x) for x in c.layouts()],
                            "runs": [c.run_name(s.nodes, s.gpus_per_node) for cc, s in runs if cc.name == c.name]}
                           for c in seen],
            "expected": {"dollars": sum(r["dollars"] for r in expected), "runs": expected}})
    return probe_dir


# ---- the command ---------------------------------------------------------------------------------


@click.command("probe", cls=GroupedCommand)
@spec_options
@click.option("--instance-types", help="Candidates, comma-separated: EC2 types (aws), GPU types or PARTITION/TYPE "
                                       "(slurm), local-<T>t[-<precision>] variants (local).")
@click.option("--probe-steps", type=click.IntRange(1, 100000), default=DEFAULT_PROBE_STEPS, show_default=True,
              help="Measured steps of each probe run (after the spec's --warmup-steps).")
@click.option("--mode", type=click.Choice(["weak", "strong"]), default="weak", show_default=True,
              help="weak: every worker keeps its batch (the per-GPU speed); strong: the global batch is split.")
@click.option("--link-sizes-mb", default=DEFAULT_LINK_SIZES_MB, show_default=True,
              help="All-reduce sizes timed in every run of more than one rank (its links).")
def probe_cmd(instance_types: str | None, probe_steps: int, mode: str, link_sizes_mb: str, rates: tuple[str, ...],
              yes: bool, **params: Any) -> None:
    """Measure candidate instance types on your own spec: 1 GPU, a whole instance, two instances.

    Prints the expected cost first, then runs every probe (one sweep), then the actual cost and a
    table per candidate; `launch plan PROBE_DIR` plans from the measurements (probe.json holds them).
    A candidate's on-premise rate is `--rate NAME=USD/gpu-hour` (e.g. local-2t=0.1/gpu-hour, repeatable)
    or the prices file; `--max-usd` refuses a probe expected to cost more; `--yes` starts it without asking.
    """
    if params.get("nodes"):
        raise SpecError("launch probe chooses the layouts itself (1x1, 1xG, 2xG); drop --nodes")
    if params.get("steps") or params.get("epochs"):
        raise SpecError("a probe run is --warmup-steps plus --probe-steps long; drop --steps / --epochs")
    if params.get("bopt__aws__instance_type"):
        raise SpecError("launch probe takes its candidates from --instance-types, not --instance-type")
    from scalelab.costs.catalog import load_catalog
    from scalelab.costs.rates import named_rates

    base = build_spec({**params, "nodes": None, "gpus_per_node": None})
    rates = tuple(named_rates(rates, [base.backend]))
    catalog = load_catalog(params.get("prices_file"), rates=rates)
    candidates = parse_candidates(instance_types, base.backend, params.get("gpus_per_node"), catalog)
    runs = probe_specs(base, candidates, mode, probe_steps, parse_sizes(link_sizes_mb))
    named = [(c.run_name(s.nodes, s.gpus_per_node), s) for c, s in runs]
    expected = expected_rows(named, catalog)
    if params["dry_run"]:
        placeholder = dryrun_dir(Path(params["runs_dir"]), base.name or f"probe-{base.model}")
        return _print_dry_run(runs, named, expected, placeholder)
    _show_expected(expected)
    total = sum(r["dollars"] for r in expected)
    if params.get("max_usd") is not None and total > params["max_usd"]:
        raise SpecError(f"the probe is expected to cost ${total:,.2f}, over --max-usd {params['max_usd']:g}: "
                        "nothing was started; probe fewer types, lower --probe-steps, or raise --max-usd")
    _confirm(base, yes)
    run_probe(base, runs, expected, Path(params["runs_dir"]), base.name or f"probe-{base.model}", mode, probe_steps,
              catalog, rates=rates)


def run_probe(base: Spec, runs: list[tuple[Candidate, Spec]], expected: list[dict[str, Any]], runs_root: Path,
              name: str, mode: str, probe_steps: int, catalog=None, backend=None, rates: tuple[str, ...] = ()) -> Path:
    """Create the probe directory, run it as a sweep (teardown on every way out), write the results.
    `backend`: one built by the caller (tests give one with their clients), else the spec's; `rates`
    (--rate) are kept in probe.json for the costs after a resume."""
    from scalelab.launcher.backend import get_backend
    from scalelab.launcher.sweep import continue_sweep, discard_unlaunched_sweep

    backend = backend or get_backend(base.backend, runs[0][1].backend_options)
    for _, spec in runs:
        backend.for_spec(spec).validate(spec)
    probe_dir = create_probe_dir(runs_root, name, base.backend, mode, probe_steps, runs, expected, rates)
    try:
        continue_sweep(backend, probe_dir)
    except BaseException as exc:  # what ran was paid for, also when the probe stopped early: say it, then the error
        if isinstance(exc, ScalelabError) and discard_unlaunched_sweep(probe_dir):
            raise  # nothing was submitted, so nothing was paid: as `launch sweep`, no directory is left
        try:
            err_console.print(f"probe: cost so far ${write_results(probe_dir, catalog)['actual']['dollars']:,.4f} "
                              f"({probe_dir / PROBE_FILE})", highlight=False, soft_wrap=True)
        except Exception as exc:  # noqa: BLE001 - the original error matters more
            err_console.print(f"probe: could not write {PROBE_FILE} ({exc})", highlight=False, soft_wrap=True)
        raise
    _show_results(probe_dir, write_results(probe_dir, catalog))
    return probe_dir


def _print_dry_run(runs: list[tuple[Candidate, Spec]], named: list[tuple[str, Spec]],
                   expected: list[dict[str, Any]], probe_dir: Path) -> None:
    """Every probe run's commands, in `probe_dir` (under --runs-dir, as the real probe's): a placeholder, as
    `launch run --dry-run`'s RUNS_DIR/NAME-DRYRUN."""
    from scalelab.launcher.backend import get_backend

    backend = get_backend(runs[0][1].backend, runs[0][1].backend_options)
    for _, spec in runs:  # what the real probe's `validate` refuses or notes, before anything is printed
        backend.for_spec(spec).check_dry_run(spec)
    click.echo(f"# probe directory: {probe_dir.absolute()} (a placeholder: --dry-run creates nothing; "
               "a real probe gets NAME-DATE-TIME)")
    for (_, spec), (name, _) in zip(runs, named):
        click.echo(f"# ---- probe run {name}: {spec.nodes}x{spec.gpus_per_node} ----")
        for request in backend.for_spec(spec).submit_dryrun_batch(spec, [probe_dir.absolute() / name]):
            click.echo(request.render())
    _show_expected(expected)


def _show_expected(expected: list[dict[str, Any]]) -> None:
    for row in expected:
        err_console.print(f"  {row['run']}: ${row['usd_per_hour']:,.2f}/hour ({row['rate_basis']}) x "
                          f"{row['seconds']:.0f} s ({row['step_basis']}, plus start-up) = ${row['dollars']:,.4f}",
                          highlight=False, soft_wrap=True)
    err_console.print(f"probe: expected cost ${sum(r['dollars'] for r in expected):,.4f} for {len(expected)} runs",
                      highlight=False, soft_wrap=True)


def _confirm(base: Spec, yes: bool) -> None:
    """On a cloud (AWS: its options say so, `fleet()`) the probe rents instances: ask on a terminal, else
    require --yes."""
    from scalelab.launcher.backend import fleet_of

    if yes or not fleet_of(base).cloud:
        return
    if not sys.stdin.isatty():
        raise SpecError(f"launch probe on {base.backend} starts paid instances: pass --yes to start it without asking "
                        "(the expected cost is printed above)")
    if not click.confirm("start the probe?", default=False):
        raise SpecError("probe not started")


def show_probe(probe_dir: Path) -> None:
    """probe.json's results rewritten from the runs as they are now (after `launch resume`), and shown."""
    _show_results(probe_dir, write_results(probe_dir))


def _show_results(probe_dir: Path, manifest: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"Probe {probe_dir}", title_justify="left")
    for col in ("candidate", "layout", "words/s", "step s", "link", "latency ms", "busbw GB/s"):
        table.add_column(col, justify="left" if col in ("candidate", "layout", "link") else "right")
    for cand in manifest["candidates"]:
        res = cand["results"]
        for row in res["layouts"]:
            link = next((k for k, v in res["links"].items() if v["run"] == row["run"]), None)
            fig = res["links"].get(link, {})
            table.add_row(cand["name"], row["layout"], _fmt(row["words_per_s"], ",.0f"),
                          _fmt(row["step_s_median"], ".3f"), link or "—", _fmt(fig.get("latency_s"), ".3f", 1e3),
                          _fmt(fig.get("busbw_bytes_per_s"), ".2f", 1e-9))
    console.print(table)
    console.print(f"probe: actual cost ${manifest['actual']['dollars']:,.4f} (expected "
                  f"${manifest['expected']['dollars']:,.4f}); {probe_dir / PROBE_FILE}; "
                  f"`launch plan {shell_word(probe_dir)}` plans from it", highlight=False, soft_wrap=True)


def _fmt(value: Any, spec: str, scale: float = 1.0) -> str:
    return "—" if value is None else format(float(value) * scale, spec)

