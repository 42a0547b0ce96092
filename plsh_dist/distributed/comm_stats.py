"""Bytes moved by sequence-parallel attention, cumulative per process.

Counted where the attention ops post their sends and receives, as payload
bytes (``numel * element_size``) of this rank's own messages; collectives
count their algorithmic share per rank (an all-gather of P chunks of c bytes
sends and receives ``(P - 1) * c`` on every rank, whatever ring/tree gloo or
NCCL use underneath). The small per-call validation exchange is counted
apart in ``meta_bytes`` so the K/V traffic can be compared with ring
attention's on its own.

Keys of :func:`comm_stats`:

- ``sent_bytes`` / ``recv_bytes``: all K/V (and K/V gradient) payload;
- ``fwd_sent_bytes``, ``fwd_recv_bytes``, ``bwd_sent_bytes``, ``bwd_recv_bytes``:
  the same split by pass;
- ``meta_bytes``: validation handshakes (sent + received);
- ``calls``: sequence-parallel attention calls (forward passes).
"""

from __future__ import annotations

_KEYS = ("fwd_sent_bytes", "fwd_recv_bytes", "bwd_sent_bytes", "bwd_recv_bytes", "meta_bytes", "calls")
_stats = dict.fromkeys(_KEYS, 0)


def record_bytes(phase: str, sent: int = 0, recv: int = 0) -> None:
    """Add payload bytes for ``phase`` in {"fwd", "bwd"}."""
    if phase not in ("fwd", "bwd"):
        raise ValueError(f"phase must be 'fwd' or 'bwd', got {phase!r}")
    _stats[f"{phase}_sent_bytes"] += int(sent)
    _stats[f"{phase}_recv_bytes"] += int(recv)


def record_meta(nbytes: int) -> None:
    """Add validation-handshake bytes (sent + received)."""
    _stats["meta_bytes"] += int(nbytes)


def record_call() -> None:
    """Count one sequence-parallel attention forward."""
    _stats["calls"] += 1


def comm_stats() -> dict[str, int]:
    """Cumulative counters of this process (a copy), with the totals
    ``sent_bytes`` and ``recv_bytes`` over both passes."""
    out = dict(_stats)
    out["sent_bytes"] = out["fwd_sent_bytes"] + out["bwd_sent_bytes"]
    out["recv_bytes"] = out["fwd_recv_bytes"] + out["bwd_recv_bytes"]
    return out


def reset_comm_stats() -> None:
    """Zero every counter (e.g. at the start of a logging interval)."""
    for key in _KEYS:
        _stats[key] = 0
