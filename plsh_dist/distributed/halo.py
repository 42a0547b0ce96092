"""Halo exchange: which earlier (and, non-causal, later) positions each rank
needs, who sends them, and the point-to-point messages that move them.

A *need* says, per key/value head ``h`` of receiving rank ``i``, the
positions ``[lo[h], first_i)`` before its chunk (left halo) and
``[end_i, hi[h])`` after it (right halo, non-causal only). Every rank
computes every rank's need from shared information (the hash seed, the
window, the group's chunks), so a sender knows what to send without a
handshake. Positions that exist on no rank (before the first chunk, in gaps
between chunks, after the last) are simply not sent.

The receiver keeps one halo buffer per side, ``(B, L, Hkv, D)``, whose L
slots are every existing position in ``[min_h lo[h], first_i)`` (resp.
``[end_i, max_h hi[h])``) in order. Slots a head does not need stay zero: no
query of that head reaches them (the callers rely on this). A message
carries, head by head, only the positions that head needs, so the bytes
received are exactly the needed (head, position) pairs.

With packed documents the need is per batch row as well (:class:`RowNeeds`):
no row needs keys of a document before its first token's, so a rank whose
chunk starts a document in every row receives nothing, and a message carries
(row, head, position) triples only where that row needs them.

Legend: B batch, T local tokens, Hkv key/value heads, D head dim, s samples,
H hash heads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from plsh_dist.distributed.comm_stats import record_bytes
from plsh_dist.distributed.group_chunks import GroupChunks

#: Point-to-point tags: keys/values, and their gradients going home.
_TAG = {"kv": 71, "grads": 72}


# ---------------------------------------------------------------------------
# What each rank needs
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Need:
    """Halo need of one rank: per kv head, left start and right end (absolute
    positions). ``lo[h] == first`` / ``hi[h] == end`` means nothing on that side."""

    lo: tuple[int, ...]
    hi: tuple[int, ...]


@dataclass(frozen=True)
class RowNeeds:
    """Halo need of one rank per batch row (packed documents): ``rows[b]`` is row b's :class:`Need`."""

    rows: tuple[Need, ...]

    @property
    def lo(self) -> tuple[int, ...]:
        """Per kv head, the earliest start over rows (the halo buffer's extent)."""
        return tuple(min(col) for col in zip(*(n.lo for n in self.rows)))

    @property
    def hi(self) -> tuple[int, ...]:
        return tuple(max(col) for col in zip(*(n.hi for n in self.rows)))


def _by_row(need) -> list[tuple[int | None, Need]]:
    """(row or None for every row, Need) pairs of a Need or RowNeeds."""
    if isinstance(need, RowNeeds):
        return list(enumerate(need.rows))
    return [(None, need)]


def _cut_at_documents(needs: list[Need], chunks: GroupChunks, docs) -> list:
    """Clamp every rank's need to the documents of its first and last token, row by row
    (``docs``: :class:`~plsh_dist.distributed.sp.documents.SPDocuments` or None)."""
    if docs is None:
        return needs
    firsts = torch.tensor([chunks.start(r) for r in range(chunks.size)])
    lasts = torch.tensor([chunks.end(r) - 1 for r in range(chunks.size)])
    per_row = [docs.bounds(b, firsts, lasts) for b in range(len(docs.row_starts))]  # ([P] starts, [P] next)
    out = []
    for r, need in enumerate(needs):
        last = int(lasts[r])
        rows = []
        for begin, nexts in per_row:
            start, nxt = begin[r], nexts[r]
            lo = tuple(max(x, start) for x in need.lo)
            hi = need.hi if nxt is None else tuple(min(x, max(nxt, last + 1)) for x in need.hi)
            rows.append(Need(lo, hi))
        out.append(rows[0] if all(n == rows[0] for n in rows) else RowNeeds(tuple(rows)))
    return out


