"""The engine a user's own script needs, read from its code before anything starts.

A Horovod script run with the default engine (ddp) started its ranks as torchrun does: `hvd.init()` found no
peers, every rank trained alone as rank 0 of 1, and the run COMPLETED with exit status 0. A DDP script under
--engine horovod failed in every rank with "environment variable RANK expected". Now: a script importing
horovod at its top gets horovod's starter when the engine is left at its default (one line says so), and is
refused with --engine ddp given; a script that calls init_process_group and imports no horovod is refused with
--engine horovod; a script importing horovod only inside an `if` (one written for both) is left alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import launch, needs_horovod, only_run_dir

HOROVOD_SCRIPT = """import horovod.torch as hvd
import torch

hvd.init()
print(f"rank {hvd.rank()} of {hvd.size()}", flush=True)
assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == hvd.size()
"""

DDP_SCRIPT = """import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))


if __name__ == "__main__":
    main()
"""

EITHER_SCRIPT = """import sys

if sys.argv[1:] == ["horovod"]:
    import horovod.torch as hvd
    hvd.init()
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@needs_horovod
@pytest.mark.slow
def test_a_horovod_script_left_at_the_default_engine_runs_as_one_horovod_job(tmp_path: Path) -> None:
    script = _write(tmp_path, "hv.py", HOROVOD_SCRIPT)
    done = launch("run", "--gpus-per-node", "2", "--script", str(script), cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hv.py:1 imports horovod: its ranks start as horovodrun starts them (--engine horovod)" in done.stderr
    out = done.stdout + done.stderr
    assert "rank 0 of 2" in out and "rank 1 of 2" in out and "of 1" not in out, out[-3000:]
    run = only_run_dir(tmp_path / "runs")
    assert '"horovod"' in (run / "spec.json").read_text()  # a resume starts it the same way


@pytest.mark.parametrize("name, text, engine, said, instead", [
    ("hv.py", '"""doc"""\n' + HOROVOD_SCRIPT, "ddp",
     "hv.py:2 imports horovod, but --engine ddp starts the ranks as torchrun does", "give --engine horovod"),
    ("dd.py", DDP_SCRIPT, "horovod", "dd.py:6 calls init_process_group and imports no horovod", "give --engine ddp"),
])
def test_a_script_and_an_engine_given_that_cannot_start_it_are_refused(tmp_path: Path, name, text, engine, said,
                                                                         instead) -> None:
    script = _write(tmp_path, name, text)
    done = launch("run", "--gpus-per-node", "2", "--engine", engine, "--script", str(script), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert said in done.stderr and instead in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()


def test_a_script_for_either_engine_and_a_ddp_script_keep_the_engine_given(tmp_path: Path) -> None:
    either = _write(tmp_path, "either.py", EITHER_SCRIPT)
    for engine in ("ddp", "horovod"):
        done = launch("run", "--gpus-per-node", "2", "--engine", engine, "--script", str(either), "--dry-run",
                      cwd=tmp_path)
        assert done.returncode == 0 and "imports horovod" not in done.stderr, done.stderr
    plain = launch("run", "--gpus-per-node", "2", "--script", str(_write(tmp_path, "dd.py", DDP_SCRIPT)),
                   "--dry-run", cwd=tmp_path)
    assert plain.returncode == 0 and "horovodrun" not in plain.stdout and "torch" in plain.stdout, plain.stderr


def test_a_horovod_module_is_read_as_its_file(tmp_path: Path) -> None:
    """`--module pkg.train` (python -m's way): the file it names is read, not imported."""
    _write(tmp_path, "pkg/__init__.py", "raise SystemExit('imported: the launcher must not run package code')\n")
    _write(tmp_path, "pkg/train.py", HOROVOD_SCRIPT)
    done = launch("run", "--gpus-per-node", "2", "--module", "pkg.train", "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "train.py:1 imports horovod" in done.stderr and "horovodrun" in done.stdout, done.stdout[-2000:]
    refused = launch("run", "--engine", "ddp", "--module", "pkg.train", "--dry-run", cwd=tmp_path)
    assert refused.returncode == 2 and "train.py:1 imports horovod, but --engine ddp" in refused.stderr
