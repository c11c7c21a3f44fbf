"""Issue 34 on Kubernetes (no API server: the dry run's manifests, validated against the published schemas as
tests/test_k8s_manifests.py does): a --script run ships its folder as a ConfigMap that every pod of the workload
mounts, and the ranks start the script runner there, under torchrun (indexed Job) or mpirun (MPIJob); the indexed
Job's container command, run here with the ConfigMaps written out as volumes, runs the mounted copy on two ranks."""

from __future__ import annotations

import base64
import copy
from pathlib import Path

import pytest
from conftest import ROOT, launch

from scalelab.core.errors import SpecError
from scalelab.core.spec import EngineSpec, Spec
from scalelab.k8s.backend import KubernetesBackend
from scalelab.k8s.manifests import CODE_MOUNT, CODE_SOURCE

pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed: pip install kubernetes-validate")
from scalelab.k8s.validate import validate_all  # noqa: E402

EXAMPLES = ROOT / "examples" / "own-script"


def script_request(engine: str, folder: Path = EXAMPLES, script: str | None = None, nodes: int = 2):
    script = script or f"train_{engine}.py"
    spec = Spec(backend="k8s", engine=EngineSpec(name=engine), nodes=nodes, gpus_per_node=2, steps=None,
                model=script, script=str(folder / script), script_dir=str(folder),
                script_args=["--steps", "12"]).validate()
    return KubernetesBackend({"image": "registry.example.com/scalelab:0.1.0"}).submit_dryrun(spec, Path("runs") / "s-1")


def pod_templates(workload: dict) -> list[dict]:
    if workload["kind"] == "MPIJob":
        return [r["template"]["spec"] for r in workload["spec"]["mpiReplicaSpecs"].values()]
    return [workload["spec"]["template"]["spec"]]


@pytest.mark.parametrize("engine, kinds", [("ddp", ["ConfigMap", "ConfigMap", "Service", "Job"]),
                                           ("horovod", ["ConfigMap", "ConfigMap", "MPIJob"])])
def test_the_script_folder_is_a_configmap_every_pod_mounts(engine: str, kinds: list[str]) -> None:
    request = script_request(engine)
    validate_all([*request.objects, request.fetch])  # the published schemas (core and the MPI Operator's)
    assert [d["kind"] for d in request.objects] == kinds
    code = request.objects[1]
    assert code["metadata"]["name"].endswith("-code")
    assert code["data"][f"train_{engine}.py"] == (EXAMPLES / f"train_{engine}.py").read_text()
    workload = request.objects[-1]
    for pod in pod_templates(workload):
        (volume,) = [v for v in pod["volumes"] if v["name"] == "code"]
        assert volume["configMap"]["name"] == code["metadata"]["name"]
        # the ConfigMap (read-only) is copied into a writable emptyDir, where the ranks start: a script writing
        # beside itself (--out outputs/x, ./runs) failed with a read-only filesystem
        (copy,) = pod["initContainers"]
        assert {"name": "code", "mountPath": CODE_SOURCE, "readOnly": True} in copy["volumeMounts"]
        assert {"name": "workdir", "mountPath": CODE_MOUNT} in copy["volumeMounts"]
        assert copy["command"][-1] == f"cp -RL {CODE_SOURCE}/. {CODE_MOUNT}/"
        assert {"name": "workdir", "emptyDir": {}} in pod["volumes"]
        for container in pod["containers"]:
            assert {"name": "workdir", "mountPath": CODE_MOUNT} in container["volumeMounts"]
            assert not any(m["name"] == "code" for m in container["volumeMounts"])
            assert container["workingDir"] == CODE_MOUNT
            assert {"name": "SCALELAB_SCRIPT_DIR", "value": CODE_MOUNT} in container["env"]
    command = " ".join(pod_templates(workload)[0]["containers"][0]["command"])
    assert "-m scalelab.train.script" in command and "scalelab.train " not in command
    if engine == "horovod":  # mpirun passes the folder's whereabouts on to the ranks it starts on the workers
        assert "-x SCALELAB_SCRIPT_DIR" in command


