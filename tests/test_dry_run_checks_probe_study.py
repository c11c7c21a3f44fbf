"""`launch probe --dry-run` and `launch study --dry-run` make the backend's own checks (no remote call), as `launch
run --dry-run` and `launch sweep --dry-run` do (`Backend.check_dry_run`): they printed a plan (exit 0) that the real
probe or study then refused (a wheel that does not exist), and said nothing of a type the default AMI cannot use."""

from __future__ import annotations

from conftest import launch

ENV = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}


def test_a_probes_dry_run_makes_the_backends_checks(tmp_path):
    base = ("probe", "--backend", "aws", "--bucket", "bkt-rev", "--region", "us-east-1", "--model", "nmt-tiny",
            "--instance-types", "p2.xlarge", "--dry-run")
    out = launch(*base, "--backend-opt", f"wheel={tmp_path / 'none.whl'}", cwd=tmp_path, env=ENV)
    assert out.returncode == 2 and f"wheel={tmp_path / 'none.whl'}: no such file" in out.stderr, out.stderr
    assert out.stdout == "" and "Traceback" not in out.stderr, out.stderr
    out = launch(*base, cwd=tmp_path, env=ENV)
    assert out.returncode == 0 and out.stdout, out.stderr
    assert "note: p2.xlarge: not among the types the default AMI supports" in out.stderr, out.stderr
    assert not (tmp_path / "runs").exists()


def test_a_studys_dry_run_makes_the_backends_checks(tmp_path):
    def study(wheel: str) -> str:
        path = tmp_path / f"study{'-wheel' if wheel else ''}.yaml"
        options = "{bucket: bkt-rev, region: us-east-1, instance_type: p2.xlarge" + (f", wheel: {wheel}}}" if wheel
                                                                                     else "}")
        path.write_text(f"title: aws dry run\nbase: {{model: nmt-tiny, backend: aws, backend_options: {options}}}\n"
                        "layouts: [1x1]\n")
        return str(path)

    out = launch("study", study(str(tmp_path / "none.whl")), "--dry-run", cwd=tmp_path, env=ENV)
    assert out.returncode == 2 and f"wheel={tmp_path / 'none.whl'}: no such file" in out.stderr, out.stderr
    assert out.stdout == "" and "Traceback" not in out.stderr, out.stderr
    out = launch("study", study(""), "--dry-run", cwd=tmp_path, env=ENV)
    assert out.returncode == 0 and out.stdout, out.stderr
    assert "note: p2.xlarge: not among the types the default AMI supports" in out.stderr, out.stderr
    assert not (tmp_path / "runs").exists()
