"""Decoding with a KV cache: new queries against all cached (and new) keys, forward only.

A cached decoder step has ``Tq`` new queries at positions ``q_pos`` and ``Tk`` keys at positions
``k_pos`` (every cached token and the new ones); each function returns exactly the rows the full
causal op computes for those queries, up to rounding: exact / windowed ALiBi and no bias through
:func:`plsh_dist.ops.alibi.alibi_forward`, PLSH and fixed blocks in the one-pass form over each
query's band (:class:`DecodeOnePass`, the table's decoding row), with the block starts and counts
of :mod:`plsh_dist.ops.cpu.band`, so the masks are a full forward's. No autograd. Why the rows agree
with a full forward: docs/design.md, section 4, "Decoding with a KV cache".

Legend: B batch, Tq new queries, Tk keys, Hq query heads, Hkv key/value heads,
D head dim, s samples, C queries of one chunk, K keys of one chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plsh_dist.hashing import PositionalLSH
from plsh_dist.ops.alibi import alibi_forward, check_slopes, check_window, widest_window
from plsh_dist.ops.cpu import block_firsts, log_count_bias
from plsh_dist.ops.dense import dense_fwd
from plsh_dist.ops.gqa import repeat_kv
from plsh_dist.ops.head_groups import head_groups
from plsh_dist.ops.strategy import Strategy

#: Queries per chunk (a decoding step has one; a chunked prefill may have many).
_CHUNK = 64


def check_decode_inputs(q, k, v, q_pos, k_pos) -> tuple[torch.Tensor, torch.Tensor]:
    """Shapes and positions of a decoding call; returns CPU LongTensors ``(q_pos, k_pos)``.

    q (B, Tq, Hq, D); k, v (B, Tk, Hkv, D) with ``Hq % Hkv == 0``; q_pos [Tq] and
    k_pos [Tk] strictly increasing, every query position among the keys'.
    """
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"q must be (B, Tq, Hq, D) and k, v (B, Tk, Hkv, D) alike; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[2] % k.shape[2]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must share B and D, and Hq must be a "
                         "multiple of Hkv")
    q_pos = torch.as_tensor(q_pos).to("cpu", torch.long).reshape(-1)
    k_pos = torch.as_tensor(k_pos).to("cpu", torch.long).reshape(-1)
    if q_pos.numel() != q.shape[1] or k_pos.numel() != k.shape[1]:
        raise ValueError(f"q_pos ({q_pos.numel()}) and k_pos ({k_pos.numel()}) must give one position per "
                         f"query ({q.shape[1]}) and key ({k.shape[1]})")
    for name, p in (("q_pos", q_pos), ("k_pos", k_pos)):
        if p.numel() > 1 and not bool((p[1:] > p[:-1]).all()):
            raise ValueError(f"{name} must be strictly increasing")
    hit = torch.searchsorted(k_pos, q_pos)
    if bool((hit >= k_pos.numel()).any()) or not torch.equal(k_pos[hit.clamp(max=k_pos.numel() - 1)], q_pos):
        raise ValueError("every query position must also be a key position (the new tokens' keys are in the cache)")
    return q_pos, k_pos


@torch.no_grad()
def alibi_decode(q, k, v, q_pos, k_pos, *, slopes, window=None, scale: float | None = None):
    """Exact (``window=None``) or windowed ALiBi rows of the queries: out (B, Tq, Hq, D).

    ``window``: an int, or one per query head (truncated ALiBi); only the keys within
    the widest window of the first query are read."""
    q_pos, k_pos = check_decode_inputs(q, k, v, q_pos, k_pos)
    slopes = check_slopes(slopes, q.shape[2])
    window = check_window(window, q.shape[2])
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if window is not None:  # keys the window hides are never read (nor repeated for GQA)
        k0 = int(torch.searchsorted(k_pos, int(q_pos[0]) - widest_window(window) + 1))
        k, v, k_pos = k[:, k0:], v[:, k0:], k_pos[k0:]
    out, _ = alibi_forward(q, k, v, q_pos, k_pos, slopes, causal=True, window=window, scale=scale, chunk=_CHUNK)
    return out


def causal_decode(q, k, v, q_pos, k_pos, *, scale: float | None = None):
    """Rows of plain causal attention (no positional bias): out (B, Tq, Hq, D)."""
    return alibi_decode(q, k, v, q_pos, k_pos, slopes=torch.zeros(q.shape[2]), scale=scale)


@torch.no_grad()
def block_decode(q, k, v, q_pos, k_pos, lsh: PositionalLSH, *, scale: float | None = None):
    """PLSH (or fixed-blocks) rows of the queries in the one-pass form: out (B, Tq, Hq, D).

    ``lsh``: the full forward's hash (``PositionalLSH(sigma, s, seed, sampler)``
    or ``FixedBlocks(sigma)``), one head shared by all query heads or one per
    query head (query head ``h`` reads kv head ``h // (Hq / Hkv)``).

    All heads run in one dense call per chunk of queries, over the union of
    their bands (the widest head's); each head's keys outside its own band
    get ``c = 0`` (weight 0). Only that key range is read and repeated for GQA,
    so a step costs O(band), not O(cached tokens).
    """
    q_pos, k_pos = check_decode_inputs(q, k, v, q_pos, k_pos)
    B, Tq, Hq, D = q.shape
    g = head_groups(lsh, Hq, k.shape[2]).kv_repeat  # all heads in one call: only the check and g matter here
    scale = D ** -0.5 if scale is None else float(scale)
    first = block_firsts(lsh, q_pos)  # (Hh, Tq, s) positions
    out = torch.empty_like(q)
    for i0 in range(0, Tq, _CHUNK):
        i1 = min(Tq, i0 + _CHUNK)
        qp = q_pos[i0:i1]
        # block starts are monotone in position: the chunk's first query reaches furthest back
        k0 = int(torch.searchsorted(k_pos, first[:, i0].min()))
        k1 = int(torch.searchsorted(k_pos, qp[-1], right=True))
        kp = k_pos[k0:k1]
        first_c = first[:, i0:i1]
        stop = torch.searchsorted(kp, qp, right=True)[None, :, None].expand(first_c.shape[0], -1, 1)
        bias = log_count_bias(torch.searchsorted(kp, first_c), stop, float(lsh.num_samples), kp.numel(),
                              q.dtype).to(q.device)  # (Hh, C, K)
        k_c, v_c = (repeat_kv(x[:, k0:k1], g).transpose(1, 2) for x in (k, v))  # (B, Hq, K, D)
        o, _ = dense_fwd(q[:, i0:i1].transpose(1, 2), k_c, v_c, causal=False, scale=scale, bias=bias[None])
        out[:, i0:i1] = o.transpose(1, 2)
    return out


@dataclass(frozen=True)
class DecodeOnePass(Strategy):
    """Forward-only strategy of a KV-cache step: the one-pass form over each query's band
    (:func:`block_decode`), whatever method the full forward uses."""

    onepass = True

    def forward(self, q, k, v, q_pos, k_pos, lsh: PositionalLSH, *, scale: float | None = None):
        """out (B, Tq, Hq, D): the queries' rows of the full causal op (see :func:`block_decode`)."""
        return block_decode(q, k, v, q_pos, k_pos, lsh, scale=scale)
