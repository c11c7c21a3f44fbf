"""The k8s backend's options, declared once: defaults, help, flags and checks (no heavy imports).

The CLI reads this module at start to make the `[k8s]` flags; `KubernetesBackend.options` is an
instance, which scalelab/k8s/manifests.py renders from. Forms a user types (`LABEL=VALUE`,
`KEY[=VALUE][:EFFECT]`) are parsed here into what the manifests hold, so a bad one fails before
anything is rendered. Secrets are referenced by name (`ENV=SECRET:KEY`), never copied.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from scalelab.core.errors import SpecError
from scalelab.core.options import MAX_LIMIT_MINUTES, BackendOptions, above, at_least, at_most, each, one_of, option
from scalelab.costs.fleet import OnPremiseFleet

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def dns_label(value: str) -> str | None:
    """What is wrong with `value` as a namespace or claim name (a DNS label), or None; a name that is too long
    says so with its length, since its characters may all be fine."""
    if len(value) > 63:
        return f"must be at most 63 characters (a DNS label), not {len(value)}: give a shorter name"
    if _DNS_LABEL.fullmatch(value):
        return None
    return ("must be a DNS label (lower-case letters, digits, '-', beginning and ending with a letter or digit, "
            "at most 63 characters)")


def dns_subdomain(value: str) -> str | None:
    """'' (not given) or a name the API server takes for a service account, PriorityClass or Secret (a DNS
    subdomain): checked here as the namespace is, so a bad one is one line before anything is created."""
    if not value or (len(value) <= 253 and _DNS_SUBDOMAIN.fullmatch(value)):
        return None
    return ("must be a DNS subdomain name (at most 253 lower-case letters, digits, '-' and '.', beginning and "
            "ending with a letter or digit)")


# An image reference as the kubelet parses it (the distribution/reference grammar, IPv6 hosts left out):
# [HOST[:PORT]/]PATH[/PATH...][:TAG][@ALGORITHM:DIGEST], each PATH lower-case.
_HOST_PART = r"[a-zA-Z0-9](?:[-a-zA-Z0-9]*[a-zA-Z0-9])?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(rf"(?:{_HOST_PART}(?:\.{_HOST_PART})*(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*"
                    r"(?::\w[\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?")


def image_reference(value: str) -> str | None:
    """'' (not given: manifests.py says it is required) or an image reference the kubelet can parse; checked here
    so that `--image "Bad Image"` is one line at --dry-run, not InvalidImageName on every pod after submit."""
    if not value or _IMAGE.fullmatch(value):
        return None
    return ("must be an image reference [REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST] with no spaces and a lower-case "
            "repository, e.g. registry.example.com/scalelab/trainer:1.0")


def _absolute(path: str) -> str | None:
    return None if path.startswith("/") else "must be an absolute path"


def _non_root(uid: int) -> str | None:
    return "must not be 0: pods run as a non-root user" if uid == 0 else at_least(1)(uid)


def _items(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _label_pairs(value: Any) -> Any:
    """`["LABEL=VALUE", ...]` (or one such string) as a mapping; a mapping as it is, values as text.

    Each key and value is checked as the API server checks a label, so a bad one is one line at --dry-run, not a
    manifest the API server refuses at submit."""
    pairs = ({str(k): str(v) for k, v in value.items()} if isinstance(value, dict)
             else dict(_label_pair(str(item)) for item in _items(value)))
    for key, val in pairs.items():
        problem = _qualified_name(key) or _label_value(val)
        if problem:
            raise ValueError(f"node selector {key + '=' + val!r}: {problem}; give LABEL=VALUE, e.g. "
                             "nvidia.com/gpu.product=Tesla-T4")
    return pairs


def _label_pair(item: str) -> tuple[str, str]:
    """'LABEL=VALUE' as (LABEL, VALUE); ValueError without '=' or a label."""
    key, sep, val = item.partition("=")
    if not sep or not key:
        raise ValueError(f"takes LABEL=VALUE, got {item!r}")
    return key, val


# Kubernetes' rules for a label's or taint's key (a label key: an optional DNS-subdomain prefix and `/`, then a name of at most
# 63 characters) and value (a label value: at most 63 characters, maybe none), as the API server checks them.
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# A container's env var name and a Secret's data key, as the API server checks them (its IsEnvVarName and
# IsConfigMapKey: a name from this pattern is taken by every version).
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def _qualified_name(key: str) -> str | None:
    """What is wrong with `key` as a label's or taint's key, or None (Kubernetes' qualified name)."""
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)):
        return f"the key's prefix {prefix!r} must be a DNS subdomain (lower-case letters, digits, '-', '.')"
    if not (len(name) <= 63 and _LABEL_NAME.fullmatch(name)):
        return (f"the key {key!r} must be a name of at most 63 letters, digits, '-', '_' or '.' beginning and "
                "ending with a letter or digit, after an optional PREFIX/")
    return None


