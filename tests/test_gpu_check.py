"""`launch gpu-check` / scripts/gpu-check.sh (issue 36) on the CPU: its arguments, its refusal where there is
no CUDA device, the step runner's isolation and budgets, what it reads from its steps, and its summary.
What only a GPU can show (the figures themselves) is the check's own job; the one test here that needs a GPU
is marked `gpu` and runs in the check's tests step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalelab.launcher import gpucheck, offline
from scalelab.launcher.gpucheck import (
    FAILED, OK, OOM, SKIPPED, TIMEOUT, Outcome, Step, StepFailed, StepResult, build_steps, markdown, memory_figures,
    output_dirs, passed, read_refusal, read_run, read_tests, run_steps, select_steps, summarize, write_summary,
)

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def _cli(*args: str, env: dict | None = None, script: bool = False) -> subprocess.CompletedProcess:
    argv = ["bash", str(ROOT / "scripts" / "gpu-check.sh"), *args] if script else \
        [PY, "-m", "scalelab.launcher.cli", "gpu-check", *args]
    full = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHON": PY, "COLUMNS": "200", **(env or {})}
    return subprocess.run(argv, capture_output=True, text=True, env=full, timeout=120, cwd=ROOT)


# ---- arguments and the refusal without CUDA ------------------------------------------------------


@pytest.mark.parametrize("args, says", [
    (["--only", "device,nope"], "--only: unknown step(s) 'nope'; steps: device, matmul"),
    (["--skip", "tests", "--only", "tests"], "--only and --skip leave no step to run"),
    (["--total-s", "0"], "--total-s"),
    (["--out", "/dev/null"], "/dev/null"),
])
def test_bad_arguments_are_one_error_line(args, says, tmp_path):
    proc = _cli(*args, env={"OUT": str(tmp_path / "out")})
    errors = [line for line in proc.stderr.splitlines() if "launch: error:" in line]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(errors) == 1 and says in errors[0], proc.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was made


def test_without_cuda_the_script_says_so_in_one_line_and_fails(tmp_path):
    proc = _cli(script=True, env={"CUDA_VISIBLE_DEVICES": "", "OUT": str(tmp_path / "out")})
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1, proc.stdout + proc.stderr
    assert "launch: error: no CUDA device here" in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_driver_pytorch_cannot_use_is_named_in_the_one_line(monkeypatch):
    import warnings

    def broken() -> bool:
        warnings.warn("CUDA initialization: The NVIDIA driver on your system is too old (found version 11040)")
        return False

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    with pytest.raises(gpucheck.ScalelabError, match=r"sees none; CUDA initialization: The NVIDIA driver .* too old"):
        gpucheck.require_cuda()


def test_steps_are_chosen_in_their_order():
    assert select_steps("tests,device", None) == ["device", "tests"]
    assert select_steps(None, "bench,tests")[-1] == "seed-1440-full"
    with pytest.raises(gpucheck.SpecError, match="unknown step"):
        select_steps("", None)


def test_the_steps_cover_the_issue(tmp_path):
    steps = {s.name: s for s in build_steps(tmp_path)}
    seed = [s for name, s in steps.items() if name.startswith("seed-")]
    assert len(seed) == 6 and {"device", "matmul", "refusal", "ddp-nccl", "tests", "bench"} <= set(steps)
    for s in seed:
        argv = " ".join(s.argv)
        assert "--model nmt-seed --engine single" in argv and "--precision bf16" in argv and "--rnn fused" in argv
    assert {(s.argv[s.argv.index("--global-batch") + 1], s.argv[s.argv.index("--output-loss") + 1]) for s in seed} == {
        (b, loss) for b in ("360", "720", "1440") for loss in ("auto", "full")}
    assert "," not in steps["refusal"].env["CUDA_VISIBLE_DEVICES"]  # one GPU visible: two ranks must be refused
    assert "--gpus-per-node 2" in " ".join(steps["refusal"].argv)
    assert steps["tests"].cwd == ROOT and all((ROOT / f).exists() for f in gpucheck.GPU_TEST_FILES)
    assert "--engine ddp --gpus-per-node 1" in " ".join(steps["ddp-nccl"].argv)
    assert sum(s.budget_s for s in steps.values()) > gpucheck.TOTAL_S  # the deadline, not the sum, bounds the check


def test_every_file_with_gpu_marked_tests_is_run_by_the_check():
    marked = {f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py") if "pytest.mark.gpu" in p.read_text()}
    assert marked == set(gpucheck.GPU_TEST_FILES)


def test_the_summary_goes_to_out_and_the_work_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    target, work = output_dirs(None)
    assert target == tmp_path / "out" and tmp_path / "out" not in work.parents
    work.rmdir()
    target, work = output_dirs(str(tmp_path / "mine"))
    assert work == tmp_path / "mine" / "work"
    monkeypatch.delenv("OUT")
    target, _ = output_dirs(None)
    assert target.parent == Path("runs") and target.name.startswith("gpu-check-")


# ---- the step runner: each step isolated, each within its budget, all within the deadline ----------


def _step(name: str, code: str, read=lambda o: {"out": o.stdout.strip()}, budget: float = 60) -> Step:
    return Step(name, f"fake {name}", budget, [PY, "-c", code], read)


@pytest.mark.slow
def test_a_failing_crashing_or_overrunning_step_does_not_stop_the_others(tmp_path):
    child = tmp_path / "child.pid"

    def broken_read(outcome):
        return {}["missing"]  # a bug in reading: the step's failure, not the check's

    steps = [
        _step("fails", "import sys; print('boom', file=sys.stderr); sys.exit(3)", read=gpucheck.last_json),
        _step("overruns", f"import subprocess, time; p = subprocess.Popen(['sleep', '60'], start_new_session=True); "
                          f"open({str(child)!r}, 'w').write(str(p.pid)); time.sleep(60)", budget=15),
        _step("bad-read", "print('x')", read=broken_read),
        Step("no-program", "a command that is not there", 60, [str(tmp_path / "nothing")], lambda o: {}),
        _step("fine", "print('done')"),
    ]
    results = {r.name: r for r in run_steps(steps, total_s=300)}
    assert [r.status for r in results.values()] == [FAILED, TIMEOUT, FAILED, FAILED, OK]
    assert "exit 3" in results["fails"].error and "boom" in results["fails"].error
    # 15 s: the step must start Python and its child and write the pid before its budget ends (5 s could end
    # before that on a busy machine, leaving no child.pid to read below)
    assert "budget of 15 s" in results["overruns"].error and results["overruns"].seconds < 45
    assert not _alive(int(child.read_text()))  # its child too, in a session of its own as a run's ranks are
    assert "KeyError" in results["bad-read"].error or "missing" in results["bad-read"].error
    assert "could not run" in results["no-program"].error
    assert results["fine"].figures == {"out": "done"}


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie that no one has reaped yet does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_steps_with_too_little_of_the_deadline_left_are_skipped_not_started(tmp_path):
    marker = tmp_path / "ran"
    times = iter([0.0, 0.0, 95.0, 95.0])  # the deadline, then what is left before each step
    steps = [_step("first", "print(1)"), _step("second", f"open({str(marker)!r}, 'w')"), _step("third", "print(3)")]
    results = run_steps(steps, total_s=100, clock=lambda: next(times))
    assert [r.status for r in results] == [OK, SKIPPED, SKIPPED]
    assert not marker.exists() and "5 s of the check's 100 s were left" in results[1].error


def test_a_step_gets_no_more_than_what_is_left_of_the_deadline(tmp_path):
    times = iter([0.0, 98.5])  # 1.5 s left: under the step's 60 s budget
    results = run_steps([_step("slow", "import time; time.sleep(60)")], total_s=100, clock=lambda: next(times),
                        min_step_s=1)
    assert results[0].status == TIMEOUT and results[0].budget_s == pytest.approx(1.5)


# ---- what the steps' outputs are read as --------------------------------------------------------


def test_the_refusal_passes_only_as_one_line_before_any_rank(tmp_path):
    read = read_refusal(tmp_path / "runs")
    msg = ("launch: error: 2 ranks would run on this machine, but only 1 GPU is visible there (CUDA_VISIBLE_DEVICES=0), "
           "and two ranks cannot share one GPU; use --gpus-per-node 1 (one rank per GPU), or --device cpu ...")
    assert read(Outcome(2, "", msg + "\n", 3.0))["message"].startswith("2 ranks would run")
    with pytest.raises(StepFailed, match="it exited 0"):
        read(Outcome(0, "", "", 3.0))
    with pytest.raises(StepFailed, match="a traceback was printed"):
        read(Outcome(1, "", "Traceback (most recent call last):\n" + msg, 3.0))
    (tmp_path / "runs" / "r" / "records").mkdir(parents=True)
    (tmp_path / "runs" / "r" / "records" / "rank-0.jsonl").write_text("{}\n")
    with pytest.raises(StepFailed, match="ranks started"):
        read(Outcome(2, "", msg, 3.0))


def _fake_run(runs: Path, device: str, output_loss: str, peak: float, words: float) -> None:
    run = runs / "nmt-seed-single-1x1-x"
    (run / "records").mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"words_per_s": words, "peak_mem_bytes": peak, "mem_kind": "cuda",
                                                  "step_s_median": 0.05, "steps_measured": 5}))
    (run / "records" / "rank-0.jsonl").write_text(json.dumps({"kind": "start", "device": device, "output_loss": output_loss,
                                                              "gpu_model": "NVIDIA H100 80GB HBM3"}) + "\n")


def test_a_seed_run_is_read_against_launch_memorys_prediction(tmp_path):
    predicted = memory_figures(360, "compiled", None, None)["predicted_peak_gib"] * 2**30
    _fake_run(tmp_path / "a", "cuda:0", "compiled", 1.1 * predicted, 1.2e6)
    f = read_run(tmp_path / "a", 360, "auto")(Outcome(0, "", "", 40.0))
    assert f["predicted_for"] == "compiled" and f["peak_vs_predicted"] == pytest.approx(1.1)
    assert f["within_tolerance"] is True and f["words_target_met"] is True
    _fake_run(tmp_path / "b", "cuda:0", "full", 1.2 * memory_figures(360, "full", None, None)["predicted_peak_gib"] * 2**30, 4.7e5)
    f = read_run(tmp_path / "b", 360, "full")(Outcome(0, "", "", 40.0))
    assert f["within_tolerance"] is False and f["words_target_met"] is False
    _fake_run(tmp_path / "c", "cpu", "full", 1e9, 100.0)
    with pytest.raises(StepFailed, match="ran on cpu, not on the GPU"):
        read_run(tmp_path / "c", 720, "full")(Outcome(0, "", "", 40.0))


def test_an_out_of_memory_run_is_a_result_and_another_failure_is_not(tmp_path):
    oom = ("launch: error: rank 0: out of memory on cuda:0 (NVIDIA H100 80GB HBM3) at step 1 with a batch of 1440 "
           "per rank in bf16; it asked for 26.82 GiB more with 16.50 GiB free of 79.2 GiB; fixes: ...")
    f = read_run(tmp_path, 1440, "full")(Outcome(2, "", oom, 30.0))
    assert f["status"] == OOM and "26.82 GiB" in f["error"] and f["predicted_peak_gib"] > 80
    records = tmp_path / "runs" / "nmt-seed-single-1x1-x" / "records"
    records.mkdir(parents=True)
    (records / "rank-0.jsonl").write_text(json.dumps({"kind": "start"}) + "\n" + json.dumps(
        {"kind": "error", "message": "out of memory on cuda:0 at step 1 with a batch of 1440 per rank in bf16"}) + "\n")
    f = read_run(tmp_path / "runs", 1440, "auto")(Outcome(1, "", "run failed", 30.0))  # only the rank's record says it
    assert f["status"] == OOM and "batch of 1440" in f["error"] and f["predicted_for"] == "auto"
    with pytest.raises(StepFailed, match="exit 2: rank 0: NCCL error"):
        read_run(tmp_path, 1440, "full")(Outcome(2, "", "launch: error: rank 0: NCCL error", 30.0))


def test_the_tests_step_counts_and_names_failures():
    out = "E  assert 3 passed == 4\nFAILED tests/test_precision.py::test_x - AssertionError\n1 failed, 7 passed, 2 skipped, 40 deselected in 9s\n"
    f = read_tests(Outcome(1, out, "", 9.0))
    assert f["status"] == FAILED and f["failed"] == ["tests/test_precision.py::test_x"]
    assert f["counts"] == {"failed": 1, "passed": 7, "skipped": 2, "deselected": 40}
    assert read_tests(Outcome(0, "8 passed, 40 deselected in 9s\n", "", 9.0))["counts"]["passed"] == 8
    with pytest.raises(StepFailed, match="no test marked gpu"):
        read_tests(Outcome(5, "no tests ran", "", 1.0))


def test_the_bench_and_ddp_steps_are_read_from_what_they_wrote(tmp_path):
    (tmp_path / "bench").mkdir()
    rows = [{"preset": "nmt-small", "rnn": "fused", "precision": p, "batch": 64, "step_s": 0.01, "words_per_s": 6.4e5,
             "flops_per_s": 5e13, "efficiency_own": 0.1, "matmul_flops_per_s": 7.9e14} for p in ("fp32", "bf16")]
    (tmp_path / "bench" / "bench.json").write_text(json.dumps({"machine": {}, "compute": rows}))
    f = gpucheck.read_bench(tmp_path / "bench")(Outcome(0, "", "", 60.0))
    assert [r["precision"] for r in f["compute"]] == ["fp32", "bf16"] and f["compute"][0]["efficiency_own"] == 0.1
    with pytest.raises(StepFailed, match="exit 2: unknown bench part"):
        gpucheck.read_bench(tmp_path / "bench")(Outcome(2, "", "launch: error: unknown bench part(s) x", 1.0))
    _fake_run(tmp_path / "ddp", "cuda:0", "compiled", 2e9, 3e5)
    (tmp_path / "ddp" / "nmt-seed-single-1x1-x" / "logs").mkdir()
    (tmp_path / "ddp" / "nmt-seed-single-1x1-x" / "logs" / "node-0.log").write_text("x:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n")
    assert gpucheck.read_ddp(tmp_path / "ddp")(Outcome(0, "", "", 30.0))["nccl_version_seen"] == "2.28.9+cuda13.0"


# ---- the summary ----------------------------------------------------------------------------------


def _results() -> list[StepResult]:
    device = {"cuda_available": True, "torch": "2.11.0+cu130", "cuda_build": "13.0", "cudnn": 91900, "nccl": "2.28.9",
              "devices": [{"name": "NVIDIA H100 80GB HBM3", "total_memory_bytes": 85 * 10**9, "capability": "9.0",
                           "multiprocessors": 132}], "nvidia_smi": {"gpus": [{"driver_version": "580.159.04"}]}}
    matmul = {"n": 8192, "device": "NVIDIA H100 80GB HBM3", "tflops": {"fp32": 50.0, "tf32": 400.0, "bf16": 790.0, "fp16": 760.0},
              "best_tflops": {"fp32": 51.0, "tf32": 410.0, "bf16": 800.0, "fp16": 770.0},
              "reference_h100_tflops": gpucheck.REFERENCE_H100["matmul_tflops"]}
    seed = {"words_per_s": 1.05e6, "output_loss": "compiled", **memory_figures(360, "compiled", 7.0 * 2**30, 1.05e6)}
    oom = memory_figures(1440, "full", None, None)
    return [
        StepResult("device", "the GPU", OK, 4.0, 60, device),
        StepResult("matmul", "rates", OK, 9.0, 60, matmul),
        StepResult("seed-360-auto", "nmt-seed 360 auto", OK, 41.0, 90, seed),
        StepResult("seed-1440-full", "nmt-seed 1440 full", OOM, 30.0, 60, oom,
                   error="rank 0: out of memory on cuda:0 at step 1 | asked for 26.82 GiB"),
        StepResult("tests", "pytest -m gpu", FAILED, 20.0, 120, {"counts": {"failed": 1, "passed": 7},
                                                                   "failed": ["tests/test_x.py::test_y"]},
                   error="pytest exit 1: tests/test_x.py::test_y"),
        StepResult("bench", "launch bench", TIMEOUT, 180.0, 180, error="ran past its budget of 180 s and was stopped"),
        StepResult("refusal", "two ranks", SKIPPED, 0.0, 60, error="not started: 3 s of the check's 450 s were left"),
    ]


def test_the_summary_records_every_step_and_the_targets(tmp_path):
    results = _results()
    summary = summarize(results, 450, 1795744329.0, 444.0)
    files = write_summary(tmp_path / "out", summary, results)
    assert [f.name for f in files] == ["gpu-check.json", "gpu-check.md", "gpu-check.log"]
    data = json.loads(files[0].read_text())
    assert data["statuses"] == {OK: ["device", "matmul", "seed-360-auto"], OOM: ["seed-1440-full"], FAILED: ["tests"],
                                TIMEOUT: ["bench"], SKIPPED: ["refusal"]}
    assert data["targets"]["words_per_s"] == {"target": 1_000_000, "batch": 360, "measured": 1.05e6, "met": True}
    assert data["targets"]["memory"]["runs_compared"] == 1 and not passed(data)
    assert data["device"]["nccl"] == "2.28.9" and len(data["steps"]) == len(results)
    assert "== bench: timeout (180 s)" in files[2].read_text()


def test_the_markdown_shows_device_rates_runs_targets_and_failures(tmp_path):
    results = _results()
    md = markdown(summarize(results, 450, 1795744329.0, 444.0))
    assert "NVIDIA H100 80GB HBM3" in md and "driver 580.159.04" in md and "cuDNN 91900" in md
    assert "| tf32 | 400.0 | 410.0 | 409 |" in md
    seed_rows = [line for line in md.splitlines() if line.startswith(("| 360 ", "| 1440 "))]
    assert len(seed_rows) == 2 and "| 1,050,000 |" in seed_rows[0] and "| oom |" in seed_rows[1]
    assert "| 7.15 | yes |" in seed_rows[0] and "| 90.77 | no |" in seed_rows[1]  # 90 % of this GPU's 79.2 GiB
    assert all(row.count(" | ") == seed_rows[0].count(" | ") for row in seed_rows)
    assert "Target words/s >= 1,000,000 at batch 360 (`--output-loss auto`): met (1,050,000)." in md
    assert "**seed-1440-full** (oom): rank 0: out of memory on cuda:0 at step 1 \\| asked for 26.82 GiB" in md
    assert "**bench** (timeout)" in md and "**refusal** (skipped)" in md and "not every step ran to a result" in md
    assert "tests (failed): 1 failed, 7 passed; failed: tests/test_x.py::test_y" in md


def test_a_check_where_every_step_gave_a_result_passes_an_oom_included():
    results = [r for r in _results() if r.status in (OK, OOM)]
    summary = summarize(results, 450, 0.0, 100.0)
    assert passed(summary) and "every step ran to a result" in markdown(summary)
    results[2].figures["words_target_met"] = False
    assert "(`--output-loss auto`): NOT met (1,050,000)." in markdown(summarize(results, 450, 0.0, 100.0))


def test_the_command_writes_three_files_into_out_and_fails_when_a_step_did(tmp_path, monkeypatch):
    """The command's wiring with the GPU faked away: selection, $OUT, the files, the exit status."""
    from click.testing import CliRunner

    facts = {"cuda_available": True, "devices": []}
    fake = {"device": _step("device", f"import json; print(json.dumps({facts!r}))", read=gpucheck.read_device),
            "matmul": _step("matmul", "import sys; sys.exit(1)", read=gpucheck.last_json),
            "tests": _step("tests", "print('3 passed in 1s')", read=read_tests)}
    monkeypatch.setattr(gpucheck, "require_cuda", lambda: None)
    monkeypatch.setattr(gpucheck, "build_steps", lambda work: [fake[n] for n in ("device", "matmul", "tests")])
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    done = CliRunner().invoke(gpucheck.gpu_check_cmd, ["--only", "device,matmul"])
    assert done.exit_code == 1, done.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gpu-check.json", "gpu-check.log", "gpu-check.md"]
    data = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    assert data["statuses"][OK] == ["device"] and data["statuses"][FAILED] == ["matmul"]  # tests: not chosen
    assert "| matmul | fake matmul | FAILED |" in done.output
    done = CliRunner().invoke(gpucheck.gpu_check_cmd, ["--skip", "matmul", "--out", str(tmp_path / "mine")])
    assert done.exit_code == 0, done.output
    assert json.loads((tmp_path / "mine" / "gpu-check.json").read_text())["statuses"][OK] == ["device", "tests"]


