"""`launch bench`: how fast the trainer, the gradient exchange, the planner and the reports are.

Each part measures against a limit of the machine, in the same run: compute against the machine's best
dense matmul rate (bf16 where the hardware has it, else fp32), every preset in fp32 and bf16 side by
side; the exchange against memory-copy bandwidth, scaling against the ideal. Results are
records (bench.json); the tables are rendered from them; docs/benchmarks.md records the figures.

    launch bench                     everything (10 minutes on 2 cores before the compute part timed
                                     bf16 beside fp32; that part now runs twice the steps)
    launch bench --only compute,exchange --quick
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import click
from rich.table import Table

from scalelab.core.checks import OutputDir
from scalelab.core.errors import SpecError
from scalelab.core.launch import horovod_env, horovodrun_argv, torchrun_argv
from scalelab.core.net import free_port
from scalelab.core.records import load_run
from scalelab.core.rundir import RunPaths, read_json
from scalelab.core.spec import Spec, save_spec
from scalelab.core.terminal import make_console
from scalelab.core.writes import open_inside, writing

PARTS = ("compute", "exchange", "scaling", "planner", "report")
COMPUTE_PRECISIONS = ("fp32", "bf16")  # on a CPU: fp16 needs a GPU (the scaler)
GPU_COMPUTE_PRECISIONS = ("fp32", "bf16", "fp16")  # on a GPU, each against the GPU's matmul rate in it


def _gpu_here() -> bool:
    import torch

    return torch.cuda.is_available()
console = make_console()


def _py(*args: str, timeout: int = 900) -> str:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout


# ---- 1. compute -----------------------------------------------------------------------------------


def bench_compute(presets: list[str], rnns: list[str], threads: int, steps: int) -> list[dict]:
    """Each preset x RNN in a fresh process (no allocator or thread-pool state carried over), its fp32
    and bf16 steps alternating in that process: one row per precision."""
    from scalelab.train.precision import cpu_bf16_problem

    out = []
    for preset in presets:
        for rnn in rnns:
            if _gpu_here():  # the child benches the GPU: every precision, against the GPU's own rates
                precisions = list(GPU_COMPUTE_PRECISIONS)
            else:
                precisions = [p for p in COMPUTE_PRECISIONS if p != "bf16" or not cpu_bf16_problem(rnn)]
            if not _gpu_here() and len(precisions) < len(COMPUTE_PRECISIONS):  # one clear line, not oneDNN's error from the child
                _progress(f"compute {preset} {rnn}: fp32 only; {cpu_bf16_problem(rnn).split('; ')[0]}")
            line = _py("-m", "scalelab.train.bench", "step", preset, "--rnn", rnn, "--threads", str(threads), "--steps", str(steps),
                       "--precisions", ",".join(precisions))
            rows = json.loads(line.strip().splitlines()[-1])
            out.extend(rows)
            _progress(f"compute {preset} {rnn}: " + ", ".join(
                f"{r['precision']} {r['efficiency']:.0%} of the {r['matmul_precision']} matmul rate" for r in rows))
    return out


# ---- 2. exchange ----------------------------------------------------------------------------------


def bench_exchange(sizes_mb: list[float], repeats: int, work: Path) -> list[dict]:
    """All-reduce busbw with 2 ranks for torch.distributed (Gloo) and Horovod (Gloo) settings."""
    from scalelab.train.bench import memcpy_bandwidth

    results = [{"label": "memcpy (one process)", **memcpy_bandwidth()}]
    sizes = ",".join(str(s) for s in sizes_mb)
    configs = [
        ("torch.distributed gloo", "ddp", {}, []),
        ("horovod default (64 MB fusion, 1 ms cycle)", "horovod", horovod_env(64, 1), []),
        ("horovod 5 ms cycle", "horovod", horovod_env(64, 5), []),
        ("horovod fp16 compression", "horovod", horovod_env(64, 1), ["--compression", "fp16"]),
        ("torch.distributed gloo, fp16 compression", "ddp", {}, ["--compression", "fp16"]),
        ("torch.distributed gloo, bf16 compression", "ddp", {}, ["--compression", "bf16"]),
        ("torch.distributed gloo, 64 tensors", "ddp", {}, ["--tensors", "64"]),
        ("horovod, 64 tensors (fused)", "horovod", horovod_env(64, 1), ["--tensors", "64"]),
        ("horovod, 64 tensors, 5 ms cycle", "horovod", horovod_env(64, 5), ["--tensors", "64"]),
        ("horovod, 64 tensors, fusion off", "horovod", horovod_env(0, 1), ["--tensors", "64"]),
    ]
    for label, engine, env, extra in configs:
        out = work / f"allreduce-{len(results)}.json"
        args = ["-m", "scalelab.train.bench", "allreduce", "--engine", engine, "--sizes-mb", sizes, "--repeats", str(repeats),
                "--label", label, "--out", str(out), *extra]
        if engine == "ddp":
            cmd = _two_ranks(args, work)
        else:
            cmd = horovodrun_argv(None, sys.executable, 2, ["localhost"], args)
        proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1", **env}, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0 or not out.exists():
            results.append({"label": label, "error": proc.stderr[-500:]})
            continue
        results.extend(json.loads(out.read_text()))
        _progress(f"exchange {label}: done")
    results.extend(bench_ps_exchange(sizes_mb, repeats, work))
    for compression, caps in (("none", "1,25,100"), ("fp16", "25"), ("bf16", "25")):
        results.extend(_ddp_exposed_exchange(compression, caps, work))
    return results


def _two_ranks(program: list[str], work: Path) -> list[str]:
    """torchrun starting 2 ranks of `python PROGRAM` here (one node, a free port on 127.0.0.1), its ranks' logs in
    the bench's folder (without --log-dir torchrun leaves a new /tmp/torchelastic_* behind every time)."""
    return torchrun_argv(sys.executable, 1, 2, 0, "127.0.0.1", free_port(), program, log_dir=str(work / "torchrun"))