@pytest.mark.parametrize("engine", ["ddp", "horovod"])
def test_the_copy_code_init_container_is_locked_down_and_guaranteed_as_every_container(engine: str) -> None:
    """Kubernetes counts init containers in a pod's QoS class, Pod Security "restricted" checks them, and a quota
    requiring limits refuses them without: `copy-code` had no resources and no securityContext, so the pods were
    Burstable and such namespaces refused them. It has the pod's CPU and memory (it runs before the others: the pod
    asks for no more), no GPU, requests equal to limits, and the others' securityContext; and the validator checks
    every container, init containers included, so one added without them fails here (and on the Indexed Job's
    and on both MPIJob roles)."""
    from scalelab.k8s.validate import ManifestInvalid, validate_doc

    request = script_request(engine)
    workload = request.objects[-1]
    for pod in pod_templates(workload):
        (init,) = pod["initContainers"]
        (main,) = pod["containers"]
        assert init["securityContext"] == main["securityContext"]
        assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert init["securityContext"]["allowPrivilegeEscalation"] is False
        cpu_mem = {k: main["resources"]["limits"][k] for k in ("cpu", "memory")}
        assert init["resources"] == {"requests": cpu_mem, "limits": cpu_mem}
    validate_doc(workload)
    for broken, problem in [(lambda c: c.pop("resources"), "init container copy-code needs a cpu limit"),
                            (lambda c: c.pop("securityContext"), "init container copy-code needs securityContext"),
                            (lambda c: c["resources"]["requests"].update(memory="1Mi"), "memory limit, and a request")]:
        for i in range(len(pod_templates(workload))):  # the Job's pod; the MPIJob's Launcher, then its Worker
            changed = copy.deepcopy(workload)
            broken(pod_templates(changed)[i]["initContainers"][0])
            with pytest.raises(ManifestInvalid, match=problem):
                validate_doc(changed)


def test_nested_and_binary_files_keep_their_paths_and_an_oversized_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "train.py").write_text("import pkg.model\n")
    (tmp_path / "pkg" / "model.py").write_text("X = 1\n")
    (tmp_path / "pkg" / "table.bin").write_bytes(b"\xff\x00\x01")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "old.log").write_text("left out: runs/ is never shipped\n")
    request = script_request("ddp", tmp_path, "train.py", nodes=1)
    validate_all(request.objects)
    code = request.objects[1]
    assert set(code["data"]) == {"train.py", "pkg__model.py"}
    assert base64.b64decode(code["binaryData"]["pkg__table.bin"]) == b"\xff\x00\x01"
    (items,) = [v["configMap"]["items"] for v in pod_templates(request.objects[-1])[0]["volumes"] if v["name"] == "code"]
    assert {"key": "pkg__model.py", "path": "pkg/model.py"} in items and len(items) == 3
    (tmp_path / "weights.bin").write_bytes(b"\0" * (1024 * 1024))
    with pytest.raises(SpecError, match=r"more than the 900.0 KiB limit \(biggest: weights.bin \(1.0 MiB\)"):
        script_request("ddp", tmp_path, "train.py", nodes=1)


def test_file_names_with_spaces_are_mounted_at_their_paths(tmp_path: Path) -> None:
    """The files listed on the ConfigMap (a JSON array) come back whole: a list joined by spaces gave the pods
    items `my` and `model.py`, keys the ConfigMap does not hold, and never `my model.py`."""
    import json

    (tmp_path / "my train.py").write_text("import my_model\n")
    (tmp_path / "sub dir").mkdir()
    (tmp_path / "sub dir" / "my model.py").write_text("X = 1\n")
    request = script_request("ddp", tmp_path, "my train.py", nodes=1)
    validate_all(request.objects)
    code = request.objects[1]
    assert json.loads(code["metadata"]["annotations"]["scalelab.io/files"]) == ["my train.py", "sub dir/my model.py"]
    (volume,) = [v for v in pod_templates(request.objects[-1])[0]["volumes"] if v["name"] == "code"]
    items = volume["configMap"]["items"]
    assert items == [{"key": "my_train.py", "path": "my train.py"}, {"key": "sub_dir__my_model.py", "path": "sub dir/my model.py"}]
    assert all(item["key"] in code["data"] for item in items)


