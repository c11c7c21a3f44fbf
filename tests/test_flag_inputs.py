"""Input handling of the backends' flags, the config file, the AWS region and --sbatch-arg.

The product's rule for bad input: one `launch: error:` line naming what is wrong and where (the flag typed, or
the config file and its key) and how to fix it, exit 2, no traceback. Each test here failed before its fix:
- every backend's generated flag takes its own help's example, and a flag whose help says "repeatable" is
  (`--toleration nvidia.com/gpu:NoSchedule` was "dictionary update sequence element #0 has length 1");
- a config file's repeatable option takes one value or a list, and its bad values are blamed on the file and
  key, not on a flag nobody typed;
- AWS_REGION names the region, as the message asking for one says (boto3 reads AWS_DEFAULT_REGION only);
- --sbatch-arg cannot silently replace the layout or what scalelab sets (nodes, tasks, signal, logs, ...).
Run in-process (tests/conftest.py::run_entry), dry runs only.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from conftest import run_entry

from scalelab.launcher import cli
from scalelab.launcher.backend import backend_flags

# What each backend's dry run needs besides the flag under test.
NEEDS = {"slurm": [], "k8s": ["--image", "trainer:1"], "aws": ["--bucket", "my-bucket", "--region", "us-east-1"]}
# Two values of each repeatable flag that has no example of its own (by its metavar, or its name).
SAMPLES = {"LABEL=VALUE": ("disk=ssd", "zone=a"), "KEY[=VALUE][:EFFECT]": ("nvidia.com/gpu:NoSchedule", "team=ml"),
           "SECRET": ("regcred", "mirror"), "ENV=SECRET:KEY": ("TOKEN=hub:token", "KEY=hub:key"),
           "ARG": ("--mail-type=END", "--comment=x"), "--fallback-instance-type": ("g3.8xlarge", "g3.16xlarge")}


def _flags() -> list[tuple[str, Any]]:
    return [(backend, flag) for backend, flags in backend_flags().items() for flag in flags]


def _example(flag) -> str | None:
    """The value the help shows after `e.g.` (`--sbatch-arg=--mail-type=END` gives `--mail-type=END`)."""
    found = re.search(r"e\.g\. (\S+)", flag.help)
    if not found:
        return None
    text = found.group(1).rstrip(".,;)")
    return text.removeprefix(f"{flag.name}=")


@pytest.fixture
def spec_of(monkeypatch):
    """The Spec each `launch run` in the test builds (build_spec spied on), newest last."""
    built: list[Any] = []
    real = cli.build_spec

    def spy(params):
        built.append(real(params))
        return built[-1]

    monkeypatch.setattr(cli, "build_spec", spy)
    return built


def _dry(backend: str, *args: str) -> list[str]:
    return ["--backend", backend, *NEEDS[backend], "--dry-run", "--steps", "20", *args]


@pytest.mark.parametrize("backend, flag", _flags(), ids=lambda v: getattr(v, "name", v))
def test_a_flag_is_repeatable_exactly_where_its_help_says_so(backend, flag):
    params = {p.name: p for p in cli.run_cmd.params}
    assert params[f"bopt__{backend}__{flag.key}"].multiple == ("repeatable" in flag.help), flag.help


@pytest.mark.parametrize("backend, flag", [(b, f) for b, f in _flags() if _example(f)],
                         ids=lambda v: getattr(v, "name", v))
def test_every_backend_flag_takes_its_own_help_example(backend, flag, monkeypatch, capsys, spec_of, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, err, _ = run_entry(_dry(backend, f"{flag.name}={_example(flag)}"), monkeypatch, capsys)
    assert code == 0 and "error" not in err, err
    assert spec_of[-1].backend_options[flag.key], spec_of[-1].backend_options


@pytest.mark.parametrize("backend, flag", [(b, f) for b, f in _flags() if "repeatable" in f.help],
                         ids=lambda v: getattr(v, "name", v))
def test_a_repeatable_flag_given_twice_keeps_both(backend, flag, monkeypatch, capsys, spec_of, tmp_path):
    monkeypatch.chdir(tmp_path)
    first, second = SAMPLES.get(flag.metavar) or SAMPLES[flag.name]
    code, err, _ = run_entry(_dry(backend, flag.name, _example(flag) or first, flag.name, second),
                             monkeypatch, capsys)
    assert code == 0, err
    assert len(spec_of[-1].backend_options[flag.key]) == 2, spec_of[-1].backend_options


def test_tolerations_as_the_help_shows_them_reach_the_pods(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, err, out = run_entry(_dry("k8s", "--toleration", "nvidia.com/gpu:NoSchedule", "--toleration",
                                    "team=ml:NoExecute"), monkeypatch, capsys)
    assert code == 0, err
    assert "key: nvidia.com/gpu" in out and "operator: Exists" in out and "effect: NoSchedule" in out
    assert "value: ml" in out and "effect: NoExecute" in out
    code, err, _ = run_entry(_dry("k8s", "--toleration", "gpu:Sometimes"), monkeypatch, capsys)
    assert code == 2 and "--toleration" in err and "NoSchedule" in err and "Traceback" not in err, err


# ---- the config file -----------------------------------------------------------------------------------


@pytest.fixture
def config(tmp_path, monkeypatch):
    """Write c.yaml in a fresh cwd and point SCALELAB_CONFIG at it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SCALELAB_CONFIG", "c.yaml")
    monkeypatch.setenv("COLUMNS", "200")

    def write(text: str):
        (tmp_path / "c.yaml").write_text(text)
    return write


