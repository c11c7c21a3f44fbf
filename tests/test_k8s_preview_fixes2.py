"""Bad k8s inputs caught at --dry-run, and the dry-run cost preview saying only what is true.

A node selector the API server refuses, an image reference the kubelet cannot parse and a name over 63
characters each were accepted by --dry-run (or told a wrong cause); the AWS spot preview ignored --max-price and
called a us-east-1 price a bound in other regions; slurm/k8s without --rate previewed nothing and an own script's
preview was a garbled sum. Each case here is one `launch` in-process (no cluster, no cloud).
"""

from __future__ import annotations

import pytest
from conftest import run_entry

K8S = ["--backend", "k8s", "--image", "reg/x:1", "--dry-run", "--steps", "20"]


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("launch: error:")]


# ---- 1. --node-selector and --image are checked as the API server and kubelet would ------------------------


@pytest.mark.parametrize("pair, says", [
    ("bad key=x", "the key 'bad key'"),
    ("gpu=a b", "the value 'a b'"),
    ("gpu=" + "a" * 64, "at most 63"),
    ("-gpu=x", "the key '-gpu'"),
    ("Bad.Prefix/gpu=x", "prefix 'Bad.Prefix'"),
])
def test_a_node_selector_the_api_server_refuses_is_one_error_line(pair, says, monkeypatch, capsys):
    code, err, out = run_entry([*K8S, "--node-selector", pair], monkeypatch, capsys)
    assert code == 2, (code, err)
    assert len(_error_lines(err)) == 1 and "--node-selector" in err and says in err, err
    assert "Traceback" not in err and "nodeSelector" not in out


def test_a_good_node_selector_is_still_rendered(monkeypatch, capsys):
    code, err, out = run_entry([*K8S, "--node-selector", "nvidia.com/gpu.product=Tesla-T4",
                                "--node-selector", "pool="], monkeypatch, capsys)
    assert code == 0, err
    assert "nodeSelector:" in out and "nvidia.com/gpu.product: Tesla-T4" in out


def test_a_node_selector_in_the_options_mapping_is_checked_too():
    from scalelab.core.errors import SpecError
    from scalelab.k8s.backend import KubernetesBackend
    with pytest.raises(SpecError, match="the value 'a b'"):
        KubernetesBackend({"image": "r/i:1", "node_selector": {"gpu": "a b"}})


@pytest.mark.parametrize("image", ["Bad Image", "reg/Trainer:1", "reg/x:", "reg/x@sha256:12", " reg/x:1"])
def test_an_image_the_kubelet_cannot_parse_is_refused_at_dry_run(image, monkeypatch, capsys):
    code, err, _ = run_entry(["--backend", "k8s", "--dry-run", "--steps", "20", "--image", image], monkeypatch, capsys)
    assert code == 2, (code, err)
    assert len(_error_lines(err)) == 1 and "--image" in err and "image reference" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("image", ["trainer", "reg/x:1", "localhost:5000/team/trainer:v1.2",
                                   "Registry.Example.com/a_b/c-d@sha256:" + "0" * 64])
def test_an_image_reference_the_kubelet_parses_is_taken(image):
    from scalelab.k8s.options import image_reference
    assert image_reference(image) is None


# ---- 2. a DNS label over 63 characters is told its length, not its characters -----------------------------


@pytest.mark.parametrize("flag", ["--namespace", "--volume-claim"])
def test_a_too_long_dns_label_names_the_63_character_limit(flag, monkeypatch, capsys):
    code, err, _ = run_entry([*K8S, flag, "a" * 70], monkeypatch, capsys)
    assert code == 2, (code, err)
    line, = _error_lines(err)
    assert flag in line and "at most 63 characters" in line and "70" in line, line
    assert "lower-case letters" not in line, line  # its characters are fine: only the length is wrong


def test_a_dns_label_with_bad_characters_still_says_which_characters():
    from scalelab.k8s.options import dns_label
    assert "lower-case letters" in (dns_label("Bad") or "")
    assert dns_label("a" * 63) is None


# ---- 3. the AWS spot preview: --max-price bounds it, another region's price is an estimate --------------------

AWS_SPOT = ["--backend", "aws", "--bucket", "my-bucket", "--placement-group", "none", "--spot", "--dry-run",
            "--steps", "20"]


def _layout_lines(err: str) -> str:
    """The preview's layout line(s), joined (a long one may be wrapped at spaces on a narrow terminal)."""
    return " ".join(err.split())


def test_max_price_bounds_the_spot_preview_where_no_spot_price_is_known(monkeypatch, capsys):
    code, err, _ = run_entry([*AWS_SPOT, "--region", "us-east-1", "--max-price", "0.10"], monkeypatch, capsys)
    assert code == 0, err
    text = _layout_lines(err)
    assert "fleet $0.10/hour" in text and "at most --max-price $0.10/instance-hour" in text, text
    assert "at most the on-demand price" not in text


