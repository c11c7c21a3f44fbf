"""scalelab: train recurrent models data-parallel on a chosen layout, measure how they scale, and plan
which layout and instance type reaches a loss by a deadline at the least cost.

Everything lives under this one package (scalelab.core, .train, .analysis, .costs, .launcher and the
backends .slurm, .k8s, .aws, .prep), so nothing in a user's working directory (a `train.py`, a `core/`)
can shadow the trainer its ranks start as `python -m scalelab.train`."""
