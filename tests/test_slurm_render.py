"""The Slurm backend without a cluster: the script submitit renders (golden files), what is sent, options,
the per-rank mapping.

Golden files live in tests/golden/slurm/; after an intended change of the script, regenerate them with
`SCALELAB_UPDATE_GOLDEN=1 python -m pytest tests/test_slurm_render.py` and review the diff.
The end-to-end behaviour on a real Slurm cluster is in tests/test_slurm_cluster.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from submitit.core.utils import DelayedSubmission
from submitit.slurm.slurm import SlurmJobEnvironment

from scalelab.core.errors import ScalelabError, SpecError
from scalelab.core.spec import Spec
from scalelab.launcher.runner import submit
from scalelab.slurm.backend import SlurmBackend
from scalelab.slurm.rank import RankJob, Task, horovod_hostname_problem, own_gpu, rank_env
from tests.conftest import assert_golden, launch

GOLDEN = Path(__file__).parent / "golden" / "slurm"
RUN_DIR = Path("/shared/runs/nmt-2x4-20250101-000000")
PYTHON = "/opt/venv/bin/python"

CASES = {
    "ddp-2x4-every-option": (
        dict(engine={"name": "ddp"}, nodes=2, gpus_per_node=4, threads=2),
        dict(partition="gpu", account="proj42", qos="high", constraint="v100", exclusive=True, cpus_per_task=2,
             mem_gb=64, time="2-00:00:00", job_name="nmt-scaling", extra_sbatch=["--mail-type=END"],
             setup=["module load cuda/12.1"], gloo_iface="ib0", signal_s=300),
    ),
    "horovod-2x4-defaults": (dict(engine={"name": "horovod"}, nodes=2, gpus_per_node=4), {}),
    "ddp-2x2-gpu-type": (dict(engine={"name": "ddp"}, nodes=2, gpus_per_node=2), dict(gpu_type="v100", partition="gpu")),
    # 2 workers and a parameter-server task per node: --ntasks-per-node=3, still two GPUs
    "ps-separate-2x2": (dict(engine={"name": "ps", "ps_placement": "separate"}, nodes=2, gpus_per_node=2), {}),
    "single-1x1-cpu-cluster": (
        dict(engine={"name": "single"}, nodes=1, gpus_per_node=1),
        dict(gres_gpus=False, requeue=False, mem_gb=1.5, time=""),
    ),
}
REPEATS = [RUN_DIR.parent / f"1x2-r{i}" for i in range(3)]  # `launch sweep --layouts 1x2 --repeats 3`


def render_case(name: str) -> str:
    spec_fields, options = CASES[name]
    spec = Spec.from_dict(spec_fields).validate()
    return SlurmBackend({**options, "python": PYTHON}).submit_dryrun(spec, RUN_DIR).render()


def render_array() -> str:
    spec = Spec.from_dict(dict(engine={"name": "ddp"}, nodes=1, gpus_per_node=2)).validate()
    (request,) = SlurmBackend({"python": PYTHON}).submit_dryrun_batch(spec, REPEATS)
    return request.render()


@pytest.mark.parametrize("name", sorted(CASES))
def test_script_matches_golden_file(name: str) -> None:
    assert_golden(GOLDEN / f"{name}.sbatch", render_case(name))


def test_repeats_are_one_job_array_matching_its_golden_file() -> None:
    script = render_array()
    assert_golden(GOLDEN / "ddp-1x2-repeats-3.sbatch", script)
    assert "#SBATCH --array=0-2%3" in script and "/1x2-rN-slurm/%A_%a_%t_log.out" in script


@pytest.mark.parametrize("name", [*sorted(CASES), "array"])
def test_script_is_valid_bash(name: str, tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(render_array() if name == "array" else render_case(name))
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_rendering_is_pure_and_follows_the_layout() -> None:
    spec = Spec.from_dict(dict(engine={"name": "ddp"}, nodes=3, gpus_per_node=2, global_batch=12)).validate()
    backend = SlurmBackend({"python": PYTHON})
    first = backend.submit_dryrun(spec, RUN_DIR).render()
    assert first == backend.submit_dryrun(spec, RUN_DIR).render()
    lines = [line for line in first.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --nodes=3" in lines and "#SBATCH --ntasks-per-node=2" in lines
    assert "#SBATCH --gpus-per-node=2" in lines and "#SBATCH --signal=USR1@120" in lines
    assert f"#SBATCH --output={RUN_DIR}/slurm/%j_0_log.out" in lines
    assert f"-m submitit.core._submit {RUN_DIR}/slurm" in first  # every task runs the pickled rank function


# ---- what is sent: submitit's submission, with sbatch on PATH a stand-in that records it ----------

FAKE_SBATCH = """#!/bin/bash
echo "$@" >> "$FAKE_SLURM/calls"
if [ "$1" = --test-only ]; then
  case "$(cat "$2")" in *nosuchpartition*) echo "sbatch: error: invalid partition specified: nosuchpartition" >&2; exit 1;; esac
  echo "sbatch: Job 4242 to start at now using 2 processors on nodes node1 in partition debug" >&2; exit 0
