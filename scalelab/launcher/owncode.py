"""Your own training code as the ranks (`launch run|sweep --script FILE|--module MOD -- ARGS`, issue 34).

What the launcher decides before anything starts: the script is there and readable, it is not mixed
with a built-in preset (`--model`), and which folder holds its code (the script's own, or the working
directory for `--module`): the folder a remote backend ships (`code_files`: its files as git would
commit them, `.gitignore` respected, at most `MAX_CODE_BYTES`); and the working directory the ranks start in
(`workdir`: the launch's own, kept for every resume). The ranks run it through
scalelab/train/script.py; `scalelab.track` records.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from scalelab.core.engines import ENGINE_TABLE, HOROVODRUN
from scalelab.core.engines import engine as engine_facts
from scalelab.core.errors import SpecError
from scalelab.core.spec import Spec

MAX_CODE_BYTES = 50 * 1024 * 1024  # a script's folder shipped to cloud nodes: code, not data sets
ALWAYS_LEFT_OUT = {".git", "__pycache__", ".venv", "venv", "runs", ".mypy_cache", ".pytest_cache"}
TRACK_HINT = ("add `from scalelab import track` and call `track.step(items=N, loss=x)` after each optimizer step "
              "(examples/own-script/)")


def apply(spec: Spec, params: dict[str, Any]) -> Spec:
    """`spec` with the user's --script / --module resolved (absolute paths, the code's folder, the arguments
    after `--`), or refused with one line; a spec without either is returned as it is."""
    args = list(params.get("script_args") or ())
    if not spec.own_code:
        if args:
            raise SpecError(script_hint(args, _command_name()) or
                            f"unexpected arguments {' '.join(args)!r}: arguments after `--` go to your --script "
                            f"or --module; without one, `launch {_command_name()}` takes only options")
        return spec
    spec.check_code_names()  # an empty name, before it is resolved as a path (the working directory) or a module
    if params.get("model") and given("model"):  # a config file's default model is not a conflict
        raise SpecError(f"--model {params['model']} picks a built-in preset and --script/--module runs your own code; "
                        "give one of them")
    _drop_configured(spec, params)
    if params.get("spec_file") and not params.get("model"):
        from scalelab.core.spec import flag_words, read_yaml_mapping

        raw = flag_words(read_yaml_mapping(params["spec_file"], "spec file"))
        if "model" in raw:
            raise SpecError(f"spec file {params['spec_file']} names model {raw['model']}, a built-in preset, and your "
                            "own code (--script/--module) runs instead; remove one of them")
    if args:
        spec.script_args = args
    if spec.script:
        path = check_script(spec.script)
        spec.script, spec.script_dir = str(path), str(path.parent)
    else:
        spec.script_dir = spec.script_dir or os.getcwd()
        check_module(str(spec.module), Path(spec.script_dir))
        _check_module_syntax(str(spec.module), Path(spec.script_dir))
    _engine_for_code(spec)
    spec.workdir = os.getcwd()  # where the ranks run, now and on every resume (relative paths resolve there)
    spec.model = str(spec.script_label)  # the run's name, label and model column
    if params.get("steps") is None and spec.steps == Spec().steps:
        spec.steps = None  # the script decides its length; --steps only sets the progress bar's total
    elif params.get("steps") is not None and given("steps"):
        _note_steps(spec, int(params["steps"]), args)
    return spec


def _check_module_syntax(name: str, folder: Path) -> None:
    """The --module's own file (in `folder`; an installed one is not read) compiles, else one line, as a --script's
    (`check_syntax`)."""
    path = module_file(name, folder)
    if path is not None:
        shown = os.path.relpath(path, folder) if path.is_relative_to(folder) else str(path)
        check_syntax(path, f"--module {name} ({shown})", f"python -m py_compile {shown}")


def _note_steps(spec: Spec, steps: int, args: list[str]) -> None:
    """One line at the start where --steps is given to a script run whose own arguments (after `--`) do not say
    --steps: it only sets the progress bar's total. Why: `launch --script train_ddp.py --steps 10` ran the script's
    own 60 steps, exit 0, under a bar that read "step 60/10": the user meant the script's --steps."""
    if any(a == "--steps" or a.startswith("--steps=") for a in args):
        return
    from scalelab.core.terminal import make_console, prose_lines

    text = (f"--steps {steps} only sets the progress bar's total ({spec.script_label} decides its length); "
            f"script arguments go after `--`: launch {_command_name()} ... -- --steps {steps}")
    print(prose_lines("launch: note: ", text, make_console(stderr=True).width), file=sys.stderr, flush=True)


