"""Namespace hosts that run from the CPU image's root filesystem, as a cluster's nodes run a container image.

``make image-check`` (or ``make image-rootfs``) exports the image
(docker/Dockerfile --target cpu) to a directory. Each host mounts it at
``/run/image`` in its own mount namespace, with its own /proc, the machine's
/dev and /sys, the cluster's /etc/hosts and ssh files over the image's, and a
directory both hosts share at ``/mnt`` (the shared filesystem of a cluster).
The host's sshd stays on the machine's filesystem (the node's sshd) and
chroots every session into ``/run/image`` (``ChrootDirectory``): what pdsh
starts on a host runs the image's Python, DeepSpeed and package, never the
machine's. ``image_command`` does the same for a command started directly.

The image's environment (its ENV lines) is not applied by a chroot: callers
pass ``IMAGE_ENV`` (PATH with the venv first, DS_ACCELERATOR, ...).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tools.cluster.hosts import ClusterUnavailable, Hosts
from tools.cluster.ssh import SshKeys, start_sshd, ssh_unavailable, wait_for_ssh

__all__ = ["IMAGE_ENV", "MOUNT", "SHARED", "image_command", "image_hosts", "rootfs_unavailable"]

MOUNT = "/run/image"
SHARED = "/mnt"
WORKDIR = "/workspace/plsh_dist"
IMAGE_ENV = {"PATH": "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "HOME": "/root", "VIRTUAL_ENV": "/opt/venv", "PYTHONUNBUFFERED": "1", "DS_ACCELERATOR": "cpu",
             "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PLSH_PROGRESS": "0"}


def rootfs_unavailable(rootfs: Path | None) -> str | None:
    """Why ``rootfs`` is no image root filesystem (None: it is one)."""
    if rootfs is None:
        return "no image root filesystem: set PLSH_IMAGE_ROOTFS (make test-cluster builds it: make image-rootfs)"
    if not os.path.lexists(Path(rootfs) / "opt/venv/bin/python") or not (Path(rootfs) / WORKDIR.lstrip("/")).is_dir():
        return f"{rootfs} is not the CPU image's root filesystem (no /opt/venv/bin/python or {WORKDIR})"
    return None


def image_command(argv: list[str], cwd: str = WORKDIR) -> list[str]:
    """``argv`` in the image: chroot into it, then ``cd cwd`` (run it with ``Host.command``)."""
    return ["chroot", MOUNT, "sh", "-c", 'cd "$0" && exec "$@"', cwd, *argv]


@contextmanager
def image_hosts(n: int, state_dir: Path, rootfs: Path) -> Iterator[tuple[Hosts, Path]]:
    """``n`` hosts running from ``rootfs``, root ssh between them; yields the hosts and the shared directory
    (``SHARED`` inside the image)."""
    reason = ssh_unavailable() or rootfs_unavailable(rootfs)
    if reason:
        raise ClusterUnavailable(reason)
    state_dir = Path(state_dir)
    shared = state_dir / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    shared.chmod(0o1777)
    hosts = Hosts(n, state_dir / "hosts", dirs=("/run/sshd", MOUNT))
    keys = SshKeys(state_dir / "ssh", hosts.names, hosts.addresses)
    for name in hosts.names:  # every session (pdsh's commands) runs in the image
        with open(keys.directory / f"sshd_config_{name}", "a") as config:
            config.write(f"ChrootDirectory {MOUNT}\n")
    os.chmod(rootfs, 0o755)  # sshd refuses a chroot directory others can write
    hosts.binds = (keys.bind, f"{rootfs}:{MOUNT}", f"/proc:{MOUNT}/proc", f"/sys:{MOUNT}/sys",
                   f"/dev:{MOUNT}/dev", f"/dev/shm:{MOUNT}/dev/shm", f"{keys.directory}:{MOUNT}/etc/ssh",
                   f"{hosts.hosts_file}:{MOUNT}/etc/hosts", f"{shared}:{MOUNT}{SHARED}")
    with hosts:
        for host in hosts:
            start_sshd(host)
        wait_for_ssh(hosts[0], hosts.names)
        yield hosts, shared
