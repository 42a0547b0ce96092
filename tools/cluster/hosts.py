"""N hosts on one machine: each a set of Linux namespaces with its own hostname, address and /run.

A host is a process tree in fresh network, UTS, mount and PID namespaces,
rooted at ``host_init.py``. The hosts share the machine's filesystem (the
checkout, the venv, a shared out_dir: what a cluster's shared filesystem
gives) but nothing else: each has its own hostname (``node-0``, ...), its own
network stack with one address on a private subnet, its own /etc/hosts
naming every host, its own /run, and its own process table (``ps`` and
``pkill`` inside a host see only that host). The hosts are joined by veth
pairs to a bridge in a further namespace (the switch); none of their
traffic reaches the machine's own network or its loopback.

Lifetime and clean-up:

- ``down()`` SIGKILLs each host's init; the kernel then kills every process
  of that host, and its namespaces, veth and mounts disappear with them.
- A crash of the process that called ``up()`` (even SIGKILL) does the same:
  each host's ``unshare`` gets SIGKILL when its parent dies
  (PR_SET_PDEATHSIG) and takes the host's init with it (``--kill-child``).
- Nothing is created in the machine's own namespaces: no named netns
  (``ip netns list`` stays empty), no interface, no mount, no file outside
  ``state_dir``.

Every external command runs under a timeout; a missing tool or a refused
namespace raises ``ClusterUnavailable`` naming the capability.
"""

from __future__ import annotations

import ctypes
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ClusterUnavailable", "Host", "Hosts", "namespaces_refused", "missing_tools"]

HOST_INIT = Path(__file__).with_name("host_init.py")
SUBNET = "10.233.0"  # private, and only ever configured inside the hosts' own network namespaces
START_TIMEOUT_S = 30
COMMAND_TIMEOUT_S = 30
_PR_SET_PDEATHSIG = 1


class ClusterUnavailable(RuntimeError):
    """The machine cannot host the cluster; the message names the missing capability and the fix."""