@pytest.mark.parametrize("text", ["rate: 0.45/gpu-hour\n", "rate: [0.45/gpu-hour]\n", "rate:\n  - 0.45/gpu-hour\n"])
def test_a_repeatable_option_in_the_config_takes_one_value_or_a_list(config, text, monkeypatch, capsys):
    config(text)
    code, err, _ = run_entry(["--backend", "slurm", "--dry-run", "--steps", "20"], monkeypatch, capsys)
    assert code == 0, err
    assert "0.45" in err or "$" in err, err  # the dry run's quote priced with the configured rate


@pytest.mark.parametrize("text, args", [
    ("model-arg: hidden_size=8\n", {"hidden_size": 8}),
    ("model-arg: [hidden_size=8, embed_size=16]\n", {"hidden_size": 8, "embed_size": 16}),
])
def test_model_args_in_the_config(config, text, args, monkeypatch, capsys, spec_of):
    config(text)
    code, err, _ = run_entry(["--dry-run", "--steps", "20"], monkeypatch, capsys)
    assert code == 0, err
    assert spec_of[-1].model_args == args


def test_a_list_for_a_repeatable_backend_flag_in_the_config(config, monkeypatch, capsys, spec_of):
    config("backend: k8s\nimage: trainer:1\ntoleration: [nvidia.com/gpu:NoSchedule, team=ml]\n")
    code, err, _ = run_entry(["--dry-run", "--steps", "20"], monkeypatch, capsys)
    assert code == 0, err
    assert [t["key"] for t in spec_of[-1].backend_options["tolerations"]] == ["nvidia.com/gpu", "team"]


@pytest.mark.parametrize("text, says", [
    ("lr: -1\n", "config file c.yaml: lr must be > 0"),
    ("steps: nan\n", "config file c.yaml: steps"),
    ("backend: mars\n", "config file c.yaml: backend"),
    ("partition: [gpu, cpu]\n", "config file c.yaml: 'partition' must be one value"),
    ("cpus-per-task: 0\n", "config file c.yaml: "),
    ("model-arg: hidden_size\n", "config file c.yaml: model-arg"),
    ("model-arg: hidden_size=abc\n", "config file c.yaml: model-arg: model field hidden_size"),
    ("model-arg: [hidden_size=8, hiden_size=8]\n", "config file c.yaml: model-arg: unknown model field"),
    ("rate: cheap\n", "config file c.yaml: rate"),
    ("toleration: gpu:Sometimes\n", "config file c.yaml"),
    ("sbatch-arg: --nodes=5\n", "config file c.yaml"),
    ("backend-opt: nosuch=1\n", "nosuch (from config file c.yaml, key backend-opt)"),
    ("backend-opt: nosuch\n", "config file c.yaml: backend-opt takes KEY=VALUE"),
])
def test_a_bad_config_value_is_blamed_on_the_file_and_key(config, text, says, monkeypatch, capsys):
    config(text)
    code, err, _ = run_entry(["--backend", "slurm", "--dry-run"], monkeypatch, capsys)
    lines = [line for line in err.splitlines() if line.startswith("launch: error:")]
    assert code == 2 and len(lines) == 1 and says in lines[0], err
    assert "Traceback" not in err and "Invalid value for '--" not in err and "(from --" not in err, err


