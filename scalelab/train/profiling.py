"""`--profile-steps A:B`: a torch.profiler trace of steps A..B on every rank, in Chrome trace format.

Why a trace beside the records: the records say how long each phase took; a trace says which
operators and kernels made it so (the timeline of a step), which is what one looks at to find work
that runs on one device only or a copy nobody asked for. Each rank writes RUN_DIR/profile/rank-R.json
(open it in chrome://tracing or ui.perfetto.dev; the HTML report links them). The profiler slows the
steps it records, so those step records carry `profiled: true` and reports leave them out of the
timings, like warm-up steps.
"""

from __future__ import annotations

from pathlib import Path

import torch

from scalelab.core.records import RecordWriter
from scalelab.core.spec import Spec

PROFILE_DIR = "profile"


class StepProfiler:
    """Starts before step A, stops after step B (or when training ends first) and writes the trace."""

    def __init__(self, run_dir: Path, spec: Spec, rank: int, device: torch.device) -> None:
        self.range = spec.profile_range()
        self.path = Path(run_dir) / PROFILE_DIR / f"rank-{rank}.json"
        self.device = device
        self.prof: torch.profiler.profile | None = None
        self.first: int | None = None

    @property
    def active(self) -> bool:
        return self.prof is not None

    def before(self, step: int) -> None:
        """Called before step `step` (1-based, as the step records count): start at the first in range."""
        if self.range is None or self.prof is not None or not self.range[0] <= step <= self.range[1]:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=activities, record_shapes=True)
        self.prof.__enter__()
        self.first = step

    def after(self, step: int, out: RecordWriter) -> None:
        """Called after step `step`: at the last step of the range, stop and write the trace."""
        if self.prof is not None and self.range is not None and step >= self.range[1]:
            self.close(step, out)

    def close(self, step: int, out: RecordWriter) -> None:
        """Stop and write the trace (also when training ended inside the range: a threshold, a signal)."""
        if self.prof is None:
            return
        self.prof.__exit__(None, None, None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.prof.export_chrome_trace(str(self.path))
        out.event("profile", first_step=self.first, last_step=step, path=str(self.path))
        self.prof = None
        self.range = None  # one trace per launch: a resume inside the range records its own
