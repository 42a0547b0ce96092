"""The rendezvous check (plsh_dist/distributed/rendezvous.py): reachable addresses pass at once,
unreachable ones fail in seconds naming the address and the cause.

In-process on loopback, plus one subprocess in a fresh network namespace
whose loopback is down (root: ``unshare --net``; skipped, naming why, elsewhere).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plsh_dist.distributed.ports import free_port
from plsh_dist.distributed.rendezvous import Rendezvous, RendezvousUnreachable, check_rendezvous, rendezvous_from_env

ROOT = Path(__file__).resolve().parents[2]


def test_a_listening_store_and_the_serving_rank_pass_at_once():
    with socket.create_server(("127.0.0.1", 0)) as server:
        t0 = time.monotonic()
        check_rendezvous(Rendezvous("127.0.0.1", server.getsockname()[1], serves_store=False), deadline_s=5)
        check_rendezvous(Rendezvous("localhost", free_port(), serves_store=True), deadline_s=5)
        assert time.monotonic() - t0 < 2


def test_a_refused_port_fails_after_the_deadline_naming_it(capfd):
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(RendezvousUnreachable, match=rf"rendezvous 127\.0\.0\.1:{port} .*connection refused"):
        check_rendezvous(Rendezvous("127.0.0.1", port, serves_store=False), deadline_s=3)
    assert 2.5 <= time.monotonic() - t0 < 6
    assert f"rendezvous 127.0.0.1:{port}: connection refused" in capfd.readouterr().err  # said once, while waiting


def test_an_unknown_host_fails_at_once():
    t0 = time.monotonic()
    with pytest.raises(RendezvousUnreachable, match=r"rendezvous no-such-host\.invalid:29500 .*unknown host"):
        check_rendezvous(Rendezvous("no-such-host.invalid", 29500, serves_store=True), deadline_s=60)
    assert time.monotonic() - t0 < 15  # one resolver answer, no retries


def test_env_rendezvous_and_torchruns_agent_store():
    env = {"MASTER_ADDR": "node-0", "MASTER_PORT": "29511", "RANK": "0"}
    assert rendezvous_from_env(env) == Rendezvous("node-0", 29511, serves_store=True)
    assert not rendezvous_from_env({**env, "RANK": "3"}).serves_store
    assert not rendezvous_from_env({**env, "TORCHELASTIC_USE_AGENT_STORE": "True"}).serves_store


def _netns_refused() -> str | None:
    try:
        res = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unshare --net unavailable: {err}"
    return None if res.returncode == 0 else f"unshare --net refused (root needed): {res.stderr.strip()}"


def test_loopback_down_fails_at_once_with_errno_101():
    reason = _netns_refused()
    if reason:
        pytest.skip(reason)
    code = ("from plsh_dist.distributed.rendezvous import *\n"
            "try:\n    check_rendezvous(Rendezvous('127.0.0.1', 29500, serves_store=True), deadline_s=60)\n"
            "except RendezvousUnreachable as e:\n    print(e)\n")
    t0 = time.monotonic()
    res = subprocess.run(["unshare", "--net", sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    assert "rendezvous 127.0.0.1:29500" in res.stdout and "network unreachable (errno 101" in res.stdout, res.stdout
    assert time.monotonic() - t0 < 15
