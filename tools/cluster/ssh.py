"""Passwordless root ssh between the namespace hosts, with keys made for this cluster only.

Everything lives in one directory that each host mounts over /etc/ssh
(``SshKeys.bind``), so the machine's own ssh files, ~/.ssh and any sshd it
runs are never read or changed:

- ``cluster_id_ed25519``: the client key every host uses; its public half is
  the only ``cluster_authorized_keys`` entry;
- ``host_<name>_ed25519``: each host's sshd key, all listed in
  ``cluster_known_hosts`` under the host's name and address (strict host key
  checking stays on);
- ``ssh_config``: the client settings (BatchMode: a missing key fails at once
  instead of prompting; connect and keep-alive timeouts: a dead host fails
  in seconds instead of hanging pdsh);
- ``sshd_config``: root by key only, no PAM; each host's sshd listens on its
  own network namespace (its eth0 and loopback).
"""

from __future__ import annotations

import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tools.cluster.hosts import ClusterUnavailable, Host, Hosts, missing_tools

__all__ = ["SSH_TOOLS", "SshKeys", "ssh_hosts", "ssh_unavailable", "start_sshd", "wait_for_ssh"]

SSH_TOOLS = ("sshd", "ssh", "ssh-keygen", "pdsh")
MOUNT_POINT = "/etc/ssh"
SSHD_CONFIG = f"""\
Port 22
HostKey {MOUNT_POINT}/host_%s_ed25519
PidFile /run/sshd.pid
AuthorizedKeysFile {MOUNT_POINT}/cluster_authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# the key files sit under a world-writable /tmp: sshd's ownership walk would refuse them
StrictModes no
X11Forwarding no
PrintMotd no
"""
SSH_CONFIG = f"""\
Host *
    User root
    IdentityFile {MOUNT_POINT}/cluster_id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile {MOUNT_POINT}/cluster_known_hosts
    GlobalKnownHostsFile {MOUNT_POINT}/cluster_known_hosts
    StrictHostKeyChecking yes
    BatchMode yes
    ConnectTimeout 10
    ServerAliveInterval 5
    ServerAliveCountMax 6
    LogLevel ERROR
"""


def _keygen(path: Path, comment: str) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True, timeout=30)
    return path.with_suffix(".pub").read_text().strip()


class SshKeys:
    """Keys and configs for hosts ``names`` at ``addresses``, written under ``directory``."""

    def __init__(self, directory: Path, names: list[str], addresses: list[str]):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o755)
        client = _keygen(self.directory / "cluster_id_ed25519", "plsh-cluster")
        (self.directory / "cluster_authorized_keys").write_text(client + "\n")
        known = []
        for name, address in zip(names, addresses):
            public = _keygen(self.directory / f"host_{name}_ed25519", name)
            known.append(f"{name},{address} {' '.join(public.split()[:2])}")
        (self.directory / "cluster_known_hosts").write_text("\n".join(known) + "\n")
        (self.directory / "ssh_config").write_text(SSH_CONFIG)
        for name in names:
            (self.directory / f"sshd_config_{name}").write_text(SSHD_CONFIG % name)

    @property
    def bind(self) -> str:
        """The ``SRC:DST`` bind mount for ``Hosts(binds=...)``."""
        return f"{self.directory}:{MOUNT_POINT}"


def start_sshd(host: Host) -> None:
    """Start the host's sshd; it daemonizes inside the host and dies with it."""
    host.run(["/usr/sbin/sshd", "-f", f"{MOUNT_POINT}/sshd_config_{host.name}"])


def wait_for_ssh(client: Host, names: list[str], timeout_s: float = 30) -> None:
    """Block until ``client`` can run a command on every host in ``names`` over ssh."""
    deadline = time.monotonic() + timeout_s
    for name in names:
        while True:
            res = client.run(["ssh", name, "hostname"], check=False, timeout_s=timeout_s)
            if res.returncode == 0 and res.stdout.strip() == name:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"ssh {client.name} -> {name} not working after {timeout_s:.0f} s: "
                                   f"{res.stderr.strip() or res.stdout.strip()}")
            time.sleep(0.2)


def ssh_unavailable() -> str | None:
    """What is missing for ssh/pdsh between the hosts (None: nothing)."""
    missing = missing_tools(SSH_TOOLS)
    if missing:
        return f"missing {', '.join(missing)} (openssh-server, openssh-client, pdsh: make cluster-deps)"
    return None


@contextmanager
def ssh_hosts(n: int, state_dir: Path, binds: tuple[str, ...] = (), dirs: tuple[str, ...] = ()) -> Iterator[Hosts]:
    """``n`` namespace hosts with sshd running and root ssh working between all of them."""
    reason = ssh_unavailable()
    if reason:
        raise ClusterUnavailable(reason)
    hosts = Hosts(n, Path(state_dir) / "hosts", dirs=("/run/sshd", *dirs))
    keys = SshKeys(Path(state_dir) / "ssh", hosts.names, hosts.addresses)
    hosts.binds = (keys.bind, *binds)
    with hosts:
        for host in hosts:
            start_sshd(host)
        wait_for_ssh(hosts[0], hosts.names)
        yield hosts
