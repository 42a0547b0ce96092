"""A free TCP port for a rendezvous (MASTER_PORT) on this machine."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port the OS reports free on 127.0.0.1 right now (another process may
    still take it before it is bound again; good enough for local launches)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
