#!/bin/bash
# scalelab bootstrap, run nmt-tiny-DRYRUN, generation 0 (rendered by scalelab/aws/render.py; no credentials)
set -uo pipefail
shutdown -h +120 "scalelab time limit" || true
export SCALELAB_RUN_ID=nmt-tiny-DRYRUN
export SCALELAB_BUCKET=scalelab-test-bucket
export SCALELAB_PREFIX=scalelab/nmt-tiny-DRYRUN
export SCALELAB_GENERATION=0
export SCALELAB_NODES=2
export SCALELAB_GPUS_PER_NODE=1
export SCALELAB_ENGINE=horovod
export SCALELAB_HOROVOD=1
export SCALELAB_HEARTBEAT_TIMEOUT_S=600
export AWS_DEFAULT_REGION=us-east-1
: "${SCALELAB_WORK:=/opt/scalelab}" "${SCALELAB_PYTHON:=/opt/pytorch/bin/python}"
[ -x "$SCALELAB_PYTHON" ] || SCALELAB_PYTHON=python3
export SCALELAB_WORK SCALELAB_PYTHON
mkdir -p "$SCALELAB_WORK" && cd "$SCALELAB_WORK" || exit 1
exec >>"$SCALELAB_WORK/bootstrap.log" 2>&1
"$SCALELAB_PYTHON" -c 'import boto3' 2>/dev/null || "$SCALELAB_PYTHON" -m pip install -q boto3
# Horovod 0.28.1 installed: the pip call below would do nothing, so it is not imported to decide (that imports
# PyTorch: 2 s of CPU); any other Horovod must import, or pip installs 0.28.1, as before
if [ "$SCALELAB_HOROVOD" = 1 ] && ! "$SCALELAB_PYTHON" -c \
    'from importlib.metadata import version; version("horovod") == "0.28.1" or __import__("horovod.torch")' 2>/dev/null; then
  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_GPU_OPERATIONS=NCCL     "$SCALELAB_PYTHON" -m pip install -q --no-cache-dir horovod==0.28.1
fi
"$SCALELAB_PYTHON" -c 'import sys, boto3; boto3.client("s3").download_file(*sys.argv[1:])' scalelab-test-bucket scalelab/nmt-tiny-DRYRUN/package/scalelab-0.1.0-py3-none-any.whl scalelab-0.1.0-py3-none-any.whl \
  && "$SCALELAB_PYTHON" -m pip install -q --force-reinstall --no-deps scalelab-0.1.0-py3-none-any.whl \
  && { "$SCALELAB_PYTHON" -m scalelab.aws.deps || "$SCALELAB_PYTHON" -m pip install -q scalelab-0.1.0-py3-none-any.whl; } \
  && "$SCALELAB_PYTHON" -m scalelab.aws.bootstrap
echo "scalelab: bootstrap exited with $?"
shutdown -h now "scalelab run ended"
