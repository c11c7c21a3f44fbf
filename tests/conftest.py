"""Shared helpers: run the real `launch` CLI in a subprocess, find run directories, read records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A developer's own ~/.config/scalelab/config.yaml must not change what the tests see (scalelab/core/config.py);
# tests/test_config_file.py sets it where it tests the files.
os.environ.setdefault("SCALELAB_CONFIG", "off")
# OpenMP threads that wait for work sleep instead of spinning. The suite keeps both cores busy, and a rank with
# 2 intra-op threads then burned 3x the CPU and took 2.5x as long spinning (docs/benchmarks.md, "OpenMP's
# wait"); the result of every operation is the same (the threads and their share of the work do not change).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def launch(*args: str, cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """`launch ARGS...` exactly as a user runs it (through the console entry point).

    On a machine with fewer GPUs than a test's ranks (one H100), where `launch` rightly refuses two ranks
    on one GPU, a test that names no device runs its ranks on the CPU, as the refusal tells users to.
    """
    args = on_cpu_where_gpus_are_short(args)
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "scalelab.launcher.cli", *args], cwd=cwd, env=full_env,
        capture_output=True, text=True, timeout=timeout,
    )


# Fixed when conftest is imported (at collection), so a test that points TMPDIR elsewhere still takes the
# same lock as every other worker.
WHEEL_LOCK = Path(tempfile.gettempdir()) / "scalelab-test-wheel.lock"


@contextmanager
def wheel_build_lock() -> Iterator[None]:
    """Held while anything runs `pip wheel` of this checkout: pip builds in the source tree (ROOT/build),
    so xdist workers building at once would collide. build_wheel takes it, and so must a test whose
    launch builds the wheel itself (the AWS backend with wheel="")."""
    import fcntl

    with open(WHEEL_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_wheel(out: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """`pip wheel` of this project into `out`, one build at a time (wheel_build_lock)."""
    with wheel_build_lock():
        return subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                               "-w", str(out), str(ROOT)], capture_output=True, text=True, timeout=timeout)


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def on_cpu_where_gpus_are_short(args: tuple[str, ...]) -> tuple[str, ...]:
    """`args` plus `--device cpu` when they start more ranks on this machine than it has GPUs (>= 1)."""
    def value(flag: str) -> int:
        for i, a in enumerate(args[:-1]):
            if a == flag and args[i + 1].isdigit():
                return int(args[i + 1])
        return 1

    if "--device" in args or "--gpus-per-node" not in args:
        return args
    ranks = value("--nodes") * value("--gpus-per-node")
    gpus = visible_gpus() if ranks > 1 else 0
    return (*args, "--device", "cpu") if 0 < gpus < ranks else args


def made_once(tmp_path_factory, key: list[str], make: Callable[[Path], Path]) -> Path:
    """What `make(where)` returns, made once in the whole pytest run and then only read (or copied) by tests.

    Under pytest-xdist the first worker that asks makes it, under a file lock in the folder the workers'
    temporary folders share; a worker that asks meanwhile waits for it instead of making its own. A module
    fixture alone made it once per worker: an uninterrupted reference run (5-10 s of CPU) or a wheel, twice
    in most runs of the suite, on 2 cores that the suite keeps busy (docs/benchmarks.md). `key` names what
    is made (the module and the run's arguments); a `make` that failed is tried again by the next test."""
    import fcntl
    import hashlib
    import shutil

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "made-once"
    root.mkdir(exist_ok=True)
    name = hashlib.sha256("\0".join(key).encode()).hexdigest()[:16]
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = root / f"{name}.done"
        if done.exists():
            return Path(done.read_text())
        where = root / name
        shutil.rmtree(where, ignore_errors=True)  # what a failed `make` left
        where.mkdir()
        made = make(where)
        done.write_text(str(made))
        return made


def copy_made_once(tmp_path_factory, key: list[str], make: Callable[[Path], Path], name: str) -> Path:
    """A copy, in a folder of this module's own (`name`), of the folder `make(where)` fills and returns, made once
    in the pytest run (made_once): for tests that write where the made thing lies (a report into its sweep)."""
    import shutil

    copy = tmp_path_factory.mktemp(name) / "copy"
    shutil.copytree(made_once(tmp_path_factory, key, make), copy, symlinks=True)
    return copy


def launched_once(tmp_path_factory, prefix: str, *args: str) -> Path:
    """The run directory of `launch ARGS... --runs-dir runs`, launched once in the pytest run (made_once)."""
    def make(where: Path) -> Path:
        proc = launch(*args, "--runs-dir", "runs", cwd=where)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return only_run_dir(where / "runs")

    return made_once(tmp_path_factory, [prefix, *args], make)


def study_made_once(tmp_path_factory, recipe: Path, *args: str) -> tuple[Path, str]:
    """(the study directory, what `launch study RECIPE ARGS...` printed), run once in the pytest run (made_once) for
    the tests that only read its tables: seed 004's end to end was run by two files, 30 s of CPU each."""
    def make(where: Path) -> Path:
        proc = launch("study", str(recipe), *args, "--runs-dir", "runs", cwd=where, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (where / "stdout.txt").write_text(proc.stdout)
        return only_run_dir(where / "runs")

    study = made_once(tmp_path_factory, ["study", str(recipe), *args], make)
    return study, (study.parents[1] / "stdout.txt").read_text()


def runs_made_once(tmp_path_factory, spec: list[str], engines: dict[str, list[str]], prefix: str):
    """`get(engine)`: a run of `spec` on that engine, launched the first time any test of the pytest run asks
    for it and reused by every later one (made_once); tests that change a run work on copies."""
    return lambda engine: launched_once(tmp_path_factory, prefix, *spec, *engines[engine])


def only_run_dir(runs: Path) -> Path:
    dirs = [p for p in runs.iterdir() if p.is_dir()]
    assert len(dirs) == 1, f"expected one run directory in {runs}, found {dirs}"
    return dirs[0]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steps_of(run_dir: Path, rank: int = 0) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "records" / f"rank-{rank}.jsonl") if r["kind"] == "step"]