def _ddp_exposed_exchange(compression: str, caps: str, work: Path) -> list[dict]:
    """nmt-small's exchange left exposed by DDP (2 ranks) per bucket size, gradients sent in `compression`."""
    out = work / f"ddp-buckets-{compression}.json"
    proc = subprocess.run(_two_ranks(["-m", "scalelab.train.bench", "ddp-buckets", "nmt-small",
                                      "--bucket-caps-mb", caps, "--compression", compression, "--out", str(out)], work),
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not out.exists():
        return [{"label": f"DDP bucket sizes, {compression} compression", "error": proc.stderr[-500:]}]
    _progress(f"exchange DDP bucket sizes ({compression} compression): done")
    return json.loads(out.read_text())


def bench_ps_exchange(sizes_mb: list[float], repeats: int, work: Path) -> list[dict]:
    """Parameter server (push + pull, 1 and 2 shards) against all-reduce, 2 ranks, at the presets'
    gradient sizes and the largest flat size (270 MB without --quick)."""
    out = work / "ps-exchange.json"
    proc = subprocess.run(_two_ranks(["-m", "scalelab.train.bench", "ps-exchange",
                                      "--presets", "nmt-tiny,nmt-small,rnnlm-small,sentiment-small",
                                      "--sizes-mb", f"{max(sizes_mb):g}", "--repeats", str(repeats), "--out", str(out)], work),
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not out.exists():
        return [{"label": "parameter server", "error": proc.stderr[-500:]}]
    _progress("exchange parameter server: done")
    return [{"label": "parameter server", **r, "ps1_vs_allreduce": r["ps1_s"] / r["allreduce_s"],
             "ps2_vs_allreduce": r["ps2_s"] / r["allreduce_s"]} for r in json.loads(out.read_text())]


# ---- 3 + 4. scaling on this machine and launch overhead ------------------------------------------


def bench_scaling(model: str, steps: int, work: Path) -> dict:
    """Strong and weak sweeps over 1 and 2 workers per engine; launch overhead from their records."""
    from scalelab.analysis.results import expand_run_dirs

    rows, overhead = [], []
    for engine in ("ddp", "horovod"):
        for mode, batch in (("strong", ["--global-batch", "64"]), ("weak", ["--batch-per-worker", "32"])):
            runs = work / f"scaling-{engine}-{mode}"
            proc = subprocess.run(
                [sys.executable, "-m", "scalelab.launcher.cli", "sweep", "--model", model, "--engine", engine, "--workers", "1,2",
                 "--mode", mode, *batch, "--steps", str(steps), "--warmup-steps", "3", "--runs-dir", str(runs)],
                capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                raise RuntimeError(f"sweep {engine} {mode} failed:\n{proc.stderr[-2000:]}")
            sweep = next(p for p in runs.iterdir() if p.is_dir())
            for r in read_json(sweep / "report.json", "sweep report"):
                rows.append({"engine": engine, "mode": mode, **{k: r[k] for k in (
                    "workers", "global_batch", "words_per_s", "step_s_mean", "speedup", "efficiency",
                    "share_exchange", "share_backward", "share_data")}})
            overhead += [{"engine": engine, "mode": mode, **launch_overhead(run)} for run in expand_run_dirs([sweep])]
            _progress(f"scaling {engine} {mode}: done")
    return {"rows": rows, "launch_overhead": overhead}


def launch_overhead(run_dir: Path) -> dict:
    """Seconds from the launch (launch.json) to the start of rank 0's first step (its records)."""
    run = load_run(run_dir)
    started = read_json(RunPaths(run_dir).launch, "launch file", dict)["started"]
    first = run.steps[run.steps["rank"] == 0].iloc[0]
    return {"workers": run.spec.workers, "seconds_to_first_step": float(first["time"] - first["step_s"] - started)}


# ---- 5. planner accuracy --------------------------------------------------------------------------


def bench_planner() -> dict:
    """Interval coverage of the planner on every table the project ships (costs.validation)."""
    from scalelab.costs.validation import planner_bench

    return planner_bench()


# ---- 6. report speed ------------------------------------------------------------------------------


def bench_report(records: int, ranks: int, work: Path) -> dict:
    """Write `records` synthetic step records over `ranks` ranks, then time each stage of the report."""
    import numpy as np

    from scalelab.analysis.results import build_report

    run = work / "report-run"
    paths = RunPaths(run)
    paths.records.mkdir(parents=True, exist_ok=True)
    save_spec(Spec(gpus_per_node=ranks, global_batch=ranks * 8, steps=records // ranks), run)
    steps = records // ranks
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for r in range(ranks):
        st = 0.05 + 0.005 * rng.random(steps)
        # written as text, not through RecordWriter: a million records must not take minutes
        with os.fdopen(open_inside(run, paths.rank_records(r), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), "w") as f:
            f.write(json.dumps({"kind": "start", "rank": r, "world": ranks, "time": 0.0, "global_batch": ranks * 8}) + "\n")
            for i in range(steps):
                f.write('{"kind": "step", "rank": %d, "world": %d, "time": %.3f, "step": %d, "epoch": 0, "warmup": %s, '
                        '"step_s": %.6f, "data_s": 0.0001, "forward_s": %.6f, "backward_s": %.6f, "exchange_s": null, '
                        '"optimizer_s": 0.002, "samples": 8, "words": 240, "loss": %.4f, "lr": 0.001}\n'
                        % (r, ranks, i * 0.05, i + 1, "true" if i < 5 else "false", st[i], st[i] / 3, st[i] / 2,
                           5.0 - i / steps))
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    load_run(run)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    build_report([run], work / "report-out")
    total_s = time.perf_counter() - t0
    return {"records": steps * ranks, "ranks": ranks, "write_s": write_s, "load_s": load_s, "full_report_s": total_s}


# ---- rendering ------------------------------------------------------------------------------------


def _progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _table(title: str, rows: list[dict], cols: list[tuple[str, str, str]], caption: str | None = None) -> Table:
    t = Table(title=title, header_style="bold", caption=caption, caption_justify="left")
    for header, _, _ in cols:
        t.add_column(header, justify="right")
    for r in rows:
        t.add_row(*[("—" if r.get(k) is None else format(r[k], fmt)) if fmt else str(r.get(k, "—")) for _, k, fmt in cols])
    return t


def render(results: dict) -> None:
    if "compute" in results:
        console.print(_table("1. Trainer compute (forward + backward + update), against the best matmul rate",
                             results["compute"], [
            ("preset", "preset", ""), ("rnn", "rnn", ""), ("precision", "precision", ""), ("batch", "batch", ""),
            ("threads", "threads", ""), ("step s", "step_s", ".4f"), ("words/s", "words_per_s", ",.0f"),
            ("vs fp32", "speedup_vs_fp32", ".2f"), ("GFLOP/s", "gflops", ".1f"), ("matmul fp32", "matmul_fp32_gflops", ".1f"),
            ("matmul bf16", "matmul_bf16_gflops", ".1f"), ("of best matmul", "efficiency", ".0%"), ("note", "note", "")],
            caption=f"vs fp32: the median of per-round ratios (each round times both formats); \"noisy\": it differs "
                    f"from the ratio of the row's words/s to its fp32 row's by more than {NOISY_RATIO_GAP:.0%}"))
    if "exchange" in results:
        ps = [r for r in results["exchange"] if "ps1_s" in r]
        if ps:
            console.print(_table("2c. Parameter server (push + pull) against all-reduce, 2 ranks, medians", ps, [
                ("gradients", "gradients", ""), ("MB", "mb", ".1f"), ("all-reduce s", "allreduce_s", ".4f"),
                ("PS 1 shard s", "ps1_s", ".4f"), ("PS 2 shards s", "ps2_s", ".4f"),
                ("1 shard / all-reduce", "ps1_vs_allreduce", ".2f"), ("2 shards / all-reduce", "ps2_vs_allreduce", ".2f")]))
        buckets = [r for r in results["exchange"] if "bucket_cap_mb" in r]
        if buckets:
            console.print(_table("2b. DDP bucket size: exchange not hidden behind backward (nmt-small, 2 ranks)", buckets, [
                ("bucket MB", "bucket_cap_mb", "g"), ("compression", "compression", ""), ("fwd+bwd with exchange s", "step_with_exchange_s", ".3f"),
                ("without s", "step_without_exchange_s", ".3f"), ("exposed s", "exposed_text", "")],
                caption="exposed s: with minus without; \"0 (noise)\": the step with the exchange measured faster "
                        "than without it, a negative difference that is timing noise (nothing exposed)"))
        console.print(_table("2. All-reduce, 2 ranks (busbw = algbw x 2(n-1)/n)", [r for r in results["exchange"] if "bucket_cap_mb" not in r and "ps1_s" not in r], [
            ("setting", "label", ""), ("MB", "mb", ""), ("time s", "time_s", ".4f"), ("busbw GB/s", "busbw_gb", ".2f"),
            ("memcpy GB/s", "memcpy_gb", ".2f")]))
    if "scaling" in results:
        console.print(_table("3. Scaling on this machine", results["scaling"]["rows"], [
            ("engine", "engine", ""), ("mode", "mode", ""), ("workers", "workers", ""), ("words/s", "words_per_s", ",.0f"),
            ("step s", "step_s_mean", ".3f"), ("speedup", "speedup", ".2f"), ("efficiency", "efficiency", ".0%"),
            ("exchange wait", "share_exchange", ".0%"), ("backward incl. exchange", "share_backward", ".0%")]))
        console.print(_table("4. Launch overhead (launch to first step)", results["scaling"]["launch_overhead"], [
            ("engine", "engine", ""), ("mode", "mode", ""), ("workers", "workers", ""), ("seconds", "seconds_to_first_step", ".2f")]))
    if "planner" in results:
        _render_planner(results["planner"])
        if "steptime" in results["planner"]:
            _render_steptime(results["planner"]["steptime"])
    if "report" in results:
        console.print(_table("6. Report speed", [results["report"]], [
            ("records", "records", ","), ("ranks", "ranks", ""), ("load s", "load_s", ".2f"), ("full report s", "full_report_s", ".2f")]))


def _render_steptime(st: dict) -> None:
    """5c-5d: the step-time model on seed 004 (costs.validation.steptime_bench)."""
    console.print(_table(f"5c. Step-time model on seed 004: fitted on {', '.join(st['fit'])}; the others predicted "
                         f"(MAPE {st['split_mape']:.1%})", st["split"], [
        ("row", "label", ""), ("model", "model", ""), ("measured s", "measured_s", ",.0f"),
        ("predicted s", "predicted_s", ",.0f"), ("error", "error", "+.1%")]))
    console.print(_table(f"5c'. Issue 33's layouts through the planner: fitted on {', '.join(st['issue33_fit'])} "
                         f"(MAPE {st['issue33_mape']:.1%}, {st['issue33_coverage']:.0%} inside their bands)",
                         st["issue33_split"], [
        ("layout", "layout", ""), ("measured s", "measured_s", ",.0f"), ("predicted s", "predicted_s", ",.0f"),
        ("low s", "low_s", ",.0f"), ("high s", "high_s", ",.0f"), ("error", "error", "+.1%"),
        ("dollars", "dollars", ",.2f")]))
    console.print(_table("5d. Step-time model on seed 004, each row from the other ten (nested leave-one-out bands)",
                         [{"level": k, **{c: v[c] for c in v if c != "rows"}} for k, v in st["loo"].items()], [
        ("level", "level", ""), ("predictions", "predictions", ".0f"), ("MAPE", "mape", ".1%"),
        ("coverage", "coverage", ".0%"), ("median half-width", "median_half_width", ".1%")]))


def _render_planner(p: dict) -> None:
    """Per level: coverage and median half-width of the throughput bands per shipped table and per
    k (first k layouts fitted, the rest predicted, each source calibrated without it), then of the
    steps bands on the independent held-out predictions."""
    cols = [("predictions", "predictions", ".0f"), ("coverage", "coverage", ".0%"),
            ("median half-width", "median_half_width", ".1%"), ("MAPE", "mape", ".1%"),
            ("naive MAPE", "naive_mape", ".1%"), ("infinite", "infinite", ".0f")]
    for lv in p["levels"]:
        level = f"{lv['confidence']:.0%} intervals"
        console.print(_table(f"5. Planner throughput per source, each whole source left out ({level})",
                             [{"origin": "all", "k_class": "", **lv["throughput"]}, *lv["throughput_by_origin"]],
                             [("source", "origin", ""), ("counts fitted", "k_class", ""), *cols]))
        by_class = [{**r, "model": lv["throughput_models"][r["k_class"]]["model"]} for r in lv["throughput_by_k_class"]]
        console.print(_table(f"5a. Planner throughput per class of fits ({level})", by_class,
                             [("counts fitted", "k_class", ""), ("model", "model", ""), *cols]))
        console.print(_table(f"5a. Planner throughput per k ({level})", lv["throughput_by_fit_counts"],
                             [("k fitted", "fit_counts", ".0f"), *cols]))
        if "interior" in lv:
            console.print(_table(f"5a. Planner throughput between measured counts, each whole source left out ({level})",
                                 [lv["interior"]], [("predictions", "predictions", ".0f"), ("sources", "origins", ".0f"),
                                                    ("coverage", "coverage", ".0%"),
                                                    ("median half-width", "median_half_width", ".1%"),
                                                    ("MAPE", "mape", ".1%")]))
        console.print(_table(f"5b. Planner steps to threshold, held out ({level})",
                             lv["steps"], [("basis", "basis", ""), ("predictions", "predictions", ".0f"),
                                           ("coverage", "coverage", ".0%"),
                                           ("median half-width", "median_half_width", ".1%"),
                                           ("mean abs error", "mean_abs_error", ".1%")]))


#: Table 1's "vs fp32" (a median of per-round ratios) is marked noisy where it and the ratio of the medians'
#: words/s differ by more than this.
NOISY_RATIO_GAP = 0.25


def _decorate(results: dict) -> None:
    compute = results.get("compute", [])
    for r in compute:
        r["gflops"], r["matmul_gflops"] = r["flops_per_s"] / 1e9, r["matmul_flops_per_s"] / 1e9
        r["matmul_fp32_gflops"], r["matmul_bf16_gflops"] = r["matmul_fp32_flops_per_s"] / 1e9, r["matmul_bf16_flops_per_s"] / 1e9
    for r in compute:
        r.setdefault("note", "")
        base = next((b for b in compute if b.get("precision") == "fp32" and r.get("precision") != "fp32"
                     and all(b.get(k) == r.get(k) for k in ("preset", "rnn", "batch", "threads"))), None)
        if base is None or not r.get("speedup_vs_fp32") or not base.get("words_per_s"):
            continue
        words_ratio = r["words_per_s"] / base["words_per_s"]
        if abs(r["speedup_vs_fp32"] / words_ratio - 1) > NOISY_RATIO_GAP:
            r["note"] = f"noisy: words/s ratio {words_ratio:.2f}"
    memcpy = next((r["bytes_per_s"] for r in results.get("exchange", []) if "bytes_per_s" in r), None)
    for r in results.get("exchange", []):
        if "busbw" in r:
            r["busbw_gb"], r["memcpy_gb"] = r["busbw"] / 1e9, memcpy / 1e9 if memcpy else None
        elif "bytes_per_s" in r:  # the memcpy row itself: its own figure in its own column
            r["memcpy_gb"] = r["bytes_per_s"] / 1e9
        if "exposed_exchange_s" in r:
            exposed = r["exposed_exchange_s"]
            r["exposed_text"] = "—" if exposed is None else "0 (noise)" if exposed < 0 else f"{exposed:.3f}"


@click.command("bench")
@click.option("--only", default=",".join(PARTS), show_default=True, help="Parts to run, comma-separated.")
@click.option("--quick", is_flag=True, help="Fewer presets, sizes and steps (about 2 minutes).")
@click.option("--out", type=OutputDir("--out"), default="bench", show_default=True,
              help="Directory for bench.json and the runs it makes.")
def bench_cmd(only: str, quick: bool, out: str) -> None:
    """Measure the trainer's compute efficiency, all-reduce bandwidth, scaling, launch overhead,
    planner accuracy and report speed on this machine; print tables and write bench.json."""

    parts = [p.strip() for p in only.split(",") if p.strip()]
    bad = sorted(set(parts) - set(PARTS))
    if bad or not parts:
        raise SpecError(f"unknown bench part(s) {', '.join(bad) or repr(only)}; valid: {', '.join(PARTS)}")
    work = Path(out)
    with writing(work, "the bench directory", "or give --out a writable directory with room"):
        work.mkdir(parents=True, exist_ok=True)
    threads = os.cpu_count() or 1
    results: dict = {"machine": {"cpus": threads, "python": sys.version.split()[0],
                                 "torch": __import__("torch").__version__, "date": time.strftime("%Y-%m-%d")}}
    if "compute" in parts:
        presets = ["nmt-small"] if quick else ["nmt-tiny", "nmt-small", "rnnlm-small", "sentiment-small"]
        results["compute"] = bench_compute(presets, ["fused", "stepwise"], threads, 5 if quick else 10)
    if "exchange" in parts:
        results["exchange"] = bench_exchange([1, 16, 64] if quick else [1, 16, 40, 64, 270], 3 if quick else 5, work)
    if "scaling" in parts:
        results["scaling"] = bench_scaling("nmt-small", 10 if quick else 25, work)
    if "planner" in parts:
        results["planner"] = bench_planner()
    if "report" in parts:
        results["report"] = bench_report(100_000 if quick else 1_000_000, 8, work)
    _decorate(results)
    (work / "bench.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    render(results)
    console.print(f"results: [bold]{work / 'bench.json'}[/]")