def test_two_files_that_would_share_a_configmap_key_are_refused(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b.py").write_text("X = 1\n")
    (tmp_path / "a__b.py").write_text("X = 2\n")  # the same key as a/b.py: one would replace the other
    with pytest.raises(SpecError, match=r"files 'a/b.py' and 'a__b.py' of your code's folder would be the same "
                                        r"ConfigMap key 'a__b.py'.*rename one of them"):
        script_request("ddp", tmp_path, "train.py", nodes=1)
    proc = launch("--backend", "k8s", "--image", "registry.example.com/scalelab:0.1.0", "--script", "train.py",
                  "--engine", "single", "--dry-run", cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "rename one of them" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not proc.stdout.strip()


def test_the_k8s_dry_run_of_a_script_prints_its_code(tmp_path: Path) -> None:
    proc = launch("--backend", "k8s", "--image", "registry.example.com/scalelab:0.1.0", "--script",
                  str(EXAMPLES / "train_ddp.py"), "--engine", "ddp", "--nodes", "2", "--dry-run", "--", "--steps", "12",
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "kind: ConfigMap" in proc.stdout and "track.step(items=" in proc.stdout  # the script itself, in the ConfigMap


def test_a_folder_over_the_limit_is_one_line_from_the_command(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "data.bin").write_bytes(b"\1" * (2 * 1024 * 1024))
    proc = launch("--backend", "k8s", "--image", "registry.example.com/scalelab:0.1.0", "--script", "train.py",
                  "--engine", "single", "--dry-run", cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "biggest: data.bin (2.0 MiB)" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not proc.stdout.strip()


@pytest.mark.slow
def test_the_pod_command_runs_the_script_from_the_mounted_configmap(tmp_path: Path) -> None:
    """No cluster: the indexed Job's container command run here, as the kubelet would run it, with the two
    ConfigMaps written out as their volumes would hold them (the code's files at their `items` paths) and the
    pod's paths mapped into tmp_path. Both ranks run the script from the mounted copy and record."""
    import json
    import os
    import subprocess

    request = script_request("ddp", nodes=1)
    spec_map, code_map, job = request.objects[0], request.objects[1], request.objects[-1]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {"/etc/scalelab": tmp_path / "spec", CODE_MOUNT: tmp_path / "code", "/scalelab/runs": tmp_path / "runs"}
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "spec.json").write_text(spec_map["data"]["spec.json"])
    (code_volume,) = [v for v in pod["volumes"] if v["name"] == "code"]
    for item in code_volume["configMap"]["items"]:
        path = tmp_path / "code" / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code_map["data"][item["key"]])
    command = container["command"][-1]
    for pod_path, here in mounts.items():
        command = command.replace(pod_path, str(here))
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env["SCALELAB_SCRIPT_DIR"] = str(tmp_path / "code")  # the mount, mapped
    env.update(MASTER_ADDR="127.0.0.1", JOB_COMPLETION_INDEX="0", HOSTNAME="pod-0", OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT), PATH=os.environ["PATH"])
    command = command.replace("exec python ", f"exec {__import__('sys').executable} ")
    done = subprocess.run(["sh", "-c", command], env=env, cwd=tmp_path / "code", capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    run_dir = next((tmp_path / "runs").iterdir())
    for rank in (0, 1):
        recs = [json.loads(x) for x in (run_dir / "records" / f"rank-{rank}.jsonl").read_text().splitlines()]
        assert recs[0]["script"] == str(tmp_path / "code" / "train_ddp.py") and recs[0]["world"] == 2  # the mount's
        assert [r["step"] for r in recs if r["kind"] == "step"] == list(range(1, 13))