def _kv_reduce(x_PSH: torch.Tensor, num_q_heads: int, num_kv_heads: int, reduce: str) -> list[list[int]]:
    """Reduce a per-(rank, sample, hash head) value to one per (rank, kv head) (``reduce``:
    "amin" or "amax").

    Hash head ``h`` serves query head ``h`` (or all query heads when H = 1);
    query head ``hq`` reads kv head ``hq // (Hq // Hkv)``.
    """
    P, s, H = x_PSH.shape
    if H == 1:
        return getattr(x_PSH.view(P, -1), reduce)(dim=1)[:, None].expand(P, num_kv_heads).tolist()
    g = num_q_heads // num_kv_heads
    return getattr(x_PSH.view(P, s, num_kv_heads, g), reduce)(dim=(1, 3)).tolist()


def _block_bounds_at(lsh, positions: list[int], after: bool) -> torch.Tensor:
    """First position of the block holding each position (``after``: the first position
    after it), LongTensor (P, s, H): the hash's own formula, one vectorised call for all ranks."""
    p = torch.tensor(positions, dtype=torch.long)[:, None, None].expand(len(positions), *lsh.shift.shape)
    return lsh.bucket_start(lsh.bucket_of(p) + int(after))


def plsh_needs(lsh, chunks: GroupChunks, num_q_heads: int, num_kv_heads: int, causal: bool, docs=None) -> list:
    """Need of every rank under a positional LSH hash.

    The only blocks that reach outside chunk ``i`` are the one holding its
    first position (to the left) and, non-causal, the one holding its last
    (to the right); over all samples and the query heads of a kv head, the
    union of their outside parts is one range per side. ``docs``
    (:class:`~plsh_dist.distributed.sp.documents.SPDocuments`): blocks are cut
    at document starts too, so each row's need stops at its documents.
    """
    P = chunks.size
    firsts = [chunks.start(r) for r in range(P)]
    ends = [chunks.end(r) for r in range(P)]
    lo = _kv_reduce(_block_bounds_at(lsh, firsts, after=False), num_q_heads, num_kv_heads, "amin")
    if causal:
        hi = [[end] * num_kv_heads for end in ends]
    else:
        hi = _kv_reduce(_block_bounds_at(lsh, [e - 1 for e in ends], after=True), num_q_heads, num_kv_heads, "amax")
    needs = [Need(tuple(min(x, first) for x in lo_r), tuple(max(x, end) for x in hi_r))
             for first, end, lo_r, hi_r in zip(firsts, ends, lo, hi)]
    return _cut_at_documents(needs, chunks, docs)


def window_needs(window: int, chunks: GroupChunks, num_kv_heads: int, causal: bool, docs=None) -> list:
    """Need of every rank under sliding-window attention: keys within
    ``window - 1`` positions of the chunk (and of its rows' documents, ``docs``)."""
    needs = []
    for r in range(chunks.size):
        lo = chunks.start(r) - (window - 1)
        hi = chunks.end(r) + (0 if causal else window - 1)
        needs.append(Need((lo,) * num_kv_heads, (hi,) * num_kv_heads))
    return _cut_at_documents(needs, chunks, docs)


# ---------------------------------------------------------------------------
# The exchange: slots and messages
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Piece:
    """``length`` tokens of kv head ``head``: owner's local index ``src``, receiver's halo slot
    ``dst``; of batch row ``row``, or of every row when None."""

    head: int
    src: int
    dst: int
    length: int
    row: int | None = None

    def rows(self) -> slice:
        return slice(None) if self.row is None else slice(self.row, self.row + 1)


@dataclass
class Transfer:
    """One message between this rank and ``peer`` (group rank); ``side`` of the receiver's halo."""

    peer: int
    side: str
    pieces: list[Piece] = field(default_factory=list)

    def tokens(self, batch: int) -> int:
        """(row, head, position) triples the message carries for a batch of ``batch`` rows."""
        return sum(p.length * (batch if p.row is None else 1) for p in self.pieces)


def _side_ranges(chunks: GroupChunks, lo: int, hi: int, owners) -> list[tuple[int, int, int]]:
    """(owner, start, stop) of existing positions in [lo, hi) held by ``owners``, in order."""
    out = []
    for j in owners:
        a, b = max(lo, chunks.start(j)), min(hi, chunks.end(j))
        if b > a:
            out.append((j, a, b))
    return out


