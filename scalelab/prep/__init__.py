"""`launch prep`: corpus preprocessing on Dask into memory-mappable shards (docs/prep.md).

- `request.py`   what a prep run is asked to do (validated; saved as prep.json)
- `corpus.py`    files, globs and URLs; byte blocks, line numbers, reading lines in lockstep
- `families.py`  samples, counts and ids per model family (`train.text`'s rules)
- `tasks.py`     the work of a Dask worker, one measured record per task
- `pipeline.py`  the phases on the driver: index, scan, merge, hold-out, encode, regroup, manifest
- `shardio.py`   columns to Arrow IPC shard files and back
- `checks.py`    the text datasets' checks of a corpus, on the scan's counts
- `clusters.py`  local, Slurm (dask-jobqueue), Kubernetes (dask-kubernetes) and AWS (S3) clusters
- `records.py`   the prep run directory and its records; `report.py` the scaling table
- `cli.py`       the command; `bench.py` lines per second against a single-process baseline
"""
