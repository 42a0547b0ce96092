"""Check, in seconds, that a rank can reach its rendezvous address before joining the process group.

PyTorch retries the connection to its TCP store (``MASTER_ADDR:MASTER_PORT``) for the whole
collective timeout whatever the cause, inside C++ code no signal handler interrupts, so a down
network or a wrong host or port looked like a ten-minute hang. ``check_rendezvous`` runs first, in
Python, with short socket timeouts: the address must resolve, the rank serving the store must reach
itself there, every other rank must connect; causes that waiting cannot fix fail at once, a refused
connection is retried until ``[parallel].rendezvous_timeout_s``; then ``RendezvousUnreachable``
names the address, port and cause. Details and measurements: docs/training.md, "Rendezvous".
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass

__all__ = ["RendezvousUnreachable", "Rendezvous", "check_rendezvous", "rendezvous_from_env"]

ATTEMPT_TIMEOUT_S = 2.0
RETRY_PAUSE_S = 0.5
# errno values no retry within seconds can change: network unreachable, address not available here
PERMANENT_ERRNOS = (101, 99)
QUIET_S = 2.0  # a peer's store is often a second late: say nothing about waits shorter than this


class RendezvousUnreachable(RuntimeError):
    """This rank cannot reach the rendezvous address; the message names it and the cause."""


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks meet (``MASTER_ADDR``, ``MASTER_PORT``) and whether this rank serves the store."""

    addr: str
    port: int
    serves_store: bool

    @property
    def where(self) -> str:
        return f"{self.addr}:{self.port}"


def rendezvous_from_env(env: dict[str, str] | None = None) -> Rendezvous:
    """The rendezvous env:// reads: ``MASTER_ADDR``, ``MASTER_PORT``; rank 0 serves the store unless
    torchrun's agent already does (``TORCHELASTIC_USE_AGENT_STORE=True``)."""
    env = os.environ if env is None else env
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    return Rendezvous(env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", "29500")),
                      serves_store=int(env.get("RANK", "0")) == 0 and not agent)


def _cause(err: OSError) -> str:
    if isinstance(err, socket.gaierror):
        return f"unknown host ({err.strerror or err})"
    if isinstance(err, TimeoutError) or isinstance(err, socket.timeout):
        return f"no answer within {ATTEMPT_TIMEOUT_S:.0f} s"
    name = {101: "network unreachable", 113: "no route to host", 111: "connection refused",
            99: "address not available on this host"}.get(err.errno or 0, "")
    detail = f"errno {err.errno}: {err.strerror}" if err.errno else str(err)
    return f"{name} ({detail})" if name else detail


def _connect(addrinfo: tuple, port: int) -> None:
    family, kind, proto, _, sockaddr = addrinfo
    with socket.socket(family, kind, proto) as s:
        s.settimeout(ATTEMPT_TIMEOUT_S)
        s.connect((sockaddr[0], port, *sockaddr[2:]))


def _reach_once(rdzv: Rendezvous) -> None:
    """One attempt; raises OSError with the cause."""
    infos = socket.getaddrinfo(rdzv.addr, rdzv.port, type=socket.SOCK_STREAM)
    if not rdzv.serves_store:
        _connect(infos[0], rdzv.port)
        return
    # The store listens on every interface; can this host reach itself at MASTER_ADDR?
    family = infos[0][0]
    with socket.create_server(("", 0), family=family, dualstack_ipv6=family == socket.AF_INET6) as server:
        _connect(infos[0], server.getsockname()[1])


def check_rendezvous(rdzv: Rendezvous, deadline_s: float) -> None:
    """Return once ``rdzv`` is reachable from this rank; raise ``RendezvousUnreachable`` after ``deadline_s``."""
    start, said = time.monotonic(), False
    while True:
        try:
            _reach_once(rdzv)
            return
        except OSError as err:
            last = err
        if isinstance(last, socket.gaierror) or last.errno in PERMANENT_ERRNOS:
            break
        if time.monotonic() - start + RETRY_PAUSE_S > deadline_s:
            break
        if not said and time.monotonic() - start >= QUIET_S:
            print(f"rendezvous {rdzv.where}: {_cause(last)}; retrying for up to {deadline_s:g} s "
                  f"([parallel].rendezvous_timeout_s)", file=sys.stderr, flush=True)
            said = True
        time.sleep(RETRY_PAUSE_S)
    role = "serves the rendezvous store at" if rdzv.serves_store else "connects to the rendezvous store at"
    raise RendezvousUnreachable(
        f"rendezvous {rdzv.where} (MASTER_ADDR:MASTER_PORT) unreachable after {time.monotonic() - start:.1f} s: "
        f"{_cause(last)}; this rank {role} that address. Check the host name, the port and the network "
        f"(a container needs its loopback up); [parallel].rendezvous_timeout_s = {deadline_s:g} s")