def _reaches(chunks: GroupChunks, i: int, need, a: int, b: int) -> bool:
    """Whether rank ``i``'s halo (either side) overlaps positions [a, b)."""
    left = min(need.lo) < b and a < chunks.start(i)
    right = max(need.hi) > a and b > chunks.end(i)
    return left or right


def _transfers(chunks: GroupChunks, i: int, need) -> list[tuple[int, Transfer]]:
    """All messages towards receiver ``i``: (owner, Transfer with peer = i)."""
    first, end = chunks.start(i), chunks.end(i)
    H = len(need.lo)
    sides = (
        ("left", min(need.lo), first, range(0, i), lambda n: (n.lo, [first] * H)),
        ("right", end, max(need.hi), range(i + 1, chunks.size), lambda n: ([end] * H, n.hi)),
    )
    result = []
    for side, lo, hi, owners, head_range in sides:
        slot = 0
        for j, a, b in _side_ranges(chunks, lo, hi, owners):
            t = Transfer(peer=i, side=side)
            for row, row_need in _by_row(need):
                head_lo, head_hi = head_range(row_need)
                for h in range(H):
                    ha, hb = max(a, head_lo[h]), min(b, head_hi[h])
                    if hb > ha:
                        t.pieces.append(Piece(h, ha - chunks.start(j), slot + ha - a, hb - ha, row))
            if t.pieces:
                result.append((j, t))
            slot += b - a
    return result


@dataclass
class HaloExchange:
    """This rank's messages and halo slots, derived identically on every rank.

    Attributes:
        recv: messages to this rank (``peer`` = owner).
        send: messages from this rank (``peer`` = receiver).
        left_pos, right_pos: LongTensor[L] absolute positions of the halo slots.
    """

    recv: list[Transfer]
    send: list[Transfer]
    left_pos: torch.Tensor
    right_pos: torch.Tensor

    @classmethod
    def build(cls, chunks: GroupChunks, needs: list[Need]) -> "HaloExchange":
        me = chunks.rank
        recv, send = [], []
        mine = (chunks.start(me), chunks.end(me))
        for i in range(chunks.size):  # fixed order: receiver, then owner
            if i != me and not _reaches(chunks, i, needs[i], *mine):
                continue  # nothing between i and this rank: O(P) per exchange instead of O(P^2)
            for j, t in _transfers(chunks, i, needs[i]):
                if i == me:
                    recv.append(Transfer(peer=j, side=t.side, pieces=t.pieces))
                elif j == me:
                    send.append(t)
        need = needs[me]
        first, end = chunks.start(me), chunks.end(me)
        pos = lambda ranges: torch.cat(  # noqa: E731
            [torch.arange(a, b) for _, a, b in ranges] or [torch.zeros(0, dtype=torch.long)]
        )
        left = pos(_side_ranges(chunks, min(need.lo), first, range(0, me)))
        right = pos(_side_ranges(chunks, end, max(need.hi), range(me + 1, chunks.size)))
        return cls(recv, send, left, right)

    def recv_tokens(self, batch: int = 1) -> int:
        """(head, position) pairs this rank receives (per row; with per-row pieces, (row, head,
        position) triples of a ``batch``-row call)."""
        return sum(t.tokens(batch) for t in self.recv)


# ---------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------


def _pack(tensors: list[torch.Tensor], pieces: list[Piece], index: str) -> torch.Tensor:
    """Flatten the pieces of each (B, n, Hkv, D) tensor, tensor by tensor, into one buffer."""
    parts = [x[p.rows(), getattr(p, index):getattr(p, index) + p.length, p.head].reshape(-1)
             for x in tensors for p in pieces]
    return torch.cat(parts)


def _unpack_into(buf: torch.Tensor, tensors: list[torch.Tensor], pieces: list[Piece], index: str, add: bool) -> None:
    """Inverse of :func:`_pack`: write (or add) the buffer's pieces into the tensors."""
    off = 0
    for x in tensors:
        B, D = x.shape[0], x.shape[3]
        for p in pieces:
            a, rows = getattr(p, index), p.rows()
            nb = B if p.row is None else 1
            n = nb * p.length * D
            chunk = buf[off:off + n].view(nb, p.length, D).to(x.dtype)
            if add:
                x[rows, a:a + p.length, p.head] += chunk
            else:
                x[rows, a:a + p.length, p.head] = chunk
            off += n