def test_a_value_one_command_refuses_is_blamed_on_the_file_there(config, monkeypatch, capsys):
    """`format: html` suits `launch report`, not `launch ls`: ls says so, naming the file and key."""
    config("format: html\n")
    code, err, _ = run_entry(["ls", "--runs-dir", "."], monkeypatch, capsys)
    assert code == 2 and "config file c.yaml: format: " in err and "'html' is not one of" in err, err


def test_help_shows_a_configured_list_as_its_values(config, monkeypatch, capsys):
    config("model-arg: [hidden_size=8, embed_size=16]\n")
    code, _, out = run_entry(["run", "--help"], monkeypatch, capsys)
    assert code == 0 and "[default:hidden_size=8,embed_size=16,fromc.yaml]" in "".join(out.split()), out


def test_a_list_troubles_only_a_command_whose_option_takes_one_value(config, monkeypatch, capsys):
    """train-src repeats in `launch prep`, not in `launch run`: the list is refused where it cannot be used."""
    config("train-src: [a.txt, b.txt]\n")
    code, err, _ = run_entry(["ls", "--runs-dir", "."], monkeypatch, capsys)
    assert code == 0, err
    code, err, _ = run_entry(["--dry-run", "--data", "text"], monkeypatch, capsys)
    assert code == 2 and "config file c.yaml: 'train-src' must be one value" in err and "Traceback" not in err, err


# ---- AWS region ----------------------------------------------------------------------------------------


@pytest.fixture
def no_aws_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))


@pytest.mark.parametrize("env, region", [
    ({"AWS_REGION": "us-east-1"}, "us-east-1"),
    ({"AWS_DEFAULT_REGION": "eu-west-1"}, "eu-west-1"),
    ({"AWS_REGION": "us-west-2", "AWS_DEFAULT_REGION": "eu-west-1"}, "us-west-2"),  # AWS's SDKs: AWS_REGION first
])
def test_the_region_comes_from_aws_region_then_aws_default_region(no_aws_config, env, region, monkeypatch, capsys):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, err, out = run_entry(["--backend", "aws", "--bucket", "my-bucket", "--dry-run", "--steps", "20"],
                               monkeypatch, capsys)
    assert code == 0, err
    assert f'"region": "{region}"' in out


def test_no_region_names_both_variables(no_aws_config, monkeypatch, capsys):
    code, err, _ = run_entry(["--backend", "aws", "--bucket", "my-bucket", "--dry-run"], monkeypatch, capsys)
    assert code == 2 and "AWS_REGION" in err and "AWS_DEFAULT_REGION" in err, err


def test_aws_gc_reads_aws_region(no_aws_config, monkeypatch):
    from scalelab.aws import cli as aws_cli

    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    ec2, _ = aws_cli._clients(None)
    assert ec2.meta.region_name == "ap-south-1"


def test_the_region_help_names_both_variables():
    help_text = next(f.help for f in backend_flags()["aws"] if f.name == "--region")
    assert "AWS_REGION" in help_text and "AWS_DEFAULT_REGION" in help_text


# ---- --sbatch-arg --------------------------------------------------------------------------------------


