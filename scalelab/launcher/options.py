"""The local backend's options, declared once (no heavy imports): the CLI reads them at start."""

from __future__ import annotations

from dataclasses import dataclass

from scalelab.core.options import BackendOptions, at_least, at_most, executable, option
from scalelab.costs.fleet import OnPremiseFleet


@dataclass(frozen=True)
class LocalOptions(BackendOptions, OnPremiseFleet):
    """Ranks as processes on this machine."""

    backend = "local"
    assumed_startup_s = 15.0  # the trainer's imports and the rendezvous

    master_port: int = option(0, "Rendezvous port of DDP; 0 = a free port, probed when the request is rendered.",
                              at_least(0), at_most(65535))
    python: str = option("", "The interpreter of the ranks [default: this one].", executable)
    instance_type: str = option("", "What the planner and `launch cost` call this machine: a --rate name of the "
                                "prices file (`launch probe` sets it to the probed variant, e.g. local-2t).")
    stop_grace_s: float = option(30.0, "Seconds the ranks get to checkpoint and exit after SIGTERM (a cancel, a "
                                 "failed node) before SIGKILL.", at_least(0), at_most(3600))