def _engine_for_code(spec: Spec) -> None:
    """Horovod's starter for code that imports horovod: under torchrun's variables `hvd.init()` finds no peers, and
    every rank trained alone, as rank 0 of 1, with exit status 0. An engine left at its default becomes horovod,
    said in one line; one chosen (--engine, a spec file) is refused, naming the import and the engine to give."""
    facts = engine_facts(spec.engine.name)
    path = Path(spec.script) if spec.script else module_file(str(spec.module), Path(spec.script_dir or "."))
    tree = _parsed(path) if path else None
    line = imports(tree, "horovod", top=True) if tree else None  # not one in an `if` or `try`: a script for both
    if tree and imports(tree, "horovod") is None and facts.starter == HOROVODRUN and \
            (call := calls(tree, "init_process_group")):
        raise SpecError(f"{path.name}:{call} calls init_process_group and imports no horovod, but --engine "
                        f"{spec.engine.name} starts the ranks as horovodrun does, without torchrun's RANK, WORLD_SIZE "
                        "and MASTER_ADDR; give --engine ddp (the ranks start as torchrun starts them)")
    if facts.one_worker and tree and (call := env_rendezvous(tree)):
        raise SpecError(f"{path.name}:{call} calls init_process_group, which reads torchrun's RANK, WORLD_SIZE and "
                        f"MASTER_ADDR, but --engine {spec.engine.name} starts one process without them; give --engine "
                        "ddp (with one worker, its rank starts as `torchrun --nproc-per-node 1` starts it)")
    if line is None or facts.starter == HOROVODRUN or facts.one_worker:
        return
    where = f"{path.name}:{line} imports horovod"
    if given("engine__name") or spec.engine.name != Spec().engine.name:
        raise SpecError(f"{where}, but --engine {spec.engine.name} starts the ranks as torchrun does: hvd.init() would "
                        "find no peers and every rank would train alone, as rank 0 of 1; give --engine horovod (the "
                        "ranks start as horovodrun starts them)")
    spec.engine.name = next(name for name, e in ENGINE_TABLE.items() if e.starter == HOROVODRUN)
    print(f"launch: {where}: its ranks start as horovodrun starts them (--engine {spec.engine.name})",
          file=sys.stderr, flush=True)


def _parsed(path: Path) -> ast.Module | None:
    """The Python file's syntax tree; None for one that cannot be read or parsed (its ranks will say why)."""
    try:
        return ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None


def env_rendezvous(tree: ast.Module) -> int | None:
    """The first line of an `init_process_group(...)` that always runs and reads torchrun's variables (no
    `init_method` other than env://, no `store`), or None. Always: a module's own statement, one in a function's body
    or under `if __name__ == "__main__"`, not one under another `if`, a `try` or a loop (a script that runs with or
    without torchrun: examples/own-script/train_ddp.py). Why: under --engine single such a script failed in its rank
    with "environment variable RANK expected, but not set"."""
    lines = [node.lineno for stmt in _always_run(tree.body) for node in ast.walk(stmt)
             if isinstance(node, ast.Call) and _reads_env(node)]
    return min(lines) if lines else None


def _always_run(body: list[ast.stmt]) -> list[ast.stmt]:
    """The simple statements of `body` that run whenever it does, with the bodies of functions and of a
    `__main__` guard (a function may only be called conditionally: a refusal then names --engine ddp, which runs it
    too)."""
    found: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += _always_run(stmt.body)
        elif isinstance(stmt, ast.If) and "__main__" in ast.unparse(stmt.test):
            found += _always_run(stmt.body)
        elif isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign, ast.Return)):
            found.append(stmt)
    return found