@pytest.mark.parametrize("arg, use", [
    ("--nodes=5", "--nodes 5"), ("--nodes 5", "--nodes 5"), ("-N5", "--nodes 5"), ("-N 5", "--nodes 5"),
    ("--ntasks=4", "--gpus-per-node"), ("-n4", "--gpus-per-node"), ("--ntasks-per-node=4", "--gpus-per-node"),
    ("--gpus-per-node=2", "--gpus-per-node"), ("--gres=gpu:v100:2", "--gpu-type"), ("-G2", "--gpus-per-node"),
    ("--signal=USR2@5", "signal_s"), ("--no-requeue", "--no-requeue"), ("--requeue", "--requeue"),
    ("--output=/etc/x", "launch logs"), ("-o/etc/x", "launch logs"), ("--error=/tmp/e", "launch logs"),
    ("-e /tmp/e", "launch logs"), ("--open-mode=truncate", "launch logs"), ("--array=0-3", "--repeats"),
    ("-a 0-3", "--repeats"), ("--job-name=x", "--job-name x"), ("-J x", "--job-name x"),
    ("--partition=gpu", "--partition gpu"), ("-p gpu", "--partition gpu"), ("--time=10", "--time 10"),
    ("-t 10", "--time 10"), ("--cpus-per-task=4", "--cpus-per-task 4"), ("-c4", "--cpus-per-task 4"),
    ("--mem=16G", "--mem-gb"), ("--account=a", "--account a"), ("-A a", "--account a"), ("--qos=q", "--qos q"),
    ("--constraint=v100", "--constraint v100"), ("-C v100", "--constraint v100"), ("--exclusive", "--exclusive"),
])
def test_sbatch_arg_cannot_replace_what_scalelab_sets(arg, use, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, err, out = run_entry(_dry("slurm", f"--sbatch-arg={arg}"), monkeypatch, capsys)
    lines = [line for line in err.splitlines() if line.startswith("launch: error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert f"--sbatch-arg {arg}" in lines[0] and use in lines[0], lines[0]
    assert "#SBATCH" not in out


@pytest.mark.parametrize("arg, line", [
    ("--mail-type=END", "#SBATCH --mail-type=END"), ("--comment x", "#SBATCH --comment=x"),
    ("-d afterok:1", "#SBATCH --dependency=afterok:1"), ("--gres=nvme:1", "#SBATCH --gres=nvme:1"),
    ("--wckey=mine", "#SBATCH --wckey=mine"),
])
def test_sbatch_arg_adds_what_scalelab_does_not_set(arg, line, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, err, out = run_entry(_dry("slurm", f"--sbatch-arg={arg}"), monkeypatch, capsys)
    assert code == 0, err
    assert line in out.splitlines(), out
    assert "#SBATCH --nodes=1" in out and "#SBATCH --signal=USR1@120" in out


def test_a_gres_of_another_kind_does_not_drop_the_gpu_type(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, err, _ = run_entry(_dry("slurm", "--gpu-type", "v100", "--sbatch-arg=--gres=nvme:1"), monkeypatch, capsys)
    assert code == 2 and "--gpu-type" in err and "--gres" in err, err


def test_an_unknown_short_sbatch_option_is_refused(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, err, _ = run_entry(_dry("slurm", "--sbatch-arg=-Z1"), monkeypatch, capsys)
    assert code == 2 and "-Z1" in err and "long form" in err, err


def test_a_list_fields_flag_is_multiple_at_its_root() -> None:
    """core.options._flag unwrapped `list[str] | None` to str, and a bare `list[str]` to str too: every list
    option's Flag said `multiple=False` (the CLI now reads the field itself, but the Flag must not lie)."""
    from scalelab.core.options import option_flags
    from scalelab.launcher.backend import options_type

    flags = {f.decl: f for b in ("slurm", "k8s", "aws") for f in option_flags(options_type(b))}
    assert flags["--sbatch-arg"].multiple and flags["--sbatch-arg"].kind is str
    assert flags["--fallback-instance-type"].multiple and flags["--image-pull-secret"].multiple
