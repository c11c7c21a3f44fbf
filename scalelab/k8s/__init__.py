"""Kubernetes backend: Horovod as a Kubeflow MPIJob, DDP as an indexed Job + headless Service.

- `options.py`    the backend's options: defaults, help, flags (`--image`, `--namespace`, ...), checks
- `manifests.py`  pure rendering of the manifests from the spec and the options (no client import)
- `backend.py`    KubernetesBackend: schedule, wait, status, logs, cancel, records back
- `api.py`        the few API calls through the official `kubernetes` client, errors as messages
- `validate.py`   manifests against the Kubernetes OpenAPI schemas and the MPIJob CRD
- `schemas/`      the MPI Operator's MPIJob CRD (source noted in validate.py)
- `Dockerfile`    the trainer image: CUDA PyTorch + Horovod with MPI and NCCL

See docs/k8s.md.
"""