def horovod_available() -> bool:
    try:
        import horovod.torch as hvd  # noqa: F401
    except ImportError:
        return False
    return hvd.gloo_built()


needs_horovod = pytest.mark.skipif(
    not horovod_available(), reason="Horovod with PyTorch + Gloo is not installed: run scripts/build-horovod.sh"
)


@pytest.fixture
def needs_cpu_bf16() -> None:
    """Skip a test that trains the fused LSTM in bf16 on the CPU where this CPU cannot (AVX2 only: oneDNN
    builds no bf16 LSTM without AVX-512); it runs wherever the CPU can. `@pytest.mark.usefixtures`."""
    from scalelab.train.precision import cpu_bf16_problem

    if cpu_bf16_problem("fused"):
        pytest.skip("no native bf16 on this CPU: oneDNN's bf16 LSTM needs AVX-512 (BF16 or AMX for speed), "
                    "`launch --precision bf16` refuses to run here")


def fake_commands(where: Path, scripts: dict[str, str], monkeypatch) -> Path:
    """Stand-in executables (name -> bash script) in `where`, first on PATH; $FAKE_SLURM names the
    folder so the scripts can keep state and log their calls there."""
    where.mkdir(exist_ok=True)
    for name, text in scripts.items():
        (where / name).write_text(text)
        (where / name).chmod(0o755)
    monkeypatch.setenv("FAKE_SLURM", str(where))
    monkeypatch.setenv("PATH", f"{where}{os.pathsep}{os.environ['PATH']}")
    return where


def assert_golden(path: Path, text: str) -> None:
    """Compare generated text (a script, manifests, requests) with its golden file, showing a unified
    diff on mismatch. `SCALELAB_UPDATE_GOLDEN=1` rewrites the file instead: review the git diff."""
    import difflib

    if os.environ.get("SCALELAB_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if not path.exists():
        pytest.fail(f"golden file {path} is missing; SCALELAB_UPDATE_GOLDEN=1 writes it (then review it)")
    want = path.read_text()
    if text != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True), str(path), "generated now"))
        pytest.fail(f"generated output differs from {path} (SCALELAB_UPDATE_GOLDEN=1 rewrites it if intended):\n{diff}")


