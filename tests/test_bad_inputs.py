"""Bad input across every command, file kind and backend: one clear message, a non-zero exit, no
traceback, nothing started.

The table is what a new user (or a fault injector) actually typed: wrong flags, NaN, infinity and
negative numbers, conflicting pairs, binary, empty and corrupt files, CSVs with duplicate rows or
columns, run directories with broken state. Each case names the words its message must contain (the
input at fault), checked case-insensitively. Cases run in-process through the console entry point
(`launcher.cli.entry`), so the table of ~100 inputs takes seconds; the subprocess path is covered by
tests/test_cli_errors.py. Run and sweep cases carry `--dry-run`: an input silently accepted prints a
request and exits 0 (a failure here) instead of training.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest

from tests.conftest import fill, mount_tmpfs, run_entry

GOOD_CSV = "label,workers,throughput\nA,1,100\nA,2,180\nA,4,300\n"
BINARY = bytes(range(256)) * 4

# name -> content of the files a case may refer to as {name}
FILES: dict[str, str | bytes] = {
    "binary.yaml": BINARY,
    "binary.csv": BINARY,
    "binary.json": BINARY,
    "binary.txt": BINARY,
    "empty.yaml": "",
    "comments.yaml": "# nothing but a comment\n",
    "list.yaml": "- nodes\n- 2\n",
    "syntax.yaml": "nodes: [1, 2\n",
    "nodes-null.yaml": "nodes: null\n",
    "nodes-neg.yaml": "nodes: -2\n",
    "nodes-float.yaml": "nodes: 2.5\n",
    "nodes-bool.yaml": "nodes: true\n",
    "lr-nan.yaml": "lr: .nan\n",
    "lr-inf.yaml": "lr: .inf\n",
    "seed-neg.yaml": "seed: -1\n",
    "unknown-key.yaml": "modle: nmt-tiny\n",
    "engine-unknown.yaml": "engine: {name: mpi}\n",
    "engine-string.yaml": "engine: [horovod, ddp]\n",  # a list: neither a mapping nor the flag's one word
    "data-text.yaml": "data: {kind: text}\n",
    "both-batches.yaml": "global_batch: 8\nbatch_per_worker: 4\n",
    "model-args-neg.yaml": "model_args: {hidden_size: -1}\n",
    "threshold-nan.yaml": "loss_threshold: .nan\nval_every: 2\n",
    "slowdown-nan.yaml": "gpus_per_node: 2\nemulate_slowdown: [1, .nan]\n",
    "nodes-string.json": '{"nodes": "two"}',
    "steps-inf.yaml": "steps: .inf\n",
    "bopt-unknown.yaml": "backend: slurm\nbackend_options: {partitionn: gpu}\n",
    "empty.csv": "",
    "header-only.csv": "label,workers,throughput\n",
    "nan.csv": "label,workers,throughput\nA,1,100\nA,2,nan\n",
    "inf.csv": "label,workers,throughput\nA,1,100\nA,2,inf\n",
    "neg-workers.csv": "label,workers,throughput\nA,1,100\nA,-2,180\n",
    "zero-workers.csv": "label,workers,throughput\nA,0,100\nA,2,180\n",
    "neg-throughput.csv": "label,workers,throughput\nA,1,100\nA,2,-180\n",
    "dup-rows.csv": "label,workers,throughput\nA,1,100\nA,2,180\nA,2,190\n",
    "dup-cols.csv": "label,workers,workers,throughput\nA,1,1,100\nA,2,2,180\n",
    "no-workers.csv": "label,throughput\nA,100\nA,180\n",
    "text-workers.csv": "label,workers,throughput\nA,one,100\nA,2,180\n",
    "good.csv": GOOD_CSV,
    "one-row.csv": "label,workers,throughput\nA,1,100\n",
    "cost-neg.csv": "label,seconds,instances\nA,-5,1*p2.xlarge\n",
    "cost-nan.csv": "label,seconds,instances\nA,nan,1*p2.xlarge\n",
    "cost-badmix.csv": "label,seconds,instances\nA,60,2*nosuch.type\n",
    "cost-dup.csv": "label,seconds,instances\nA,60,1*p2.xlarge\nA,60,1*p2.xlarge\n",
    "prices-corrupt.json": '{"p2.xlarge": ',
    "prices-neg.json": '{"on-demand": {"us-east-1": {"p2.xlarge": -0.9}}}',
    "prices-od-neg.json": '{"on_demand": [{"instance_type": "p2.xlarge", "region": "us-east-1", "usd_per_hour": -0.9}]}',
    "prices-nan.json": '{"spot": [{"instance_type": "p2.xlarge", "region": "us-east-1", "usd_per_hour": NaN}]}',
    "prices-huge.json": '{"on_demand": [{"instance_type": "p2.xlarge", "region": "us-east-1", "usd_per_hour": 1e308}]}',
    "prices-gpus0.json": '{"instances": [{"name": "x9.large", "gpus": 0}]}',
    "prices-rate-key.yaml": "rates: [{name: slurm, usd_per_gpu_hour: 0.45, gpu_modle: V100}]\n",
    "prices-dup.yaml": "rates: []\nrates: []\n",
    "dup-key.yaml": "nodes: 2\nseed: 3\nnodes: 4\n",
    "study-dup-key.yaml": "title: t\ntitle: u\n",
    "profile-bad.yaml": "profile_steps: 8:6\n",
    "study-empty.yaml": "",
    "study-list.yaml": "- a\n",
    "workers-1e400.csv": "label,workers,throughput\nA,1,100\nA,1e400,180\n",
    "study-mode.yaml": "mode: medium\nbase: {model: nmt-tiny}\nvariants: [{label: a}]\n",
    "study-dup-labels.yaml": "base: {model: nmt-tiny}\nvariants: [{label: a, set: {rnn: fused}}, {label: a, set: {rnn: stepwise}}]\n",
    "study-no-variants.yaml": "base: {model: nmt-tiny}\nvariants: []\n",
}

STEP = ('{"kind": "start", "rank": 0, "world": 1, "time": 1}\n'
        '{"kind": "step", "step": 1, "warmup": false, "step_s": STEP_S, "samples": 8, "words": 80, "rank": 0, '
        '"world": 1, "time": 2}\n')


def _run_dir(root: Path, name: str, spec: str | None = '{"model": "nmt-tiny"}', launch: str | None = None,
             records: str | bytes | None = None) -> Path:
    """A run directory as the launcher leaves one, with whichever part broken."""
    run = root / name
    (run / "records").mkdir(parents=True)
    if spec is not None:
        (run / "spec.json").write_text(spec)
    if launch is not None:
        (run / "launch.json").write_text(launch)
    if records is not None:
        path = run / "records" / "rank-0.jsonl"
        path.write_bytes(records if isinstance(records, bytes) else records.encode())
    return run


LAUNCHED = json.dumps({"backend": "local", "state": "RUNNING", "processes": [], "pids": []})


def _small_filesystems(tmp: Path, mounted: list[Path]) -> tuple[dict[str, str], list[Path], str]:
    """{ro}: a read-only tmpfs holding a launched run; {full}: a tmpfs of 64 KiB, filled, holding one too.

    Read-only is a real read-only mount (root writes through chmod and a read-only bind can be
    remounted by the test only as root too, so a tmpfs remounted `ro` is the honest case)."""
    for name in ("ro", "full"):
        why = mount_tmpfs(tmp / f"fs-{name}", 64 * 1024)
        if why:
            return {}, mounted, why
        mounted.append(tmp / f"fs-{name}")
        _run_dir(tmp / f"fs-{name}", "run", launch=LAUNCHED)
    ro, full = mounted
    subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
    fill(full)
    return {"ro": str(ro), "full": str(full)}, mounted, ""


def _fixtures(tmp: Path) -> dict[str, str]:
    for name, content in FILES.items():
        path = tmp / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    step = '{"kind": "start", "rank": 0, "world": 1, "time": 1}\n{"kind": "step", "step": "abc", "rank": 0, "world": 1, "time": 2}\n'
    paths = {name: str(tmp / name) for name in FILES}
    paths.update({
        "corrupt_spec_run": str(_run_dir(tmp, "corrupt-spec", spec='{"model": ')),
        "binary_spec_run": str(_run_dir(tmp, "binary-spec", spec=None)),
        "no_spec_run": str(_run_dir(tmp, "no-spec", spec=None)),
        "corrupt_launch_run": str(_run_dir(tmp, "corrupt-launch", launch='{"pids": [')),
        "binary_records_run": str(_run_dir(tmp, "binary-records", records=BINARY)),
        "typed_records_run": str(_run_dir(tmp, "typed-records", records=step)),
        "no_records_run": str(_run_dir(tmp, "no-records")),
        "a_file": paths["good.csv"],
        "tmp": str(tmp),
    })
    (tmp / "binary-spec" / "spec.json").write_bytes(BINARY)
    paths.update(_planted_links(tmp))
    paths.update(_hand_edited(tmp))
    return paths


def _hand_edited(tmp: Path) -> dict[str, str]:
    """Special files and state edited by hand (issue #27 items 5, 6 and 10): each was a traceback, a hang
    or an acceptance."""
    import os

    os.mkfifo(tmp / "pipe.csv")
    (tmp / "a-dir").mkdir()
    out = {"fifo": str(tmp / "pipe.csv"), "a_dir": str(tmp / "a-dir")}
    out["launch_list_run"] = str(_run_dir(tmp, "launch-list", launch="[]", records=STEP.replace("STEP_S", "0.5")))
    for name, step_s in (("step-zero", "0"), ("step-negative", "-1"), ("step-1e308", "1e308")):
        out[name.replace("-", "_") + "_run"] = str(_run_dir(tmp, name, records=STEP.replace("STEP_S", step_s)))
    stray = _run_dir(tmp, "stray-rank", records=STEP.replace("STEP_S", "0.5"))
    (stray / "records" / "rank-abc.jsonl").write_text("")
    rank_dir = _run_dir(tmp, "rank-dir", launch=LAUNCHED)
    (rank_dir / "records" / "rank-0.jsonl").mkdir()
    out.update(stray_rank_run=str(stray), rank_dir_run=str(rank_dir))
    sweep = tmp / "parent" / "sweep"
    sweep.mkdir(parents=True)
    (sweep / "sweep.json").write_text('{"runs": [".."]}')
    corrupt, empty = tmp / "corrupt-report", tmp / "empty-report"
    corrupt.mkdir(), empty.mkdir()
    (corrupt / "report.json").write_text('[{"label": ')
    (empty / "report.json").write_text("[]")
    out.update(dotdot_sweep=str(sweep), corrupt_report=str(corrupt), empty_report=str(empty))
    return out


def _planted_links(tmp: Path) -> dict[str, str]:
    """Run and report directories whose files are links out of them (issue #27 item 3); the victims'
    content is checked unchanged by test_no_planted_link_was_followed."""
    victim = tmp / "victim.txt"
    victim.write_text("precious\n")
    out = tmp / "linked-out"
    out.mkdir()
    (out / "report.md").symlink_to(victim)
    linked = _run_dir(tmp, "linked-records", launch=LAUNCHED)
    (linked / "records" / "rank-0.jsonl").symlink_to(victim)
    logs = _run_dir(tmp, "planted-logs", spec='{"model": "nmt-tiny", "backend": "local"}',
                    launch=json.dumps({**json.loads(LAUNCHED), "log_files": ["/etc/hostname"]}))
    return {"victim": str(victim), "linked_out": str(out), "linked_records_run": str(linked),
            "planted_logs_run": str(logs)}


DRY = ["--dry-run"]
# (case id, argv with {placeholders}, words the message must contain)
CASES: list[tuple[str, list[str], list[str]]] = [
    # ---- run: numbers in flags -------------------------------------------------------------------
    ("nodes-zero", ["--nodes", "0", *DRY], ["--nodes"]),
    ("nodes-negative", ["--nodes", "-1", *DRY], ["--nodes"]),
    ("gpus-zero", ["--gpus-per-node", "0", *DRY], ["--gpus-per-node"]),
    ("nodes-text", ["--nodes", "two", *DRY], ["two"]),
    ("steps-zero", ["--steps", "0", *DRY], ["--steps"]),
    ("steps-negative", ["--steps", "-5", *DRY], ["--steps"]),
    ("epochs-zero", ["--epochs", "0", *DRY], ["--epochs"]),
    ("lr-nan", ["--lr", "nan", *DRY], ["--lr"]),
    ("lr-inf", ["--lr", "inf", *DRY], ["--lr"]),
    ("lr-negative", ["--lr", "-1", *DRY], ["--lr"]),
    ("lr-zero", ["--lr", "0", *DRY], ["--lr"]),
    ("threshold-nan", ["--loss-threshold", "nan", "--val-every", "5", *DRY], ["--loss-threshold"]),
    ("threshold-inf", ["--loss-threshold", "inf", "--val-every", "5", *DRY], ["--loss-threshold"]),
    ("threshold-negative", ["--loss-threshold", "-1", "--val-every", "5", *DRY], ["--loss-threshold"]),
    ("threshold-without-validation", ["--loss-threshold", "1.0", *DRY], ["--val-every"]),
    ("seed-negative", ["--seed", "-1", *DRY], ["--seed"]),
    ("fusion-negative", ["--fusion-threshold-mb", "-1", *DRY], ["--fusion-threshold-mb"]),
    ("fusion-nan", ["--fusion-threshold-mb", "nan", *DRY], ["--fusion-threshold-mb"]),
    ("bucket-zero", ["--bucket-cap-mb", "0", *DRY], ["--bucket-cap-mb"]),
    ("bucket-inf", ["--bucket-cap-mb", "inf", *DRY], ["--bucket-cap-mb"]),
    ("cycle-negative", ["--cycle-time-ms", "-1", *DRY], ["--cycle-time-ms"]),
    ("warmup-negative", ["--warmup-steps", "-1", *DRY], ["--warmup-steps"]),
    ("val-every-negative", ["--val-every", "-1", *DRY], ["--val-every"]),
    ("val-batches-zero", ["--val-batches", "0", *DRY], ["--val-batches"]),
    ("checkpoint-every-negative", ["--checkpoint-every", "-3", *DRY], ["--checkpoint-every"]),
    ("threads-zero", ["--threads", "0", *DRY], ["--threads"]),
    ("interop-zero", ["--interop-threads", "0", *DRY], ["--interop-threads"]),
    ("prefetch-negative", ["--prefetch", "-1", *DRY], ["--prefetch"]),
    ("train-samples-zero", ["--train-samples", "0", *DRY], ["--train-samples"]),
    ("global-batch-zero", ["--global-batch", "0", *DRY], ["--global-batch"]),
    ("balance-every-zero", ["--balance-every", "0", *DRY], ["--balance-every"]),
    # ---- run: conflicting or impossible combinations ---------------------------------------------
    ("both-batch-flags", ["--global-batch", "8", "--batch-per-worker", "4", *DRY], ["--global-batch", "--batch-per-worker"]),
    ("steps-below-warmup", ["--steps", "3", "--warmup-steps", "5", *DRY], ["--steps", "--warmup-steps"]),
    ("thousand-local-ranks", ["--engine", "ddp", "--gpus-per-node", "1000", *DRY], ["1000"]),
    ("single-with-two-workers", ["--engine", "single", "--gpus-per-node", "2", *DRY], ["single"]),
    ("replicas-with-dynamic", ["--engine", "ddp", "--gpus-per-node", "2", "--independent-replicas", "--balance", "dynamic", *DRY],
     ["--independent-replicas"]),
    ("batch-does-not-split", ["--engine", "ddp", "--global-batch", "15", "--gpus-per-node", "2", *DRY], ["split"]),
    ("slowdown-not-a-number", ["--engine", "ddp", "--gpus-per-node", "2", "--emulate-slowdown", "1,x", *DRY], ["--emulate-slowdown"]),
    ("slowdown-nan", ["--engine", "ddp", "--gpus-per-node", "2", "--emulate-slowdown", "1,nan", *DRY], ["--emulate-slowdown"]),
    ("slowdown-count", ["--engine", "ddp", "--gpus-per-node", "2", "--emulate-slowdown", "1", *DRY], ["--emulate-slowdown"]),
    ("text-without-files", ["--data", "text", *DRY], ["--train-src"]),
    ("text-binary-file", ["--data", "text", "--model", "rnnlm-tiny", "--train-src", "{binary.txt}", *DRY], ["binary.txt"]),
    ("text-missing-file", ["--data", "text", "--model", "rnnlm-tiny", "--train-src", "{tmp}/absent.txt", *DRY], ["absent.txt"]),
    ("runs-dir-is-a-file", ["--runs-dir", "{a_file}", "--steps", "2"], ["good.csv"]),
    # ---- run: model and backend options ----------------------------------------------------------
    ("model-arg-negative", ["--model-arg", "hidden_size=-5", *DRY], ["hidden_size"]),
    ("model-arg-nan", ["--model-arg", "hidden_size=nan", *DRY], ["hidden_size"]),
    ("model-arg-bool", ["--model-arg", "hidden_size=true", *DRY], ["hidden_size"]),
    ("model-arg-dropout", ["--model-arg", "dropout=1.5", *DRY], ["dropout"]),
    ("model-arg-null", ["--model-arg", "vocab_size=null", *DRY], ["vocab_size"]),
    ("model-arg-no-equals", ["--model-arg", "hidden_size", *DRY], ["--model-arg"]),
    ("model-arg-unknown", ["--model-arg", "hiden_size=3", *DRY], ["hiden_size"]),
    ("local-port-negative", ["--backend-opt", "master_port=-1", *DRY], ["master_port"]),
    ("local-port-too-big", ["--backend-opt", "master_port=99999", *DRY], ["master_port"]),
    ("local-option-unknown", ["--backend-opt", "gpus=3", *DRY], ["gpus"]),
    ("flag-of-other-backend", ["--partition", "gpu", *DRY], ["--partition", "slurm"]),
    ("slurm-cpus-zero", ["--backend", "slurm", "--cpus-per-task", "0", *DRY], ["cpus"]),
    ("slurm-mem-negative", ["--backend", "slurm", "--mem-gb", "-1", *DRY], ["mem"]),
    ("slurm-mem-nan", ["--backend", "slurm", "--mem-gb", "nan", *DRY], ["mem"]),
    ("slurm-option-unknown", ["--backend", "slurm", "--backend-opt", "partitionn=gpu", *DRY], ["partitionn"]),
    ("k8s-without-image", ["--backend", "k8s", *DRY], ["--image"]),
    ("k8s-bad-selector", ["--backend", "k8s", "--image", "x.org/s:1", "--node-selector", "nolabel", *DRY], ["nolabel"]),
    ("aws-without-bucket", ["--backend", "aws", *DRY], ["--bucket"]),
    ("aws-unknown-type", ["--backend", "aws", "--bucket", "bkt", "--instance-type", "nosuch.x", *DRY], ["nosuch.x"]),
    ("aws-max-price-negative", ["--backend", "aws", "--bucket", "bkt", "--spot", "--max-price", "-1", *DRY], ["max"]),
    ("aws-time-limit-zero", ["--backend", "aws", "--bucket", "bkt", "--time-limit-min", "0", *DRY], ["time"]),
    ("aws-time-limit-nan", ["--backend", "aws", "--bucket", "bkt", "--time-limit-min", "nan", *DRY], ["time"]),
    ("aws-mix-count", ["--backend", "aws", "--bucket", "bkt", "--instance-type", "1*p2.xlarge+1*g3.4xlarge", "--nodes", "3", "--global-batch", "12", *DRY],
     ["--nodes"]),
    # ---- spec files --------------------------------------------------------------------------------
    ("spec-missing", ["--spec", "{tmp}/missing.yaml", *DRY], ["missing.yaml"]),
    ("spec-binary", ["--spec", "{binary.yaml}", *DRY], ["binary.yaml"]),
    ("spec-empty", ["--spec", "{empty.yaml}", *DRY], ["empty.yaml"]),
    ("spec-only-comments", ["--spec", "{comments.yaml}", *DRY], ["comments.yaml"]),
    ("spec-list", ["--spec", "{list.yaml}", *DRY], ["list.yaml"]),
    ("spec-syntax", ["--spec", "{syntax.yaml}", *DRY], ["syntax.yaml"]),
    ("spec-null-number", ["--spec", "{nodes-null.yaml}", *DRY], ["nodes"]),
    ("spec-negative", ["--spec", "{nodes-neg.yaml}", *DRY], ["nodes"]),
    ("spec-float-for-int", ["--spec", "{nodes-float.yaml}", *DRY], ["nodes"]),
    ("spec-bool-for-int", ["--spec", "{nodes-bool.yaml}", *DRY], ["nodes"]),
    ("spec-nan", ["--spec", "{lr-nan.yaml}", *DRY], ["lr"]),
    ("spec-inf", ["--spec", "{lr-inf.yaml}", *DRY], ["lr"]),
    ("spec-steps-inf", ["--spec", "{steps-inf.yaml}", *DRY], ["steps"]),
    ("spec-seed-negative", ["--spec", "{seed-neg.yaml}", *DRY], ["seed"]),
    ("spec-duplicate-key", ["--spec", "{dup-key.yaml}", *DRY], ["duplicate key 'nodes'", "dup-key.yaml"]),
    ("spec-profile-steps-backwards", ["--spec", "{profile-bad.yaml}", *DRY], ["profile-steps", "8:6"]),
    ("study-duplicate-key", ["study", "{study-dup-key.yaml}", *DRY], ["duplicate key 'title'"]),
    ("spec-unknown-key", ["--spec", "{unknown-key.yaml}", *DRY], ["modle"]),
    ("spec-unknown-engine", ["--spec", "{engine-unknown.yaml}", *DRY], ["mpi"]),
    ("spec-engine-not-mapping", ["--spec", "{engine-string.yaml}", *DRY], ["engine"]),
    ("spec-text-without-files", ["--spec", "{data-text.yaml}", *DRY], ["train"]),
    ("spec-both-batches", ["--spec", "{both-batches.yaml}", *DRY], ["global-batch", "batch-per-worker"]),
    ("spec-model-args-negative", ["--spec", "{model-args-neg.yaml}", *DRY], ["hidden_size"]),
    ("spec-threshold-nan", ["--spec", "{threshold-nan.yaml}", *DRY], ["threshold"]),
    ("spec-slowdown-nan", ["--spec", "{slowdown-nan.yaml}", "--engine", "ddp", *DRY], ["slowdown"]),
    ("spec-json-string-for-int", ["--spec", "{nodes-string.json}", *DRY], ["nodes"]),
    ("spec-backend-option-unknown", ["--spec", "{bopt-unknown.yaml}", *DRY], ["partitionn"]),
    # ---- sweep -------------------------------------------------------------------------------------
    ("sweep-no-layouts", ["sweep", *DRY], ["--workers"]),
    ("sweep-zero-workers", ["sweep", "--workers", "0,1", *DRY], ["0"]),
    ("sweep-negative-workers", ["sweep", "--workers", "1,-2", *DRY], ["-2"]),
    ("sweep-text-workers", ["sweep", "--workers", "a,b", *DRY], ["a"]),
    ("sweep-bad-layout", ["sweep", "--layouts", "1x0", *DRY], ["1x0"]),
    ("sweep-half-layout", ["sweep", "--layouts", "2x", *DRY], ["2x"]),
    ("sweep-duplicate-layout", ["sweep", "--workers", "1,1", *DRY], ["1"]),
    ("sweep-batch-does-not-split", ["sweep", "--engine", "ddp", "--workers", "1,2", "--global-batch", "3", *DRY], ["split"]),
    ("sweep-mode-contradicts-axis", ["sweep", "--workers", "1,2", "--mode", "strong", "--work-scaling", "growing", *DRY],
     ["--mode strong", "--work-scaling growing"]),
    ("sweep-bad-axis", ["sweep", "--workers", "1,2", "--batch-scaling", "weak", *DRY], ["--batch-scaling"]),
    ("sweep-steps-do-not-divide", ["sweep", "--engine", "ddp", "--workers", "1,2,4", "--batch-scaling", "growing",
                                   "--work-scaling", "fixed", "--steps", "42", *DRY], ["--steps 42"]),
    # ---- report ------------------------------------------------------------------------------------
    ("report-missing-dir", ["report", "{tmp}/nothing"], ["nothing"]),
    ("report-a-file", ["report", "{a_file}"], ["good.csv"]),
    ("report-csv-missing", ["report", "--from-csv", "{tmp}/absent.csv"], ["absent.csv"]),
    ("report-csv-binary", ["report", "--from-csv", "{binary.csv}"], ["binary.csv"]),
    ("report-csv-empty", ["report", "--from-csv", "{empty.csv}"], ["empty.csv"]),
    ("report-csv-header-only", ["report", "--from-csv", "{header-only.csv}"], ["header-only.csv"]),
    ("report-csv-nan", ["report", "--from-csv", "{nan.csv}"], ["nan.csv"]),
    ("report-csv-inf", ["report", "--from-csv", "{inf.csv}"], ["inf.csv"]),
    ("report-csv-negative-workers", ["report", "--from-csv", "{neg-workers.csv}"], ["neg-workers.csv"]),
    ("report-csv-zero-workers", ["report", "--from-csv", "{zero-workers.csv}"], ["zero-workers.csv"]),
    ("report-csv-negative-throughput", ["report", "--from-csv", "{neg-throughput.csv}"], ["neg-throughput.csv"]),
    ("report-csv-duplicate-rows", ["report", "--from-csv", "{dup-rows.csv}"], ["dup-rows.csv"]),
    ("report-csv-duplicate-columns", ["report", "--from-csv", "{dup-cols.csv}"], ["workers"]),
    ("report-csv-no-workers", ["report", "--from-csv", "{no-workers.csv}"], ["workers"]),
    ("report-csv-text-workers", ["report", "--from-csv", "{text-workers.csv}"], ["one"]),
    ("report-runs-and-csv", ["report", "{typed_records_run}", "--from-csv", "{good.csv}"], ["--from-csv"]),
    ("report-corrupt-spec", ["report", "{corrupt_spec_run}"], ["spec.json"]),
    ("report-binary-spec", ["report", "{binary_spec_run}"], ["spec.json"]),
    ("report-binary-records", ["report", "{binary_records_run}"], ["rank-0.jsonl"]),
    ("report-wrong-record-type", ["report", "{typed_records_run}"], ["rank-0.jsonl"]),
    ("report-no-records", ["report", "{no_records_run}"], ["records"]),
    ("report-out-is-a-file", ["report", "--from-csv", "{good.csv}", "--out", "{a_file}"], ["good.csv"]),
    # ---- cost and plan -----------------------------------------------------------------------------
    ("cost-csv-binary", ["cost", "--from-csv", "{binary.csv}"], ["binary.csv"]),
    ("cost-csv-negative", ["cost", "--from-csv", "{cost-neg.csv}"], ["cost-neg.csv"]),
    ("cost-csv-nan", ["cost", "--from-csv", "{cost-nan.csv}"], ["cost-nan.csv"]),
    ("cost-csv-unknown-type", ["cost", "--from-csv", "{cost-badmix.csv}"], ["nosuch.type"]),
    ("cost-csv-duplicate-rows", ["cost", "--from-csv", "{cost-dup.csv}"], ["cost-dup.csv"]),
    ("cost-rate-text", ["cost", "--from-csv", "{good.csv}", "--rate", "slurm=abc"], ["--rate"]),
    ("cost-rate-negative", ["cost", "--from-csv", "{good.csv}", "--rate", "slurm=-1/gpu-hour"], ["--rate"]),
    ("cost-interruptions-negative", ["cost", "--from-csv", "{good.csv}", "--interruptions-per-hour", "-1"], ["--interruptions-per-hour"]),
    ("cost-prices-binary", ["cost", "--list", "--prices", "{binary.json}"], ["binary.json"]),
    ("cost-prices-corrupt", ["cost", "--list", "--prices", "{prices-corrupt.json}"], ["prices-corrupt.json"]),
    # ---- links out of a run or report directory are never followed (issue #27 item 3) ---------------
    ("report-out-through-a-link", ["report", "--from-csv", "{good.csv}", "--out", "{linked_out}"], ["report.md", "symbolic link", "rm "]),
    ("report-linked-records", ["report", "{linked_records_run}"], ["rank-0.jsonl", "symbolic link"]),
    ("logs-planted-log-file", ["logs", "{planted_logs_run}"], ["/etc/hostname", "launch.json", "own logs"]),
    # ---- prices files: one schema (issue #27 item 4) ------------------------------------------------
    ("cost-prices-misspelt-top-key", ["cost", "--list", "--prices", "{prices-neg.json}"], ["'on-demand'", "did you mean 'on_demand'"]),
    ("plan-prices-negative", ["plan", "--from-csv", "{good.csv}", "--prices", "{prices-od-neg.json}"], ["on_demand[0].usd_per_hour", "prices-od-neg.json"]),
    ("cost-prices-nan", ["cost", "--list", "--prices", "{prices-nan.json}"], ["spot[0].usd_per_hour", "nan"]),
    ("cost-prices-1e308", ["cost", "--list", "--prices", "{prices-huge.json}"], ["usd_per_hour", "<= 10,000"]),
    ("cost-prices-gpus-zero", ["cost", "--list", "--prices", "{prices-gpus0.json}"], ["instances[0].gpus", ">= 1"]),
    ("cost-prices-row-key", ["cost", "--list", "--prices", "{prices-rate-key.yaml}"], ["gpu_modle", "did you mean 'gpu_model'"]),
    ("cost-prices-duplicate-key", ["cost", "--list", "--prices", "{prices-dup.yaml}"], ["duplicate key 'rates'"]),
    ("plan-deadline-negative", ["plan", "--from-csv", "{good.csv}", "--deadline-h", "-1"], ["--deadline-h"]),
    ("plan-deadline-nan", ["plan", "--from-csv", "{good.csv}", "--deadline-h", "nan"], ["--deadline-h"]),
    ("plan-budget-negative", ["plan", "--from-csv", "{good.csv}", "--budget", "-5"], ["--budget"]),
    ("plan-work-negative", ["plan", "--from-csv", "{good.csv}", "--work", "-1"], ["--work"]),
    ("plan-work-nan", ["plan", "--from-csv", "{good.csv}", "--work", "nan"], ["--work"]),
    ("plan-predict-negative", ["plan", "--from-csv", "{good.csv}", "--predict-workers", "0,-1"], ["--predict-workers"]),
    ("plan-predict-text", ["plan", "--from-csv", "{good.csv}", "--predict-workers", "a"], ["--predict-workers"]),
    ("plan-gradient-negative", ["plan", "--from-csv", "{good.csv}", "--gradient-mb", "-1"], ["--gradient-mb"]),
    ("plan-unknown-type", ["plan", "--from-csv", "{good.csv}", "--instance-types", "nosuch.type"], ["nosuch.type"]),
    ("plan-csv-binary", ["plan", "--from-csv", "{binary.csv}"], ["binary.csv"]),
    # ---- study -------------------------------------------------------------------------------------
    ("study-missing", ["study", "{tmp}/absent.yaml", "--dry-run"], ["absent.yaml"]),
    ("study-binary", ["study", "{binary.yaml}", "--dry-run"], ["binary.yaml"]),
    ("study-empty", ["study", "{study-empty.yaml}", "--dry-run"], ["study-empty.yaml"]),
    ("study-list", ["study", "{study-list.yaml}", "--dry-run"], ["study-list.yaml"]),
    # ---- run directories: status, logs, cancel, resume ---------------------------------------------
    ("status-missing", ["status", "{tmp}/nothing"], ["nothing"]),
    ("status-not-a-run", ["status", "{no_spec_run}"], ["spec.json"]),
    ("status-corrupt-launch", ["status", "{corrupt_launch_run}"], ["launch.json"]),
    ("logs-missing", ["logs", "{tmp}/nothing"], ["nothing"]),
    ("cancel-missing", ["cancel", "{tmp}/nothing"], ["nothing"]),
    ("cancel-corrupt-launch", ["cancel", "{corrupt_launch_run}"], ["launch.json"]),
    ("resume-missing", ["resume", "{tmp}/nothing"], ["nothing"]),
    ("resume-corrupt-spec", ["resume", "{corrupt_spec_run}"], ["spec.json"]),
    ("resume-binary-spec", ["resume", "{binary_spec_run}"], ["spec.json"]),
    # ---- read-only and full filesystems where the launcher writes ------------------------------------
    ("run-runs-dir-read-only", ["--steps", "6", "--runs-dir", "{ro}/runs"], ["read-only", "--runs-dir"]),
    ("run-runs-dir-full", ["--steps", "6", "--runs-dir", "{full}/runs"], ["is full", "--runs-dir"]),
    ("detach-runs-dir-full", ["--steps", "6", "--detach", "--runs-dir", "{full}/runs"], ["is full"]),
    ("sweep-runs-dir-read-only", ["sweep", "--workers", "1", "--steps", "6", "--runs-dir", "{ro}/runs"], ["read-only"]),
    ("report-out-read-only", ["report", "--from-csv", "{good.csv}", "--out", "{ro}/report"], ["read-only", "--out"]),
    ("report-out-full", ["report", "--from-csv", "{good.csv}", "--out", "{full}/report"], ["is full", "--out"]),
    ("cancel-read-only-run", ["cancel", "{ro}/run"], ["read-only", "stopped"]),
    ("cancel-full-run", ["cancel", "{full}/run"], ["is full", "launch.json"]),
    ("resume-read-only-run", ["resume", "{ro}/run"], ["read-only"]),
    ("resume-full-run", ["resume", "{full}/run"], ["is full"]),
    ("bench-out-read-only", ["bench", "--only", "report", "--out", "{ro}/bench"], ["read-only", "--out"]),
    ("prep-out-read-only", ["prep", "--model", "rnnlm-tiny", "--train", "{good.csv}", "--out", "{ro}/shards"], ["read-only"]),
    # ---- ls, bench, prep, aws gc, plan and cost edge cases -----------------------------------------
    ("ls-runs-dir-missing", ["ls", "--runs-dir", "{tmp}/nothing"], ["nothing"]),
    ("ls-runs-dir-a-file", ["ls", "--runs-dir", "{a_file}"], ["good.csv"]),
    ("ls-format-unknown", ["ls", "--format", "xml"], ["xml"]),
    ("bench-part-unknown", ["bench", "--only", "nosuch"], ["nosuch"]),
    ("bench-no-part", ["bench", "--only", ","], ["valid"]),
    ("bench-out-a-file", ["bench", "--only", "report", "--out", "{a_file}"], ["good.csv"]),
    ("prep-model-unknown", ["prep", "--model", "nosuch", "--train", "{good.csv}", "--out", "{tmp}/shards"], ["nosuch"]),
    ("prep-workers-zero", ["prep", "--model", "rnnlm-tiny", "--train", "{good.csv}", "--out", "{tmp}/shards", "--workers", "0"],
     ["--workers"]),
    ("aws-gc-empty-run-id", ["aws", "gc", "--run-id", "", "--dry-run"], ["--run-id"]),
    ("aws-gc-run-id-with-spaces", ["aws", "gc", "--run-id", "a b", "--dry-run"], ["--run-id"]),
    ("aws-gc-force-every-run", ["aws", "gc", "--force"], ["--force", "--run-id"]),
    ("plan-one-worker-count", ["plan", "--from-csv", "{one-row.csv}"], ["two different worker counts"]),
    ("plan-deadline-zero", ["plan", "--from-csv", "{good.csv}", "--deadline-h", "0"], ["--deadline-h"]),
    ("plan-deadline-inf", ["plan", "--from-csv", "{good.csv}", "--deadline-h", "inf"], ["--deadline-h"]),
    ("plan-budget-nan", ["plan", "--from-csv", "{good.csv}", "--budget", "nan"], ["--budget"]),
    ("plan-csv-not-a-table", ["plan", "--from-csv", "{comments.yaml}"], ["workers"]),
    ("cost-csv-of-plan", ["cost", "--from-csv", "{good.csv}"], ["seconds"]),
    ("cost-csv-empty", ["cost", "--from-csv", "{empty.csv}"], ["empty.csv"]),
    ("cost-interruptions-nan", ["cost", "--from-csv", "{good.csv}", "--interruptions-per-hour", "nan"], ["--interruptions-per-hour"]),
]
FIRST_ISSUE27_CASE = len(CASES)  # the rows below must also be one line on stderr (click's usage block is not)
CASES += [
    # ---- issue #27 item 5: output paths through a file or on special files (were mkdir tracebacks) ----
    ("runs-dir-under-a-file", ["--runs-dir", "{a_file}/x", "--steps", "6"], ["--runs-dir", "good.csv", "not a directory"]),
    ("runs-dir-dev-null", ["--runs-dir", "/dev/null", "--steps", "6"], ["--runs-dir", "/dev/null", "character device"]),
    ("runs-dir-proc", ["--runs-dir", "/proc/x", "--steps", "6"], ["--runs-dir", "/proc/x", "proc"]),
    ("sweep-runs-dir-dev-null", ["sweep", "--workers", "1,2", "--runs-dir", "/dev/null", *DRY], ["--runs-dir", "/dev/null"]),
    ("study-runs-dir-under-a-file", ["study", "{study-mode.yaml}", "--runs-dir", "{a_file}/x", *DRY], ["--runs-dir"]),
    ("prep-out-a-file", ["prep", "--model", "rnnlm-tiny", "--train", "{good.csv}", "--out", "{a_file}"],
     ["--out", "good.csv", "not a directory"]),
    ("bench-out-dev-null", ["bench", "--only", "report", "--out", "/dev/null"], ["--out", "/dev/null"]),
    # ---- item 5: hand-edited state ------------------------------------------------------------------
    ("status-launch-json-list", ["status", "{launch_list_run}"], ["launch.json", "list", "restore or delete"]),
    ("report-launch-json-list", ["report", "{launch_list_run}"], ["launch.json", "list"]),
    ("cancel-launch-json-list", ["cancel", "{launch_list_run}"], ["launch.json", "list"]),
    ("logs-launch-json-list", ["logs", "{launch_list_run}"], ["launch.json", "list"]),
    ("compare-corrupt-report", ["report", "--compare", "{corrupt_report}", "{empty_report}"], ["corrupt-report", "corrupt"]),
    ("compare-empty-report", ["report", "--compare", "{empty_report}", "{corrupt_report}"], ["empty-report", "no rows"]),
    ("report-step-s-zero", ["report", "{step_zero_run}"], ["rank-0.jsonl:2", "step_s 0"]),
    ("report-step-s-negative", ["report", "{step_negative_run}"], ["rank-0.jsonl:2", "step_s -1"]),
    ("report-step-s-1e308", ["report", "{step_1e308_run}"], ["rank-0.jsonl:2", "step_s 1e+308"]),
    ("report-stray-rank-file", ["report", "{stray_rank_run}"], ["rank-abc.jsonl", "move it out"]),
    ("report-rank-file-a-directory", ["report", "{rank_dir_run}"], ["rank-0.jsonl", "is a directory"]),
    ("resume-rank-file-a-directory", ["resume", "{rank_dir_run}"], ["rank-0.jsonl", "is a directory"]),
    ("report-csv-workers-1e400", ["report", "--from-csv", "{workers-1e400.csv}"], ["workers-1e400.csv:3", "1e400"]),
    ("plan-csv-workers-1e400", ["plan", "--from-csv", "{workers-1e400.csv}"], ["workers-1e400.csv:3", "1e400"]),
    # ---- item 5: values accepted, then crashing in the rank -------------------------------------------
    ("seed-past-64-bits", ["--seed", "100000000000000000000000", *DRY], ["seed", "<="]),
    ("model-arg-hidden-1e12", ["--model-arg", "hidden_size=1000000000000", *DRY], ["hidden_size", "at most"]),
    ("backend-opt-python-missing", ["--backend-opt", "python=/missing", *DRY], ["python", "/missing"]),
    ("prep-scheduler-not-an-address", ["prep", "--model", "rnnlm-tiny", "--train", "{good.csv}", "--out", "{tmp}/shards",
                                       "--scheduler", "not-a-url"], ["--scheduler", "not-a-url", "tcp://"]),
    ("study-mode-medium", ["study", "{study-mode.yaml}", *DRY], ["mode 'medium'", "strong, weak"]),
    # ---- item 6: silent acceptances -------------------------------------------------------------------
    ("sweep-workers-with-nodes", ["sweep", "--workers", "1,2", "--nodes", "2", *DRY], ["--nodes 2", "--workers 1,2", "--layouts 2x1,2x2"]),
    ("sweep-workers-with-gpus-per-node", ["sweep", "--workers", "1,2", "--gpus-per-node", "4", *DRY],
     ["--gpus-per-node 4", "--workers 1,2"]),
    ("sweep-layouts-with-nodes", ["sweep", "--layouts", "1x1,1x2", "--nodes", "1", *DRY], ["--nodes 1", "--layouts"]),
    ("report-sweep-lists-dotdot", ["report", "{dotdot_sweep}"], ["sweep.json", "'..'"]),
    ("resume-sweep-lists-dotdot", ["resume", "{dotdot_sweep}"], ["sweep.json", "'..'"]),
    ("status-sweep-lists-dotdot", ["status", "{dotdot_sweep}"], ["sweep.json", "'..'"]),
    ("runs-dir-empty", ["--runs-dir", "", *DRY], ["--runs-dir is empty"]),
    ("sweep-runs-dir-empty", ["sweep", "--workers", "1,2", "--runs-dir", "", *DRY], ["--runs-dir is empty"]),
    ("study-duplicate-labels", ["study", "{study-dup-labels.yaml}", *DRY], ["label 'a'", "study-dup-labels.yaml"]),
    ("study-no-variants", ["study", "{study-no-variants.yaml}", *DRY], ["variants", "study-no-variants.yaml"]),
    # ---- item 10: a directory or FIFO where a file is expected: said as such, never opened -------------
    ("report-csv-fifo", ["report", "--from-csv", "{fifo}"], ["pipe.csv", "FIFO"]),
    ("plan-csv-fifo", ["plan", "--from-csv", "{fifo}"], ["pipe.csv", "FIFO"]),
    ("spec-fifo", ["--spec", "{fifo}", *DRY], ["pipe.csv", "FIFO"]),
    ("spec-a-directory", ["--spec", "{a_dir}", *DRY], ["a-dir", "is a directory"]),
    ("report-csv-a-directory", ["report", "--from-csv", "{a_dir}"], ["a-dir", "is a directory"]),
    ("study-file-a-directory", ["study", "{a_dir}", *DRY], ["a-dir", "is a directory"]),
    ("cost-prices-fifo", ["cost", "--list", "--prices", "{fifo}"], ["pipe.csv", "FIFO"]),
    ("text-train-src-a-directory", ["--data", "text", "--model", "rnnlm-tiny", "--train-src", "{a_dir}", *DRY],
     ["a-dir", "is a directory", "--train-src"]),
    # ---- item 10: prep refuses what it can check before it makes a run directory ----------------------
    ("prep-train-missing", ["prep", "--model", "rnnlm-tiny", "--train", "{tmp}/absent.txt", "--out", "{tmp}/shards"],
     ["absent.txt", "--train"]),
    ("prep-train-a-directory", ["prep", "--model", "rnnlm-tiny", "--train", "{a_dir}", "--out", "{tmp}/shards"],
     ["a-dir", "is a directory"]),
]


ISSUE27_CASES = {c[0] for c in CASES[FIRST_ISSUE27_CASE:]}


def _fill(args: list[str], paths: dict[str, str]) -> list[str]:
    return [re.sub(r"\{([\w.\-]+)\}", lambda m: paths[m.group(1)], a) for a in args]


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("bad-inputs")
    found = _fixtures(tmp)
    mounted: list[Path] = []
    try:
        filesystems, mounted, why = _small_filesystems(tmp, mounted)
        yield {**found, **filesystems, "no_filesystems": why}
    finally:
        for mnt in mounted:
            subprocess.run(["umount", str(mnt)], check=True)


def test_the_table_is_large_and_covers_every_command() -> None:
    assert len(CASES) >= 80
    assert len({c[0] for c in CASES}) == len(CASES), "case ids must be unique"
    commands = {c[1][0] for c in CASES if not c[1][0].startswith("-")}
    assert {"sweep", "report", "cost", "plan", "study", "status", "logs", "cancel", "resume", "ls", "bench", "prep",
            "aws"} <= commands


@pytest.mark.parametrize("case, args, words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_one_clear_message(case, args, words, paths, monkeypatch, capsys, tmp_path) -> None:
    if any(f"{{{fs}}}" in a for a in args for fs in ("ro", "full")) and paths["no_filesystems"]:
        pytest.skip(paths["no_filesystems"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    argv = _fill(args, paths)
    if "--runs-dir" not in argv and argv[0] not in ("report", "cost", "plan", "status", "logs", "cancel", "resume",
                                                    "bench", "aws"):
        argv += ["--runs-dir", str(tmp_path / "runs")]
    code, err, stdout = run_entry(argv, monkeypatch, capsys)
    out = SimpleNamespace(err=err, out=stdout)
    text = " ".join((out.err + out.out).split()).lower()
    assert code != 0, f"{case}: accepted (exit 0); output:\n{out.out[-1500:]}{out.err[-1500:]}"
    assert "traceback" not in text, f"{case}: traceback:\n{out.err[-3000:]}"
    for word in words:
        assert word.lower() in text, f"{case}: {word!r} not in the message:\n{out.err[-1500:]}"
    if case in ISSUE27_CASES:
        assert len(out.err.strip().splitlines()) == 1, f"{case}: not one line:\n{out.err[-1500:]}"
    for runs in (tmp_path / "runs", Path(paths.get("full", tmp_path)) / "runs"):
        assert not runs.exists() or not any(runs.iterdir()), f"{case}: left {list(runs.iterdir())}"
    if any("{full}" in a for a in args):  # what a failed write left on the full filesystem: nothing
        assert {p.name for p in Path(paths["full"]).iterdir()} <= {"filler", "run", "runs"}, f"{case}: left files"
        assert sorted(p.name for p in (Path(paths["full"]) / "run").iterdir()) == ["launch.json", "records", "spec.json"]


def test_every_message_is_one_line_for_spec_errors(paths, monkeypatch, capsys, tmp_path) -> None:
    """A spec error is one line (the message), not a wall of text."""
    from scalelab.launcher.cli import entry

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["launch", "--spec", paths["lr-nan.yaml"], "--dry-run"])
    with pytest.raises(SystemExit):
        entry()
    err = capsys.readouterr().err.strip()
    assert err.startswith("launch: error:") and len(err.splitlines()) == 1, err
    json.dumps(err)  # printable


# ---- a --name that is shell text: dry runs print what a real run would submit (issue #27 item 8) ----

HOSTILE_NAME = "x\ntouch /tmp/scalelab-pwned $(id)"
DRY_BACKENDS = [("local", []), ("slurm", []), ("aws", ["--bucket", "bkt", "--region", "us-east-1"])]


@pytest.mark.parametrize("backend, extra", DRY_BACKENDS, ids=[b for b, _ in DRY_BACKENDS])
def test_dry_run_sanitises_the_name_like_a_real_run(backend, extra, monkeypatch, capsys, tmp_path) -> None:
    """The dry run's run directory and id go through `run_name`, as `new_run_dir` does: no line of the
    rendered request (shell command, batch script, EC2 user data) is the name's second line."""
    from scalelab.core.rundir import run_name
    from scalelab.launcher.cli import entry

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["launch", "--backend", backend, *extra, "--name", HOSTILE_NAME, "--dry-run",
                                      "--runs-dir", str(tmp_path / "runs")])
    try:
        entry()
    except SystemExit as exc:
        assert not exc.code, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"{run_name(HOSTILE_NAME)}-DRYRUN" in out
    assert run_name(HOSTILE_NAME) == "x-touch-tmp-scalelab-pwned-id"
    assert not [line for line in out.splitlines() if line.lstrip().startswith("touch")]
    assert "$(id)-DRYRUN" not in out
    # the name itself appears only as the spec's JSON string (escaped, on one line), never as shell text
    assert all(re.search(r"x\\+ntouch /tmp/scalelab-pwned \$\(id\)", line) for line in out.splitlines() if "$(id)" in line)
    assert not (tmp_path / "runs").exists()


def test_no_planted_link_was_followed(paths, monkeypatch) -> None:
    """After the link cases of the table (or on their own): the files the links point to are unchanged."""
    from scalelab.launcher.cli import entry

    for argv in (["report", "--from-csv", paths["good.csv"], "--out", paths["linked_out"]],
                 ["report", paths["linked_records_run"]]):
        monkeypatch.setattr(sys, "argv", ["launch", *argv])
        with pytest.raises(SystemExit) as exc:
            entry()
        assert exc.value.code != 0
    assert Path(paths["victim"]).read_text() == "precious\n"


def test_a_rank_killed_by_a_signal_is_128_plus_n() -> None:
    """issue #27 item 10: the local backend's exit codes are the shell's (143 for SIGTERM), not Popen's -15."""
    import signal

    from scalelab.launcher.local import shell_status

    assert shell_status(-signal.SIGTERM) == 143
    assert shell_status(-signal.SIGKILL) == 137
    assert shell_status(0) == 0 and shell_status(2) == 2 and shell_status(None) is None


def test_a_fifo_given_as_a_csv_is_refused_without_opening_it(paths, monkeypatch, capsys) -> None:
    """issue #27 item 10: `report --from-csv FIFO` blocked forever in open(); now refused at once (the
    timeout of this test's subprocess is the hang it guards against)."""
    done = subprocess.run([sys.executable, "-c", "from scalelab.launcher.cli import entry; entry()", "report",
                           "--from-csv", paths["fifo"]], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "FIFO" in done.stderr and "Traceback" not in done.stderr
