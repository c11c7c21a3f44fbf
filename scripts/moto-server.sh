#!/usr/bin/env bash
# AWS without AWS, for trying the aws backend by hand: moto's server on loopback.
#   scripts/moto-server.sh [PORT]      (default 5000; Ctrl-C stops it)
# then, in another shell:
#   export AWS_ENDPOINT_URL=http://127.0.0.1:5000 AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=y AWS_DEFAULT_REGION=us-east-1
#   aws s3 mb s3://scalelab-try   (or boto3)
#   launch --backend aws --bucket scalelab-try --placement-group none --backend-opt report_timeout_min=0.5
#     (instances start but run nothing: the run fails "never reported" and leaves nothing running)
#   launch aws gc
# moto 5.2 serves EC2 and S3 but not placement groups (use --placement-group none) nor the Pricing API.
set -euo pipefail
PY=${PYTHON:-python3}
$PY -c 'import moto.server, flask, flask_cors' 2>/dev/null || $PY -m pip install -q "moto[server]"
exec $PY -m moto.server -H 127.0.0.1 -p "${1:-5000}"
