"""The shape of the code, checked: imports run one way, no file circles, short functions.

Layers, lowest first (docs/architecture.md): a package may import only from its own layer or below.
Imports inside functions count: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Each package and the packages it may import (besides itself).
LAYERS: list[str] = ["core", "train", "analysis", "costs", "launcher"]
BACKENDS = ["slurm", "k8s", "aws", "prep"]  # prep (`launch prep`) sits at the backends' level
ALLOWED: dict[str, set[str]] = {pkg: set(LAYERS[:i]) for i, pkg in enumerate(LAYERS)}
ALLOWED.update({b: set(LAYERS) for b in BACKENDS})
PACKAGES = set(ALLOWED)
MAX_FUNCTION_LINES = 80


TOP = "scalelab"  # the one importable package; its subpackages are the layers


def _modules() -> dict[str, Path]:
    """{"scalelab.core.spec": path, ...} for every module of every layer."""
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / TOP / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    assert {m.split(".")[1] for m in out} == PACKAGES, "a layer has no modules: has the package moved?"
    return out


def _layer(name: str) -> str | None:
    """The layer of an absolute module name ("scalelab.costs.cli" -> "costs"); None outside the project."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == TOP and parts[1] in PACKAGES else None


def test_nothing_but_the_package_is_top_level() -> None:
    """Everything importable lives under scalelab/ (issue #24): no old top-level folder came back."""
    stray = [p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists() and p.name not in (TOP, "tests")]
    assert not stray, f"top-level packages beside {TOP}: {stray}"
    assert not [n for n in PACKAGES if (ROOT / n).exists()]


def _imports(module: str, path: Path) -> set[str]:
    """Every module `module` imports, at any depth in the file (absolute names)."""
    found = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            found.add(prefix)
            found.update(f"{prefix}.{a.name}" for a in node.names)
    return found


def test_packages_import_downward_only() -> None:
    wrong = []
    for module, path in _modules().items():
        pkg = _layer(module)
        for name in _imports(module, path):
            top = _layer(name)
            if top is not None and top != pkg and top not in ALLOWED[pkg]:
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
            assert name.split(".")[0] not in PACKAGES, f"{path.relative_to(ROOT)} imports {name}: the old top-level name"
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(wrong))


def test_no_circles_between_files() -> None:
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        for name in _imports(module, path):
            # `from pkg import mod` names pkg.mod; keep the longest prefix that is one of our files
            parts = name.split(".")
            for k in range(len(parts), 0, -1):
                target = ".".join(parts[:k])
                if target in modules:
                    if target != module and not modules[target].name == "__init__.py":
                        graph[module].add(target)
                    break
    circles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for module in sorted(modules):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles between files:\n" + "\n".join(circles)


def _code_lines(node: ast.AST, source_lines: list[str]) -> int:
    """Lines of a function that are code: its docstring, blank lines and comments do not count."""
    body = node.body
    start = node.lineno
    doc = ast.get_docstring(node, clean=False)
    if doc is not None and body:
        start = body[0].end_lineno + 1
        body = body[1:]
    lines = source_lines[start - 1: node.end_lineno]
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


def test_functions_are_short_enough_to_read_at_once() -> None:
    long = []
    for module, path in _modules().items():
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = _code_lines(node, lines)
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines of code:\n" + "\n".join(long)


@pytest.mark.parametrize("backend,extra", [("slurm", []), ("k8s", ["--image", "example.org/scalelab:1"]), ("aws", ["--bucket", "scalelab-test", "--instance-type", "g3.8xlarge"])])
def test_dry_run_of_remote_backends_does_not_import_torch(backend: str, extra: list[str], tmp_path: Path) -> None:
    """Planning a cluster job on a laptop must not need PyTorch: the dry run imports none of it."""
    code = (
        "import sys\n"
        "from scalelab.launcher.cli import entry\n"
        "sys.argv = ['launch', '--backend', sys.argv[1], '--engine', 'ddp', '--nodes', '2', '--gpus-per-node', '2',\n"
        "            '--dry-run', '--runs-dir', sys.argv[2], *sys.argv[3:]]\n"
        "try:\n"
        "    entry()\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "heavy = sorted(m for m in ('torch', 'horovod') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    env = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1"}
    out = subprocess.run([sys.executable, "-c", code, backend, str(tmp_path), *extra], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout, out.stdout[-2000:]
