"""Network helpers shared by the launcher, the Slurm ranks and the tests."""

from __future__ import annotations

import ipaddress
import random
import socket
from collections.abc import Callable, Sequence
from pathlib import Path


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS = range(20000, 32768)  # below Linux's default ephemeral range (32768-60999)
AVOIDED_PORTS = range(29400, 29601)  # torchrun's defaults (c10d rendezvous 29400, master 29500): others' listeners


def free_port(host: str = "127.0.0.1", ephemeral: Path = EPHEMERAL_RANGE) -> int:
    """A TCP port free on `host` now, for a rendezvous server that binds it a few seconds later.

    It is drawn at random from ports outside the kernel's ephemeral range, because a port the kernel
    picks for `bind(0)` is one it will hand out again, to any process's next `bind(0)` or outgoing
    connection, as soon as this probe closes: the Slurm cluster test lost its rank-0 TCPStore to
    EADDRINUSE that way (CI of 2026-11-28). A port below the range is taken only by a process that names
    it. Where the range leaves no room below it (or cannot be read), the kernel's pick is the fallback.
    """
    for port in _listen_candidates(ephemeral):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue  # in use (or in TIME_WAIT): the next one
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _listen_candidates(ephemeral: Path, tries: int = 64) -> list[int]:
    """Up to `tries` random ports of LISTEN_PORTS that lie outside the ephemeral range read from `ephemeral`."""
    try:
        low, high = (int(v) for v in ephemeral.read_text().split())
    except (OSError, ValueError):
        return []
    ports = [p for p in LISTEN_PORTS if not low <= p <= high and p not in AVOIDED_PORTS]
    return random.SystemRandom().sample(ports, min(tries, len(ports)))


def resolve(name: str) -> str | None:
    """The IPv4 address `name` resolves to here, or None when it does not resolve."""
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def gloo_hostname_problem(others: Sequence[str], lookup: Callable[[str], str | None] = resolve,
                          hostname: str | None = None) -> str | None:
    """Why other hosts' Horovod ranks could not reach this host's, or None (also when it cannot tell).

    Horovod 0.28's Gloo builds its process sets' connections on the address this host's *name*
    resolves to, whatever HOROVOD_GLOO_IFACE says (gloo_context.cc, InitializeForProcessSet). A host
    whose /etc/hosts maps its name to 127.0.x.x (Debian's default) makes every rank abort in hvd.init
    with "connect [127.0.0.1]: Connection refused". That only matters when a peer is another machine:
    one of `others` (the peers' host names or addresses) resolves to an address that is not loopback.
    """
    name = hostname or socket.gethostname()
    remote = [(o, a) for o in others if (a := lookup(o)) and not is_loopback(a)]
    if not remote:
        return None  # every peer is on this machine (or unknown here): loopback works
    address = lookup(name)
    peer, at = remote[0]
    if address is None:
        return (f"this host's name {name!r} does not resolve, and Horovod's Gloo needs it to name the address "
                f"that {peer} ({at}) reaches this host at: add '<this host's address> {name}' to /etc/hosts")
    if is_loopback(address):
        return (f"this host's name {name!r} resolves to {address}, a loopback address, while its peer {peer} is at "
                f"{at}: Horovod's Gloo would listen on {address} and the other hosts' ranks could not connect "
                f"(every rank aborts in hvd.init). Map {name!r} to this host's address on the cluster's network in "
                f"/etc/hosts (or DNS), as the other hosts see it")
    return None
