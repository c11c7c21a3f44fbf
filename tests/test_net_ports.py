"""The rendezvous port probe (scalelab.core.net.free_port): ports outside the kernel's ephemeral range, so that
another process's bind(0) or outgoing connection cannot be handed the port between the probe and the server's
bind (the EADDRINUSE that failed the Slurm probe test in CI on 2026-11-28)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
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
        got = {net.free_port(ephemeral=tmp_path / "range", handed=tmp_path / f"ledger-{i}") for i in range(10)}
        assert got == {other}  # a fresh ledger each time: only the bind decides
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


def _two_ports(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    """Two free ports as the only candidates (ephemeral by no range), the ledger's window as it is."""
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    monkeypatch.setattr(net, "LISTEN_PORTS", ports)
    monkeypatch.setattr(net, "AVOIDED_PORTS", range(0))
    (tmp_path / "range").write_text("1 2\n")
    return ports


def test_a_port_handed_out_is_not_handed_out_again_while_its_server_may_still_be_starting(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Two launches that probe the same free port seconds apart both find it free (nothing listens yet): the
    ledger makes the second one take another (the README test command's EADDRINUSE, 2026-12-06)."""
    ports = _two_ports(monkeypatch, tmp_path)
    draw = lambda: net.free_port(ephemeral=tmp_path / "range", handed=tmp_path / "ledger")  # noqa: E731
    first, second = draw(), draw()
    assert {first, second} == set(ports)
    third = draw()  # both candidates handed out moments ago: the kernel's pick, never one of them
    assert third not in ports
    monkeypatch.setattr(net, "HANDED_FOR_S", 0.0)  # their window over: handed out again
    assert draw() in ports


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"x": "y"}'])
def test_a_damaged_ledger_is_forgotten_and_rewritten(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     content: str) -> None:
    ports = _two_ports(monkeypatch, tmp_path)
    ledger = tmp_path / "ledger"
    ledger.write_text(content)
    port = net.free_port(ephemeral=tmp_path / "range", handed=ledger)
    assert port in ports
    assert json.loads(ledger.read_text()).keys() == {str(port)}


def test_a_ledger_that_cannot_be_written_leaves_the_bind_probe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A read-only temporary directory (or one owned by someone else) is no error: the ports still bind."""
    ports = _two_ports(monkeypatch, tmp_path)
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    assert net.free_port(ephemeral=tmp_path / "range", handed=blocked / "sub" / "ledger") in ports


def test_launches_drawing_at_once_from_a_small_pool_never_share_a_port(tmp_path: Path) -> None:
    """Eight processes drawing five ports each at the same moment from 40 candidates: 40 different ports
    (without the ledger's lock two draws of one port would be likely: 1 - P(no collision) is about 100%)."""
    script = tmp_path / "draw.py"
    script.write_text(
        "import sys\nfrom pathlib import Path\nfrom scalelab.core import net\n"
        "net.LISTEN_PORTS = range(int(sys.argv[1]), int(sys.argv[1]) + 40)\nnet.AVOIDED_PORTS = range(0)\n"
        "print(*[net.free_port(ephemeral=Path(sys.argv[2]), handed=Path(sys.argv[3])) for _ in range(5)])\n")
    (tmp_path / "range").write_text("60000 60999\n")
    # Below net.LISTEN_PORTS (20000-32767), which every other worker's launches draw from (a port they took
    # between this probe and the draw would make it skip one), and below the kernel's ephemeral range:
    # nothing else takes a port here unless it names it.
    base = _forty_free(10000, 19960)
    procs = [subprocess.Popen([sys.executable, str(script), str(base), str(tmp_path / "range"), str(tmp_path / "ledger")],
                              stdout=subprocess.PIPE, text=True) for _ in range(8)]
    drawn = [int(p) for proc in procs for p in proc.communicate(timeout=60)[0].split()]
    assert len(drawn) == 40 and len(set(drawn)) == 40, sorted(drawn)
    assert all(base <= p < base + 40 for p in drawn)


def _forty_free(low: int, high: int) -> int:
    """The first of 40 consecutive ports in [low, high) that all bind now."""
    for base in range(low, high, 40):
        try:
            for port in range(base, base + 40):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    pytest.skip("no 40 consecutive free ports here")
