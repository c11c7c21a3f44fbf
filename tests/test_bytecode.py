"""scripts/bytecode.py covers what a rank imports late, not only at start: without the bytecode of
torch._dynamo and sympy (about 800 modules, imported as the optimizer is built), every rank of a virtualenv
that has none compiles them from source (a 10-step 2-rank DDP launch: 29 s of CPU against 15 s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
import bytecode
have = bytecode.imported_sources(bytecode.ENTRY_MODULES)
assert any("/torch/_dynamo/" in f for f in have) and any("/sympy/" in f for f in have), "no dynamo, no sympy"
import torch
model = torch.nn.Linear(4, 4)
for opt in (torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.Adam(model.parameters())):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()  # torch.optim imports torch._dynamo here, lazily
late = {m.__file__ for m in list(sys.modules.values())
        if isinstance(getattr(m, "__file__", None), str) and m.__file__.endswith(".py")} - have
print("\\n".join(sorted(late)))
"""


@pytest.mark.slow
def test_an_optimizer_step_imports_nothing_the_bytecode_script_left_out() -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE, str(ROOT / "scripts")], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "", f"imported after the entry modules, so compiled from source by every rank:\n{done.stdout}"


def test_both_readme_commands_write_the_bytecode_after_installing_and_before_any_launch() -> None:
    """The README's first command ran its main job, and left the user's virtualenv, without bytecode: where
    PYTHONDONTWRITEBYTECODE=1 every later `launch` compiled pandas and PyTorch's compiler from source again
    (2.9x the CPU of a two-rank launch, docs/benchmarks.md 2026-12-03). Both commands call the script
    between the install and the first process that trains."""
    for script, first_run in (("setup.sh", "launch\" sweep"), ("test.sh", "-m pytest")):
        lines = (ROOT / "scripts" / script).read_text().splitlines()
        at = {what: next((i for i, line in enumerate(lines) if what in line and not line.lstrip().startswith("#")), None)
              for what in ("scripts/install.sh", "scripts/bytecode.py", first_run)}
        assert None not in at.values(), (script, at)
        assert at["scripts/install.sh"] < at["scripts/bytecode.py"] < at[first_run], (script, at)
