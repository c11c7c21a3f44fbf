"""Two EC2 instances played on this machine, each in namespaces of its own, for the tests whose ranks must
cross from one instance to the other the way they do on EC2 (Horovod's horovodrun over ssh, torchrun's
rendezvous over the VPC).

Why namespaces: horovodrun starts the ranks of a host over ssh only when that host's address is not one of
this machine's own (horovod/runner/util/network.py), so the second instance needs a network stack of its
own with an sshd in it. Each instance gets:

- a network namespace with its private address (moto's) on `ens5`, a veth whose other end is on a bridge
  joining the two instances and this machine (the same interface name on both instances, as on one AMI:
  horovodrun only uses an interface that every host has; and no port shared with this machine's own
  processes or another test's instances);
- a mount namespace in which its own scratch folder is mounted at the common SCALELAB_WORK path (every
  instance has the same paths, so the leader's command lines name the right files on the other one), its
  own /root/.ssh, and an /etc/hosts in which its hostname names its private address, as EC2's DNS does
  (Horovod 0.28's Gloo process sets bind to whatever the hostname resolves to: this machine's name
  resolves to 127.0.0.1, which the other instance cannot reach);
- a UTS namespace (its own hostname) and a PID namespace (its processes only; when its user data ends,
  whatever it left is killed with it, as when an instance powers off).

Of this machine's state, only two empty directories may stay: /root/.ssh (the instances' mount point; an
empty one is how a root account starts) and /run/sshd (sshd's privilege-separation directory, which Debian
makes at boot).

The instances reach moto and their metadata stand-ins over the bridge, at this machine's address on it
(a second moto server in the test's process, sharing the first one's state). Needs root, `ip`,
`unshare` and sshd (installed by scripts/sshd-install.sh); a test skips with the reason where they are not.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SSHD = "/usr/sbin/sshd"


@functools.lru_cache(maxsize=1)
def unavailable() -> str:
    """Why two instances cannot be played here ('' when they can). Installs sshd (with ssh) once."""
    if os.geteuid() != 0:
        return "playing two instances needs root (network and mount namespaces)"
    installed = subprocess.run(["bash", str(ROOT / "scripts" / "sshd-install.sh")], capture_output=True, text=True)
    if installed.returncode != 0:
        return installed.stderr.strip() or "scripts/sshd-install.sh failed"
    for tool in ("ip", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"playing two instances needs `{tool}`"
    return ""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


@dataclass
class Instance:
    """One played instance: its index, private address, hostname and scratch folders (this machine's view)."""

    index: int
    ip: str
    hostname: str
    folder: Path  # mounted at the common work path inside the instance
    ssh_dir: Path  # mounted at /root/.ssh inside the instance
    netns: str

    def wrap(self, work: Path, command: str, before: str = "") -> list[str]:
        """argv running `command` (bash) inside this instance's namespaces, after `before` (bash) there."""
        hosts = self.folder.parent / f"hosts-{self.index}"
        hosts.write_text(f"127.0.0.1 localhost\n{self.ip} {self.hostname}\n")
        q = shlex.quote
        setup = (f"set -e; hostname {q(self.hostname)}; mount --bind {q(str(hosts))} /etc/hosts; "
                 f"mkdir -p {q(str(work))}; mount --bind {q(str(self.folder))} {q(str(work))}; "
                 f"mount --bind {q(str(self.ssh_dir))} /root/.ssh; export HOME=/root; "
                 f"{before} set +e; exec bash -c {q(command)}")
        # --kill-child: when the test kills this process, everything in the instance goes with it
        inner = ["unshare", "--mount", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation",
                 "private", "bash", "-c", setup]
        return ["ip", "netns", "exec", self.netns, *inner]


@dataclass
class Network:
    """The played VPC: the instances, and this machine's address on their link (`gateway`), where the
    tests serve moto and the metadata stand-ins to them."""

    instances: list[Instance]
    gateway: str


@contextmanager
def two_instances(tmp_path: Path, ips: tuple[str, str]):
    """Two instances with these private addresses, each in a network namespace of its own, their `ens5`
    (the same name on both, as on one AMI) on a bridge with this machine's `gateway` address; removed
    afterwards. Nothing of theirs shares this machine's ports (two runs' torchrun both listen on 29500)."""
    # The mount point of each instance's own /root/.ssh. It stays (empty, as on any root account): removing it
    # would detach the bind mount of another test's instances that use it now (the other xdist worker's:
    # their horovodrun lost its key, CI 2026-11-27).
    Path("/root/.ssh").mkdir(mode=0o700, exist_ok=True)
    tag = uuid.uuid4().hex[:6]
    bridge = f"sl{tag}"
    gateway = f"198.18.{uuid.uuid4().int % 250 + 1}.{uuid.uuid4().int % 250 + 1}"  # RFC 2544's test range
    made: list[Instance] = []
    for i, ip in enumerate(ips):
        folder, ssh_dir = tmp_path / f"instance-{i}", tmp_path / f"instance-{i}-ssh"
        folder.mkdir()
        ssh_dir.mkdir(mode=0o700)
        made.append(Instance(i, ip, f"ip-{ip.replace('.', '-')}", folder, ssh_dir, f"slns{tag}{i}"))
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{gateway}/32", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for instance in made:
            ns, end = instance.netns, f"{bridge}{instance.index}"
            _ip("netns", "add", ns)
            _ip("link", "add", end, "type", "veth", "peer", "name", "ens5", "netns", ns)
            _ip("link", "set", end, "master", bridge)
            _ip("link", "set", end, "up")
            _ip("-n", ns, "addr", "add", f"{instance.ip}/32", "dev", "ens5")
            _ip("-n", ns, "link", "set", "ens5", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            for other in [gateway] + [o.ip for o in made if o is not instance]:
                _ip("-n", ns, "route", "add", f"{other}/32", "dev", "ens5")
            _ip("route", "add", f"{instance.ip}/32", "dev", bridge)
    except RuntimeError as exc:
        _remove(bridge, made)
        if "not permitted" in str(exc) or "not supported" in str(exc).lower():  # a sandbox without these powers
            pytest.skip(f"cannot link two played instances here: {exc}")
        raise
    try:
        yield Network(made, gateway)
    finally:
        _remove(bridge, made)


def _remove(bridge: str, made: list[Instance]) -> None:
    for instance in made:
        _ip("netns", "del", instance.netns, check=False)  # takes its veth pair with it
    _ip("link", "del", bridge, check=False)


def sshd_start(instance: Instance) -> str:
    """bash (for Instance.wrap's `before`) starting an sshd on the instance's address, its host key and
    config in the instance's folder; root may log in with a key, as on EC2's AMIs."""
    home = instance.folder.parent / f"sshd-{instance.index}"
    home.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / "host_key")], check=True)
    (home / "sshd_config").write_text(
        f"ListenAddress {instance.ip}\nPort 22\nHostKey {home / 'host_key'}\nPidFile {home / 'sshd.pid'}\n"
        "UsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
        "StrictModes no\nAuthorizedKeysFile .ssh/authorized_keys\n")
    log = shlex.quote(str(home / "sshd.log"))  # a refusal is the test's failure message, not an instance that never boots
    return (f"mkdir -p /run/sshd; {SSHD} -f {home / 'sshd_config'} -E {log} "
            f"|| {{ echo \"the played instance's sshd did not start: $(cat {log})\"; exit 1; }};")