def missing_tools(tools: tuple[str, ...]) -> list[str]:
    """The executables among ``tools`` found neither on PATH nor in /usr/sbin (daemons live there)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [t for t in tools if shutil.which(t, path=path) is None]


def namespaces_refused() -> str | None:
    """Why this process cannot create the hosts' namespaces (None: it can)."""
    if missing_tools(("unshare", "nsenter", "ip")):
        return f"missing {', '.join(missing_tools(('unshare', 'nsenter', 'ip')))} (util-linux, iproute2)"
    try:
        res = subprocess.run(["unshare", "--net", "--uts", "--mount", "--pid", "--fork", "--mount-proc", "true"],
                             capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return "unshare --net --uts --mount --pid did not return within 30 s"
    if res.returncode != 0:
        return (f"namespaces refused: unshare --net --uts --mount --pid failed ({res.stderr.strip()}); "
                "the cluster needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) on Linux")
    return None


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent dies (so a crashed test leaves no host)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def _run(argv: list[str], timeout_s: float = COMMAND_TIMEOUT_S, **kwargs) -> subprocess.CompletedProcess:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, **kwargs)
    if res.returncode != 0:
        raise ClusterUnavailable(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


@dataclass
class Host:
    """One host: its name, address and the machine-side pid of its init (for nsenter)."""

    name: str
    address: str
    launcher: subprocess.Popen = field(repr=False)
    pid: int = 0

    def command(self, argv: list[str], cwd: str | os.PathLike | None = None) -> list[str]:
        """``argv`` run inside this host: its network, hostname, mounts and process table."""
        wd = [f"--wd={cwd}"] if cwd is not None else []
        return ["nsenter", "-t", str(self.pid), "--net", "--uts", "--mount", "--pid", *wd, "--", *argv]

    def run(self, argv: list[str], timeout_s: float = COMMAND_TIMEOUT_S, check: bool = True,
            **kwargs) -> subprocess.CompletedProcess:
        """Run to completion inside the host; raises on a non-zero exit when ``check``."""
        res = subprocess.run(self.command(argv, kwargs.pop("cwd", None)), capture_output=True, text=True,
                             timeout=timeout_s, **kwargs)
        if check and res.returncode != 0:
            raise RuntimeError(f"{self.name}: {' '.join(argv)} exited {res.returncode}: "
                               f"{res.stderr.strip()[-2000:]}")
        return res

    def popen(self, argv: list[str], cwd: str | os.PathLike | None = None, **kwargs) -> subprocess.Popen:
        """Start inside the host in the background (its own session, so a test can kill the group)."""
        return subprocess.Popen(self.command(argv, cwd), start_new_session=True, **kwargs)

    @property
    def alive(self) -> bool:
        return self.launcher.poll() is None


class Hosts:
    """``n`` hosts ``node-0`` .. ``node-{n-1}`` at 10.233.0.1 ..; use as a context manager or up()/down().

    ``binds``: extra ``SRC:DST`` bind mounts in every host (DST must exist on
    the machine, e.g. a directory of config files over /etc/slurm); ``dirs``:
    directories to create in each host's private /run.
    """

    def __init__(self, n: int, state_dir: Path, *, binds: tuple[str, ...] = (), dirs: tuple[str, ...] = ()):
        if not 1 <= n <= 200:
            raise ValueError(f"n={n}: between 1 and 200 hosts")
        self.state_dir = Path(state_dir)
        self.names = [f"node-{i}" for i in range(n)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(n)]
        self.binds, self.dirs = binds, dirs
        self.hosts: list[Host] = []
        self.switch: Host | None = None

    def __enter__(self) -> "Hosts":
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __iter__(self):
        return iter(self.hosts)

    @property
    def hosts_file(self) -> Path:
        return self.state_dir / "hosts"

    def up(self) -> None:
        reason = namespaces_refused()
        if reason:
            raise ClusterUnavailable(reason)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost"] + [f"{a} {n}" for a, n in zip(self.addresses, self.names)]
        self.hosts_file.write_text("\n".join(lines) + "\n")
        try:
            self.switch = self._start("switch", "", binds=())
            self.hosts = [self._start(n, a, binds=(f"{self.hosts_file}:/etc/hosts", *self.binds))
                          for n, a in zip(self.names, self.addresses)]
            self._wire()
        except BaseException:
            self.down()
            raise

    def _start(self, name: str, address: str, binds: tuple[str, ...]) -> Host:
        argv = ["unshare", "--net", "--uts", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
                sys.executable, str(HOST_INIT), "--hostname", name]
        argv += [a for b in binds for a in ("--bind", b)]
        argv += [a for d in self.dirs for a in ("--dir", d)]
        launcher = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    preexec_fn=_die_with_parent)
        host = Host(name, address, launcher)
        ready, _, _ = select.select([launcher.stdout], [], [], START_TIMEOUT_S)
        line = launcher.stdout.readline().strip() if ready else ""
        if line != "ready":
            launcher.kill()
            launcher.wait(COMMAND_TIMEOUT_S)
            raise ClusterUnavailable(f"host {name} did not start within {START_TIMEOUT_S} s: "
                                     f"{line or 'no output'}")
        host.pid = self._init_pid(launcher.pid)
        return host

    @staticmethod
    def _init_pid(unshare_pid: int) -> int:
        """The machine-side pid of unshare's one child (the host's PID 1)."""
        children = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()
        if len(children) != 1:
            raise ClusterUnavailable(f"unshare {unshare_pid} has children {children}, expected one host init")
        return int(children[0])

    def _wire(self) -> None:
        """A bridge in the switch's namespace; one veth pair per host, its eth0 end in the host."""
        sw = ["nsenter", "-t", str(self.switch.pid), "--net", "--"]
        _run([*sw, "ip", "link", "set", "lo", "up"])
        _run([*sw, "ip", "link", "add", "name", "br0", "type", "bridge"])
        _run([*sw, "ip", "link", "set", "br0", "up"])
        for i, host in enumerate(self.hosts):
            port = f"port{i}"
            _run([*sw, "ip", "link", "add", "name", port, "type", "veth", "peer", "name", "eth0",
                  "netns", str(host.pid)])
            _run([*sw, "ip", "link", "set", port, "master", "br0", "up"])
            inside = ["nsenter", "-t", str(host.pid), "--net", "--"]
            _run([*inside, "ip", "link", "set", "lo", "up"])
            _run([*inside, "ip", "addr", "add", f"{host.address}/24", "dev", "eth0"])
            _run([*inside, "ip", "link", "set", "eth0", "up"])

    def down(self) -> None:
        """Kill every host (and the switch) and wait until their processes are gone. Idempotent."""
        for host in [*self.hosts, *([self.switch] if self.switch else [])]:
            if host.pid:
                try:
                    os.kill(host.pid, signal.SIGKILL)  # the PID namespace dies with its init
                except ProcessLookupError:
                    pass
            if host.launcher.poll() is None:
                host.launcher.kill()
            host.launcher.wait(COMMAND_TIMEOUT_S)
            host.launcher.stdout.close()
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        for host in [*self.hosts, *([self.switch] if self.switch else [])]:
            while host.pid and Path(f"/proc/{host.pid}").exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"host {host.name}: init {host.pid} still there after SIGKILL")
                time.sleep(0.05)
        self.hosts, self.switch = [], None