def test_max_price_bounds_each_instance_of_a_layout(monkeypatch, capsys):
    code, err, _ = run_entry([*AWS_SPOT, "--region", "us-east-1", "--max-price", "0.10", "--nodes", "2"],
                             monkeypatch, capsys)
    assert code == 0, err
    assert "fleet $0.20/hour (2*g4dn.xlarge spot at most --max-price $0.10/instance-hour" in _layout_lines(err), err


def test_a_region_without_prices_is_priced_at_us_east_1_as_an_estimate_not_a_bound(monkeypatch, capsys):
    code, err, _ = run_entry([*AWS_SPOT, "--region", "ap-south-2"], monkeypatch, capsys)
    assert code == 0, err
    text = _layout_lines(err)
    assert "estimated at the us-east-1 on-demand price" in text and "none known in ap-south-2" in text, text
    assert "at most the us-east-1" not in text


def test_max_price_bounds_the_spot_price_in_any_region(monkeypatch, capsys):
    code, err, _ = run_entry([*AWS_SPOT, "--region", "ap-south-2", "--max-price", "0.10"], monkeypatch, capsys)
    assert code == 0, err
    assert "fleet $0.10/hour" in _layout_lines(err) and "us-east-1" not in err, err


@pytest.mark.parametrize("price", ["0", "0.0"])
def test_a_max_price_of_zero_is_refused_not_dropped(price, monkeypatch, capsys):
    code, err, _ = run_entry([*AWS_SPOT, "--region", "us-east-1", "--max-price", price], monkeypatch, capsys)
    assert code == 2, (code, err)
    line, = _error_lines(err)
    assert "--max-price" in line and "> 0" in line and "Traceback" not in err, err


# ---- 4. the preview on an unpriced backend, and for a script of its own ------------------------------------


@pytest.mark.parametrize("args", [["--backend", "slurm"], ["--backend", "k8s", "--image", "reg/x:1"]],
                         ids=["slurm", "k8s"])
def test_a_dry_run_without_a_rate_says_no_price_is_known_and_how_to_give_one(args, monkeypatch, capsys):
    code, err, _ = run_entry(["run", *args, "--dry-run", "--steps", "20"], monkeypatch, capsys)
    assert code == 0, err
    text = _layout_lines(err)
    assert "have no price" in text and "--rate USD_PER_GPU_HOUR" in text, err
    assert text.count("note:") == 1, err


def test_the_local_backend_still_previews_nothing(monkeypatch, capsys):
    code, err, _ = run_entry(["run", "--backend", "local", "--dry-run", "--steps", "20"], monkeypatch, capsys)
    assert code == 0, err
    assert "no price" not in err and "--rate" not in err, err


def test_an_own_script_preview_gives_the_hourly_price_and_says_why_no_total(tmp_path, monkeypatch, capsys):
    script = tmp_path / "x.py"
    script.write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    code, err, _ = run_entry(["run", "--backend", "slurm", "--rate", "0.5", "--script", str(script), "--dry-run"],
                             monkeypatch, capsys)
    assert code == 0, err
    text = _layout_lines(err)
    assert "1x1: fleet $0.50/hour" in text and "a script's length is not known before it runs, so no total" in text
    assert "unknown steps" not in text and "an unknown time" not in text and "x 0.5 s/step" not in text, err


def test_a_known_spot_price_above_max_price_is_not_the_preview_price(monkeypatch, capsys):
    """The built-in catalog knows p2.xlarge spot at $0.1288/hour in us-east-1: a bid of $0.05 was previewed at $0.13/hour,
    a price the instances can never be paid at (EC2 starts none while the spot price is above the bid)."""
    code, err, _ = run_entry([*AWS_SPOT, "--region", "us-east-1", "--instance-type", "p2.xlarge", "--max-price", "0.05"],
                             monkeypatch, capsys)
    assert code == 0, err
    text = _layout_lines(err)
    assert "fleet $0.05/hour" in text and "fleet $0.13/hour" not in text, text
    assert "last known spot price of p2.xlarge $0.1288/hour" in text and "SpotMaxPriceTooLow" in text, text
    assert "raise --max-price" in text, text


def test_a_bid_above_the_known_spot_price_is_previewed_at_that_price(monkeypatch, capsys):
    code, err, _ = run_entry([*AWS_SPOT, "--region", "us-east-1", "--instance-type", "p2.xlarge", "--max-price", "0.50"],
                             monkeypatch, capsys)
    assert code == 0, err
    text = _layout_lines(err)
    assert "fleet $0.13/hour (1*p2.xlarge spot)" in text and "SpotMaxPriceTooLow" not in text, text