# ---- the offline start: what is missing, and how to carry it --------------------------------------


def test_a_missing_package_is_named_with_how_to_carry_it(tmp_path, monkeypatch, capsys):
    lock = tmp_path / "requirements.lock"
    lock.write_text("click==8.5.1\nnumpy==2.4.6 ; python_full_version < '3.12'\nnumpy==2.5.5 ; python_full_version >= '3.12'\n")
    assert offline.missing({"json": "json", "no_such_module_gpu_check": "no-such-dist"}) == ["no-such-dist"]
    text = offline.carry_message(["click", "numpy"], lock)
    assert "\n" not in text and "-d .whl click==8.5.1 numpy`" in text  # numpy: a version per Python, pip picks
    assert "pip download --no-deps" in text and "-d .whl" in text and "install --no-index --no-deps .whl/*.whl" in text
    monkeypatch.setattr(offline, "NEEDED", {"no_such_module_gpu_check": "no-such-dist"})
    assert offline.main(["gpu-check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpu-check: missing Python package(s) no-such-dist")


def test_the_float32_setting_is_restored_after_the_tf32_rate():
    from scalelab.train.bench import matmul_rates

    before = torch.get_float32_matmul_precision()
    rows = matmul_rates(("fp32", "tf32"), repeats=1, warmup=0, n=64)
    assert [r["precision"] for r in rows] == ["fp32", "tf32"] and all(r["flops_per_s"] > 0 for r in rows)
    assert torch.get_float32_matmul_precision() == before


@pytest.mark.gpu
def test_the_gpu_check_measures_this_gpu():
    """On a GPU (the check's tests step): the device facts and every format's rate, tf32 included."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from scalelab.train.bench import device_facts, matmul_rates

    facts = device_facts()
    assert facts["cuda_available"] and facts["devices"] and facts["cudnn"]
    rows = {r["precision"]: r for r in matmul_rates(repeats=2, warmup=1, n=2048)}
    assert set(rows) == {"fp32", "tf32", "bf16", "fp16"} and rows["bf16"]["device"] == facts["devices"][0]["name"]
    assert rows["bf16"]["flops_per_s"] > rows["fp32"]["flops_per_s"]
