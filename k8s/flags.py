"""`launch --backend k8s` flags: (flag, backend option key, click kwargs). No heavy imports here."""

FLAGS = [
    ("--image", "image", dict(type=str, help="Trainer image (built from k8s/Dockerfile); required.")),
    ("--namespace", "namespace", dict(type=str, help="Namespace to run in [default: default].")),
    ("--kube-context", "context", dict(type=str, help="kubeconfig context [default: the current one].")),
    ("--kubeconfig", "kubeconfig", dict(type=str, help="kubeconfig file [default: $KUBECONFIG or ~/.kube/config].")),
    ("--service-account", "service_account", dict(type=str, help="Service account of the pods.")),
    ("--node-selector", "node_selector", dict(multiple=True, metavar="LABEL=VALUE", help="Node selector (repeatable).")),
    ("--toleration", "tolerations", dict(multiple=True, metavar="KEY[=VALUE][:EFFECT]", help="Toleration (repeatable), e.g. nvidia.com/gpu:NoSchedule.")),
    ("--priority-class", "priority_class", dict(type=str, help="PriorityClass of the pods.")),
    ("--image-pull-secret", "image_pull_secrets", dict(multiple=True, metavar="SECRET", help="Secret for a private registry (repeatable).")),
    ("--secret-env", "secret_env", dict(multiple=True, metavar="ENV=SECRET:KEY", help="Env var from a Kubernetes Secret key (repeatable); never a literal.")),
    ("--volume-claim", "volume_claim", dict(type=str, help="ReadWriteMany PVC for records and checkpoints [default: scalelab-runs].")),
]