def _label_value(value: str) -> str | None:
    """What is wrong with `value` as a label's or taint's value, or None ('' is a value)."""
    if value and not (len(value) <= 63 and _LABEL_NAME.fullmatch(value)):
        return (f"the value {value!r} must be at most 63 letters, digits, '-', '_' or '.' beginning and ending with "
                "a letter or digit")
    return None


def _tolerations(value: Any) -> list[Any]:
    return [_toleration(item) for item in _items(value)]


def _toleration(item: Any) -> Any:
    """'key=value:Effect' (Equal), 'key:Effect' or 'key' (Exists), or a toleration mapping as it is."""
    if isinstance(item, dict):
        return {str(k): v for k, v in item.items()}
    text = str(item)
    rest, colon, effect = text.rpartition(":") if ":" in text else (text, "", "")
    if colon and effect not in _EFFECTS:
        raise ValueError(f"toleration {text!r}: effect must be one of {', '.join(_EFFECTS)} (after the last ':'); "
                         "give KEY[=VALUE][:EFFECT], e.g. nvidia.com/gpu:NoSchedule")
    key, sep, val = rest.partition("=")
    if not key:
        raise ValueError(f"toleration {text!r} needs a key: KEY[=VALUE][:EFFECT], e.g. nvidia.com/gpu:NoSchedule")
    problem = _qualified_name(key) or (_label_value(val) if sep else None)
    if problem:  # `--toleration :::` wrote `key: '::'` into the manifest, for the API server to refuse
        raise ValueError(f"toleration {text!r}: {problem}; give KEY[=VALUE][:EFFECT], e.g. nvidia.com/gpu:NoSchedule")
    out = {"key": key, "operator": "Equal" if sep else "Exists"}
    if sep:
        out["value"] = val
    if effect:
        out["effect"] = effect
    return out


def secret_env_ref(item: str) -> tuple[str, str, str]:
    """`ENV_NAME=SECRET_NAME:KEY` as (env name, secret name, key); ValueError if it is not that form."""
    name, sep, ref = item.partition("=")
    secret, colon, key = ref.partition(":")
    if not (sep and colon and name and secret and key):
        raise ValueError(f"secret env {item!r} must be ENV_NAME=SECRET_NAME:KEY (a reference to a Kubernetes Secret)")
    # The API server's own rules, checked here so that a bad part is one line before anything is created, not a
    # 422 on the pods after the ConfigMap exists.
    problem = (None if _ENV_NAME.fullmatch(name) else
               f"ENV_NAME {name!r} must be letters, digits, '_', '-' or '.', not beginning with a digit")
    problem = problem or (f"SECRET_NAME {secret!r} {dns_subdomain(secret)}" if dns_subdomain(secret) else None)
    if not problem and not (len(key) <= 253 and _SECRET_KEY.fullmatch(key)):
        problem = f"KEY {key!r} must be at most 253 letters, digits, '-', '_' or '.' (a key of the Secret's data)"
    if problem:
        raise ValueError(f"secret env {item!r}: {problem}; give ENV_NAME=SECRET_NAME:KEY, e.g. "
                         "WANDB_API_KEY=wandb:api-key")
    return name, secret, key


def _secret_env(value: Any) -> Any:
    items = [str(item) for item in _items(value)]
    for item in items:
        secret_env_ref(item)
    return items


