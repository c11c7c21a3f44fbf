"""The `aws` backend: the trainer on EC2 GPU instances (on-demand or spot), nothing left running.

Instance shapes and the `--instance-type` grammar are the cost catalog's (scalelab/costs/catalog.py,
scalelab/costs/billing.py `Mix.for_nodes`). Modules, in the order a run uses them: `options` (options and their
CLI flags), `render`
(the pure EC2/S3 requests and the user-data script), `backend` (schedule, wait, status, logs,
cancel), `bootstrap` (what runs on each instance), `teardown` (terminate and delete by tag),
`cli` (`launch aws gc`). boto3 is imported
lazily, only when a request is sent. Mixed instance types use the trainer's dynamic load balancer
(`--balance dynamic`, scalelab/train/balance.py). See docs/aws.md.
"""
