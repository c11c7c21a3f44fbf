"""`python -m scalelab.train RUN_DIR`: the per-rank entry point every backend starts.

The rank leaves with `os._exit` once its records are closed and its engine shut down: interpreter
teardown would otherwise run C++ static destructors while Gloo's threads may still be joinable,
which aborts the process now and then ("terminate called without an active exception") after a
run that finished correctly, and the launcher would report a failure.

The imports run with the cyclic garbage collector paused, and one collection after them: PyTorch makes
about 250,000 objects that live as long as the rank, and the collector walked them again and again while
they loaded (docs/benchmarks.md, tenth stop). `torch._dynamo`, which PyTorch's optimizers and DDP import,
is not imported here: the trainer's optimizers and its DDP do without it (scalelab/train/optim.py,
scalelab/train/ddp.py); a rank that compiles its output layer imports it then. Nothing is frozen
(`gc.freeze`, which makes full collections frequent): with it, two DDP ranks of one CI run hung after their
last record, freeing DDP's reducer, whose Gloo group's destructor joins Gloo's threads with the GIL held
while one of them waited for the GIL. The group is now kept to the end besides (`_KEPT_UNTIL_EXIT`,
scalelab/train/engines.py).
"""

from scalelab.train import collector_paused, exit_without_teardown

with collector_paused(collect=True):
    from scalelab.train.loop import main

exit_without_teardown(main())
