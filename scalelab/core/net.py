"""Network helpers shared by the launcher, the Slurm ranks and the tests."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import random
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS = range(20000, 32768)  # below Linux's default ephemeral range (32768-60999)
AVOIDED_PORTS = range(29400, 29601)  # torchrun's defaults (c10d rendezvous 29400, master 29500): others' listeners


def free_port(host: str = "127.0.0.1", ephemeral: Path = EPHEMERAL_RANGE, handed: Path | None = None) -> int:
    """A TCP port free on `host` now, for a rendezvous server that binds it a few seconds later.

    It is drawn at random from ports outside the kernel's ephemeral range, because a port the kernel
    picks for `bind(0)` is one it will hand out again, to any process's next `bind(0)` or outgoing
    connection, as soon as this probe closes: the Slurm cluster test lost its rank-0 TCPStore to
    EADDRINUSE that way (CI of 2026-11-28). A port below the range is taken only by a process that names
    it. Where the range leaves no room below it (or cannot be read), the kernel's pick is the fallback.

    The processes that name ports there are mostly other launches on this machine, which draw from the
    same pool: two that probed the same port within seconds of each other both found it free, and the
    second server to bind it failed (a resumed DDP run in the README's test command, 2026-12-06). So a
    port handed out here is written down (`handed`, a file per user, shared by every process on this
    machine) and not handed out again for HANDED_FOR_S, by which time its server has bound it or given up.
    """
    ledger = handed if handed is not None else handed_ports_file()
    with _ledger(ledger) as recent:
        for port in _listen_candidates(ephemeral):
            if port in recent:
                continue  # another launch here took it moments ago: its server may not be listening yet
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue  # in use (or in TIME_WAIT): the next one
            recent[port] = time.time()
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


HANDED_FOR_S = 120.0  # a rendezvous server binds its port within seconds of the probe; Slurm's queue may add more


def handed_ports_file() -> Path:
    """The ledger of ports `free_port` handed out lately: one per user, in the temporary directory."""
    return Path(tempfile.gettempdir()) / f"scalelab-{os.getuid()}" / "handed-ports.json"


@contextlib.contextmanager
def _ledger(path: Path) -> Iterator[dict[int, float]]:
    """The ports handed out in the last HANDED_FOR_S (port -> time), under an exclusive lock; what the block
    adds is written back. A ledger that cannot be kept (read-only or full /tmp) is an empty one, not an
    error: the probe then works as it did without it."""
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        yield {}
        return
    with os.fdopen(fd, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
        now = time.time()
        try:
            recent = {int(p): float(t) for p, t in json.loads(f.read() or "{}").items()
                      if 0 <= now - float(t) < HANDED_FOR_S}
        except (ValueError, TypeError, AttributeError):
            recent = {}  # damaged (a crash mid-write): forget it, the bind probe still guards
        before = dict(recent)
        yield recent
        if recent != before:
            with contextlib.suppress(OSError):
                f.seek(0)
                f.truncate()
                f.write(json.dumps({str(p): t for p, t in recent.items()}))


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