@dataclass(frozen=True)
class KubernetesOptions(BackendOptions, OnPremiseFleet):
    """Where and how the pods run; sizes per node (pod), the unit in each name."""

    backend = "k8s"
    assumed_startup_s = 120.0  # pods scheduled, the image pulled, the rendezvous

    image: str = option("", "Trainer image (built from scalelab/k8s/Dockerfile); required.", image_reference,
                        flag="--image")
    image_pull_policy: str = option("IfNotPresent", "When the kubelet pulls the image.",
                                    one_of("Always", "IfNotPresent", "Never"))
    namespace: str = option("default", "Namespace to run in.", dns_label, flag="--namespace")
    context: str = option("", "kubeconfig context [default: the current one].", flag="--kube-context")
    kubeconfig: str = option("", "kubeconfig file [default: $KUBECONFIG or ~/.kube/config].", flag="--kubeconfig")
    service_account: str = option("", "Service account of the pods.", dns_subdomain, flag="--service-account")
    node_selector: dict[str, str] = option({}, "Node selector (repeatable).", flag="--node-selector",
                                           metavar="LABEL=VALUE", parse=_label_pairs)
    tolerations: list[dict[str, Any]] = option([], "Toleration (repeatable), e.g. nvidia.com/gpu:NoSchedule.",
                                               flag="--toleration", metavar="KEY[=VALUE][:EFFECT]", parse=_tolerations)
    priority_class: str = option("", "PriorityClass of the pods.", dns_subdomain, flag="--priority-class")
    image_pull_secrets: list[str] = option([], "Secret for a private registry (repeatable).", each(dns_subdomain),
                                           flag="--image-pull-secret", metavar="SECRET")
    secret_env: list[str] = option([], "Env var from a Kubernetes Secret key (repeatable); never a literal.",
                                   flag="--secret-env", metavar="ENV=SECRET:KEY", parse=_secret_env)
    volume_claim: str = option("scalelab-runs", "ReadWriteMany PVC for records and checkpoints.", dns_label,
                               flag="--volume-claim")
    mount_path: str = option("/scalelab/runs", "Where the claim is mounted; RUN_DIR = mount_path/<run name>.",
                             _absolute)
    cpus_per_node: float = option(8.0, "CPUs of each worker pod.", above(0))
    mem_gb_per_node: float = option(32.0, "Memory of each worker pod in GB.", above(0))
    shm_gb: float = option(8.0, "/dev/shm (memory-backed) for NCCL and data loading, in GB.", above(0))
    launcher_cpus: float = option(1.0, "CPUs of the MPIJob launcher pod.", above(0))
    launcher_mem_gb: float = option(2.0, "Memory of the MPIJob launcher pod in GB.", above(0))
    timeout_min: int = option(0, "activeDeadlineSeconds in minutes; 0 = no limit.", at_least(0),
                              at_most(MAX_LIMIT_MINUTES, f"must be at most {MAX_LIMIT_MINUTES:,} minutes (a year, as "
                                      "AWS's --time-limit-min and Slurm's --time): give the minutes the run may need, "
                                      "or 0 for no limit"))
    ttl_after_finished_min: int = option(1440, "Finished objects are garbage-collected after this.", at_least(0))
    backoff_limit: int = option(0, "Retries of failed pods; the trainer resumes from its checkpoint.", at_least(0))
    clean_pod_policy: str = option("Running", "MPIJob: which pods to delete when it finishes.",
                                   one_of("Running", "All", "None"))
    master_port: int = option(29500, "DDP rendezvous port of pod 0.", at_least(1), at_most(65535))
    run_as_user: int = option(1000, "User id of the pods (the image's non-root user).", _non_root)
    poll_s: float = option(10.0, "Seconds between status polls while following a run.", above(0))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.shm_gb >= self.mem_gb_per_node:
            raise SpecError(
                f"k8s backend option shm_gb {self.shm_gb:g} is not less than mem_gb_per_node {self.mem_gb_per_node:g}: "
                "/dev/shm is memory-backed and counts against each worker pod's memory limit, so the ranks would be "
                f"killed for memory; raise --backend-opt mem_gb_per_node above {self.shm_gb:g} (plus what the ranks "
                "need) or lower shm_gb")
