"""`runner.native_abort`: a rank whose C++ code threw past its thread (exit 134, no record, no Python
traceback) is named with its own `what()` line, whatever the starter's tags on its output. The end-to-end
case (a real Gloo rendezvous timing out under horovodrun) is in tests/test_rank_signals.py."""

from __future__ import annotations

import pytest

from scalelab.launcher.runner import native_abort


@pytest.mark.parametrize("logs, said", [
    ("[0]<stderr>:terminate called after throwing an instance of 'gloo::IoException'\n"
     "[0]<stderr>:  what():  [/h/http_store.cc:54] [/h/http_store.cc:54] Wait timeout after 30 seconds\n"
     "[0]<stderr>:Aborted\nProcess 0 exit with status code 134.",
     "rank 0 aborted: gloo::IoException: Wait timeout after 30 seconds"),  # horovodrun; gloo's source cut
    ("[0]<stderr>:terminate called after throwing an instance of 'gloo::IoException'\n"
     "[1]<stderr>:terminate called after throwing an instance of 'std::runtime_error'\n"
     "[1]<stderr>:  what():  rank one's words\n[0]<stderr>:  what():  rank zero's words",
     "rank 0 aborted: gloo::IoException: rank zero's words"),  # two ranks at once: their lines interleave
    ("[1,3]<stderr>:terminate called after throwing an instance of 'c10::Error'\n[1,3]<stderr>:  what():  CUDA error",
     "rank 3 aborted: c10::Error: CUDA error"),  # mpirun --tag-output (Kubernetes' MPIJob)
    ("Fri Nov 27 12:00:01 2026[2]<stderr>:terminate called after throwing an instance of 'X'\n"
     "Fri Nov 27 12:00:01 2026[2]<stderr>:  what():  y", "rank 2 aborted: X: y"),  # horovodrun's timestamps
    ("[default3]:terminate called after throwing an instance of 'X'\n[default3]:  what():  z",
     "local rank 3 aborted: X: z"),  # torchrun --tee: a local rank, not a global one
    ("2026-11-27T12:00:01.5Z terminate called after throwing an instance of 'c10::Error'\n"
     "2026-11-27T12:00:01.5Z   what():  CUDA error: k8s", "a rank aborted: c10::Error: CUDA error: k8s"),
    ("terminate called after throwing an instance of 'std::bad_alloc'", "a rank aborted: std::bad_alloc"),
    ("Traceback (most recent call last):\nValueError: no\nterminate called without an active exception", ""),
    ("", ""),
])
def test_a_ranks_own_abort_line_is_found_under_every_starters_tags(logs, said):
    assert native_abort(logs) == said