fi
cp "$1" "$FAKE_SLURM/sent.sbatch"; echo "Submitted batch job 4242"
"""


@pytest.fixture
def fake_sbatch(tmp_path: Path, monkeypatch) -> Path:
    where = tmp_path / "fake-slurm"
    where.mkdir()
    (where / "sbatch").write_text(FAKE_SBATCH)
    (where / "sbatch").chmod(0o755)
    monkeypatch.setenv("FAKE_SLURM", str(where))
    monkeypatch.setenv("PATH", f"{where}{os.pathsep}{os.environ['PATH']}")
    return where


def test_what_is_sent_is_the_dry_run_and_the_rank_function(fake_sbatch: Path, tmp_path: Path) -> None:
    spec = Spec.from_dict(dict(backend="slurm", engine={"name": "ddp"}, nodes=1, gpus_per_node=2,
                               backend_options={"max_requeues": 2})).validate()
    backend, run_dir = SlurmBackend(spec.backend_options), tmp_path / "run"
    run_dir.mkdir()
    printed = backend.submit_dryrun(spec, run_dir).render()
    submit(backend, spec, run_dir)
    assert (fake_sbatch / "sent.sbatch").read_text() == printed, "sbatch got exactly what --dry-run prints"
    calls = (fake_sbatch / "calls").read_text().splitlines()
    assert len(calls) == 2 and calls[0].startswith("--test-only "), "asked first, then sent once"
    info = json.loads((run_dir / "launch.json").read_text())
    assert info["job_id"] == "4242" and info["runs"] == [{"job_id": "4242", "folder": str(run_dir / "slurm")}]
    sent = DelayedSubmission.load(run_dir / "slurm" / "4242_submitted.pkl").function  # what every task calls
    assert isinstance(sent, RankJob) and (sent.run_dir, sent.requeues_left) == (run_dir, 2)
    again = sent.checkpoint().function  # Checkpointable: what runs after a requeue
    assert isinstance(again, RankJob) and (again.run_dir, again.requeues_left) == (run_dir, 1)


def test_a_refusal_of_test_only_queues_nothing(fake_sbatch: Path, tmp_path: Path) -> None:
    spec = Spec.from_dict(dict(backend="slurm", nodes=1, gpus_per_node=1)).validate()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(ScalelabError, match="invalid partition specified: nosuchpartition.*sinfo -s"):
        submit(SlurmBackend({"partition": "nosuchpartition"}), spec, run_dir)
    assert len((fake_sbatch / "calls").read_text().splitlines()) == 1 and not (fake_sbatch / "sent.sbatch").exists()
    assert not list((run_dir / "slurm").glob("*.pkl")), "nothing pickled for a job that was never sent"


def test_unknown_option_fails_listing_the_valid_ones() -> None:
    with pytest.raises(SpecError) as err:
        SlurmBackend({"partiton": "gpu"})
    message = str(err.value)
    assert "partiton" in message
    for valid in SlurmBackend.Options():
        assert valid in message


@pytest.mark.parametrize("options, words", [
    ({"partition": "gpu big"}, "partition"),
    ({"cpus_per_task": 0}, "cpus_per_task"),
    ({"exclusive": "maybe"}, "exclusive"),
    ({"mem_gb": -1}, "mem_gb"),
    ({"extra_sbatch": ["mail-type=END"]}, "--sbatch-arg"),
    ({"extra_sbatch": ["--comment=a\n#SBATCH --x"]}, "extra_sbatch"),
])
def test_invalid_option_values_fail_at_configuration(options: dict, words: str) -> None:
    with pytest.raises(SpecError, match=words):
        SlurmBackend(options)


def test_dry_run_prints_the_script_and_submits_nothing(tmp_path: Path) -> None:
    env = {"PATH": os.path.dirname(sys.executable)}  # no sbatch, squeue or scancel on PATH: nothing can be sent
    done = launch("--backend", "slurm", "--nodes", "2", "--gpus-per-node", "4", "--engine", "horovod",
                  "--partition", "debug", "--time", "10", "--runs-dir", str(tmp_path / "runs"), "--dry-run",
                  cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("#!/bin/bash")
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --partition=debug", "#SBATCH --time=10"):
        assert line in done.stdout
    assert "slurm.rendezvous" in done.stdout
    assert not (tmp_path / "runs").exists(), "a dry run must not create a run directory"


@pytest.mark.parametrize("time, signal_s, longest", [("1", None, 30), ("2", None, 60), ("3", None, 90),
                                                     ("0:04:00", 150, 120), ("1-00", 50000, 43200)])
def test_a_time_limit_the_warning_signal_would_fill_is_refused_with_the_signal_to_give(tmp_path, time, signal_s,
                                                                                        longest) -> None:
    """Before: `--time 1` with the default warning (USR1 120 s before the limit) was sent; the ranks got USR1 as
    they started, checkpointed and requeued at once, 3 times, then FAILED. Now the warning may take at most half
    the limit, so every start trains at least as long; a dry run is refused alike, naming signal_s to give."""
    extra = ["--backend-opt", f"signal_s={signal_s}"] if signal_s is not None else []
    done = launch("--backend", "slurm", "--time", time, *extra, "--runs-dir", str(tmp_path / "runs"), "--dry-run",
                  cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("launch: error: --time"), done.stderr
    assert "time-limit warning" in lines[0] and f"--backend-opt signal_s={longest}" in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("time, signal_s", [("4", None), ("1", 30), ("0:03:30", 100), ("", None), ("UNLIMITED", None),
                                            ("1:00:00", None), ("10", 0)])
def test_a_time_limit_with_room_before_the_warning_is_taken(tmp_path, time, signal_s) -> None:
    extra = ["--backend-opt", f"signal_s={signal_s}"] if signal_s is not None else []
    done = launch("--backend", "slurm", "--time", time, *extra, "--runs-dir", str(tmp_path / "runs"), "--dry-run",
                  cwd=tmp_path)
    assert done.returncode == 0 and f"--signal=USR1@{120 if signal_s is None else signal_s}" in done.stdout, done.stderr


def test_slurm_flags_are_rejected_with_another_backend(tmp_path: Path) -> None:
    done = launch("--backend", "local", "--partition", "gpu", "--dry-run", cwd=tmp_path)
    assert done.returncode == 2
    assert "--partition is an option of --backend slurm" in done.stderr
    assert "Traceback" not in done.stderr


# ---- scalelab/slurm/rank.py: submitit's JobEnvironment -> the engines' variables ---------------------------

def task(procid: int, nodes: int = 2, per_node: int = 4) -> Task:
    return Task(procid, nodes * per_node, procid % per_node, procid // per_node, nodes,
                tuple(f"node{i + 1}" for i in range(nodes)), "77")


RDZV = {"SCALELAB_RDZV_ADDR": "node1", "SCALELAB_RDZV_PORT": "29400"}


def test_the_task_is_what_submitits_job_environment_says(monkeypatch) -> None:
    for key, value in {"SLURM_JOB_ID": "77", "SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2",
                       "SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "node[1-2]"}.items():
        monkeypatch.setenv(key, value)
    got = Task.of(SlurmJobEnvironment())
    assert got == task(6) and (got.local_world, got.hostname) == (4, "node2")


def test_ddp_variables() -> None:
    env = rank_env(task(6), "ddp", RDZV)
    assert env["RANK"] == "6" and env["WORLD_SIZE"] == "8"
    assert env["LOCAL_RANK"] == "2" and env["LOCAL_WORLD_SIZE"] == "4" and env["GROUP_RANK"] == "1"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("node1", "29400")
    assert not any(k.startswith("HOROVOD_") for k in env)


def test_horovod_variables() -> None:
    env = rank_env(task(5), "horovod", RDZV)
    assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"]) == ("5", "8")
    assert (env["HOROVOD_LOCAL_RANK"], env["HOROVOD_LOCAL_SIZE"]) == ("1", "4")
    assert (env["HOROVOD_CROSS_RANK"], env["HOROVOD_CROSS_SIZE"]) == ("1", "2")
    assert env["HOROVOD_HOSTNAME"] == "node2"
    assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"
    assert (env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], env["HOROVOD_GLOO_RENDEZVOUS_PORT"]) == ("node1", "29400")


def test_each_rank_sees_its_own_gpu() -> None:
    assert own_gpu({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 2, 4) == "6"
    assert own_gpu({"SLURM_GPUS_ON_NODE": "4"}, 3, 4) == "3"  # GPUs allocated, no device list
    assert own_gpu({}, 1, 2) is None


def test_a_node_with_fewer_gpus_than_ranks_is_refused_by_the_rank_and_a_pinned_rank_uses_cuda_0(monkeypatch) -> None:
    """Two ranks never share a GPU on Slurm either: the rank wrapper refuses with the one message; the ranks
    it pins (one GPU each, CUDA_VISIBLE_DEVICES) skip the engine's node check, which would count one GPU."""
    import torch

    from scalelab.core.devices import GPU_PINNED_ENV
    from scalelab.core.errors import SpecError
    from scalelab.core.spec import EngineSpec
    from scalelab.train.engines import Engine, Placement

    with pytest.raises(SpecError, match=r"4 ranks would run on node 1, but only 2 GPUs are visible there"):
        own_gpu({"CUDA_VISIBLE_DEVICES": "0,1"}, 3, 4, node=1)
    monkeypatch.setenv(GPU_PINNED_ENV, "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    engine = Engine(EngineSpec())
    engine.placement = Placement(rank=5, world=8, local_rank=1, local_world=4, node_rank=1)
    assert engine.device("auto") == torch.device("cuda", 0)
    assert rank_env(task(7), "ddp", {**RDZV, "CUDA_VISIBLE_DEVICES": "0,1,2,3"})["CUDA_VISIBLE_DEVICES"] == "3"
    assert "CUDA_VISIBLE_DEVICES" not in rank_env(task(7), "ddp", RDZV)


def test_a_non_block_distribution_is_refused() -> None:
    cyclic = Task(1, 8, 0, 1, 2, ("node1", "node2"), "77")  # rank 1 on the second node
    with pytest.raises(ValueError, match="block"):
        rank_env(cyclic, "horovod", RDZV)


@pytest.mark.parametrize("engine, names, says", [
    ("horovod", {"vm": "127.0.1.1", "node1": "10.0.0.1", "node2": "10.0.0.2"}, "resolves to 127.0.1.1, a loopback"),
    ("horovod", {"node1": "10.0.0.1", "node2": "10.0.0.2"}, "does not resolve"),
    ("horovod", {"vm": "10.0.0.2", "node1": "10.0.0.1", "node2": "10.0.0.2"}, None),  # the cluster's DNS
    ("horovod", {"vm": "127.0.0.1", "node1": "127.0.0.1", "node2": "127.0.0.1"}, None),  # two slurmd, one machine
    ("horovod", {"vm": "127.0.0.1"}, None),  # the node names do not resolve here: it cannot tell
    ("ddp", {"vm": "127.0.1.1", "node1": "10.0.0.1", "node2": "10.0.0.2"}, None),  # torch.distributed: MASTER_ADDR
])
def test_multi_node_horovod_on_hosts_named_as_loopback_is_refused_before_the_trainer(engine, names, says) -> None:
    """Horovod 0.28's Gloo listens on the address the host's name resolves to (scalelab/core/net.py):
    with a loopback name and a peer on another machine every rank would abort in hvd.init."""
    got = horovod_hostname_problem(task(5), engine, lookup=names.get, hostname="vm")
    if says is None:
        assert got is None
    else:
        assert got.startswith("node node2: this host's name 'vm' ") and says in got and "node1" in got
        assert "10.0.0.1" in got and "/etc/hosts" in got and got.endswith("or run this layout with --engine ddp")


def _raise(exc: Exception):
    raise exc


def test_the_rank_function_records_the_hostname_problem_and_starts_no_trainer(tmp_path: Path, monkeypatch) -> None:
    """Through RankJob itself, as srun runs it: an error record for the launcher, exit 2, no trainer."""
    import scalelab.slurm.rank as rank
    from scalelab.core.records import read_errors

    run = tmp_path / "run"
    (run / "records").mkdir(parents=True)
    (run / "spec.json").write_text(json.dumps({"engine": {"name": "horovod"}}))
    for key, value in {"SLURM_JOB_ID": "77", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
                       "SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "node[1-2]"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(rank.submitit, "JobEnvironment", SlurmJobEnvironment)
    monkeypatch.setattr(rank.socket, "gethostname", lambda: "vm")
    hosts = {"vm": "127.0.1.1", "node1": "10.0.0.1"}
    monkeypatch.setattr(rank.socket, "gethostbyname", lambda name: hosts.get(name) or _raise(OSError(name)))
    monkeypatch.setattr(rank, "run_trainer", lambda *a, **k: pytest.fail("the trainer was started"))
    with pytest.raises(SystemExit) as stop:
        RankJob(run, requeues_left=0)()
    assert stop.value.code == 2
    errors = read_errors(run)
    assert len(errors) == 1 and "'vm' resolves to 127.0.1.1, a loopback address" in errors[0]["message"]


def test_the_rank_function_passes_stop_signals_on(tmp_path: Path, monkeypatch) -> None:
    """TERM and USR1 to the task reach the trainer (here a stand-in `faketrain` that records what it got)."""
    fake = tmp_path / "fake" / "faketrain"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(
        "import os, signal, sys, time\n"
        "got = []\n"
        "for s in (signal.SIGTERM, signal.SIGUSR1): signal.signal(s, lambda n, f: got.append(n))\n"
        "open(sys.argv[1] + '/ready', 'w').close()\n"
        "while len(got) < 2: time.sleep(0.05)\n"
        "open(sys.argv[1] + '/got', 'w').write(' '.join(map(str, got)))\n"
        "sys.exit(143)\n")
    code = (f"import os, signal, sys, threading, time; sys.path.insert(0, {str(tmp_path / 'fake')!r})\n"
            "import scalelab.slurm.rank as rank; rank.TRAINER = ('-m', 'faketrain')\n"
            "from scalelab.slurm.rank import run_trainer\n"
            f"run = {str(tmp_path)!r}\n"
            "def send():\n"
            "    while not os.path.exists(run + '/ready'): time.sleep(0.05)\n"
            "    os.kill(os.getpid(), signal.SIGUSR1); time.sleep(0.2); os.kill(os.getpid(), signal.SIGTERM)\n"
            "threading.Thread(target=send).start()\n"
            "print(run_trainer(run, {}))\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'fake'}{os.pathsep}{Path(__file__).parents[1]}"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr((143, {signal.SIGUSR1.value, signal.SIGTERM.value}))
    assert (tmp_path / "got").read_text() == f"{signal.SIGUSR1} {signal.SIGTERM}"


def test_a_dry_run_sweep_with_repeats_prints_one_job_array_per_layout(tmp_path: Path) -> None:
    done = launch("sweep", "--backend", "slurm", "--layouts", "1x1,1x2", "--repeats", "2", "--runs-dir",
                  str(tmp_path / "runs"), "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("#!/bin/bash") == 2 and done.stdout.count("#SBATCH --array=0-1%1") == 2
    assert "sweep-nmt-tiny-strong-DRYRUN/1x2-rN-slurm/%A_%a_%t_log.out" in done.stdout  # the real sweep's name
    assert not (tmp_path / "runs").exists(), "a dry run must not create a run directory"


@pytest.mark.parametrize("extra, together", [
    ([], False),                                             # layouts share nodes: one after another
    (["--exclusive"], True),                                 # whole nodes each: at once
    (["--sbatch-arg=--dependency=afterok:7"], True),         # the user's own order: theirs alone
])
def test_a_sweeps_layouts_run_one_at_a_time_unless_they_get_whole_nodes(tmp_path: Path, extra, together) -> None:
    """Queued at once, a 1-worker and a 2-worker layout ran together on one node and the sweep reported a speedup
    of 24 on 2 workers. Without --exclusive every layout (and repeat) of a sweep has one job name and
    `--dependency=singleton`, so Slurm runs one at a time; a plain run is left alone."""
    done = launch("sweep", "--backend", "slurm", "--layouts", "1x1,1x2", "--repeats", "2", "--runs-dir",
                  str(tmp_path / "runs"), "--dry-run", *extra, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    names = set(re.findall(r"#SBATCH --job-name=(\S+)", done.stdout))
    if together:
        assert "--dependency=singleton" not in done.stdout and done.stdout.count("#SBATCH --array=0-1%2") == 2
        assert names == {"scalelab-1x1-r", "scalelab-1x2-r"}
    else:
        assert done.stdout.count("#SBATCH --dependency=singleton") == 2 and done.stdout.count("--array=0-1%1") == 2
        assert names == {"scalelab-sweep-nmt-tiny-strong-DRYRUN"}
    one = launch("run", "--backend", "slurm", "--runs-dir", str(tmp_path / "runs"), "--dry-run", cwd=tmp_path)
    assert one.returncode == 0 and "--dependency" not in one.stdout, one.stderr


@pytest.mark.parametrize("sacct, squeue, expected", [
    ("PENDING", "RUNNING", "RUNNING"),      # accounting lags the controller: the controller's word
    ("", "PENDING", "PENDING"),             # accounting does not know the job yet
    ("RUNNING", "PENDING", "RUNNING"),      # sacct's live state is kept (the watcher asked no squeue)
    ("CANCELLED by 0", "", "CANCELLED"),    # ended: accounting's word
    ("PENDING", "", "PENDING"),             # left the queue before squeue was asked: sacct's last word
    ("", "", "UNKNOWN"),
])
def test_job_state_prefers_the_controller_while_accounting_says_pending(monkeypatch, sacct, squeue, expected):
    """CI saw `launch status` say PENDING for a job whose ranks were writing steps: slurmdbd had not yet
    recorded the start. The state comes from the controller (the watcher's squeue answer) while sacct
    says PENDING or knows nothing; job_state itself never calls squeue (tests/test_slurm_watch.py
    counts when the watcher does)."""
    import scalelab.slurm.backend as sb

    class Watcher:
        queued = {"42": squeue} if squeue else {}

        def get_info(self, job_id: str, mode: str = "standard") -> dict[str, str]:
            return {"State": sacct, "NodeList": "n1"} if sacct else {}

    monkeypatch.setattr(sb, "need", lambda *_: None)
    monkeypatch.setattr(sb, "_slurm", lambda cmd, timeout=60: pytest.fail(f"job_state ran {cmd}"))
    backend = SlurmBackend()
    backend.watcher = Watcher()
    assert backend.job_state("42")[0] == expected


def test_a_run_submitted_before_the_warning_check_is_still_listed_and_read(tmp_path) -> None:
    """The check is a submission's, not the stored options': a run sent with `--time 2` and the default warning
    before it existed must still be listed and its backend built (`launch status`, `cancel`, `ls`), not refused."""
    from scalelab.core.rundir import start_state
    from scalelab.core.spec import Spec, save_spec
    from scalelab.launcher.backend import get_backend
    from scalelab.launcher.inventory import inventory

    run = tmp_path / "runs" / "old"
    run.mkdir(parents=True)
    spec = Spec(model="nmt-tiny", backend="slurm", backend_options={"time": "2"})
    save_spec(spec, run)
    start_state(run, backend="slurm", state="FAILED")
    backend = get_backend("slurm", spec.backend_options)  # what status, logs and cancel build
    assert backend.options["time"] == "2"
    (row,) = inventory(tmp_path / "runs")
    assert row["state"] == "FAILED" and row["layout"] == "1x1", row
    with pytest.raises(Exception, match="too short for the time-limit warning"):
        backend.submit_dryrun(spec, run)  # sending it again is refused, as a new run's is


def test_a_job_name_slurm_would_not_show_as_given_is_refused_with_one_it_would(tmp_path: Path) -> None:
    """`--job-name "my job"` became `my-job` without a word; now refused, naming the characters and a name to use."""
    done = launch("run", "--backend", "slurm", "--job-name", "my job/x", "--dry-run", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "not a space, '/': e.g. my-job-x" in done.stderr, done.stderr
    ok = launch("run", "--backend", "slurm", "--job-name", "my-job.1", "--dry-run", cwd=tmp_path)
    assert ok.returncode == 0 and "#SBATCH --job-name=my-job.1" in ok.stdout, ok.stderr
