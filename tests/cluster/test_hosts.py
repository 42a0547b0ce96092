"""The namespace hosts themselves: identity, isolation, take-down, crash clean-up, clear refusals.

- Each host has its own hostname, address and process table, and reaches
  the other by name (TCP over the veth); the machine's namespaces gain
  nothing (no named netns, no interface).
- ``down()`` leaves no process of the hosts; neither does a SIGKILL of the
  process that brought them up (the kernel tears the hosts down).
- Without the tools or the namespaces, the error names what is missing
  (these run anywhere, no root needed).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import unavailable
from tools.cluster.hosts import ClusterUnavailable, Hosts, namespaces_refused

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 30


def _machine_links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=TIMEOUT_S).stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.fixture()
def can_host():
    reason = namespaces_refused()
    if reason:
        unavailable(reason)


@pytest.mark.cluster
def test_two_hosts_have_their_own_names_addresses_and_processes(can_host, tmp_path):
    links_before = _machine_links()
    with Hosts(2, tmp_path) as hosts:
        assert [h.run(["hostname"]).stdout.strip() for h in hosts] == ["node-0", "node-1"]
        for host in hosts:
            assert f"inet {host.address}/24" in host.run(["ip", "-4", "-o", "addr"]).stdout
            assert host.run(["ps", "-e", "-o", "pid="]).stdout.split()[0] == "1"  # its own PID namespace
        server = hosts[1].popen([sys.executable, "-c", (
            "import socket; s = socket.create_server(('node-1', 7000)); c, _ = s.accept(); "
            "print(c.recv(16).decode())")], stdout=subprocess.PIPE, text=True)
        client = ("import socket, time\nfor _ in range(100):\n    try:\n"
                  "        socket.create_connection(('node-1', 7000), timeout=5).sendall(b'from node-0'); break\n"
                  "    except ConnectionRefusedError:\n        time.sleep(0.1)\n")
        hosts[0].run([sys.executable, "-c", client])
        assert server.communicate(timeout=TIMEOUT_S)[0].strip() == "from node-0"
        assert _machine_links() == links_before  # no interface in the machine's own namespace
        pids = [h.pid for h in hosts]
    assert not any(_alive(p) for p in pids)
    assert "node-" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                         timeout=TIMEOUT_S).stdout


@pytest.mark.cluster
def test_a_crashed_owner_leaves_nothing_behind(can_host, tmp_path):
    """SIGKILL the process that brought the hosts up (and started a daemon in each): all of it goes."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from tools.cluster.hosts import Hosts\n"
        f"hosts = Hosts(2, Path({str(tmp_path)!r}))\n"
        "hosts.up()\n"
        "for h in hosts:\n"
        "    h.run(['sh', '-c', 'sleep 600 > /dev/null 2>&1 &'])  # a daemon, reparented to the host's init\n"
        "print(' '.join(str(h.pid) for h in [*hosts, hosts.switch]), flush=True)\n"
        "time.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        pids = [int(p) for p in owner.stdout.readline().split()]
        assert len(pids) == 3, "the hosts did not come up"
        daemons = [int(line.split()[0]) for line in subprocess.run(
            ["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, timeout=TIMEOUT_S).stdout.splitlines()
            if int(line.split()[1]) in pids and "sleep 600" in line]
        assert len(daemons) == 2
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(TIMEOUT_S)
    deadline = time.monotonic() + TIMEOUT_S
    while any(_alive(p) for p in pids + daemons) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids + daemons if _alive(p)]


def test_missing_namespace_tools_are_named(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no unshare or nsenter (util-linux, /usr/bin)
    reason = namespaces_refused()
    assert reason and "unshare" in reason and "util-linux" in reason


def test_refused_namespaces_are_named(monkeypatch, tmp_path):
    for tool in ("nsenter", "ip"):
        (tmp_path / tool).write_text("#!/bin/sh\nexit 0\n")
        (tmp_path / tool).chmod(0o755)
    (tmp_path / "unshare").write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\n"
                                      "exit 1\n")
    (tmp_path / "unshare").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    reason = namespaces_refused()
    assert reason.startswith("namespaces refused") and "Operation not permitted" in reason and "root" in reason
    with pytest.raises(ClusterUnavailable, match="namespaces refused"):
        Hosts(2, tmp_path / "state").up()
