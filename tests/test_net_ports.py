"""The rendezvous port probe (scalelab.core.net.free_port): ports outside the kernel's ephemeral range, so that
another process's bind(0) or outgoing connection cannot be handed the port between the probe and the server's
bind (the EADDRINUSE that failed the Slurm probe test in CI on 2026-11-28)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from scalelab.core import net


def _ephemeral() -> tuple[int, int]:
    low, high = (int(v) for v in net.EPHEMERAL_RANGE.read_text().split())
    return low, high


@pytest.mark.skipif(not net.EPHEMERAL_RANGE.exists(), reason="no /proc/sys/net/ipv4/ip_local_port_range here")
def test_ports_lie_outside_the_ephemeral_range_and_bind() -> None:
    low, high = _ephemeral()
    ports = {net.free_port() for _ in range(20)}
    assert all(not low <= p <= high for p in ports), (ports, low, high)
    assert not ports & set(net.AVOIDED_PORTS)
    assert len(ports) > 1  # drawn at random, not the same port for every caller
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: a server can take it


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    try:
        other = net.free_port()  # a second port that is free now
        monkeypatch.setattr(net, "LISTEN_PORTS", [taken, other])
        monkeypatch.setattr(net, "AVOIDED_PORTS", range(0))
        (tmp_path / "range").write_text("60000 60001\n")  # neither candidate is ephemeral by this file
        got = {net.free_port(ephemeral=tmp_path / "range") for _ in range(10)}
        assert got == {other}
    finally:
        held.close()


@pytest.mark.parametrize("content", ["1024 65535\n", "not numbers\n", None])
def test_the_kernels_pick_when_nothing_lies_outside_the_range(tmp_path: Path, content: str | None) -> None:
    """A range that covers every candidate, or a file that cannot be read, leaves bind(0)'s port."""
    path = tmp_path / "range"
    if content is not None:
        path.write_text(content)
    port = net.free_port(ephemeral=path)
    assert 1 <= port <= 65535
    if net.EPHEMERAL_RANGE.exists():
        low, high = _ephemeral()
        assert low <= port <= high  # the kernel's own choice