def _isend(chunks: GroupChunks, buf: torch.Tensor, peer: int, phase: str, what: str):
    record_bytes(phase, sent=buf.numel() * buf.element_size())
    return dist.isend(buf, dst=chunks.global_ranks[peer], group=chunks.group, tag=_TAG[what])


def _irecv(chunks: GroupChunks, buf: torch.Tensor, peer: int, phase: str, what: str):
    record_bytes(phase, recv=buf.numel() * buf.element_size())
    return dist.irecv(buf, src=chunks.global_ranks[peer], group=chunks.group, tag=_TAG[what])


class PendingHalo:
    """Posted halo messages of keys/values; :meth:`wait` returns the filled halo buffers."""

    def __init__(self, chunks: GroupChunks, exchange: HaloExchange, k: torch.Tensor, v: torch.Tensor, phase: str):
        self.exchange = exchange
        B, _, Hkv, D = k.shape
        self.shapes = {"left": (B, exchange.left_pos.numel(), Hkv, D), "right": (B, exchange.right_pos.numel(), Hkv, D)}
        self.like = k
        self.works, self.bufs = [], []
        for t in exchange.recv:  # receives first, so a sender never waits on an unposted receive
            buf = k.new_empty(2 * t.tokens(B) * D)
            self.bufs.append((t, buf))
            self.works.append(_irecv(chunks, buf, t.peer, phase, "kv"))
        for t in exchange.send:
            self.works.append(_isend(chunks, _pack([k, v], t.pieces, "src").contiguous(), t.peer, phase, "kv"))

    def wait(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """side -> (halo_k, halo_v), each (B, L_side, Hkv, D), zero where no head needs a slot."""
        for w in self.works:
            w.wait()
        halos = {s: (self.like.new_zeros(shape), self.like.new_zeros(shape)) for s, shape in self.shapes.items()}
        for t, buf in self.bufs:
            _unpack_into(buf, list(halos[t.side]), t.pieces, "dst", add=False)
        return halos


def post_kv(chunks: GroupChunks, exchange: HaloExchange, k: torch.Tensor, v: torch.Tensor,
            phase: str = "fwd") -> PendingHalo:
    """Post the halo messages of ``k``, ``v`` (B, T, Hkv, D); returns before they complete. ``phase``
    ("fwd", or "bwd" for a backward that fetches the halo again) is where :mod:`comm_stats` counts them."""
    return PendingHalo(chunks, exchange, k, v, phase)


class PendingGrads:
    """Posted backward messages: halo gradients going back to their owners."""

    def __init__(self, chunks, exchange: HaloExchange, halo_grads: dict[str, tuple[torch.Tensor, torch.Tensor]], like):
        self.works, self.bufs = [], []
        B, _, Hkv, D = like.shape
        for t in exchange.send:  # gradients for the tokens this rank sent in forward
            buf = like.new_empty(2 * t.tokens(B) * D)
            self.bufs.append((t, buf))
            self.works.append(_irecv(chunks, buf, t.peer, "bwd", "grads"))
        for t in exchange.recv:
            buf = _pack(list(halo_grads[t.side]), t.pieces, "dst").to(like.dtype).contiguous()
            self.works.append(_isend(chunks, buf, t.peer, "bwd", "grads"))

    def wait_add(self, dk: torch.Tensor, dv: torch.Tensor) -> None:
        """Wait, then add the received gradients into this rank's ``dk``, ``dv`` (B, T, Hkv, D)."""
        for w in self.works:
            w.wait()
        for t, buf in self.bufs:
            _unpack_into(buf, [dk, dv], t.pieces, "src", add=True)


def post_grads(chunks: GroupChunks, exchange: HaloExchange, halo_grads, like: torch.Tensor) -> PendingGrads:
    """Post the backward messages: ``halo_grads`` side -> (dk_halo, dv_halo) go to
    their owners; the gradients of this rank's sent tokens are received.
    ``like``: a (B, T, Hkv, D) tensor of the gradient dtype."""
    return PendingGrads(chunks, exchange, halo_grads, like)
