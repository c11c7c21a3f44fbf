"""EC2 GPU instance shapes: how many GPUs (ranks) each instance type runs, and its CPUs and memory.

Copied from the project's reference table (shared/reference/aws_gpu_instances.csv, gathered from
AWS's public instance-type pages and price lists; seed 004 used p2.xlarge, g3.4xlarge and
g3.16xlarge). Shapes only: prices live in costs/ because they change and must be refreshable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.errors import SpecError


@dataclass(frozen=True)
class Shape:
    gpus: int
    vcpus: int
    mem_gib: float
    gpu_model: str


INSTANCES: dict[str, Shape] = {
    "p2.xlarge": Shape(1, 4, 61, "K80"),
    "p2.8xlarge": Shape(8, 32, 488, "K80"),
    "p2.16xlarge": Shape(16, 64, 732, "K80"),
    "g3s.xlarge": Shape(1, 4, 30.5, "M60"),
    "g3.4xlarge": Shape(1, 16, 122, "M60"),
    "g3.8xlarge": Shape(2, 32, 244, "M60"),
    "g3.16xlarge": Shape(4, 64, 488, "M60"),
    "p3.2xlarge": Shape(1, 8, 61, "V100"),
    "p3.8xlarge": Shape(4, 32, 244, "V100"),
    "p3.16xlarge": Shape(8, 64, 488, "V100"),
    "g4dn.xlarge": Shape(1, 4, 16, "T4"),
    "g4dn.12xlarge": Shape(4, 48, 192, "T4"),
    "g5.xlarge": Shape(1, 4, 16, "A10G"),
    "g5.12xlarge": Shape(4, 48, 192, "A10G"),
    "p4d.24xlarge": Shape(8, 96, 1152, "A100"),
}


def shape(name: str) -> Shape:
    """The shape of `name`; an unknown type names the known ones."""
    if name not in INSTANCES:
        raise SpecError(f"unknown instance type {name!r}; known GPU instance types: {', '.join(INSTANCES)}")
    return INSTANCES[name]


_TERM = re.compile(r"^\s*(?:(\d+)\s*\*\s*)?([a-z0-9]+\.[a-z0-9]+)\s*$")


def parse_instance_types(text: str, nodes: int) -> list[str]:
    """One instance type per node, in node order.

    `g3.4xlarge` means `nodes` of that type; a mix such as `1*p2.xlarge+3*g3.4xlarge` lists the
    instances itself and must add up to `nodes` (so the spec saved with the run says what ran).
    """
    terms = [t for t in str(text).split("+")]
    if len(terms) == 1 and "*" not in terms[0]:
        shape(terms[0].strip())
        return [terms[0].strip()] * nodes
    out: list[str] = []
    for term in terms:
        m = _TERM.match(term)
        if not m:
            raise SpecError(f"cannot read instance type term {term!r} in {text!r}; write e.g. 1*p2.xlarge+3*g3.4xlarge")
        count = int(m.group(1) or 1)
        if count < 1:
            raise SpecError(f"instance count must be >= 1 in {term!r}")
        shape(m.group(2))
        out += [m.group(2)] * count
    if len(out) != nodes:
        raise SpecError(f"the instance mix {text!r} has {len(out)} instances but --nodes is {nodes}; pass --nodes {len(out)}")
    return out