def _reads_env(call: ast.Call) -> bool:
    """Whether `call` is init_process_group(...) rendezvousing through torchrun's environment variables."""
    if "init_process_group" not in (getattr(call.func, "attr", None), getattr(call.func, "id", None)):
        return False
    words = {k.arg: k.value for k in call.keywords}
    method = words.get("init_method")
    env = method is None or (isinstance(method, ast.Constant) and str(method.value).startswith("env://"))
    return env and "store" not in words and not (len(call.args) > 1)


def calls(tree: ast.AST, name: str) -> int | None:
    """The first line calling a function or method `name` (`dist.init_process_group(...)`), or None."""
    lines = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
             and (getattr(node.func, "attr", None) == name or getattr(node.func, "id", None) == name)]
    return min(lines) if lines else None


def imports(tree: ast.Module, package: str, top: bool = False) -> int | None:
    """The first line importing `package` or one of its modules (`import horovod.torch as hvd`, `from horovod
    import torch`), or None; `top`: only the module's own statements (not an import inside an `if`, a `try` or a
    function, which a script that runs either way may have)."""
    lines = []
    for node in (tree.body if top else ast.walk(tree)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(name == package or name.startswith(package + ".") for name in names):
            lines.append(node.lineno)
    return min(lines) if lines else None


def module_file(name: str, folder: Path) -> Path | None:
    """The .py file `python -m NAME` runs from `folder` (a module's file, a package's __main__.py), or None."""
    where = [str(folder)]
    parts = name.split(".")
    for i, part in enumerate(parts):
        packages, modules = _found_in(where, part)
        if i == len(parts) - 1:
            py = [Path(m) for m in modules if m.endswith(".py")]
            main = [Path(p) / "__main__.py" for p in packages if (Path(p) / "__main__.py").is_file()]
            return (py or main or [None])[0]
        where = packages
    return None


def _is_file(word: str) -> bool:
    """Whether `word` names a file; False for what no path can be (`~nosuchuser`, a name too long, no access)."""
    try:
        return os.path.isfile(os.path.expanduser(word))
    except (OSError, RuntimeError, ValueError):
        return False


def script_hint(words: list[str], command: str = "run", whole: bool = False) -> str | None:
    """What to type where the first of `words` is a script given as torchrun and python take it (`launch train.py
    ARGS`, `launch run train.py`): a .py name or an existing file; else None. `whole`: `words` is the whole command
    line after `launch` (its other words are the script's, as torchrun reads them), not the arguments click left
    over from among options. Why: it was "no command 'train.py'", or "arguments after `--`" of a command line with
    no `--`."""
    from scalelab.core.errors import shell_word

    first = words[0] if words else ""
    if first.startswith("-") or not (first.endswith(".py") or _is_file(first)):
        return None
    if whole:
        rest = " -- " + " ".join(shell_word(w) for w in words[1:]) if words[1:] else ""
        example = f"launch {command} --script {shell_word(first)}{rest}"
    else:
        example = f"launch {command} [OPTIONS] --script {shell_word(first)} [-- SCRIPT_ARGS]"
    return f"{first}: your own script is given as --script, its arguments after `--`: `{example}`"


def _drop_configured(spec: Spec, params: dict[str, Any]) -> None:
    """Reset the built-in trainer's settings that came from a config file's default (`precision: bf16` in a
    project's scalelab.yaml): meant for its models, they reach no script, and are no conflict either (as a
    configured `model` is not); what the command line or the spec file gives is refused by `Spec.validate`."""
    from scalelab.core.spec import trainer_only_keys

    default = Spec()
    for key in trainer_only_keys():
        name = key.replace(".", "__")  # the click parameter of a dotted key (core.flags.param_name)
        if params.get(name) in (None, ()) or given(name):
            continue
        *path, last = key.split(".")
        owner, fresh = spec, default
        for part in path:
            owner, fresh = getattr(owner, part), getattr(fresh, part)
        setattr(owner, last, getattr(fresh, last))


def _command_name() -> str:
    """The command being run (`run`, `sweep`, `probe`), for its messages; `run` outside a click command."""
    import click

    ctx = click.get_current_context(silent=True)
    return ctx.info_name if ctx is not None and ctx.info_name else "run"


def given(name: str) -> bool:
    """True when the option `name` came from the command line (or no click command runs), not from a default or a
    config file's default (issue 35's ~/.config/scalelab/config.yaml)."""
    import click

    ctx = click.get_current_context(silent=True)
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return source is None or source.name not in ("DEFAULT", "DEFAULT_MAP")


def workdir(spec: Spec) -> Path | None:
    """The directory the ranks of a --script / --module run start in: the one its first `launch run` started in
    (recorded in spec.json as `workdir`), whatever directory `launch resume` is run from; None for the built-in
    trainer and a run recorded before `workdir` was (they run where the launcher does). A recorded directory that
    is gone is refused in one line: the script's relative paths (its outputs, its data) would resolve elsewhere."""
    if not spec.own_code or not spec.workdir:
        return None
    path = Path(spec.workdir)
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "no longer exists"
        raise SpecError(f"the working directory of this run, {path}, {what}: your {spec.script_label} ran there "
                        "(its relative paths, outputs and data resolve there), so it was not started elsewhere; "
                        f"recreate {path} (with the files the script reads), or set `workdir` in the run's spec.json "
                        "to the directory to run in")
    return path


def check_script(text: str) -> Path:
    """The script as an absolute path: an existing, readable file, else one line saying what it is."""
    given, path = text, Path(text).expanduser()
    if not path.exists():
        raise SpecError(f"--script {given}: no such file")
    if not path.is_file():
        raise SpecError(f"--script {given} is a directory or a special file, not a script")
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError as exc:
        raise SpecError(f"--script {given} cannot be read ({exc.strerror})") from None
    if b"\0" in head:
        raise SpecError(f"--script {given} is not a text file (binary); give the Python script itself")
    interpreter = head.split(b"\n", 1)[0][2:].strip().decode(errors="replace") if head.startswith(b"#!") else ""
    if _program(interpreter) in NOT_PYTHON:  # the ranks run it with Python (torchrun's default too)
        raise SpecError(f"--script {given} is a script for {interpreter!r}, not Python: its ranks run it with "
                        "Python; give the Python script it starts (its arguments after `--`)")
    check_syntax(path, f"--script {given}", f"python {given}")
    return path.resolve()


def check_syntax(path: Path, what: str, shows: str) -> None:
    """Refuse, in one line, Python code that cannot be compiled: a syntax error, bytes that are no UTF-8 text (nor
    in the encoding its coding line names). `what` names it (`--script x.py`), `shows` is the command that shows the
    error. Why: such a script started every rank, each printed the same traceback, and a FAILED run was left."""
    try:
        ast.parse(path.read_bytes(), filename=str(path))
    except OSError:
        return  # unreadable: check_script said so already; a module's file is left to its ranks
    except SyntaxError as exc:
        if str(exc.msg).startswith("(unicode error)"):
            raise SpecError(f"{what} is not Python source: line {exc.lineno} is not UTF-8 text; give the Python "
                            "script itself (or name its encoding in a `# -*- coding: NAME -*-` line)") from None
        raise SpecError(f"{what}: line {exc.lineno}: {exc.msg}: fix the script (`{shows}` shows it)") from None
    except ValueError:  # a NUL byte past the start of the file
        raise SpecError(f"{what} is not a text file (binary); give the Python script itself") from None


# Interpreters whose scripts are surely no Python: only these are refused. A Python script's line may name
# another program (`#!/usr/bin/env -S uv run --script`, pypy3, `pixi exec`), and is run with Python all the same.
NOT_PYTHON = frozenset({"sh", "bash", "zsh", "dash", "ksh", "csh", "tcsh", "fish", "perl", "ruby", "node", "Rscript",
                        "julia", "lua", "php", "awk"})


def _program(interpreter: str) -> str:
    """The program a `#!` line runs: its first word's name, or after `env` (and its options) the word env starts."""
    words = interpreter.split()
    while words and (Path(words[0]).name == "env" or words[0].startswith("-")):
        words = words[1:]
    return Path(words[0]).name if words else ""


def check_module(name: str, folder: Path) -> None:
    """--module is found from `folder` (or installed), each of its dotted parts in the package before it; nothing
    is imported (a package's __init__ is the user's code, run by the ranks only). Why each part: `pkg.missing` of
    an existing `pkg` started a run whose ranks failed with an ImportError."""
    parts = name.split(".")
    sys.path.insert(0, str(folder))
    try:
        found = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        found = None
    finally:
        sys.path.remove(str(folder))
    if found is None:
        raise SpecError(f"--module {name}: no module {parts[0]!r} in {folder} or installed; run launch from the "
                        "folder that holds it")
    where = list(found.submodule_search_locations or [])
    for i in range(1, len(parts)):
        package = ".".join(parts[:i])
        if not where:
            raise SpecError(f"--module {name}: {package!r} is a module, not a package holding {parts[i]!r}; check the "
                            f"name (python -m {name} would fail the same way)")
        packages, modules = _found_in(where, parts[i])
        if not packages and not modules:
            raise SpecError(f"--module {name}: no module {parts[i]!r} in package {package!r} ({', '.join(where)}); "
                            f"check the name (python -m {name} would fail the same way)")
        where = packages


def _found_in(locations: list[str], part: str) -> tuple[list[str], list[str]]:
    """(folders named `part`: a package, regular or namespace; files of module `part`: .py, .pyc, extensions) in
    a package's `locations`, looked at, not imported (PathFinder would need the package imported for a namespace
    package)."""
    suffixes = importlib.machinery.all_suffixes()
    folders = [str(Path(loc) / part) for loc in locations if (Path(loc) / part).is_dir()]
    files = [str(Path(loc) / (part + suffix)) for loc in locations for suffix in suffixes
             if (Path(loc) / (part + suffix)).is_file()]
    return folders, files


def _size(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def code_files(spec: Spec, limit: int | None = None) -> list[tuple[Path, str]]:
    """(file, path inside the folder) of every file of the code's folder a remote node needs: as git would
    commit them (`.gitignore` respected; `.git`, virtualenvs, caches and `runs/` left out); over `limit`
    bytes in all is refused, naming the biggest files."""
    limit = MAX_CODE_BYTES if limit is None else limit
    folder = Path(str(spec.script_dir))
    files = _git_files(folder)
    if files is None:
        files = _walk(folder, _ignore_patterns(folder))
    files = [(folder / rel, rel) for rel in sorted(files) if (folder / rel).is_file() and not (folder / rel).is_symlink()]
    sizes = [(p.stat().st_size, rel) for p, rel in files]
    total = sum(s for s, _ in sizes)
    if total > limit:
        big = ", ".join(f"{rel} ({_size(s)})" for s, rel in sorted(sizes, reverse=True)[:3])
        raise SpecError(f"the folder of your code, {folder}, holds {_size(total)} to ship, more than the "
                        f"{_size(limit)} limit (biggest: {big}); list data and outputs in its .gitignore or "
                        "move the script into a folder of its own")
    return files


def _git_files(folder: Path) -> list[str] | None:
    """The files git would commit under `folder` (tracked and untracked, not ignored), None outside a work tree."""
    try:
        proc = subprocess.run(["git", "-C", str(folder), "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                               "."], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    names = [n for n in proc.stdout.decode(errors="replace").split("\0") if n]
    return [n for n in names if not set(Path(n).parts) & ALWAYS_LEFT_OUT]


def _ignore_patterns(folder: Path) -> list[str]:
    path = folder / ".gitignore"
    if not path.is_file():
        return []
    lines = path.read_text(errors="replace").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _ignored(rel: str, patterns: list[str]) -> bool:
    """A path matched by a .gitignore line (the common forms: `name`, `*.ext`, `dir/`, `/rooted`)."""
    parts = Path(rel).parts
    for pat in patterns:
        p = pat.rstrip("/")
        if pat.startswith("/"):
            if fnmatch.fnmatch(rel, p.lstrip("/")) or fnmatch.fnmatch(parts[0], p.lstrip("/")):
                return True
        elif any(fnmatch.fnmatch(part, p) for part in parts) or fnmatch.fnmatch(rel, p):
            return True
    return False


def _walk(folder: Path, patterns: list[str]) -> list[str]:
    out = []
    for root, dirs, names in os.walk(folder):
        here = Path(root).relative_to(folder)
        dirs[:] = [d for d in dirs if d not in ALWAYS_LEFT_OUT and not _ignored(str(here / d), patterns)]
        out += [str(here / n) for n in names if not _ignored(str(here / n), patterns)]
    return [o.removeprefix("./") for o in out]