@pytest.fixture(scope="module")
def moto_url():
    """AWS APIs served by moto's server on loopback (shared/recipes/moto.md) for one test module."""
    moto_server = pytest.importorskip("moto.server", reason='moto server is not installed: pip install "moto[server]"')
    from scalelab.core.net import free_port

    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def fill(directory: Path) -> None:
    """Fill the filesystem of `directory` to its last block (a file named `filler`)."""
    fd = os.open(Path(directory) / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"x" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def mount_tmpfs(mnt: Path, size: int, read_only: bool = False) -> str:
    """Mount a tmpfs of `size` bytes (rounded up to pages) at `mnt`; '' on success, else why it cannot."""
    if os.geteuid() != 0:
        return "mounting a small tmpfs needs root; the injected variants cover the same paths"
    mnt.mkdir(exist_ok=True)
    opts = f"size={-(-size // 4096) * 4096}" + (",ro" if read_only else "")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mnt)], check=False,
                          capture_output=True, text=True)
    return "" if proc.returncode == 0 else f"this machine forbids mounting a tmpfs ({proc.stderr.strip()})"


@pytest.fixture
def small_fs(tmp_path):
    """`make(size, read_only=False)`: a tmpfs of `size` bytes mounted for the test; skips where mounting is
    forbidden. Read-only is a real read-only mount: root writes through chmod 0555, so that proves nothing."""
    mounted = []

    def make(size: int, read_only: bool = False):
        mnt = tmp_path / f"small-fs-{len(mounted)}"
        why = mount_tmpfs(mnt, size, read_only)
        if why:
            pytest.skip(why)
        mounted.append(mnt)
        return mnt

    yield make
    for mnt in mounted:
        subprocess.run(["umount", str(mnt)], check=True)


