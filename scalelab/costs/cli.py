"""`launch cost`, `launch plan` and `launch report --from-csv`: dollars, predictions, purchase advice.

    launch cost --from-csv runs.csv --format json          dollars per logged run (catalog prices)
    launch cost runs/sweep-x --instances 2*g3.16xlarge     dollars of recorded runs
    launch cost --refresh spot --region us-west-2          refresh prices from AWS
    launch plan --from-csv scaling.csv --predict-workers 5,6,7,8 --format json
    launch plan runs/sweep-x --instance-types g3.4xlarge,g3.16xlarge --work 1e9 --deadline-h 4

Loaded lazily by scalelab/launcher/cli.py (LAZY_COMMANDS), so pandas/matplotlib load only when used.
All numbers come from costs.billing / costs.planner; this module reads inputs and prints.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import click
from rich import box
from rich.markup import escape
from rich.table import Table

from scalelab.core.checks import NON_NEGATIVE, POSITIVE, InputFile, Number, OutputDir, aws_region_problem
from scalelab.core.errors import DataError, RecordError, SpecError
from scalelab.core.records import load_run
from scalelab.core.runids import RunDir, holds_runs
from scalelab.core.spec import MAX_GPUS
from scalelab.core.terminal import (break_name, dollars_text, duration_text, fold_cell, make_console, number_text,
                                    unbreakable_width, usd_text)
from scalelab.costs.billing import Mix, instances_for, run_cost
from scalelab.costs.catalog import DEFAULT_REGION, MARKETS, Catalog, CatalogError, load_catalog, parse_interruptions, refresh
from scalelab.costs.memory import overflows
from scalelab.costs.rates import named_rates, rate_options

if TYPE_CHECKING:  # pandas, the planner and the reports load in the commands that use them: --help needs none
    import pandas as pd

    from scalelab.costs.expected import FleetPrice
    from scalelab.costs.measurements import Measurements

console = make_console()
err_console = make_console(stderr=True)

_FORMATS = ["table", "json", "markdown"]
# `plan --work 1e300` priced 300-digit dollars: 1e15 samples or words is a thousand times the largest
# training runs published (about 1.5e13 tokens)
MAX_WORK = 1e15
# `plan --gradient-mb 1e305` overflowed the gradient's bytes to inf and the fit's SVD failed (a traceback). A gradient
# is the model's parameters in their precision: the largest models published (1-2 trillion parameters) have 4-8 TB
# of fp32 gradients, so 10 TB bounds every real one with room, far below where the arithmetic overflows.
MAX_GRADIENT_MB = 1e7


def _catalog_options(func):
    func = click.option("--region", default=DEFAULT_REGION, show_default=True, help="AWS region of the prices.")(func)
    func = rate_options(func)
    func = click.option("--interruptions-per-hour", "interruptions", multiple=True, metavar="[TYPE=]RATE",
                        help="Spot: expected interruptions per instance per hour of wall time, for every type "
                             "(RATE) or one type (TYPE=RATE, repeatable; also from the prices file) [default: 0]; "
                             "a job is interrupted as often as the sum over its instances.")(func)
    func = click.option("--checkpoint-write-s", type=NON_NEGATIVE, default=0.0, show_default=True,
                        help="Spot: seconds to write one checkpoint (paid every --checkpoint-interval-s).")(func)
    func = click.option("--checkpoint-interval-s", type=POSITIVE, default=600.0, show_default=True,
                        help="Spot: seconds between checkpoints (half is lost per interruption on average).")(func)
    func = click.option("--restart-s", type=NON_NEGATIVE, default=180.0, show_default=True,
                        help="Spot: seconds to get a new instance and resume after an interruption.")(func)
    return func


def _spot_kwargs(params: dict[str, Any]) -> dict[str, float]:
    return dict(interruptions_per_hour=parse_interruptions(params["interruptions"])[0],
                checkpoint_interval_s=params["checkpoint_interval_s"], restart_s=params["restart_s"],
                checkpoint_write_s=params["checkpoint_write_s"])


def _load_catalog(params: dict[str, Any], backends: tuple[str, ...] = ()) -> Catalog:
    """The catalog of the common options: prices file, --rate (a bare one names each of `backends`, the
    runs' own), region, per-type interruptions."""
    catalog = load_catalog(params["prices_file"], named_rates(params["rates"], backends), params["region"],
                           parse_interruptions(params["interruptions"])[1])
    priced = {r for _, r in [*catalog.on_demand, *catalog.spot]}
    unknown = aws_region_problem(params["region"], priced)  # `--region mars-1` was priced "no price in mars-1"
    if unknown:
        raise CatalogError(unknown + f" (or one a prices file prices: {', '.join(sorted(priced))})")
    return catalog


def _print_json(rows: Any) -> None:
    from scalelab.analysis.report import _jsonable

    click.echo(json.dumps(_jsonable(rows), indent=2, allow_nan=False))


def _rich_table(title: str, df: pd.DataFrame, fmt: dict[str, Any], width: int | None = None,
                droppable: tuple[str, ...] = ()) -> Table:
    """A table that fits `width` (the console's) without a cell cut inside a word or a number; `fmt` maps a
    column to a format spec or a function (those columns are numbers: never folded). Boxed where it fits,
    else its columns two spaces apart under a rule, as `kubectl get` and `squeue` print them; where neither
    fits, text cells fold between their parts (`core.terminal.fold_cell`: a run's name after a hyphen, a
    mix after `+`), and then the columns named in `droppable` leave, least needed first, said in the
    caption. Headers wrap between their words."""
    rows = [[_cell(r[col], fmt.get(col), col in fmt) for col in df.columns] for _, r in df.iterrows()]
    headers = [str(c) for c in df.columns]
    width = width or console.width
    text = [col not in fmt for col in df.columns]
    keep, widths, boxed = _fit_columns(headers, rows, text, droppable, width) if rows else \
        (list(range(len(headers))), [None] * len(headers), True)
    if rows and _table_width(widths, boxed) > width:  # narrower than any table: one record per row
        return _records(title, headers, rows, width)
    t = (Table(title=title or None, header_style="bold") if boxed else
         Table(title=title or None, header_style="bold", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
               collapse_padding=True))
    for i, w in zip(keep, widths):
        t.add_column(headers[i], justify="left" if text[i] else "right", overflow="fold", width=w,
                     min_width=None if w else _header_word(headers[i]))
    for cells in rows:
        t.add_row(*(fold_cell(cells[i], w, hyphens=i == 0) if text[i] and w else cells[i]
                    for i, w in zip(keep, widths)))
    dropped = [h for i, h in enumerate(headers) if i not in keep]
    if dropped:
        t.caption = f"left out to fit {width} columns: {', '.join(dropped)} (every column is in --format json)"
        t.caption_justify = "left"
    return t


def _records(title: str, headers: list[str], rows: list[list[str]], width: int) -> Table:
    """Each row as `header: cell` fields, two spaces apart and wrapped between fields (the next lines
    indented), for a terminal too narrow for any table: no field is cut."""
    t = Table.grid(padding=(0, 0))
    t.title = title or None
    t.add_column(no_wrap=True)
    for cells in rows:
        lines = [""]
        for field in (f"{h}: {c}" for h, c in zip(headers, cells)):
            if lines[-1].strip() and len(lines[-1]) + 2 + len(field) > width:
                lines.append("  ")
            lines[-1] += ("  " if lines[-1].strip() else "") + field
        t.add_row("\n".join(lines))
    return t


def _cell(v: Any, spec: Any, numeric: bool) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if callable(spec):
        return spec(v)
    return format(float(v), spec) if numeric else str(v)


def _header_word(header: str) -> int:
    """A header's longest word: its column is never narrower (a header wraps between words, not in one)."""
    return max((len(w) for w in header.split()), default=0)


def _natural_widths(columns: Any, rows: list[list[str]]) -> list[int]:
    """Each column's width with no cell wrapped (a header at least as wide as its longest word)."""
    return [max([_header_word(str(h))] + [len(r[i]) for r in rows]) for i, h in enumerate(columns)]


def _table_width(widths: list[int], boxed: bool) -> int:
    """A table's width with columns `widths` wide: boxed, 3 columns per cell of padding and rule and one more;
    else its columns two spaces apart with no edges. The one formula of `launch cost`'s and `launch study`'s
    tables (`launcher.study.print_cells`)."""
    return sum(widths) + (3 * len(widths) + 1 if boxed else 2 * (len(widths) - 1))


def _fit_columns(headers: list[str], rows: list[list[str]], text: list[bool], droppable: tuple[str, ...],
                 width: int) -> tuple[list[int], list[int], bool]:
    """(the columns kept, their widths, boxed) of the widest table that fits `width`: boxed, else unboxed;
    each with every cell and header on one line, else with text cells folded between their parts and headers
    between their words; else the next column of
    `droppable` left out. Where nothing fits, the narrowest of all (rich folds what is still too wide)."""
    natural = [max(w, len(h)) for w, h in zip(_natural_widths(headers, rows), headers)]  # a header on one line
    least = [max(_header_word(h), *(unbreakable_width(r[i], hyphens=i == 0) for r in rows)) if text[i]
             else natural[i] for i, h in enumerate(headers)]
    keep = list(range(len(headers)))
    for name in (None, *droppable):
        if name is not None and name not in [headers[i] for i in keep]:
            continue
        keep = [i for i in keep if headers[i] != name]
        for boxed in (True, False):
            widths = _shrunk([natural[i] for i in keep], [least[i] for i in keep], width, boxed)
            if widths is not None:
                return keep, widths, boxed
    return keep, [least[i] for i in keep], False


def _shrunk(natural: list[int], least: list[int], width: int, boxed: bool) -> list[int] | None:
    """`natural` widths narrowed, the column with most room to give first, toward `least` until the table
    fits `width` (folded cells only where needed); None when even `least` does not fit."""
    if _table_width(least, boxed) > width:
        return None
    widths = list(natural)
    while _table_width(widths, boxed) > width:
        i = max(range(len(widths)), key=lambda j: widths[j] - least[j])
        widths[i] -= 1
    return widths


def _title_above(title: str, width: int) -> str:
    """A table's title as its own lines above it, words longer than the terminal broken after a hyphen:
    inside the table it wrapped at the table's width and cut a long run name inside a word."""
    return " ".join(break_name(word, width) for word in title.split(" "))


def human_duration(seconds: float) -> str:
    """One rendering of a duration, the HTML report's too (core.terminal: no pandas or matplotlib)."""
    return duration_text(seconds)


# ---- cost ----------------------------------------------------------------------------------------


@click.command("cost")
@click.argument("run_dirs", nargs=-1, type=RunDir())
@click.option("--from-csv", "from_csv", type=InputFile("--from-csv file"),
              help="CSV with label, seconds, instances (e.g. 3*g3.4xlarge+1*p2.xlarge), market (optional).")
@click.option("--instances", help="For RUN_DIRS: the instances the runs used, e.g. 2*g3.16xlarge or "
                                  "1*p2.xlarge+1*g3.4xlarge; a bare type is one per node "
                                  "[default: the run's instance_type backend option, one per node].")
@click.option("--market", type=click.Choice(MARKETS), help="Price market [default: the CSV's column, else on-demand].")
@_catalog_options
@click.option("--refresh", "refresh_what", type=click.Choice(["spot", "on-demand", "all"]),
              help="Fetch current prices from AWS (describe_spot_price_history / Pricing API) and keep them.")
@click.option("--list", "list_catalog", is_flag=True, help="Print the catalog: instance shapes and prices known.")
@click.option("--format", "fmt", type=click.Choice(_FORMATS), default="table", show_default=True)
def cost_cmd(run_dirs: tuple[str, ...], from_csv: str | None, instances: str | None, market: str | None,
             refresh_what: str | None, list_catalog: bool, fmt: str, **params: Any) -> None:
    """Dollars per run: hours x catalog price, billed per second with a 60-second minimum.

    Spot runs use the spot price; with --interruptions-per-hour their time includes the expected
    lost work and restarts. Mixed instance types are billed together for the whole run (the
    slowest worker sets the pace, the others wait and are billed).
    """
    import pandas as pd
    from scalelab.analysis.report import markdown_table
    from scalelab.costs.tables import read_cost_csv

    run_dirs = tuple(str(p) for p in _runs_among([Path(p) for p in run_dirs]))
    catalog = _load_catalog(params, _backends(run_dirs))
    if refresh_what:
        rows = refresh(catalog, refresh_what, params["region"],
                       path=Path(params["prices_file"]) if params["prices_file"] else None)
        if fmt == "json":
            _print_json(rows)
        else:
            console.print(f"refreshed {len(rows)} price(s) for {params['region']}")
            for r in rows:
                console.print(f"  {r['instance_type']}: ${r['usd_per_hour']:.4f}/h ({r['source']})")
        if not (from_csv or run_dirs or list_catalog):
            return
    if list_catalog:
        given = [what for what, v in (("RUN_DIRS", run_dirs), ("--from-csv", from_csv), ("--instances", instances))
                 if v]
        if given:  # the catalog was listed and they were ignored
            raise SpecError(f"--list prints the catalog; it does not go with {' or '.join(given)}: drop --list to "
                            "cost runs, or drop them to list")
        _list_catalog(catalog, params["region"], fmt)
        return
    if from_csv and run_dirs:
        raise SpecError("give RUN_DIRS or --from-csv, not both")
    if from_csv and instances:
        raise SpecError("--instances is for RUN_DIRS; with --from-csv the 'instances' column says what each run used")
    if from_csv:
        df = read_cost_csv(from_csv)
        rows = []
        for _, r in df.iterrows():
            try:
                c = run_cost(float(r["seconds"]), str(r["instances"]), catalog, market or r["market"],
                             label=r["label"], **_spot_kwargs(params))
            except CatalogError as exc:
                raise CatalogError(f"{from_csv}:{int(r['_line'])}: {exc}") from None
            rows.append(c.to_dict())
    elif run_dirs:
        fleet_of = (click.get_current_context().obj or {}).get("fleet_of")  # the launcher's: costs/ names no backend
        rows = _cost_of_runs([Path(p) for p in run_dirs], instances, market, catalog, params, fleet_of)
    else:
        raise SpecError("give RUN_DIRS, --from-csv FILE, --refresh or --list (see launch cost --help)")
    out = pd.DataFrame(rows)
    if fmt == "json":
        _print_json(out.to_dict(orient="records"))
        return
    keep = [c for c in _COST_HEADERS if c in out.columns and (c in ("label", "seconds") or out[c].notna().any())]
    if "state" in keep and (out["state"] == "COMPLETED").all():  # said only where a run did not complete
        keep.remove("state")
    show = out[keep].rename(columns=_COST_HEADERS)  # threshold columns only where a run has a threshold
    # dollars as `launch report` rounds them (`usd_text`): 0.0075 and 0.0150, where ",.2f" read 0.01 for both
    nfmt: dict[str, Any] = {"wall": _wall_cell, "$/hour": ".4f", "dollars": dollars_text,
                            "wall to threshold": human_duration, "$ to threshold": usd_text}
    never = _never_lines(out)
    if fmt == "markdown":
        click.echo(markdown_table(show, nfmt))
        for line in never:
            click.echo(f"\n{line}")
    else:
        show, title = _distinct_runs(show, out.get("run_dir"))
        title = f"Cost per run{title} (per-second billing, 60 s minimum)"
        console.print(escape(_title_above(title, console.width)), style="italic", highlight=False)
        console.print(_rich_table("", show, nfmt))
        bases = sorted({str(b) for b in out.get("price_basis", pd.Series(dtype=str)).dropna()})
        if bases:
            console.print("price: " + "; ".join(bases), highlight=False)  # wrapped at words, not by the terminal
        for line in never:
            console.print(escape(line), highlight=False)


def _wall_cell(seconds: float) -> str:
    """A run's wall time; `never` where spot interruptions leave no time to work (`billing.spot_stall`)."""
    return "never" if math.isinf(seconds) else human_duration(seconds)


def _never_lines(out: pd.DataFrame) -> list[str]:
    """Under the cost table, why its `never` rows never finish (`RunCost.never_finishes`, the JSON's field),
    once per reason with the runs it holds for. Why: the table said dollars `inf` and nothing else."""
    if "never_finishes" not in out.columns:
        return []
    reasons: dict[str, list[str]] = {}
    for label, why in zip(out["label"], out["never_finishes"]):
        if isinstance(why, str) and why:
            reasons.setdefault(why, []).append(str(label))
    return [f"{', '.join(labels)}: {why}" for why, labels in reasons.items()]


def _distinct_runs(show: pd.DataFrame, run_dirs: pd.Series | None) -> tuple[pd.DataFrame, str]:
    """The cost table's run column without what every row says (it goes into the title: ": nmt-tiny fused fp32
    horovod strong"), and each run told apart by its directory where two rows would read the same (three
    runs all read "nmt-tiny fused fp32 horovod strong 1x2")."""
    if "run" not in show.columns or len(show) < 2:
        return show, ""
    words = [str(v).split() for v in show["run"]]
    common = [w for w in words[0] if all(w in ws for ws in words[1:])]
    cells = [" ".join(w for w in ws if w not in common) for ws in words]
    if run_dirs is not None and len(set(cells)) < len(cells):  # the runs' own names (what `launch status` takes)
        import re

        paths = [Path(str(d)) for d in run_dirs]
        cells = [f"{p.parent.name}/{p.name}" if re.fullmatch(r"\d+x\d+(-r\d+)?", p.name)
                 or sum(q.name == p.name for q in paths) > 1 else p.name for p in paths]  # a sweep's 1x2: its sweep too
    show = show.copy()
    show["run"] = cells
    return show, f": {' '.join(common)}" if common else ""


def finished_run_dirs(run_dirs: tuple[str, ...]) -> tuple[str, ...]:
    """The runs a plan measures: a sweep's (or study's) layouts that completed, as `launch report` takes them, each
    left out named in a warning. Why: a sweep stopped part way, or with a layout directory deleted, failed the
    whole plan ("run directory not found", "has no records") though its finished layouts measure what they
    measure and the report of the same sweep used them."""
    from scalelab.analysis.results import _finished_runs
    from scalelab.core.rundir import STUDY_FILE, is_sweep

    out: list[str] = []
    for given in run_dirs:
        path = Path(given)
        if not (is_sweep(path) or (path / STUDY_FILE).exists()):
            out.append(given)
            continue
        # none finished: one error saying so and what continues it
        runs, said = _finished_runs(path, "the plan leaves it out")
        out += [str(r) for r in runs]
        for line in said:
            err_console.print(f"[yellow]warning:[/] {escape(line)}", highlight=False, soft_wrap=True)
    return tuple(out)


def _backends(run_dirs: tuple[str, ...]) -> tuple[str, ...]:
    """The backends of the runs given (what a bare --rate prices)."""
    from scalelab.analysis.results import expand_run_dirs
    from scalelab.core.spec import read_spec

    return tuple(dict.fromkeys(read_spec(d).backend for d in expand_run_dirs([Path(p) for p in run_dirs])))


# `launch cost`'s columns in a table (JSON keeps the long names, every column and seconds).
_COST_HEADERS = {"label": "run", "state": "state", "instances": "instances", "market": "market", "seconds": "wall",
                 "usd_per_hour": "$/hour", "dollars": "dollars", "wall_to_threshold_s": "wall to threshold",
                 "dollars_to_threshold": "$ to threshold"}


_GPU_SPECS = ("fp32_tflops", "tf32_tflops", "fp16_tflops", "bf16_tflops", "mem_bandwidth_gbs")


def _catalog_row(catalog: Catalog, name: str, region: str) -> dict[str, Any]:
    """One row of `launch cost --list`: the shape, its GPU's specs, its prices and spot interruption rate."""
    inst = catalog.instance(name)
    gpu = catalog.gpu(inst)
    row: dict[str, Any] = {k: getattr(inst, k) for k in (
        "gpus", "gpu_model", "gpu_mem_gib", "vcpus", "mem_gib", "network", "network_gbps", "efa", "interconnect",
        "provider", "source", "source_date")}
    row = {"instance_type": name, **row, **{f"gpu_{k}": getattr(gpu, k) if gpu else None for k in _GPU_SPECS},
           "gpu_source": f"{gpu.source} ({gpu.date})" if gpu else None,
           "spot_interruptions_per_hour": catalog.interruptions.get(name)}
    for m in MARKETS:
        try:
            p = catalog.price(name, m, region)
            row[f"{m}_usd_per_hour"], row[f"{m}_source"], row[f"{m}_observed"] = p.usd_per_hour, p.source, p.observed
        except CatalogError:
            row[f"{m}_usd_per_hour"], row[f"{m}_source"], row[f"{m}_observed"] = None, None, None
    return row


def _list_catalog(catalog: Catalog, region: str, fmt: str) -> None:
    """The catalog: every column in json; the main ones (GPU specs per GPU, prices per instance) in a table."""
    import pandas as pd
    from scalelab.analysis.report import markdown_table

    df = pd.DataFrame([_catalog_row(catalog, name, region) for name in catalog.names()])
    if fmt == "json":
        _print_json(df.to_dict(orient="records"))
        return
    df["efa"] = df["efa"].map({True: "yes", False: "no"})
    show = df[["instance_type", "gpus", "gpu_model", "gpu_mem_gib", "vcpus", "mem_gib", "network_gbps", "efa",
               "interconnect", "gpu_fp32_tflops", "gpu_bf16_tflops", "gpu_mem_bandwidth_gbs",
               "on-demand_usd_per_hour", "spot_usd_per_hour", "spot_interruptions_per_hour"]]
    show = show.set_axis(list(_LIST_COLUMNS), axis=1)
    nfmt = {"gpus": ".0f", "gpu_gib": ".0f", "vcpus": ".0f", "mem_gib": ".1f", "net_gbps": "g", "fp32_tf": "g",
            "bf16_tf": "g", "mem_gb_s": ".0f", "od_usd_h": ".4f", "spot_usd_h": ".4f", "intr_h": "g"}
    if fmt == "markdown":
        click.echo(markdown_table(show, nfmt))
    else:
        console.print(_rich_table(f"Instance catalog ({region})", show, nfmt))
        console.print("per GPU: fp32_tf, bf16_tf peak TFLOP/s (dense), mem_gb_s memory GB/s; per instance: "
                      "net_gbps network Gbit/s, od_usd_h / spot_usd_h dollars an hour, intr_h spot interruptions "
                      "an hour (if set); sources and dates: --format json", highlight=False)


# The table's short headers, in the order of _list_catalog's columns (json keeps the long names).
_LIST_COLUMNS = ("type", "gpus", "gpu", "gpu_gib", "vcpus", "mem_gib", "net_gbps", "efa", "gpu_link", "fp32_tf",
                 "bf16_tf", "mem_gb_s", "od_usd_h", "spot_usd_h", "intr_h")


def _given_price(run, instances: str | None, market: str | None, catalog) -> FleetPrice:
    """The instances a recorded run is priced on when its backend does not price it: `--instances` if given,
    else the run's own `instance_type` option, one per node; counted by `billing.instances_for` as every
    price is (a bare type holds every node's GPUs; an explicit mix as written)."""
    from scalelab.costs.expected import FleetPrice

    spec = run.spec
    text = instances if instances is not None else (spec.backend_options or {}).get("instance_type")
    if not text:
        raise SpecError(f"{run.run_dir}: the run does not say which instances it used; give --instances "
                        f"(e.g. g3.4xlarge for one per node, or 1*p2.xlarge+1*g3.4xlarge) or --rate "
                        f"USD_PER_GPU_HOUR for its backend (or NAME=USD/gpu-hour and --instances {spec.workers}*NAME)")
    try:
        if instances is None:
            Mix.for_nodes(text, spec.nodes, catalog)  # the run's own: one instance per node
        mix = instances_for(spec.nodes, spec.gpus_per_node, text, catalog)
    except CatalogError as exc:
        raise CatalogError(f"{run.run_dir}: instance_type of the run: {exc}" if instances is None else str(exc)) from None
    market = market or "on-demand"
    return FleetPrice(mix, market, catalog.region, f"{mix} {market}", catalog)


def _fleet_price(run, market: str | None, catalog, fleet_of) -> FleetPrice | None:
    """The run's own fleet's price (`costs.expected.fleet_pricing`: the rule the report, the previews and the
    plan use); None when its backend cannot say, no rate prices it, or another market is asked of a cloud
    run (then --instances or its instance_type)."""
    from scalelab.costs.expected import fleet_pricing

    if fleet_of is None:
        return None
    try:
        fleet = fleet_of(run.spec)
        price = fleet_pricing(run.spec, fleet, catalog)
    except (CatalogError, SpecError):
        return None
    if price.assumed or (fleet.cloud and market is not None and market != fleet.market):
        return None
    return price


def _runs_among(paths: list[Path]) -> list[Path]:
    """The run, sweep and study directories among `paths`; with several paths (`launch cost runs/*`) the
    others (a report folder, a stray file) are skipped with a note, one path must be a run."""
    from scalelab.core.rundir import STUDY_FILE, SWEEP_FILE

    if len(paths) < 2:
        return paths
    runs = [p for p in paths if holds_runs(p)]
    skipped = [p for p in paths if not holds_runs(p)]
    if not runs:
        raise DataError(f"none of the {len(paths)} paths is a run, sweep or study directory (no spec.json, "
                        f"{SWEEP_FILE} or {STUDY_FILE}); `launch ls` lists the runs")
    if skipped:
        err_console.print(f"[yellow]note:[/] skipped {len(skipped)} path(s) that are not runs: "
                          + ", ".join(map(str, skipped[:5])) + (" ..." if len(skipped) > 5 else ""), highlight=False,
                          soft_wrap=True)
    return runs


def _cost_of_runs(paths: list[Path], instances: str | None, market: str | None, catalog, params,
                  fleet_of=None) -> list[dict[str, Any]]:
    """One row per run: billed wall time (`run_seconds`) and wall time to the threshold at its fleet's
    price, or at --instances', through `billing.run_cost` (the measured time holds its interruptions)."""
    from scalelab.analysis.results import expand_run_dirs, run_label, summarize_loaded
    from scalelab.core.rundir import run_state
    from scalelab.costs.expected import recorded_cost

    rows = []
    for run_dir in expand_run_dirs(paths):
        try:
            run = load_run(run_dir)
        except RecordError as exc:  # of several (`launch cost runs/*`): one whose records cannot be read
            if len(paths) < 2:
                raise
            err_console.print(f"[yellow]warning:[/] {escape(str(exc))}; left out", highlight=False, soft_wrap=True)
            continue
        price = _fleet_price(run, market, catalog, fleet_of) if instances is None else None
        price = price or _given_price(run, instances, market, catalog)
        try:  # billed: the wall time from the launch to the threshold event, not the training seconds
            summary = summarize_loaded(run)
        except (DataError, RecordError):  # a run with no step measured (none: it failed before its first, or all
            summary = None  # warm-up) is still billed: its wall time, from its launch and its records
        wall = summary.wall_to_threshold_s if summary is not None else None
        row = recorded_cost(run, price, wall, f"{run_label(run.spec)} {run.spec.nodes}x{run.spec.gpus_per_node}")
        row.pop("price_note")
        row["time_to_threshold_s"] = summary.time_to_threshold_s if summary is not None else None
        row["wall_to_threshold_s"] = wall
        row["run_dir"] = str(run_dir)
        row["state"] = run_state(run_dir) or "NEW"  # a failed or cancelled run cost money too: priced, and said
        rows.append(row)
    return rows


# ---- report --from-csv ---------------------------------------------------------------------------


def report_from_csv(path: str, out: Path | None, fmt: str, plots: bool = False) -> None:
    """`launch report --from-csv FILE`: speedup and efficiency of a published scaling table; with --out, report.md,
    report.html and report.json there (`plots`: speedup.png and throughput.png too)."""
    from scalelab.analysis.html import scaling_sections, write_html
    from scalelab.analysis.report import print_scaling, to_json_records, write_markdown
    from scalelab.costs.tables import read_scaling_csv, scaling_from_table

    table = scaling_from_table(read_scaling_csv(path))
    keep = [c for c in ("label", "workers", "nodes", "mode", "throughput", "time_s", "speedup", "efficiency",
                        "karp_flatt", "base_workers", "n") if c in table.columns]
    table = table[keep + [c for c in table.columns if c not in keep]]
    if out is not None:
        write_markdown(table, out, f"Scaling of {Path(path).name}", notes=[f"source: {path}"], plots=plots)
        write_html(out / "report.html", f"Scaling of {Path(path).name}", scaling_sections(table),
                   intro=f"Measurements imported from {path}.")
        (out / "report.json").write_text(json.dumps(to_json_records(table), indent=2) + "\n")
    if fmt == "json":
        _print_json(to_json_records(table))
    elif fmt == "markdown":
        with tempfile.TemporaryDirectory() as tmp:
            click.echo(write_markdown(table, Path(tmp), f"Scaling of {Path(path).name}", plots=False).read_text())
    else:
        print_scaling(table, console=console, title=f"Scaling ({Path(path).name})")
        if out is not None:
            console.print(f"report: [bold]{out / 'report.md'}[/]  html: {out / 'report.html'}")


# ---- plan ----------------------------------------------------------------------------------------


def _parse_workers(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise SpecError(f"--predict-workers takes whole numbers separated by commas, e.g. 5,6,7,8; got {text!r}") from None
    if any(w < 1 for w in out):
        raise SpecError(f"--predict-workers must be positive, got {text!r}")
    if any(w > MAX_GPUS for w in out):
        raise SpecError(f"--predict-workers {max(out):,} is more GPUs than any cluster has; give counts up to "
                        f"{MAX_GPUS:,}")
    return out


def _parse_speed(pairs: tuple[str, ...], catalog: Catalog) -> dict[str, float]:
    """`--speed KEY=FACTOR` pairs, each key a GPU model, type or rate of `catalog` and each factor in
    (0, MAX_SPEED_FACTOR]. Why: a misspelt key (`V10=3`) was ignored without a word, and `A10G=1e300`
    priced every layout at "0 s"."""
    from scalelab.costs.speed import MAX_SPEED_FACTOR, check_speed

    out = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        try:
            out[k.strip()] = float(v)
            assert sep and k.strip() and 0 < float(v) <= MAX_SPEED_FACTOR
        except (ValueError, AssertionError):
            raise SpecError(f"--speed takes GPU_OR_TYPE=FACTOR with FACTOR > 0 and <= {MAX_SPEED_FACTOR:g} (the "
                            f"type's per-GPU speed over the measured one, e.g. V100=2.5), got {p!r}") from None
    why = check_speed(out, catalog)
    if why:
        raise SpecError(why)
    return out


def _asked_type(name: str, catalog: Catalog) -> None:
    """A type of `--instance-types` the catalog lacks is an error naming the fix; a mix (`1*p2.xlarge+3*g3.4xlarge`)
    is not a type: the worker-count planner prices one type at a time, and mixes are `--predict NxG@MIX`."""
    if "*" in name or "+" in name:
        raise SpecError(f"--instance-types {name!r}: a mix of instances, not one type; --instance-types takes single "
                        "types (e.g. g3.4xlarge,p2.xlarge); plan a mixed fleet with --predict NODESxGPUS@MIX, e.g. "
                        "--predict 4x1@1*p2.xlarge+3*g3.4xlarge (the table needs nodes and instance_type)")
    catalog.instance(name)


def _none_named(labels: Sequence[Any]) -> str:
    """'a names none' / 'a, b name none': the runs that name no instance type."""
    names = [str(x) for x in labels]
    return f"{', '.join(names)} {'names' if len(names) == 1 else 'name'} none"


def _one_reason_each(reasons: Sequence[str]) -> str:
    """Reasons of the form 'TYPE: why', one per cause with its types listed, not the same long sentence once per
    type in one line. A `--speed GPU=FACTOR` hint that differs only by GPU is merged, its GPUs named."""
    causes: dict[str, list[str]] = {}
    gpus: dict[str, list[str]] = {}
    for reason in reasons:
        name, sep, why = reason.partition(": ")
        if not sep:
            name, why = "", reason
        generic = re.sub(r"--speed (\S+)=FACTOR", "--speed GPU=FACTOR", why)
        causes.setdefault(generic, []).append(name)
        gpus.setdefault(generic, []).extend(re.findall(r"--speed (\S+)=FACTOR", why))
    out = []
    for why, names in causes.items():
        keys = list(dict.fromkeys(gpus[why]))
        why = why.replace("--speed GPU=FACTOR", f"--speed {keys[0]}=FACTOR") if len(keys) == 1 else \
            why.replace("--speed GPU=FACTOR", f"--speed GPU=FACTOR ({', '.join(keys)})") if keys else why
        named = [n for n in names if n]
        out.append(f"{', '.join(named)}: {why}" if named else why)
    return "; ".join(out)


def _parse_batches(text: str | None) -> list[int]:
    """Global batches, each a whole number >= 1; the message names the item that is not."""
    for item in (text or "").replace(" ", "").split(","):
        if item and (not item.isdigit() or int(item) < 1):
            raise SpecError(f"--predict-batch takes global batches (whole numbers >= 1) separated by commas, e.g. "
                            f"64,128; {item!r} in {text!r} is not one")
    try:
        return _parse_workers(text)
    except SpecError as exc:
        raise SpecError(str(exc).replace("--predict-workers", "--predict-batch")) from None


@click.command("plan")
@click.argument("run_dirs", nargs=-1, type=RunDir())
@click.option("--from-csv", "from_csv", type=InputFile("--from-csv file"),
              help="A published scaling table (label, workers, nodes, throughput or time_s, batch_scaling, "
                   "work_scaling) or a table of steps to a threshold (label, global_batch, steps_to_threshold, "
                   "noise_scale).")
@click.option("--predict-workers", help="Worker counts to predict, e.g. 5,6,7,8 [default: measured ones and doublings].")
@click.option("--predict", "predict_layouts", metavar="LAYOUTS",
              help="Plan named layouts NODESxGPUS@INSTANCES[:dynamic], comma-separated, e.g. "
                   "2x4@2*g3.16xlarge (two nodes of 4 GPUs) or the mixed fleet 4x1@1*p2.xlarge+3*g3.4xlarge "
                   "(one layout; a comma starts the next): predicted by the step-time "
                   "model (scalelab/costs/steptime.py; the CSV needs nodes and instance_type, runs an instance "
                   "type), priced, ranked and recommended like every plan (--out, --format html, --work, "
                   "--deadline-h, --budget and --market work with it).")
@click.option("--predict-batch", help="Global batches to predict steps and samples to the loss threshold for, e.g. 64,128.")
@click.option("--confidence", type=Number(minimum=0.5, maximum=0.99), default=0.9, show_default=True,
              help="Level of every interval, and the chance a recommendation must have of meeting its limit.")
@click.option("--instance-types", help="Price the layouts on these types, e.g. g3.4xlarge,g3.16xlarge (or --rate names).")
@click.option("--market", type=click.Choice([*MARKETS, "both"]), default="on-demand", show_default=True,
              help="Price on-demand, spot (with --interruptions-per-hour its expected restarts), or both side by side.")
@click.option("--work", type=Number(above=0, maximum=MAX_WORK, why="a thousand times the largest training runs "
                                     "published; above it the dollars run to hundreds of digits"), help="A fixed amount of work for every layout, in the throughput's unit (e.g. "
                                         "words) [default for runs: the steps to their loss threshold at each "
                                         "layout's global batch].")
@click.option("--measured-on", help="Instance type the measurements were made on [default for runs: from their spec; "
                                    "runs on several types: the one with the most runs, the others are probes].")
@click.option("--speed", multiple=True, metavar="GPU=FACTOR", help="Per-GPU speed of another GPU model or type relative "
                                                                   "to the measured one, e.g. V100=2.5 (repeatable; "
                                                                   "speed_basis user). Without it a type is priced at "
                                                                   "its probed or spec-estimated speed, or not at all "
                                                                   "(docs/costs.md).")
@click.option("--gradient-mb", type=Number(above=0, maximum=MAX_GRADIENT_MB, why="10 TB: more than the gradient of "
                                            "any model trained; a trillion fp32 parameters is 4 TB"), help="Gradient size for the all-reduce model [default: 1 MB; the fit calibrates it].")
@click.option("--intra-gbps", type=POSITIVE, default=80.0, show_default=True, help="Bandwidth between GPUs of one node.")
@click.option("--deadline-h", type=POSITIVE, help="Recommend the cheapest layout that finishes within this many hours "
                                               "(with --confidence).")
@click.option("--budget", "budget_usd", type=POSITIVE, help="Recommend the fastest layout that costs at most this many "
                                                         "dollars (with --confidence).")
@_catalog_options
@click.option("--out", type=OutputDir("--out"), help="Write plan.md, plan.html and plan.json here.")
@click.option("--format", "fmt", type=click.Choice([*_FORMATS, "html"]), default="table", show_default=True,
              help="table for the terminal; json (every column) or markdown for scripts and notes; html one page.")
def plan_cmd(run_dirs: tuple[str, ...], from_csv: str | None, predict_workers: str | None,
             predict_layouts: str | None, predict_batch: str | None, confidence: float, instance_types: str | None, market: str, work: float | None, measured_on: str | None,
             speed: tuple[str, ...], gradient_mb: float | None, intra_gbps: float, deadline_h: float | None,
             budget_usd: float | None, out: str | None, fmt: str, **params: Any) -> None:
    """Predict throughput, steps, time and dollars to the loss threshold of untried layouts and
    global batches, and say which layout to buy.

    Throughput: a measured layout is its measurement; any other, the model (efficiency decay, its node-aware
    variant, Ernest, ring, PS and their blends: scalelab/costs/registry.py) with the lowest held-out error
    on 35 published scaling tables, its band calibrated on them leaving each whole source out, bounded by
    linear scaling, with more GPUs placed on nodes as the measurements place them. --predict
    NODESxGPUS@INSTANCES plans named layouts and mixed fleets the same way (the step-time model). Steps to the threshold: S(B) = S_min (1 + B_noise/B) from
    runs at two or more global batches, or from one run and its measured noise scale. Time: S(B)
    times each layout's step time at its global batch, plus the runs' start-up and overheads. Every
    interval is at --confidence; the recommendations are the cheapest layout that finishes within
    --deadline-h and the fastest within --budget with that confidence. It also names the
    measurement that would help most next.
    """
    from scalelab.costs.fitting import LinkModel
    from scalelab.costs.measurements import measured_from_csv, measured_from_runs
    from scalelab.costs.planner import PlanRequest, plan

    if bool(from_csv) == bool(run_dirs):
        raise SpecError("give RUN_DIRS (run or sweep directories) or --from-csv FILE (one of the two)")
    run_dirs = finished_run_dirs(run_dirs)
    if predict_layouts is not None:
        _refuse_with_predict({"--predict-workers": predict_workers, "--predict-batch": predict_batch,
                              "--instance-types": instance_types, "--measured-on": measured_on,
                              "--speed": speed or None})
        markets = list(MARKETS) if market == "both" else [market]
        _predict_layouts(run_dirs, from_csv, predict_layouts, confidence, fmt, out, params, markets, deadline_h,
                         budget_usd, work)
        return
    m = measured_from_csv(from_csv, measured_on) if from_csv else measured_from_runs([Path(p) for p in run_dirs],
                                                                                       measured_on)
    given_on, measured_on = measured_on, measured_on or m.measured_on
    catalog = _load_catalog(params, _backends(run_dirs))
    said: list[str] = []  # what the table decided for the user, said with the plan's notes
    if from_csv and measured_on is None:
        measured_on = _table_type(m.measured, catalog, said)
    if from_csv and work is None:
        work = _one_job(m.measured, said)
    asked = [t.strip() for t in (instance_types or "").split(",") if t.strip()]
    if instance_types is not None and not asked:  # '' or ',' priced the default types without a word
        raise SpecError(f"--instance-types {instance_types!r} names no type: give types, e.g. g3.4xlarge,g3.16xlarge, "
                        "or leave the flag out for the default ones")
    for t in asked:
        _asked_type(t, catalog)
    if given_on is not None and given_on not in catalog.names():  # was planned unpriced without a word
        try:
            catalog.instance(given_on)
        except CatalogError as exc:
            raise CatalogError(f"--measured-on {given_on}: {exc}") from None
    if from_csv and given_on is not None and given_on in catalog.names():
        said += _unholdable(m.measured, catalog.instance(given_on), from_csv)
    unpriced = measured_on is not None and measured_on not in catalog.names()
    types = asked or _default_types(measured_on, m, catalog)
    link = LinkModel(gradient_bytes=(gradient_mb or 1.0) * 1e6, intra_gbps=intra_gbps)
    result = plan(PlanRequest(
        m.measured, _worker_grid(m.measured, predict_workers), catalog, types,
        list(MARKETS) if market == "both" else [market], work, measured_on, _parse_speed(speed, catalog), link,
        deadline_h=deadline_h, budget_usd=budget_usd, region=params["region"], confidence=confidence,
        convergence=m.convergence, predict_batch=_parse_batches(predict_batch), overheads=m.overheads,
        probe_speed=m.probe_speed, precision=m.precision, memory=m.memory, source=_source(from_csv),
        **_spot_kwargs(params)))
    result.notes[:0] = said
    if unpriced:
        why = (f"the runs were measured on {measured_on!r}, which the catalog does not price: the predictions are "
               f"not priced; give --rate {measured_on}=USD/gpu-hour (and a rate for each probed type) with "
               "--instance-types to price them")
        result.notes.append(why)
        result.unpriced.append(why)
    if len(result.candidates) == 0 and types and work is not None:  # the cause alone, not the fit's notes
        raise CatalogError(_one_reason_each(result.unpriced) or "nothing could be priced")
    _refuse_unanswered_limits(result, deadline_h, budget_usd, asked, _source(from_csv))
    _show_plan(result, fmt, out, m)


def _unholdable(measured: pd.DataFrame, inst, path: str) -> list[str]:
    """A note where --measured-on TYPE has fewer GPUs than a published table ran on one node (8 on a DGX-1, named
    p3.8xlarge: 4 GPUs): TYPE then stands for the table's GPU (its per-GPU speed), not for where it ran, and its
    layouts are priced on instances of TYPE that hold them (8 on two). It went unsaid; a CPU stand-in's runs
    named after a one-GPU type are the same case, so it is said, not refused."""
    if "instance_type" in measured.columns:  # rows that name their own type were measured on it, not on TYPE
        measured = measured[measured["instance_type"].isna() | (measured["instance_type"] == inst.name)]
    nodes = measured["nodes"] if "nodes" in measured.columns else [1] * len(measured)  # no pandas here: --help
    over = measured[[not inst.holds(int(w), int(n)) for w, n in zip(measured["workers"], nodes)]]
    if not len(over):
        return []
    r = over.iloc[0]
    return [f"--measured-on {inst.name} has {inst.gpus} GPU(s) per instance, but {Path(path).name} ran "
            f"{int(r['workers'])} workers on {int(r['nodes']) if 'nodes' in over.columns else 1} node(s): {inst.name} "
            "is taken for its GPU's speed, and those layouts are priced on instances that hold them; name the type "
            "the table ran on to price its own layouts"]


def _table_type(measured: pd.DataFrame, catalog: Catalog, said: list[str]) -> str | None:
    """The measured type of a table whose `instance` column names several types of one GPU model (seed 004:
    g3.4xlarge and g3.16xlarge, both M60): the type of its fewest workers, which per-GPU speeds are relative
    to; None where the column is absent, names a mix or a type the catalog lacks, or types of other GPUs
    (--measured-on then decides, as before)."""
    if "instance_type" not in measured.columns or measured["instance_type"].isna().any():
        return None
    names = list(dict.fromkeys(str(t) for t in measured.sort_values("workers")["instance_type"]))
    if any(c in n for n in names for c in "*+") or not all(n in catalog.names() for n in names):
        return None
    gpus = {catalog.instance(n).gpu_model for n in names}
    if len(gpus) != 1 or None in gpus:
        return None
    said.append(f"measured on {names[0]} (the table's fewest workers; its other types, {', '.join(names[1:])}, have "
                f"the same GPU, {gpus.pop()}): give --measured-on TYPE to relate speeds to another")
    return names[0]


def _one_job(measured: pd.DataFrame, said: list[str]) -> float | None:
    """--work of a table of whole jobs' times (time_s, the same job on every layout): one job, which is what its
    throughput (1 / time_s) counts; None for any other table."""
    from scalelab.costs.tables import whole_jobs

    if not whole_jobs(measured):
        return None
    said.append("work: one job, the one each row's time_s measures (give --work to price another amount)")
    return 1.0


def _source(from_csv: str | None) -> str:
    """Where the plan's measurements came from, as its messages name it (`PlanRequest.source`)."""
    from scalelab.costs.planner import RUNS
    return Path(from_csv).name if from_csv else RUNS


def _default_types(measured_on: str | None, m: Measurements, catalog: Catalog) -> list[str]:
    """Without --instance-types: the measured type and every probed one the catalog prices (`launch plan
    PROBE_DIR` left out the second probed candidate unless it was named)."""
    found = [t for t in dict.fromkeys([measured_on, *m.probe_speed]) if t]
    priced = [t for t in found if t in catalog.names()]
    for t in found:
        if t not in priced and t != measured_on:
            err_console.print(f"[yellow]note:[/] probed {t!r} is not priced: give --rate {t}=USD/gpu-hour (or "
                              f"USD/node-hour@GPUS) to plan it", highlight=False)
    return priced


def _refuse_unanswered_limits(result, deadline_h: float | None, budget_usd: float | None, asked: list[str],
                              source: str) -> None:
    """--deadline-h and --budget are answered only by priced candidates with a time to the loss threshold (or
    --work): without them the flags were silently ignored (the README's own example). Refused, saying why."""
    from scalelab.costs.planner import threshold_fix
    given = [flag for flag, v in (("--deadline-h", deadline_h), ("--budget", budget_usd)) if v is not None]
    if not given or len(result.candidates):
        return
    why = []
    if not result.convergence:
        why.append(f"no steps to a loss threshold in {source} ({threshold_fix(source)}) and no --work "
                   "(the job's work in the throughput's unit, e.g. words) was given")
    if not asked:
        why.append("no instance type is priced (give --instance-types, e.g. g5.xlarge,g5.12xlarge; runs on a CPU "
                   "also need --measured-on TYPE or --speed GPU=FACTOR, or `launch probe` the types)")
    why += result.unpriced[:2]
    raise SpecError(f"{' and '.join(given)} cannot be answered: " + "; ".join(why or result.notes or ["nothing was priced"]))


def _refuse_with_predict(given: dict[str, Any]) -> None:
    """--predict names its layouts and their instances; flags that choose workers or types conflict."""
    bad = [k for k, v in given.items() if v is not None]
    if bad:
        raise SpecError(f"--predict does not go with {', '.join(bad)}: its layouts name their own workers and "
                        "instance types (NODESxGPUS@INSTANCES); drop them, or drop --predict to plan worker counts")


def _predict_layouts(run_dirs: tuple[str, ...], path: str | None, text: str, confidence: float, fmt: str,
                     out: str | None, params: dict[str, Any], markets: list[str], deadline_h: float | None,
                     budget_usd: float | None, work: float | None) -> None:
    """`launch plan (RUN_DIRS | --from-csv F) --predict LAYOUTS`: the named layouts through the one planner
    (costs.planner.plan with layouts), shown, written and recommended like every other plan."""
    from scalelab.costs.measurements import measured_from_csv, measured_from_runs
    from scalelab.costs.planner import PlanRequest, plan
    from scalelab.costs.steptime import parse_fleet_layouts
    from scalelab.costs.tables import csv_kind

    if path and csv_kind(path) == "convergence":
        raise DataError(f"{path}: a table of steps to a threshold; --predict needs a scaling table with workers, "
                        "nodes, instance_type and time_s or throughput")
    catalog = _load_catalog(params)
    layouts = parse_fleet_layouts(text, catalog)
    m = measured_from_csv(path, None) if path else measured_from_runs([Path(p) for p in run_dirs], None, every_type=True)
    measured = m.measured
    if not path and measured["instance_type"].isna().any():
        raise DataError("--predict with run directories needs runs made on a named instance type (a cloud "
                        "backend, or --rate TYPE=... with --instance-type); "
                        + _none_named(measured.loc[measured['instance_type'].isna(), 'label'].unique()))
    result = plan(PlanRequest(measured, [], catalog, markets=markets, work=work, deadline_h=deadline_h,
                              budget_usd=budget_usd, region=params["region"], confidence=confidence,
                              layouts=layouts, source=_source(path), **_spot_kwargs(params)))
    if result.unpriced and not len(result.candidates):  # as the worker-count path: an error, not a table and a note
        raise CatalogError("; ".join(result.unpriced))
    given = [flag for flag, v in (("--deadline-h", deadline_h), ("--budget", budget_usd)) if v is not None]
    if given and not len(result.candidates):
        raise SpecError(f"{' and '.join(given)} cannot be answered: no layout is priced ("
                        + "; ".join(result.notes[-1:] or ["nothing was priced"]) + ")")
    _show_plan(result, fmt, out, m)


def _worker_grid(measured: pd.DataFrame, text: str | None) -> list[int]:
    """--predict-workers, else the measured counts and the doublings up to twice the largest."""
    grid = _parse_workers(text)
    if grid or not len(measured):
        return grid
    top = int(measured["workers"].max())
    return sorted({int(w) for w in measured["workers"]} | {2 ** k for k in range(0, 12) if 2 ** k <= 2 * top})


def plan_unit(m: Measurements) -> str:
    """What the plan's throughput counts per second: the runs' own ("words/s", a --script's "images/s"), or a
    --from-csv table's, which only the table knows."""
    from scalelab.analysis.report import throughput_header

    if m.table is None or not len(m.table):
        from scalelab.costs.tables import whole_jobs

        return "jobs/s: 1 / time_s" if len(m.measured) and whole_jobs(m.measured) else "a table's own unit"
    header = throughput_header(m.table)
    return "items/s, each series its own unit" if header == "items/s" else header


def _show_plan(result, fmt: str, out: str | None, m: Measurements) -> None:
    """Write the plan's files (--out, or a temporary folder for html), the notes, and the plan."""
    out_dir = Path(out) if out else (Path(tempfile.mkdtemp(prefix="scalelab-plan-")) if fmt == "html" else None)
    unit = plan_unit(m)
    if out_dir is not None:
        _write_plan(result, out_dir, m.table, m.curves, unit)
    for note in result.notes:
        err_console.print(f"[yellow]note:[/] {note}", highlight=False)
    if fmt == "json":
        _print_json(result.rows())
    elif fmt == "html":
        click.echo(str(out_dir / "plan.html"))
    elif fmt == "markdown":
        click.echo(plan_markdown(result, unit))
    else:
        _print_plan(result, unit)
        if out_dir is not None:
            console.print(f"plan: [bold]{out_dir / 'plan.html'}[/]  ({out_dir / 'plan.md'})")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _recommendation_line(key: str, v: dict[str, Any]) -> str:
    """One recommendation with its bounds, and what its speed rests on when it was never measured on that type."""
    speed = v.get("speed_basis")
    unmeasured = "" if speed in (None, "measured", "probe") else f"; {speed} speed, never measured on {v['instance_type']}"
    where = v["layout"] if v.get("layout") else f"{_plural(int(v['workers']), 'worker')} on {v['instances']}*{v['instance_type']}"
    return (f"{key.replace('_', ' ')}: {where} "
            f"({v['market']}): {human_duration(v['hours'] * 3600)} (up to {human_duration(v['hours_high'] * 3600)}), "
            f"${dollars_text(v['dollars'])} (up to ${dollars_text(v['dollars_high'])}){unmeasured}")


#: A limit no layout meets, per recommendation: (its flag, the column judged, what the surest is, its unit).
_UNMET = {"cheapest_within_deadline": ("--deadline-h", "hours_high", "finishes within", "h"),
          "fastest_within_budget": ("--budget", "dollars_high", "costs at most", "$")}


def _unmet_line(key: str, result) -> str:
    """The answer where no layout meets --deadline-h or --budget: none, the surest layout and its bad end, and
    what to change. Why: it was a stderr note only, the answer block silent and no way out said. Rendered from
    the plan's candidates (the planner keeps the recommendation as None). Where no layout finishes at all (spot
    at its interruption rate), that is the answer (`_never_line`)."""
    from scalelab.costs.planner import candidate_text, finishing_candidates, fitting_candidates, never_finishing

    fitting = fitting_candidates(result.candidates)  # as the planner judges: one that overflows is never recommended
    finite = finishing_candidates(fitting)
    if finite.empty or key not in _UNMET:
        return _never_line(key, result, never_finishing(fitting))
    fitting = finite
    flag, column, verb, unit = _UNMET[key]
    surest = fitting.loc[fitting[column].idxmin()]
    needed = math.ceil(float(surest[column]) * 100) / 100
    # the surest's price as its table cell reads (`dollars_text`); the flag's value rounded up to a cent that meets it
    bound = f"{needed:.2f} h" if unit == "h" else f"${dollars_text(float(surest[column]))}"
    ways = [f"raise {flag} to at least {needed:.2f}", *_other_ways(key, result, fitting)]
    if result.confidence > 0.5:  # --confidence's least
        ways.append(f"lower --confidence (now {result.confidence:.0%})")
    return (f"{key.replace('_', ' ')}: none: no layout {verb} {flag} with {result.confidence:.0%} confidence; the "
            f"surest, {candidate_text(surest)} {surest['market']}, {'takes' if unit == 'h' else 'costs'} up to {bound}. "
            f"To get one: {', '.join(ways[:-1])}, or {ways[-1]}")


def _never_line(key: str, result, stalled: pd.DataFrame) -> str:
    """The answer where no priced layout finishes: on spot every one loses each hour to its interruptions
    (`billing.spot_stall`: the nearest one's reason and what would let it finish). Why: the plan recommended a
    layout of infinite time and crashed printing it (`launch plan --market spot --interruptions-per-hour 10`)."""
    from scalelab.costs.planner import nearest_never_text

    name = key.replace("_", " ")
    if key == "fastest" and "cheapest" in result.recommendations:
        return f"{name}: none: no layout finishes (see cheapest)"
    if not len(stalled):  # infinite for another cause: a band down to no throughput
        return (f"{name}: none: no layout's time is bounded at {result.confidence:.0%} confidence (its band reaches "
                "no throughput); measure more layouts or lower --confidence")
    return f"{name}: none: no priced layout finishes; {nearest_never_text(stalled)}"


def _other_ways(key: str, result, fitting: pd.DataFrame) -> list[str]:
    """Besides the limit and the confidence, what could bring a layout within it: faster or cheaper layouts."""
    if "layout" in fitting.columns:  # --predict: the layouts are named, not a worker grid
        return [f"name {'larger or faster' if key == 'cheapest_within_deadline' else 'smaller or cheaper'} "
                "layouts in --predict"]
    if key == "cheapest_within_deadline":
        return [f"plan more workers than {int(fitting['workers'].max())} (--predict-workers)",
                "price faster --instance-types"]
    ways = [f"plan fewer workers than {int(fitting['workers'].min())} (--predict-workers)"] \
        if int(fitting["workers"].min()) > 1 else []
    ways.append("price cheaper --instance-types")
    if "spot" not in set(fitting["market"]) and not any("spot" in why for why in result.unpriced):
        ways.append("the spot market (--market spot)")  # not where spot was asked and has no price
    return ways


def _assumption_lines(result) -> list[str]:
    """What every figure below rests on, said once on top: the models, the steps to the threshold."""
    lines = [f"every interval and recommendation at {result.confidence:.0%} confidence; "
             "prices per second with a 60 s minimum"]
    for label, fit in result.fits.items():
        used = result.predictions[result.predictions["label"] == label].iloc[0]
        lines.append(f"throughput of {label or '(unlabelled)'}: {_plural(len(fit.measured), 'measurement')} at "
                     f"{_plural(fit.measured['workers'].nunique(), 'GPU count')}; {used['model']} model (held-out error "
                     f"{used['held_out_error']:.1%} on the published scaling tables, docs/benchmarks.md)")
    for label, conv in result.convergence.items():
        b_noise = "unbounded" if math.isinf(conv.b_noise) else f"{conv.b_noise:,.0f}"
        lines.append(f"steps to threshold{', ' + label if label else ''}: {conv.basis} of {_plural(conv.runs, 'run')} at global batch "
                     f"{', '.join(map(str, conv.batches))}; S_min {conv.s_min:,.0f} steps, B_noise {b_noise} "
                     f"(measured noise scale {'—' if conv.noise_scale is None else f'{conv.noise_scale:,.0f}'}); "
                     f"learning-rate rule: {conv.lr_rule}")
    return lines


def _model_lines(result) -> list[str]:
    """The plan's words, in reading order: assumptions, the answer (recommendations with their bounds),
    what to measure next."""
    lines = _assumption_lines(result)
    # a None one too: `recommend` leaves one None only where it has no answer, and `_unmet_line` says why
    lines += [_recommendation_line(k, v) if v else _unmet_line(k, result) for k, v in result.recommendations.items()]
    if result.next_measurement:
        n = result.next_measurement
        series = f" ({n['label']})" if n["label"] else ""
        lines.append(f"measure next: {_plural(int(n['workers']), 'worker')}{series}: {n['why']}")
    return lines


# Terminal and Markdown tables of the plan: short headers with units, each column a word or two, so
# they fit the terminal (`_rich_table`); every column (and the long names) is in --format json and plan.json.
_PRED_VIEW = {"label": "series", "workers": "workers", "nodes": "nodes", "global_batch": "batch", "model": "model",
              "predicted_throughput": "predicted /s", "interval_low": "low /s", "interval_high": "high /s",
              "measured_throughput": "measured /s"}
# rates cell by cell in one readable format (`number_text`): 181,005 words/s, 13.5 samples/s, 0.0000278 jobs/s
_PRED_FMT: dict[str, Any] = {"workers": ".0f", "nodes": ".0f", "batch": ".0f", "predicted /s": number_text,
                             "low /s": number_text, "high /s": number_text, "measured /s": number_text}
_LAYOUT_VIEW = {"layout": "layout", "model": "model", "basis": "basis", "predicted_time_s": "time", "time_low_s": "low",
                "time_high_s": "high", "compute_share": "compute", "exchange_share": "exchange"}
_LAYOUT_FMT: dict[str, Any] = {"time": lambda s: human_duration(s), "low": lambda s: human_duration(s),
                               "high": lambda s: human_duration(s), "compute": ".0%", "exchange": ".0%"}
_LAYOUT_THR_VIEW = {"layout": "layout", "model": "model", "basis": "basis", "predicted_throughput": "predicted /s",
                    "throughput_low": "low /s", "throughput_high": "high /s", "compute_share": "compute",
                    "exchange_share": "exchange"}
_LAYOUT_THR_FMT: dict[str, Any] = {"predicted /s": number_text, "low /s": number_text, "high /s": number_text,
                                   "compute": ".0%", "exchange": ".0%"}
_BATCH_VIEW = {"label": "series", "global_batch": "batch", "predicted_steps_to_threshold": "steps",
               "steps_low": "steps low", "steps_high": "steps high", "predicted_samples_to_threshold": "samples",
               "basis": "basis", "b_noise": "B_noise", "noise_scale": "noise scale"}
_BATCH_FMT = {"batch": ".0f", "steps": ",.0f", "steps low": ",.0f", "steps high": ",.0f", "samples": ",.0f",
              "B_noise": ",.0f", "noise scale": ",.0f"}
_CAND_VIEW = {"label": "series", "workers": "workers", "instances": "instances", "market": "market",
              "speed_basis": "speed", "global_batch": "batch", "steps_to_threshold": "steps", "hours": "time",
              "hours_high": "up to", "dollars": "dollars", "dollars_high": "up to $", "pick": "pick"}
_CAND_FMT: dict[str, Any] = {"workers": ".0f", "batch": ".0f", "steps": ",.0f", "dollars": dollars_text,
                             "up to $": dollars_text, "time": lambda h: _wall_cell(h * 3600),
                             "up to": lambda h: _wall_cell(h * 3600)}


#: The plan's columns a narrow terminal leaves out, least needed first, where folding text cells between
#: their parts is not enough (80 columns, both markets): each is said elsewhere too (the speed in the
#: recommendations and notes, the shares and model in --format json) and named under the table.
_NARROW_DROPS = ("speed", "exchange", "compute", "noise scale", "B_noise", "measured /s", "steps", "batch", "model",
                 "nodes", "basis")


def _view(rows: pd.DataFrame, names: dict[str, str], always: tuple[str, ...]) -> tuple[pd.DataFrame, str]:
    """`rows` under short names; a column with one value in every row (the series, the market, the batch)
    leaves the table for its title, unless `always` keeps it; a column no row has a value in (the batch and
    steps under --work) leaves it too, so the table fits 80 columns."""
    rows = rows[[c for c in names if c in rows.columns and (c in always or rows[c].notna().any())]]
    same = [c for c in rows.columns if c not in always and len(rows) > 1 and rows[c].astype(str).nunique() == 1]
    if len(rows) == 1:
        same = [c for c in ("label", "market", "global_batch") if c in rows.columns]
    said = ", ".join(f"{names[c] if c != 'label' else ''} {rows[c].iloc[0]}".strip() for c in same
                     if c in ("label", "market", "global_batch", "model", "speed_basis", "basis")
                     and str(rows[c].iloc[0]).strip() not in ("", "nan", "None"))  # an unlabelled series: no ", "
    keep = [c for c in rows.columns if c not in same or c not in ("label", "market", "global_batch", "model",
                                                                  "speed_basis", "basis", "nodes")]
    rows, common = _series_apart(rows[keep])
    said = ", ".join(x for x in (f"every series {common}" if common else "", said) if x)
    return rows.rename(columns=names), said


def _series_apart(rows: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """`rows` with each series label cut to the words that tell it apart, and the words every label has (for
    the title). Why: two sweeps of one model were labelled "nmt-tiny fused fp32 ddp strong global-batch=64
    steps=300" and "... global-batch=128 steps=400", and at 80 columns each row's label folded into six lines;
    `launch cost` takes the runs' common words into its title the same way."""
    if "label" not in rows.columns or rows["label"].astype(str).nunique() < 2:
        return rows, ""
    words = [str(v).split() for v in rows["label"]]
    common = [w for w in words[0] if all(w in ws for ws in words[1:])]
    cells = [" ".join(w for w in ws if w not in common) for ws in words]
    if not common or not all(cells) or len(set(cells)) < len(set(map(tuple, words))):  # a label all common: keep
        return rows, ""
    return rows.assign(label=cells), " ".join(common)


def _candidate_rows(result) -> pd.DataFrame:
    c = result.candidates.sort_values("hours").copy()
    if "layout" in c.columns:  # named layouts: the layout names its instances
        c["instances"] = c["layout"]
    else:
        c["instances"] = [f"{int(n)}*{t}" for n, t in zip(c["instances"], c["instance_type"])]
    fits = c["fits_memory"] if "fits_memory" in c.columns else [None] * len(c)
    never = c["never_finishes"] if "never_finishes" in c.columns else [None] * len(c)
    c["pick"] = [_pick_word(r, p, f, n) for r, p, f, n in zip(c["recommendation"], c["pareto"], fits, never)]
    return c


def _pick_word(recommendation: Any, pareto: Any, fits: Any = None, never: Any = None) -> str:
    """cheapest / fastest (a recommendation), no fit (a rank would overflow its GPU's memory), never (spot at its
    interruption rate never finishes), frontier (nothing both faster and cheaper), or nothing."""
    if overflows(fits):
        return "no fit"
    if isinstance(never, str) and never:
        return "never"
    if isinstance(recommendation, str) and recommendation:
        words = [w for w in ("cheapest", "fastest") if w in recommendation]
        return "both" if len(words) == 2 else words[0] if words else ""
    return "frontier" if bool(pareto) else ""


_PICK_LEGEND = ("pick: cheapest / fastest / both = the recommendations above; frontier = no other row is both faster and "
                "cheaper at the upper ends of their bands (up to, up to $); no fit = a rank would not fit its GPU's memory (never recommended). speed: measured (the runs' type), probe (its own runs), estimate (GPU specs), user (--speed)")


def _pick_legend(result) -> str:
    """The pick column's legend, with `never` where a row has it (the spot layouts that never finish)."""
    from scalelab.costs.planner import never_finishing

    if not len(never_finishing(result.candidates)):
        return _PICK_LEGEND
    return _PICK_LEGEND.replace("; no fit", "; never = never finishes on spot at its interruption rate (time and "
                                            "dollars never; the answer above says why and what to change); no fit")


def _plan_tables(result, unit: str = "words/s") -> list[tuple[str, pd.DataFrame, dict[str, Any]]]:
    """(title, rows, number formats) of every table the plan has, in the order shown; `unit`: what the
    throughput counts (`plan_unit`)."""
    tables = []
    if len(result.predictions) and "layout" in result.predictions.columns:
        timed = "predicted_time_s" in result.predictions.columns
        rows, said = _view(result.predictions, _LAYOUT_VIEW if timed else _LAYOUT_THR_VIEW, ("layout",))
        tables.append((f"Predicted {'time' if timed else 'throughput per second'} of each layout "
                       f"({result.confidence:.0%} band; the step-time model, its share of compute and exchange)"
                       + (f": {said}" if said else ""), rows, _LAYOUT_FMT if timed else _LAYOUT_THR_FMT))
    elif len(result.predictions):
        rows, said = _view(result.predictions, _PRED_VIEW, ("workers",))
        title = f"Predicted throughput per second ({unit})"
        tables.append((title + (f": {said}" if said else ""), rows, _PRED_FMT))
    if len(result.batch_predictions):
        rows, said = _view(result.batch_predictions, _BATCH_VIEW, ("batch",))
        tables.append(("Steps to the loss threshold against the global batch" + (f" ({said})" if said else ""), rows,
                       _BATCH_FMT))
    if len(result.candidates):
        rows, said = _view(_candidate_rows(result), _CAND_VIEW, ("workers", "instances", "time", "dollars", "pick"))
        tables.append(("Candidates: time and dollars to the threshold, or for the given work"
                       + (f" ({said})" if said else ""), rows, _CAND_FMT))
    return tables


def _print_plan(result, unit: str = "words/s") -> None:
    """Assumptions once on top, the answer, then the tables (fitting the terminal: `_rich_table`), notes last."""
    lines = _model_lines(result)
    for line in lines:
        console.print(line, highlight=False)
    for title, rows, fmt in _plan_tables(result, unit):
        console.print(f"[bold]{escape(title)}[/]", highlight=False)  # above the table: a title inside wraps at its width
        rows, legend = _series_keys(rows, fmt, console.width)
        if legend:
            console.print(escape(legend), highlight=False)
        console.print(_rich_table("", rows, fmt, droppable=_NARROW_DROPS))
    if len(result.candidates):
        console.print(_pick_legend(result), highlight=False)


def _series_keys(rows: pd.DataFrame, fmt: dict[str, Any], width: int) -> tuple[pd.DataFrame, str]:
    """Where a table with several series is wider than the terminal, each series as a letter and a line naming
    them above the table: at 80 columns a label such as "global-batch=64 steps=300" folded into three lines
    (six before `_series_apart`) on every row. The letters follow the labels' natural order, so a series has
    the same letter in every table of the plan."""
    if "series" not in rows.columns or rows["series"].nunique() < 2:
        return rows, ""
    cells = [[_cell(r[col], fmt.get(col), col in fmt) for col in rows.columns] for _, r in rows.iterrows()]
    whole = [max(w, len(str(h))) for w, h in zip(_natural_widths(rows.columns, cells), rows.columns)]
    if _table_width(whole, boxed=False) <= width:  # every cell and header on one line: as it is
        return rows, ""
    labels = sorted({str(v) for v in rows["series"]}, key=_natural_order)
    keys = {label: chr(ord("A") + i) if i < 26 else str(i + 1) for i, label in enumerate(labels)}
    legend = "series: " + "; ".join(f"{keys[label]} = {label}" for label in labels)
    if len(legend) > width:  # a line per series: wrapped, "C" ended one line and "= its label" began the next
        legend = "\n".join(f"series {keys[label]} = {label}" for label in labels)
    return rows.assign(series=[keys[str(v)] for v in rows["series"]]), legend


def _natural_order(label: str) -> list[Any]:
    """A sort key that orders numbers inside text by value: global-batch=64 before global-batch=128."""
    import re

    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", label)]


def plan_markdown(result, unit: str = "words/s") -> str:
    from scalelab.analysis.report import markdown_table

    parts = ["# Scaling plan", "", *[f"- {line}" for line in _model_lines(result)]]
    for title, rows, fmt in _plan_tables(result, unit):
        parts += ["", f"## {title}", "", markdown_table(rows, fmt)]
    if len(result.candidates):
        parts += ["", _pick_legend(result)]
    if result.notes:
        parts += ["", "## Notes", "", *[f"- {n}" for n in result.notes]]
    return "\n".join(parts) + "\n"


def _write_plan(result, out_dir: Path, table: pd.DataFrame | None, curves: dict[str, pd.DataFrame],
                unit: str = "words/s") -> None:
    from scalelab.analysis.html import plan_sections, scaling_sections, write_html

    out_dir.mkdir(parents=True, exist_ok=True)
    unmet = {k: _unmet_line(k, result) for k, v in result.recommendations.items() if not v}
    sections = plan_sections(result, unit, unmet)
    if table is not None and len(table):
        sections += scaling_sections(table, curves)
    write_html(out_dir / "plan.html", "Scaling and cost plan", sections,
               intro="Predictions come from models fitted to the measured layouts; intervals say how sure they are.")
    (out_dir / "plan.md").write_text(plan_markdown(result, unit))
    _write_json_file(out_dir / "plan.json", result.rows())


def _write_json_file(path: Path, rows: Any) -> None:
    from scalelab.analysis.report import _jsonable

    path.write_text(json.dumps(_jsonable(rows), indent=2, allow_nan=False) + "\n")