SLURM_SCRIPT = ROOT / "scripts" / "slurm-cluster.sh"
SLURM_LOCK = Path("/tmp/scalelab-test-slurm-cluster.lock")  # held while a worker checks or starts the cluster
SLURM_STARTED_BY = Path("/tmp/scalelab-test-slurm-cluster.started-by")  # the test run that started the cluster
TEST_RUN_ENV = "SCALELAB_TEST_RUN"  # one id per pytest run, set in the controller, inherited by xdist's workers


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller (or the one process without xdist)
        import uuid

        os.environ.setdefault(TEST_RUN_ENV, uuid.uuid4().hex)


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running two-node cluster, shared by both xdist workers: the first worker that needs it starts it
    (the other waits on the lock and finds it up); the run's controller stops it after every worker is done
    (pytest_sessionfinish below). The Slurm tests are not one xdist group: two at a time on the cluster took
    2/3 of the time they took one at a time beside the other tests (docs/benchmarks.md), and each test checks
    only its own jobs and processes. A cluster that was up before the run is left up."""
    import fcntl

    if not sys.platform.startswith("linux"):
        pytest.skip("the test Slurm cluster needs Linux")
    with SLURM_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if subprocess.run(["bash", str(SLURM_SCRIPT), "status"], capture_output=True, text=True).returncode != 0:
            done = subprocess.run(["bash", str(SLURM_SCRIPT), "start"], capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                subprocess.run(["bash", str(SLURM_SCRIPT), "stop"], capture_output=True, text=True, timeout=120)
                reason = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [f"exit code {done.returncode}"]
                pytest.skip(f"no Slurm cluster on this machine: {reason[0]}")
            SLURM_STARTED_BY.write_text(os.environ.get(TEST_RUN_ENV, ""))
    yield


def pytest_sessionfinish(session):
    """The controller stops the cluster this run started (no worker can know the other is done)."""
    if hasattr(session.config, "workerinput") or not SLURM_STARTED_BY.exists():
        return
    if SLURM_STARTED_BY.read_text() == os.environ.get(TEST_RUN_ENV):
        subprocess.run(["bash", str(SLURM_SCRIPT), "stop"], capture_output=True, text=True, timeout=300)
        SLURM_STARTED_BY.unlink(missing_ok=True)


# Modules whose tests mostly wait rather than compute, besides those on the Slurm cluster: stall timeouts.
WAITING_MODULES = ("tests/test_stalls.py",)


def pytest_collection_modifyitems(session, config, items):
    """The tests that mostly wait (on the Slurm cluster's scheduler, on a stall timeout) spread evenly among the
    other modules, which stay whole and in order (a module's tests that do not wait stay together). Why: in file
    order they came one after the other, so that for minutes all three workers waited on the cluster at once, the
    cores 17-47 % idle and the jobs queued behind each other's (docs/benchmarks.md, stop 65), where the suite is
    otherwise CPU-bound. A module with a waiting test and a module-scoped fixture moves whole, so that the fixture
    is made once; each module's waiting tests spread over the run, interleaved with the other modules' (a module's
    long waits at once left the cores idle). The order is the same in every xdist worker, as xdist requires."""
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    def waits(item) -> bool:
        return item.nodeid.split("::")[0] in WAITING_MODULES or "slurm_cluster" in getattr(item, "fixturenames", ())

    units, busy = [], []  # what moves as one: a waiting test, or a module with one and a module-scoped fixture
    for its in modules.values():
        if not any(waits(it) for it in its):
            busy.append(its)
        elif any(_module_scoped(it) for it in its):
            units.append(its)
        else:
            units += [[it] for it in its if waits(it)]
            if rest := [it for it in its if not waits(it)]:
                busy.append(rest)
    if not units or not busy:
        return
    # each module's waiting units spread over the whole run, not one module's after another's: test_stalls' cases
    # (30-40 s each, their ranks asleep) came within a minute of each other, all three workers waiting at once
    # with the cores 80 % idle (docs/benchmarks.md, stop 67). A stable sort on (k + phase) / n, the k-th of a module's
    # n units, interleaves the modules and keeps each one's own order; each module's phase in [0, 1) is its own
    # (golden-ratio steps), so that modules of one waiting test do not all land together in the middle.
    module_of = [unit[0].nodeid.split("::")[0] for unit in units]
    count, seen, where = Counter(module_of), Counter(), []
    phase = {module: (0.5 + j * 0.618034) % 1 for j, module in enumerate(count)}
    for module in module_of:
        where.append((seen[module] + phase[module]) / count[module])
        seen[module] += 1
    units = [unit for _, unit in sorted(zip(where, units), key=lambda wu: wu[0])]
    # the waiting tests at even steps through the first 85 % of the other modules: quick ones fill the end
    slots: dict[int, list] = {}
    for i, unit in enumerate(units):
        slots.setdefault(round((i + 0.5) * 0.85 * len(busy) / len(units)), []).extend(unit)
    items[:] = [item for i, module in enumerate(busy) for item in (*slots.pop(i, []), *module)]
    items.extend(item for unit in slots.values() for item in unit)


def _module_scoped(item) -> bool:
    """Whether `item` uses a module-scoped fixture (made again each time its module is come back to)."""
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(d.scope == "module" for defs in info.name2fixturedefs.values() for d in defs)


def run_entry(argv: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """`launch ARGV` in-process through the console entry point: (exit code, stderr, stdout)."""
    import sys as _sys

    from scalelab.launcher.cli import entry

    monkeypatch.setattr(_sys, "argv", ["launch", *argv])
    code = 0
    try:
        entry()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.err, out.out


# No xdist groups: scripts/test.sh's two workers take the tests one by one (`--dist loadgroup` with no
# group is that). Modules that make runs once (a module fixture) make them once per worker. Grouping such
# modules, or the Slurm cluster's tests, on one worker each was measured slower on 2 cores (25-27 min
# against 23-24: docs/benchmarks.md, "The xdist groups").
